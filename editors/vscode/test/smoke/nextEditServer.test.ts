/*
 * Next edits through the whole extension against the real tabloop server: the user renames a
 * parameter, the server predicts the matching change from its edit history with a scripted model
 * (a loopback OpenAI-compatible server that answers the next-edit prompt of this file with the
 * rewritten window), the extension draws it; Escape rejects it, an explicit request brings it
 * back and Tab applies it; the server counts each outcome (`tabloop/status`'s `nextEdit` part).
 * Needs the project's .venv; prints why when it skips.
 */
import * as assert from 'node:assert/strict';
import { promises as fs } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, describe, it } from 'node:test';

import * as vscode from 'vscode';

import { activate, deactivate, type TabloopExtension } from '../../src/extension';
import { NEXT_EDIT_COMMANDS, NEXT_EDIT_CONTEXT } from '../../src/nextEdit';
import { mock, type TextDocument, type TextEditor } from '../mock/vscode';
import { EXTENSION_DIR, venvPython } from '../paths';
import { READY_TIMEOUT_MS, scriptedCompletionSettings, startScriptedModel, waitFor, type ScriptedModelServer } from './fixtures';

const python = venvPython();
const skipReason = python ? undefined : 'no Python environment at .venv (run `make venv`); skipping the next-edit server smoke test';
if (skipReason) process.stdout.write(`# ${skipReason}\n`);

const SOURCE = ['def area(width, height):', '    return width * height', '', '', 'print(area(2, 3))', ''].join('\n');
const RENAMED = SOURCE.replace('area(width, height):', 'area(w, height):');
const PREDICTED = RENAMED.replace('return width * height', 'return w * height');
const FILE_SEP = '<|file_sep|>';

interface NextEditStatus {
  nextEdit?: { enabled: boolean; shown: number; accepted: number; rejected: number };
  model?: { state?: string };
}


describe('next edits in a VS Code host, against the real server', { skip: skipReason, timeout: 600_000 }, () => {
  let home: string;
  let model: ScriptedModelServer;
  let extension: TabloopExtension;
  let document: TextDocument;
  let editor: TextEditor;

  const status = () => extension.client!.sendRequest<NextEditStatus>('tabloop/status', {});

  before(async () => {
    // The model rewrites this file's window (the prompt ends with `updated/area.py`) as predicted.
    model = await startScriptedModel(python!, { rules: { 'updated/area.py\n': PREDICTED + FILE_SEP }, default: '' });
    home = await fs.mkdtemp(path.join(os.tmpdir(), 'tabloop-next-edit-server-'));
    await fs.mkdir(path.join(home, 'ws'));
    mock.reset();
    mock.setWorkspaceFolders([path.join(home, 'ws')]);
    const settings: Record<string, unknown> = {
      'tabloop.server.path': python,
      ...Object.fromEntries(Object.entries(scriptedCompletionSettings(model.url)).map(([key, value]) => [`tabloop.${key}`, value])),
      'tabloop.cacheDir': path.join(home, 'cache'),
      'tabloop.index.enabled': false,
      'tabloop.telemetry.level': 'off',
      // Generous: the scripted model's pieces outnumber the HTTP runner's token estimate.
      'tabloop.nextEdit.windowTokens': 64,
      'tabloop.nextEdit.marginTokens': 512,
    };
    for (const [key, value] of Object.entries(settings)) mock.setConfig('global', key, value);
  });

  after(async () => {
    await deactivate();
    if (model) await model.close();
    if (home) await fs.rm(home, { recursive: true, force: true });
  });

  it('starts the server, which offers next edits once its model is ready', async () => {
    const packageJSON = JSON.parse(await fs.readFile(path.join(EXTENSION_DIR, 'package.json'), 'utf8'));
    extension = await activate({ subscriptions: [], extension: { packageJSON } } as unknown as vscode.ExtensionContext);
    const ready = await waitFor('the model', READY_TIMEOUT_MS, async () => {
      if (!extension.client?.isRunning()) return undefined;
      const current = await status();
      return current.model?.state === 'loading' ? undefined : current;
    });
    assert.equal(ready.model?.state, 'ready');
    assert.equal(ready.nextEdit?.enabled, true);
    assert.deepEqual(extension.client!.initializeResult?.capabilities.experimental, { tabloop: { nextEdit: true } });
    document = mock.openDocument(path.join(home, 'ws', 'area.py'), 'python', SOURCE);
    editor = mock.showEditor(document);
  });

  it('a rename brings the matching change, drawn; Escape rejects it', async () => {
    // Select `width` in the signature and type `w` over it.
    editor.selection = new vscode.Selection(new vscode.Position(0, 9), new vscode.Position(0, 14)) as never;
    mock.type(editor, 'w');
    assert.equal(document.getText(), RENAMED);
    const shown = await waitFor('the prediction', 60_000, () => extension.nextEdit.current);
    assert.equal(shown.version, document.version);
    assert.ok(
      shown.items.every((item) => item.range.start.line === 1 && item.range.end.line === 1),
      JSON.stringify(shown.items),
    );
    assert.equal(mock.state.context.get(NEXT_EDIT_CONTEXT), true);
    await vscode.commands.executeCommand(NEXT_EDIT_COMMANDS.dismiss);
    const counted = await waitFor('the rejection counted', 10_000, async () => {
      const current = await status();
      return current.nextEdit?.rejected === 1 ? current.nextEdit : undefined;
    });
    assert.equal(counted.shown, 1);
    assert.equal(document.getText(), RENAMED);
  });

  it('asked again, Tab applies it and the server counts the acceptance', async () => {
    const again = await extension.nextEdit.requestNow();
    assert.ok(again, 'an explicit request brings the prediction back');
    assert.equal(await extension.nextEdit.accept(), true);
    assert.equal(document.getText(), PREDICTED);
    const counted = await waitFor('the acceptance counted', 10_000, async () => {
      const current = await status();
      return current.nextEdit?.accepted === 1 ? current.nextEdit : undefined;
    });
    assert.deepEqual([counted.shown, counted.accepted, counted.rejected], [2, 1, 1]);
  });
});
