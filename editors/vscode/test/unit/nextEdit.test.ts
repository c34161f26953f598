import * as assert from 'node:assert/strict';
import { promises as fs } from 'node:fs';
import * as path from 'node:path';
import { afterEach, beforeEach, describe, it } from 'node:test';

import * as vscode from 'vscode';

import { DEBOUNCE_MS, NEXT_EDIT_COMMANDS, NEXT_EDIT_CONTEXT, NextEditController, type NextEditConnection, type Timers } from '../../src/nextEdit';
import type { NextEditItem } from '../../src/nextEditPlan';
import { JUMP_HINT } from '../../src/nextEditView';
import {
  ACCEPT_NEXT_EDIT_COMMAND,
  NEXT_EDIT_REJECTED_NOTIFICATION,
  DID_SHOW_INLINE_EDIT_NOTIFICATION,
} from '../../src/protocol';
import { mock, Range, type TextDocument, type TextEditor } from '../mock/vscode';
import { EXTENSION_DIR } from '../paths';

const SOURCE = ['def area(w, h):', '    return width * height', ''].join('\n');

/** Settles when the request is answered; the test chooses when and with what. */
interface PendingRequest {
  params: { textDocument: { uri: string; version: number }; position: { line: number; character: number }; context: { triggerKind: number } };
  token: vscode.CancellationToken;
  answer(result: unknown): Promise<void>;
}

/** The server side of the protocol, scripted by the test. */
class FakeConnection implements NextEditConnection {
  offered = true;
  requests: PendingRequest[] = [];
  notifications: { method: string; params: unknown }[] = [];
  commands: { command: string; args: unknown[] }[] = [];
  available(): boolean {
    return this.offered;
  }
  uri(document: vscode.TextDocument): string {
    return document.uri.toString();
  }
  request(params: unknown, token: vscode.CancellationToken): Promise<unknown> {
    return new Promise((resolve) => {
      this.requests.push({
        params: params as PendingRequest['params'],
        token,
        answer: async (result) => {
          resolve(result);
          await new Promise((done) => setImmediate(done)); // the controller's continuation runs
        },
      });
    });
  }
  notify(method: string, params: unknown): void {
    this.notifications.push({ method, params });
  }
  async executeCommand(command: string, args: unknown[]): Promise<unknown> {
    this.commands.push({ command, args });
    return null;
  }
  rejections(): unknown[] {
    return this.notifications.filter((n) => n.method === NEXT_EDIT_REJECTED_NOTIFICATION).map((n) => n.params);
  }
}

/** A debounce clock the test advances by hand. */
class FakeTimers implements Timers {
  pending = new Map<number, { callback: () => void; ms: number }>();
  private next = 0;
  set(callback: () => void, ms: number): unknown {
    this.next += 1;
    this.pending.set(this.next, { callback, ms });
    return this.next;
  }
  clear(handle: unknown): void {
    this.pending.delete(handle as number);
  }
  /** Runs every timer due (the pause in typing is over). */
  elapse(): void {
    const due = [...this.pending.values()];
    this.pending.clear();
    for (const { callback } of due) callback();
  }
}

function edit(uri: string, version: number, range: [number, number, number, number], text: string, id = 'p1'): NextEditItem {
  const [sl, sc, el, ec] = range;
  return {
    id,
    textDocument: { uri, version },
    range: { start: { line: sl, character: sc }, end: { line: el, character: ec } },
    text,
    command: { title: 'Accept next edit', command: ACCEPT_NEXT_EDIT_COMMAND, arguments: [id] },
  };
}

let connection: FakeConnection;
let timers: FakeTimers;
let controller: NextEditController;
let document: TextDocument;
let editor: TextEditor;
let enabled: boolean;

/** What each decoration type of the controller's view drew in `editor`, by role. */
function drawn(): Record<'deleted' | 'inserted' | 'ghost' | 'jump', { range: Range; renderOptions?: { after?: { contentText?: string } } }[]> {
  const [deleted, inserted, ghost, jump] = mock.state.decorationTypes;
  const get = (type: { key: string } | undefined) => (editor.decorations.get(type!.key) ?? []) as never;
  return { deleted: get(deleted), inserted: get(inserted), ghost: get(ghost), jump: get(jump) };
}

const rangeOf = (r: Range) => [r.start.line, r.start.character, r.end.line, r.end.character];

/** Types `text` at the cursor (the end of line 0), lets the pause pass and answers the request with `edits`. */
async function typeAndAnswer(text: string, edits: NextEditItem[]): Promise<PendingRequest> {
  mock.type(editor, text);
  timers.elapse();
  const request = connection.requests.at(-1)!;
  await request.answer({ edits });
  return request;
}

beforeEach(() => {
  mock.reset();
  connection = new FakeConnection();
  timers = new FakeTimers();
  enabled = true;
  controller = new NextEditController(connection, () => enabled, timers);
  document = mock.openDocument('/ws/area.py', 'python', SOURCE);
  editor = mock.showEditor(document);
  editor.selection = new vscode.Selection(new vscode.Position(0, 15), new vscode.Position(0, 15)) as never;
});
afterEach(() => controller.dispose());

describe('asking for a next edit', () => {
  it('asks once after a pause in typing, with the document version, the cursor and an automatic trigger', () => {
    mock.type(editor, 'x');
    mock.type(editor, 'y');
    assert.deepEqual([...timers.pending.values()].map((t) => t.ms), [DEBOUNCE_MS]);
    assert.equal(connection.requests.length, 0);
    timers.elapse();
    assert.equal(connection.requests.length, 1);
    assert.deepEqual(connection.requests[0]!.params, {
      textDocument: { uri: document.uri.toString(), version: document.version },
      position: { line: 0, character: 17 },
      context: { triggerKind: 2 },
    });
  });

  it('keeps at most one request in flight: a new one cancels the previous, whose answer is not shown', async () => {
    mock.type(editor, 'x');
    timers.elapse();
    mock.type(editor, 'y');
    const [first] = connection.requests;
    assert.equal(first!.token.isCancellationRequested, true, 'typing again cancels the request in flight');
    timers.elapse();
    assert.equal(connection.requests.length, 2);
    assert.equal(connection.requests[1]!.token.isCancellationRequested, false);
    await first!.answer({ edits: [edit(document.uri.toString(), first!.params.textDocument.version, [1, 11, 1, 16], 'w')] });
    assert.equal(controller.current, undefined);
  });

  it('asks nothing when the server does not offer next edits, or the setting is off', () => {
    connection.offered = false;
    mock.type(editor, 'x');
    timers.elapse();
    connection.offered = true;
    enabled = false;
    mock.type(editor, 'y');
    timers.elapse();
    assert.equal(connection.requests.length, 0);
  });

  it('shows nothing for an answer to an older version, or after the cursor moved', async () => {
    mock.type(editor, 'x');
    timers.elapse();
    const request = connection.requests[0]!;
    const version = request.params.textDocument.version;
    editor.selection = new vscode.Selection(new vscode.Position(1, 0), new vscode.Position(1, 0)) as never;
    await request.answer({ edits: [edit(document.uri.toString(), version, [1, 11, 1, 16], 'w')] });
    assert.equal(controller.current, undefined);
    assert.deepEqual(connection.notifications, []);
  });
});

describe('a prediction on screen', () => {
  it('is drawn, sets the context key and is reported shown with its first item', async () => {
    const uri = document.uri.toString();
    const items = [edit(uri, 2, [1, 11, 1, 16], 'w'), edit(uri, 2, [1, 19, 1, 25], 'h')];
    await typeAndAnswer('x', items);
    assert.equal(controller.current?.id, 'p1');
    assert.equal(mock.state.context.get(NEXT_EDIT_CONTEXT), true);
    assert.deepEqual(connection.notifications, [{ method: DID_SHOW_INLINE_EDIT_NOTIFICATION, params: { item: items[0] } }]);
    const { deleted, inserted, ghost, jump } = drawn();
    assert.deepEqual(deleted.map((d) => rangeOf(d.range)), [
      [1, 11, 1, 16],
      [1, 19, 1, 25],
    ]);
    assert.deepEqual(inserted.map((d) => [rangeOf(d.range), d.renderOptions?.after?.contentText]), [
      [[1, 16, 1, 16], 'w'],
      [[1, 25, 1, 25], 'h'],
    ]);
    assert.deepEqual([ghost, jump], [[], []]);
  });

  it('draws an insertion at the cursor as ghost text, and a multi-line insertion on one line', async () => {
    const uri = document.uri.toString();
    await typeAndAnswer(':', [edit(uri, 2, [0, 16, 0, 16], ' # area'), edit(uri, 2, [1, 4, 1, 4], 'assert w > 0\n    ')]);
    const { ghost, inserted } = drawn();
    assert.deepEqual(ghost.map((d) => [rangeOf(d.range), d.renderOptions?.after?.contentText]), [[[0, 16, 0, 16], ' # area']]);
    assert.deepEqual(inserted.map((d) => d.renderOptions?.after?.contentText), ['assert w > 0 ⏎     ']);
  });

  it('Tab applies every edit as one workspace edit, puts the cursor after it and runs the accept command', async () => {
    const uri = document.uri.toString();
    await typeAndAnswer('x', [edit(uri, 2, [1, 11, 1, 16], 'w'), edit(uri, 2, [1, 19, 1, 25], 'h')]);
    assert.equal(await vscode.commands.executeCommand(NEXT_EDIT_COMMANDS.accept), true);
    assert.equal(mock.state.appliedEdits.length, 1);
    assert.equal(document.getText(), 'def area(w, h):x\n    return w * h\n');
    assert.deepEqual([editor.selection.active.line, editor.selection.active.character], [1, 16]);
    assert.deepEqual(connection.commands, [{ command: ACCEPT_NEXT_EDIT_COMMAND, args: ['p1'] }]);
    assert.deepEqual(connection.rejections(), []);
    assert.equal(mock.state.context.get(NEXT_EDIT_CONTEXT), false);
    assert.deepEqual(drawn().deleted, []);
    // Tab is one keystroke: the next prediction is asked for at once, at the document the edit
    // left, and no pause is waited for (the edit's own change does not count as typing).
    assert.equal(connection.requests.length, 2);
    const after = connection.requests[1]!;
    assert.equal(after.params.textDocument.version, document.version);
    assert.deepEqual(after.params.position, { line: 1, character: 16 });
    assert.equal(after.params.context.triggerKind, 2);
    assert.equal(timers.pending.size, 0);
    assert.equal(after.token.isCancellationRequested, false);
  });

  it('after Tab, typing before the answer cancels the request asked at once and asks after the pause', async () => {
    await typeAndAnswer('x', [edit(document.uri.toString(), 2, [1, 11, 1, 16], 'w')]);
    assert.equal(await controller.accept(), true);
    const atOnce = connection.requests.at(-1)!;
    mock.type(editor, 'y');
    assert.equal(atOnce.token.isCancellationRequested, true);
    assert.equal(timers.pending.size, 1);
    timers.elapse();
    assert.equal(connection.requests.at(-1)!.params.textDocument.version, document.version);
  });

  it('Escape dismisses it and tells the server', async () => {
    await typeAndAnswer('x', [edit(document.uri.toString(), 2, [1, 11, 1, 16], 'w')]);
    await vscode.commands.executeCommand(NEXT_EDIT_COMMANDS.dismiss);
    assert.deepEqual(connection.rejections(), [{ id: 'p1', reason: 'dismissed' }]);
    assert.equal(controller.current, undefined);
    assert.equal(mock.state.context.get(NEXT_EDIT_CONTEXT), false);
    assert.deepEqual(drawn().inserted, []);
    assert.equal(await controller.accept(), false, 'nothing left to accept');
    assert.equal(document.getText(), 'def area(w, h):x\n    return width * height\n');
  });

  it('goes when the user types on (typed) and asks again after the pause', async () => {
    await typeAndAnswer('x', [edit(document.uri.toString(), 2, [1, 11, 1, 16], 'w')]);
    mock.type(editor, 'y');
    assert.deepEqual(connection.rejections(), [{ id: 'p1', reason: 'typed' }]);
    timers.elapse();
    assert.equal(connection.requests.length, 2);
  });

  it('goes when the cursor moves away (moved)', async () => {
    await typeAndAnswer('x', [edit(document.uri.toString(), 2, [1, 11, 1, 16], 'w')]);
    editor.selection = new vscode.Selection(new vscode.Position(1, 2), new vscode.Position(1, 2)) as never;
    assert.deepEqual(connection.rejections(), [{ id: 'p1', reason: 'moved' }]);
  });

  it('off screen: a hint at the cursor, the first Tab jumps to it, the second accepts', async () => {
    editor.visibleRanges = [new Range(0, 0, 0, 0)];
    await typeAndAnswer('x', [edit(document.uri.toString(), 2, [1, 11, 1, 16], 'w')]);
    const [hint] = drawn().jump;
    assert.deepEqual(rangeOf(hint!.range), [0, 16, 0, 16]);
    assert.equal(hint!.renderOptions?.after?.contentText, `⇥ ${JUMP_HINT} (line 2)`);
    assert.equal(await controller.accept(), true);
    assert.deepEqual([editor.selection.active.line, editor.selection.active.character], [1, 11]);
    assert.deepEqual(editor.reveals.map(rangeOf), [[1, 11, 1, 11]]);
    assert.deepEqual(drawn().jump, []);
    assert.equal(controller.current?.id, 'p1', 'the jump keeps it shown');
    assert.deepEqual(connection.rejections(), []);
    assert.equal(await controller.accept(), true);
    assert.equal(document.getText(), 'def area(w, h):x\n    return w * height\n');
    assert.deepEqual(connection.commands, [{ command: ACCEPT_NEXT_EDIT_COMMAND, args: ['p1'] }]);
  });

  it('an explicit request (the command) asks at once with trigger kind invoked', async () => {
    const pending = vscode.commands.executeCommand(NEXT_EDIT_COMMANDS.request);
    const [request] = connection.requests;
    assert.equal(request!.params.context.triggerKind, 1);
    await request!.answer({ edits: [] });
    assert.equal(await pending, undefined);
    assert.deepEqual(connection.notifications, []);
  });
});

describe('the keys', () => {
  it('Tab and Escape act on a next edit only while one is shown', async () => {
    const packageJson = JSON.parse(await fs.readFile(path.join(EXTENSION_DIR, 'package.json'), 'utf8'));
    const bindings = packageJson.contributes.keybindings as { command: string; key: string; when?: string }[];
    const tab = bindings.find((b) => b.command === NEXT_EDIT_COMMANDS.accept);
    const escape = bindings.find((b) => b.command === NEXT_EDIT_COMMANDS.dismiss);
    assert.equal(tab?.key, 'tab');
    assert.equal(escape?.key, 'escape');
    for (const binding of [tab, escape]) assert.match(binding!.when!, new RegExp(`^${NEXT_EDIT_CONTEXT.replace('.', '\\.')} && `));
    // An inline suggestion on screen keeps Tab.
    assert.match(tab!.when!, /!inlineSuggestionVisible/);
  });
});
