/*
 * Next-edit suggestions: after a pause in typing, ask the server for the edit the user is about
 * to make near the cursor (`textDocument/copilotInlineEdit`, one request at a time, the previous
 * one cancelled), draw it (nextEditView.ts), and let Tab take it (jumping to it first when it is
 * off screen) and Escape dismiss it. The context key `tabloop.nextEditVisible` scopes those keys
 * to while a prediction is shown. The server hears what happened: `textDocument/didShowInlineEdit`
 * when one is drawn, `tabloop.acceptNextEdit` after its edits are applied, `tabloop/nextEditRejected`
 * with why it went (dismissed, typed over, cursor moved away).
 */
import * as vscode from 'vscode';

import {
  isOnScreen,
  lineSpan,
  offsetAfterApply,
  readPrediction,
  renderPlan,
  type LspPosition,
  type Prediction,
} from './nextEditPlan';
import { NextEditView } from './nextEditView';
import {
  ACCEPT_NEXT_EDIT_COMMAND,
  CONFIGURATION_SECTION,
  NEXT_EDIT_REJECTED_NOTIFICATION,
  DID_SHOW_INLINE_EDIT_NOTIFICATION,
} from './protocol';

export const NEXT_EDIT_CONTEXT = 'tabloop.nextEditVisible';
export const NEXT_EDIT_COMMANDS = {
  accept: 'tabloop.nextEdit.accept',
  dismiss: 'tabloop.nextEdit.dismiss',
  request: 'tabloop.nextEdit.request',
} as const;
/** Quiet time after a keystroke before asking (the protocol's ~300 ms). */
export const DEBOUNCE_MS = 300;
export const TRIGGER = { invoked: 1, automatic: 2 } as const;

export type RejectReason = 'dismissed' | 'typed' | 'moved';

/** What the controller needs of the language client (`clientConnection` adapts the real one). */
export interface NextEditConnection {
  /** The server is running and advertised `experimental.tabloop.nextEdit`. */
  available(): boolean;
  /** The document's URI as the client sent it in `didOpen`. */
  uri(document: vscode.TextDocument): string;
  request(params: unknown, token: vscode.CancellationToken): Promise<unknown>;
  notify(method: string, params: unknown): void;
  executeCommand(command: string, args: unknown[]): Promise<unknown>;
}

/** The timer the debounce runs on (a fake one in tests). */
export interface Timers {
  set(callback: () => void, ms: number): unknown;
  clear(handle: unknown): void;
}

export const REAL_TIMERS: Timers = {
  set: (callback, ms) => setTimeout(callback, ms),
  clear: (handle) => clearTimeout(handle as NodeJS.Timeout),
};

interface Shown {
  prediction: Prediction;
  editor: vscode.TextEditor;
  /** Where the cursor was when it was drawn (or where the jump put it): moving it elsewhere dismisses. */
  cursor: LspPosition;
  /** Off screen: Tab jumps to it first. */
  jumpPending: boolean;
}

const samePosition = (a: LspPosition, b: LspPosition) => a.line === b.line && a.character === b.character;
const toPosition = (p: LspPosition) => new vscode.Position(p.line, p.character);

export function nextEditEnabled(): boolean {
  return vscode.workspace.getConfiguration(CONFIGURATION_SECTION).get<boolean>('nextEdit.enabled', true);
}

export class NextEditController implements vscode.Disposable {
  readonly view = new NextEditView();
  private shown: Shown | undefined;
  private timer: unknown;
  private inFlight: vscode.CancellationTokenSource | undefined;
  /** The document and version the last acceptance left: its own change is not typing. */
  private accepted: { document: vscode.TextDocument; version: number } | undefined;
  private readonly disposables: vscode.Disposable[] = [];

  constructor(
    private readonly connection: NextEditConnection,
    private readonly enabled: () => boolean = nextEditEnabled,
    private readonly timers: Timers = REAL_TIMERS,
    private readonly debounceMs = DEBOUNCE_MS,
  ) {
    this.disposables.push(
      this.view,
      vscode.commands.registerCommand(NEXT_EDIT_COMMANDS.accept, () => this.accept()),
      vscode.commands.registerCommand(NEXT_EDIT_COMMANDS.dismiss, () => this.reject('dismissed')),
      vscode.commands.registerCommand(NEXT_EDIT_COMMANDS.request, () => this.requestNow(TRIGGER.invoked)),
      vscode.workspace.onDidChangeTextDocument((event) => this.documentChanged(event)),
      vscode.window.onDidChangeTextEditorSelection((event) => this.selectionChanged(event)),
      vscode.window.onDidChangeActiveTextEditor(() => {
        this.cancelPending();
        this.reject('moved');
      }),
    );
  }

  /** The prediction on screen, if any. */
  get current(): Prediction | undefined {
    return this.shown?.prediction;
  }

  private documentChanged(event: vscode.TextDocumentChangeEvent): void {
    if (event.contentChanges.length === 0) return;
    const accepted = this.accepted;
    if (accepted?.document === event.document && accepted.version === event.document.version) return;
    if (this.shown?.editor.document === event.document) this.reject('typed');
    const editor = vscode.window.activeTextEditor;
    if (editor?.document === event.document) this.schedule(editor);
  }

  private selectionChanged(event: vscode.TextEditorSelectionChangeEvent): void {
    const shown = this.shown;
    // A change of the text dismissed it already; only a move of the cursor alone is handled here.
    if (!shown || event.textEditor !== shown.editor || event.textEditor.document.version !== shown.prediction.version) return;
    const cursor = event.selections[0]?.active;
    if (cursor && !samePosition(cursor, shown.cursor)) this.reject('moved');
  }

  /** Drops the debounce timer and cancels the request in flight (`$/cancelRequest`). */
  private cancelPending(): void {
    if (this.timer !== undefined) this.timers.clear(this.timer);
    this.timer = undefined;
    this.inFlight?.cancel();
    this.inFlight = undefined;
  }

  private schedule(editor: vscode.TextEditor): void {
    this.cancelPending();
    if (!this.enabled() || !this.connection.available()) return;
    this.timer = this.timers.set(() => {
      this.timer = undefined;
      void this.request(editor, TRIGGER.automatic);
    }, this.debounceMs);
  }

  /** Asks at once for the active editor's cursor (the `tabloop.nextEdit.request` command). */
  async requestNow(triggerKind: number = TRIGGER.invoked): Promise<Prediction | undefined> {
    const editor = vscode.window.activeTextEditor;
    if (!editor || !this.enabled() || !this.connection.available()) return undefined;
    this.cancelPending();
    this.reject('dismissed');
    return this.request(editor, triggerKind);
  }

  /** One request; the prediction is shown when it still fits the editor (same text, same cursor). */
  async request(editor: vscode.TextEditor, triggerKind: number): Promise<Prediction | undefined> {
    this.inFlight?.cancel();
    const source = new vscode.CancellationTokenSource();
    this.inFlight = source;
    const { document } = editor;
    const version = document.version;
    const cursor = editor.selection.active;
    const uri = this.connection.uri(document);
    const params = {
      textDocument: { uri, version },
      position: { line: cursor.line, character: cursor.character },
      context: { triggerKind },
    };
    let result: unknown;
    try {
      result = await this.connection.request(params, source.token);
    } catch {
      return undefined; // cancelled, or the server failed (the client logs it)
    } finally {
      if (this.inFlight === source) this.inFlight = undefined;
      source.dispose();
    }
    if (source.token.isCancellationRequested || vscode.window.activeTextEditor !== editor) return undefined;
    if (document.version !== version || !samePosition(editor.selection.active, cursor)) return undefined;
    const prediction = readPrediction(result, uri, version);
    if (prediction) this.show(editor, prediction, cursor);
    return prediction;
  }

  private show(editor: vscode.TextEditor, prediction: Prediction, cursor: LspPosition): void {
    this.reject('dismissed'); // a prediction still shown (an explicit request while one was)
    this.shown = { prediction, editor, cursor, jumpPending: !isOnScreen(prediction, editor.visibleRanges) };
    this.draw();
    void vscode.commands.executeCommand('setContext', NEXT_EDIT_CONTEXT, true);
    this.connection.notify(DID_SHOW_INLINE_EDIT_NOTIFICATION, { item: prediction.items[0] });
  }

  private draw(): void {
    const shown = this.shown!;
    const plan = renderPlan(shown.prediction, shown.cursor);
    const hintAt = shown.editor.document.lineAt(shown.cursor.line).range.end;
    const jump = shown.jumpPending ? { line: lineSpan(shown.prediction).first, hintAt } : undefined;
    this.view.show(shown.editor, plan, jump);
  }

  private hide(): Shown | undefined {
    const shown = this.shown;
    if (!shown) return undefined;
    this.shown = undefined;
    this.view.clear(shown.editor);
    void vscode.commands.executeCommand('setContext', NEXT_EDIT_CONTEXT, false);
    return shown;
  }

  /** Takes the prediction away and tells the server why. */
  reject(reason: RejectReason): void {
    const shown = this.hide();
    if (shown) this.connection.notify(NEXT_EDIT_REJECTED_NOTIFICATION, { id: shown.prediction.id, reason });
  }

  /**
   * Tab: jumps to an off-screen prediction, else applies all its edits as one workspace edit,
   * puts the cursor after the last one, runs `tabloop.acceptNextEdit` and asks for the next
   * prediction at once. False when none is shown.
   */
  async accept(): Promise<boolean> {
    const shown = this.shown;
    if (!shown) return false;
    const { editor, prediction } = shown;
    if (shown.jumpPending) {
      const target = prediction.items[0]!.range.start;
      shown.cursor = target; // before moving it, so that the move does not dismiss
      shown.jumpPending = false;
      editor.selection = new vscode.Selection(toPosition(target), toPosition(target));
      editor.revealRange(new vscode.Range(toPosition(target), toPosition(target)), vscode.TextEditorRevealType.InCenter);
      this.draw();
      return true;
    }
    this.hide();
    const { document } = editor;
    if (document.version !== prediction.version) return false;
    const cursorOffset = offsetAfterApply(prediction, (p) => document.offsetAt(toPosition(p)));
    const edit = new vscode.WorkspaceEdit();
    for (const item of prediction.items) edit.replace(document.uri, new vscode.Range(toPosition(item.range.start), toPosition(item.range.end)), item.text);
    if (!(await vscode.workspace.applyEdit(edit))) return false;
    const version = document.version;
    this.accepted = { document, version };
    const after = document.positionAt(cursorOffset);
    editor.selection = new vscode.Selection(after, after);
    await this.connection.executeCommand(ACCEPT_NEXT_EDIT_COMMAND, [prediction.id]).catch(() => undefined);
    // Tab is one keystroke, not typing: the prediction after it is asked for at once (the server
    // has computed it while the user read this one), unless the user went on meanwhile.
    if (document.version === version && samePosition(editor.selection.active, after) && vscode.window.activeTextEditor === editor) {
      this.cancelPending();
      void this.request(editor, TRIGGER.automatic);
    }
    return true;
  }

  dispose(): void {
    this.cancelPending();
    this.hide();
    for (const disposable of this.disposables) disposable.dispose();
  }
}
