/*
 * Next edits through the whole extension, activated in the mocked VS Code host with the real
 * vscode-languageclient, against a scripted language server
 * (`python -m tests.support.next_edit_server`, which speaks the next-edit protocol and answers
 * from rules the test chooses) started through `tabloop.server.path` as a user would: a typed
 * rename asks after the pause, a slower answer is cancelled with `$/cancelRequest` by the next
 * keystroke, the prediction is drawn and reported shown, Tab applies it (the server's copy of the
 * document follows) and runs `tabloop.acceptNextEdit`, Escape dismisses the next one. Needs the
 * project's .venv; prints why when it skips.
 */
import * as assert from 'node:assert/strict';
import { promises as fs } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, describe, it } from 'node:test';

import * as vscode from 'vscode';

import { activate, deactivate, type TabloopExtension } from '../../src/extension';
import { NEXT_EDIT_COMMANDS, NEXT_EDIT_CONTEXT } from '../../src/nextEdit';
import {
  ACCEPT_NEXT_EDIT_COMMAND,
  NEXT_EDIT_REJECTED_NOTIFICATION,
  NEXT_EDIT_REQUEST,
  DID_SHOW_INLINE_EDIT_NOTIFICATION,
} from '../../src/protocol';
import { mock, type TextDocument, type TextEditor } from '../mock/vscode';
import { EXTENSION_DIR, REPO_ROOT, venvPython } from '../paths';
import { waitFor } from './fixtures';

const python = venvPython();
const skipReason = python ? undefined : 'no Python environment at .venv (run `make venv`); skipping the next-edit smoke test';
if (skipReason) process.stdout.write(`# ${skipReason}\n`);

/** The file mid-rename: the user is about to close the signature "def area(w, h" with "):". */
const SOURCE = ['def area(w, h', '    return width * height', ''].join('\n');
const SCRIPT = {
  rules: [
    { when: 'return w * h', edits: [{ find: 'return w * h', replace: 'return abs(w * h)' }] },
    { when: 'def area(w, h):', edits: [{ find: 'width', replace: 'w' }, { find: 'height', replace: 'h' }] },
  ],
  // Slow enough that a keystroke lands while a request is in flight.
  delay_ms: 1500,
};

interface LogEntry {
  method: string;
  params?: { textDocument?: { version: number }; item?: { id: string }; id?: string; reason?: string };
  outcome?: string;
  command?: string;
  arguments?: unknown[];
}


describe('next edits in a VS Code host, against a scripted server', { skip: skipReason, timeout: 120_000 }, () => {
  let home: string;
  let extension: TabloopExtension;
  let document: TextDocument;
  let editor: TextEditor;

  const serverLog = () => extension.client!.sendRequest<LogEntry[]>('scripted/log', {});

  before(async () => {
    home = await fs.mkdtemp(path.join(os.tmpdir(), 'tabloop-next-edit-'));
    const scriptPath = path.join(home, 'script.json');
    await fs.writeFile(scriptPath, JSON.stringify(SCRIPT));
    // Started as a `tabloop` executable would be (its arguments, `serve --stdio`, are not needed).
    const launcher = path.join(home, 'tabloop');
    await fs.writeFile(launcher, `#!/bin/sh\ncd '${REPO_ROOT}' && exec '${python}' -m tests.support.next_edit_server --script '${scriptPath}'\n`, { mode: 0o755 });
    await fs.mkdir(path.join(home, 'ws'));
    mock.reset();
    mock.setWorkspaceFolders([path.join(home, 'ws')]);
    mock.setConfig('global', 'tabloop.server.path', launcher);
  });

  after(async () => {
    await deactivate();
    if (home) await fs.rm(home, { recursive: true, force: true });
  });

  it('starts the server, which offers next edits', async () => {
    const packageJSON = JSON.parse(await fs.readFile(path.join(EXTENSION_DIR, 'package.json'), 'utf8'));
    extension = await activate({ subscriptions: [], extension: { packageJSON } } as unknown as vscode.ExtensionContext);
    await waitFor('the client to run', 30_000, () => extension.client?.isRunning());
    assert.deepEqual(extension.client!.initializeResult?.capabilities.experimental, { tabloop: { nextEdit: true } });
    document = mock.openDocument(path.join(home, 'ws', 'area.py'), 'python', SOURCE);
    editor = mock.showEditor(document);
    editor.selection = new vscode.Selection(new vscode.Position(0, 13), new vscode.Position(0, 13)) as never;
  });

  it('asks after a pause in typing, cancelling a request the next keystroke made stale', async () => {
    mock.type(editor, ')');
    const first = await waitFor('a request in flight', 10_000, async () => (await serverLog()).find((e) => e.method === NEXT_EDIT_REQUEST));
    mock.type(editor, ':');
    const shown = await waitFor('the prediction drawn', 20_000, () => extension.nextEdit.current);
    const requests = (await serverLog()).filter((e) => e.method === NEXT_EDIT_REQUEST);
    assert.deepEqual(
      requests.map((e) => [e.params!.textDocument!.version, e.outcome]),
      [
        [first.params!.textDocument!.version, 'cancelled'],
        [document.version, 'answered'],
      ],
    );
    assert.equal(shown.items.length, 2);
    assert.equal(mock.state.context.get(NEXT_EDIT_CONTEXT), true);
    const shows = await waitFor('didShowInlineEdit', 5_000, async () => {
      const found = (await serverLog()).filter((e) => e.method === DID_SHOW_INLINE_EDIT_NOTIFICATION);
      return found.length ? found : undefined;
    });
    assert.deepEqual(shows.map((e) => e.params!.item!.id), [shown.id]);
  });

  it('Tab applies the edits, the server sees the new text and the acceptance', async () => {
    const id = extension.nextEdit.current!.id;
    await vscode.commands.executeCommand(NEXT_EDIT_COMMANDS.accept);
    assert.equal(document.getText(), 'def area(w, h):\n    return w * h\n');
    // The server's copy follows (the client sent the edit as didChange).
    const serverText = await extension.client!.sendRequest<string>('scripted/document', { uri: document.uri.toString() });
    assert.equal(serverText, document.getText());
    const accepted = await waitFor('the acceptance', 5_000, async () => (await serverLog()).find((e) => e.command === ACCEPT_NEXT_EDIT_COMMAND));
    assert.deepEqual(accepted.arguments, [id]);
    // The accepted edit counts as typing: the next prediction comes for the new text, which the
    // server holds at the same version (an answer for another version would not be shown).
    const next = await waitFor('the next prediction', 20_000, () => extension.nextEdit.current);
    assert.notEqual(next.id, id);
    assert.equal(next.version, document.version);
    assert.deepEqual(next.items.map((item) => item.text), ['return abs(w * h)']);
  });

  it('Escape dismisses it and the server hears why', async () => {
    const id = extension.nextEdit.current!.id;
    await vscode.commands.executeCommand(NEXT_EDIT_COMMANDS.dismiss);
    assert.equal(mock.state.context.get(NEXT_EDIT_CONTEXT), false);
    const rejected = await waitFor('the rejection', 5_000, async () => (await serverLog()).find((e) => e.method === NEXT_EDIT_REJECTED_NOTIFICATION));
    assert.deepEqual(rejected.params, { id, reason: 'dismissed' });
    assert.equal(document.getText(), 'def area(w, h):\n    return w * h\n');
  });
});
