/*
 * An in-memory stand-in for the `vscode` module, enough for the extension's logic and for
 * vscode-languageclient to start a real server. Tests reach its state through `mock`.
 */
import * as path from 'node:path';

export const version = '1.91.0';

type Listener<T> = (e: T) => unknown;

export class Disposable {
  static from(...items: { dispose(): unknown }[]): Disposable {
    return new Disposable(() => items.forEach((item) => item.dispose()));
  }
  constructor(private readonly callOnDispose: () => unknown) {}
  dispose(): void {
    this.callOnDispose();
  }
}

export class EventEmitter<T> {
  private listeners: Listener<T>[] = [];
  readonly event = (listener: Listener<T>, thisArg?: unknown, disposables?: Disposable[]): Disposable => {
    const bound: Listener<T> = (e) => listener.call(thisArg, e);
    this.listeners.push(bound);
    const disposable = new Disposable(() => {
      this.listeners = this.listeners.filter((l) => l !== bound);
    });
    disposables?.push(disposable);
    return disposable;
  };
  fire(e: T): void {
    for (const listener of [...this.listeners]) listener(e);
  }
  dispose(): void {
    this.listeners = [];
  }
}

export class CancellationError extends Error {}

export class CancellationTokenSource {
  private emitter = new EventEmitter<void>();
  token = { isCancellationRequested: false, onCancellationRequested: this.emitter.event };
  cancel(): void {
    this.token.isCancellationRequested = true;
    this.emitter.fire();
  }
  dispose(): void {
    this.emitter.dispose();
  }
}

export class Uri {
  private constructor(
    readonly scheme: string,
    readonly authority: string,
    readonly path: string,
    readonly query = '',
    readonly fragment = '',
  ) {}
  static file(fsPath: string): Uri {
    return new Uri('file', '', path.resolve(fsPath));
  }
  static parse(value: string): Uri {
    const url = new URL(value);
    return new Uri(url.protocol.replace(/:$/, ''), url.host, decodeURIComponent(url.pathname));
  }
  static joinPath(base: Uri, ...segments: string[]): Uri {
    return new Uri(base.scheme, base.authority, path.posix.join(base.path, ...segments));
  }
  get fsPath(): string {
    return this.path;
  }
  with(change: { path?: string }): Uri {
    return new Uri(this.scheme, this.authority, change.path ?? this.path);
  }
  toString(): string {
    return `${this.scheme}://${this.authority}${encodeURI(this.path)}`;
  }
  toJSON(): unknown {
    return { scheme: this.scheme, path: this.path };
  }
}

export class Position {
  constructor(readonly line: number, readonly character: number) {}
  isEqual(other: Position): boolean {
    return this.line === other.line && this.character === other.character;
  }
}

export class Range {
  readonly start: Position;
  readonly end: Position;
  constructor(startLine: number | Position, startChar: number | Position, endLine?: number, endChar?: number) {
    if (startLine instanceof Position && startChar instanceof Position) {
      this.start = startLine;
      this.end = startChar;
    } else {
      this.start = new Position(startLine as number, startChar as number);
      this.end = new Position(endLine ?? 0, endChar ?? 0);
    }
  }
}

export class Selection extends Range {
  readonly anchor: Position;
  readonly active: Position;
  constructor(anchor: Position, active: Position) {
    const before = anchor.line < active.line || (anchor.line === active.line && anchor.character <= active.character);
    super(before ? anchor : active, before ? active : anchor);
    this.anchor = anchor;
    this.active = active;
  }
  get isEmpty(): boolean {
    return this.anchor.isEqual(this.active);
  }
}

/** Edits to apply together (`workspace.applyEdit`): replacements by document URI. */
export class WorkspaceEdit {
  readonly edits: { uri: Uri; range: Range; text: string }[] = [];
  replace(uri: Uri, range: Range, text: string): void {
    this.edits.push({ uri, range, text });
  }
  insert(uri: Uri, position: Position, text: string): void {
    this.edits.push({ uri, range: new Range(position, position), text });
  }
}

export class ThemeColor {
  constructor(readonly id: string) {}
}

export class MarkdownString {
  constructor(public value = '', public supportThemeIcons = false) {}
  appendMarkdown(value: string): this {
    this.value += value;
    return this;
  }
  appendCodeblock(code: string, language = ''): this {
    this.value += `\n\`\`\`${language}\n${code}\n\`\`\`\n`;
    return this;
  }
}

export class InlineCompletionItem {
  constructor(public insertText: string, public range?: Range, public command?: unknown) {}
}

export class InlineCompletionList {
  constructor(public items: InlineCompletionItem[]) {}
}

export enum StatusBarAlignment {
  Left = 1,
  Right = 2,
}
export enum ConfigurationTarget {
  Global = 1,
  Workspace = 2,
  WorkspaceFolder = 3,
}
export enum ProgressLocation {
  SourceControl = 1,
  Window = 10,
  Notification = 15,
}
export enum LogLevel {
  Off = 0,
  Trace = 1,
  Debug = 2,
  Info = 3,
  Warning = 4,
  Error = 5,
}
export enum NotebookCellKind {
  Markup = 1,
  Code = 2,
}
export enum TextEditorRevealType {
  Default = 0,
  InCenter = 1,
}
export enum QuickPickItemKind {
  Separator = -1,
  Default = 0,
}
export enum ViewColumn {
  Active = -1,
}
export class TabInputText {}
export class TabInputTextDiff {}
export class TabInputNotebook {}
export class TabInputCustom {}

const noop = (): Disposable => new Disposable(() => undefined);

/** Settings as VS Code's three scopes hold them: `section.key` -> value. */
interface ConfigScopes {
  defaults: Map<string, unknown>;
  global: Map<string, unknown>;
  workspace: Map<string, unknown>;
}

export interface RecordedMessage {
  kind: 'error' | 'warning' | 'info';
  message: string;
  items: string[];
}

function freshState() {
  return {
    config: { defaults: new Map(), global: new Map(), workspace: new Map() } as ConfigScopes,
    messages: [] as RecordedMessage[],
    /** What the next `show*Message` resolves to (a button label), first in first out. */
    messageAnswers: [] as (string | undefined)[],
    inputAnswers: [] as (string | undefined)[],
    /** Picks the item to return from a quick pick's items. */
    pickAnswers: [] as ((items: readonly QuickPickItemLike[]) => QuickPickItemLike | undefined)[],
    shownPicks: [] as QuickPickItemLike[][],
    commands: new Map<string, (...args: unknown[]) => unknown>(),
    executed: [] as { command: string; args: unknown[] }[],
    statusBarItems: [] as StatusBarItemMock[],
    outputChannels: [] as OutputChannelMock[],
    openedDocuments: [] as string[],
    revealed: [] as { uri: string; range: Range }[],
    extensions: new Map<string, unknown>(),
    /** Inline completion providers registered (by the language client). */
    inlineProviders: [] as { selector: unknown; provider: InlineProvider }[],
    documentEmitter: new EventEmitter<TextDocument>(),
    /** Progress shown with `window.withProgress`: its title and what was reported. */
    progress: [] as { title: string | undefined; reports: unknown[] }[],
    telemetryEnabled: true,
    telemetryEmitter: new EventEmitter<boolean>(),
    configurationEmitter: new EventEmitter<{ affectsConfiguration(section: string): boolean }>(),
    changeEmitter: new EventEmitter<TextDocumentChangeEvent>(),
    selectionEmitter: new EventEmitter<{ textEditor: TextEditor; selections: Selection[]; kind: number | undefined }>(),
    activeEditorEmitter: new EventEmitter<TextEditor | undefined>(),
    /** Context keys set with the `setContext` command. */
    context: new Map<string, unknown>(),
    decorationTypes: [] as DecorationType[],
    appliedEdits: [] as WorkspaceEdit[],
  };
}

export interface TextDocumentChangeEvent {
  document: TextDocument;
  contentChanges: { range: Range; rangeOffset: number; rangeLength: number; text: string }[];
  reason: undefined;
}

/** A decoration type; what editors drew with it is on each `TextEditor.decorations`. */
export class DecorationType {
  private static next = 0;
  readonly key = `decoration-${DecorationType.next++}`;
  disposed = false;
  constructor(readonly options: unknown) {}
  dispose(): void {
    this.disposed = true;
  }
}

/** An editor on a document: selection, visible ranges, decorations drawn (by type key), reveals. */
export class TextEditor {
  private current: Selection;
  readonly decorations = new Map<string, { range: Range; renderOptions?: unknown; hoverMessage?: unknown }[]>();
  readonly reveals: Range[] = [];
  constructor(
    readonly document: TextDocument,
    public visibleRanges: Range[] = [new Range(0, 0, Math.max(0, document.lineCount - 1), 0)],
  ) {
    this.current = new Selection(new Position(0, 0), new Position(0, 0));
  }
  get selection(): Selection {
    return this.current;
  }
  /** Like VS Code's: moving the selection fires `onDidChangeTextEditorSelection`. */
  set selection(selection: Selection) {
    this.current = selection;
    mock.state.selectionEmitter.fire({ textEditor: this, selections: [selection], kind: undefined });
  }
  get selections(): Selection[] {
    return [this.current];
  }
  setDecorations(type: DecorationType, options: { range: Range }[]): void {
    this.decorations.set(type.key, options);
  }
  revealRange(range: Range): void {
    this.reveals.push(range);
  }
}

export interface InlineProvider {
  provideInlineCompletionItems(
    document: TextDocument,
    position: Position,
    context: { triggerKind: number; selectedCompletionInfo: undefined },
    token: unknown,
  ): Promise<InlineCompletionList | InlineCompletionItem[] | undefined | null>;
}

/** A text document held in memory: enough for the language client's document sync and for edits. */
export class TextDocument {
  version = 1;
  isClosed = false;
  isDirty = false;
  isUntitled = false;
  eol = 1;
  constructor(readonly uri: Uri, readonly languageId: string, private text: string) {}
  get fileName(): string {
    return this.uri.fsPath;
  }
  get lineCount(): number {
    return this.text.split('\n').length;
  }
  getText(range?: Range): string {
    return range ? this.text.slice(this.offsetAt(range.start), this.offsetAt(range.end)) : this.text;
  }
  offsetAt(position: Position): number {
    const lines = this.text.split('\n');
    const line = Math.min(Math.max(position.line, 0), lines.length - 1);
    let offset = 0;
    for (let i = 0; i < line; i += 1) offset += lines[i]!.length + 1;
    return offset + Math.min(Math.max(position.character, 0), lines[line]!.length);
  }
  positionAt(offset: number): Position {
    const before = this.text.slice(0, Math.min(Math.max(offset, 0), this.text.length));
    const line = before.split('\n').length - 1;
    return new Position(line, before.length - before.lastIndexOf('\n') - 1);
  }
  lineAt(line: number): { text: string; range: Range } {
    const text = this.text.split('\n')[line] ?? '';
    return { text, range: new Range(line, 0, line, text.length) };
  }
  /** Replaces ranges of the current text (given in any order), bumps the version and fires the change event. */
  applyChanges(changes: { range: Range; text: string }[]): void {
    const ordered = [...changes].sort((a, b) => this.offsetAt(b.range.start) - this.offsetAt(a.range.start));
    const contentChanges = ordered.map(({ range, text }) => {
      const rangeOffset = this.offsetAt(range.start);
      const rangeLength = this.offsetAt(range.end) - rangeOffset;
      return { range, rangeOffset, rangeLength, text };
    });
    for (const change of contentChanges) {
      this.text = this.text.slice(0, change.rangeOffset) + change.text + this.text.slice(change.rangeOffset + change.rangeLength);
    }
    this.version += 1;
    mock.state.changeEmitter.fire({ document: this, contentChanges, reason: undefined });
  }
}

export interface QuickPickItemLike {
  label: string;
  description?: string;
  detail?: string;
}

class StatusBarItemMock {
  text = '';
  tooltip: string | MarkdownString | undefined;
  command: string | undefined;
  name: string | undefined;
  backgroundColor: ThemeColor | undefined;
  visible = false;
  constructor(readonly alignment: StatusBarAlignment, readonly priority?: number) {}
  show(): void {
    this.visible = true;
  }
  hide(): void {
    this.visible = false;
  }
  dispose(): void {
    this.visible = false;
  }
}

class OutputChannelMock {
  lines: string[] = [];
  shown = false;
  logLevel = LogLevel.Info;
  onDidChangeLogLevel = new EventEmitter<LogLevel>().event;
  constructor(readonly name: string) {}
  append(value: string): void {
    this.lines.push(value);
  }
  appendLine(value: string): void {
    this.lines.push(value);
  }
  replace(value: string): void {
    this.lines = [value];
  }
  trace(value: string): void {
    this.lines.push(value);
  }
  debug(value: string): void {
    this.lines.push(value);
  }
  info(value: string): void {
    this.lines.push(value);
  }
  warn(value: string): void {
    this.lines.push(value);
  }
  error(value: string | Error): void {
    this.lines.push(String(value));
  }
  clear(): void {
    this.lines = [];
  }
  show(): void {
    this.shown = true;
  }
  hide(): void {
    this.shown = false;
  }
  dispose(): void {}
}

export const mock = {
  state: freshState(),
  /** Forget everything tests did, before the next test. */
  reset(): void {
    mock.state = freshState();
    workspace.textDocuments = [];
    workspace.workspaceFolders = undefined;
    window.activeTextEditor = undefined;
    window.visibleTextEditors = [];
  },
  setConfig(scope: 'defaults' | 'global' | 'workspace', key: string, value: unknown): void {
    mock.state.config[scope].set(key, value);
    mock.state.configurationEmitter.fire({ affectsConfiguration: (s: string) => key === s || key.startsWith(`${s}.`) });
  },
  /** Opens a document as VS Code would: listed in `workspace.textDocuments`, then announced. */
  openDocument(fsPath: string, languageId: string, text: string): TextDocument {
    const document = new TextDocument(Uri.file(fsPath), languageId, text);
    workspace.textDocuments.push(document);
    mock.state.documentEmitter.fire(document);
    return document;
  },
  /** Shows `document` in the active editor (`visibleRanges` defaults to the whole document). */
  showEditor(document: TextDocument, visibleRanges?: Range[]): TextEditor {
    const editor = new TextEditor(document, visibleRanges);
    window.activeTextEditor = editor;
    window.visibleTextEditors = [editor];
    mock.state.activeEditorEmitter.fire(editor);
    return editor;
  },
  /** Types `text` over the selection of `editor`, as a keystroke would: the document changes, then the cursor moves. */
  type(editor: TextEditor, text: string): void {
    const { start, end } = editor.selection;
    const offset = editor.document.offsetAt(start);
    editor.document.applyChanges([{ range: new Range(start, end), text }]);
    const after = editor.document.positionAt(offset + text.length);
    editor.selection = new Selection(after, after);
  },
  setWorkspaceFolders(paths: string[]): void {
    workspace.workspaceFolders = paths.map((p, index) => ({ uri: Uri.file(p), name: path.basename(p), index }));
  },
  setTelemetryEnabled(enabled: boolean): void {
    mock.state.telemetryEnabled = enabled;
    mock.state.telemetryEmitter.fire(enabled);
  },
};

function record(kind: RecordedMessage['kind'], message: string, rest: unknown[]): Promise<string | undefined> {
  const items = rest.filter((r): r is string => typeof r === 'string');
  mock.state.messages.push({ kind, message, items });
  return Promise.resolve(mock.state.messageAnswers.shift());
}

class Configuration {
  constructor(private readonly section: string) {}
  private key(key: string): string {
    return this.section ? `${this.section}.${key}` : key;
  }
  get<T>(key: string, defaultValue?: T): T | undefined {
    const full = this.key(key);
    const { config } = mock.state;
    for (const scope of [config.workspace, config.global, config.defaults]) {
      if (scope.has(full)) return scope.get(full) as T;
    }
    return defaultValue;
  }
  has(key: string): boolean {
    return this.get(key) !== undefined;
  }
  inspect<T>(key: string) {
    const full = this.key(key);
    const { config } = mock.state;
    return {
      key: full,
      defaultValue: config.defaults.get(full) as T | undefined,
      globalValue: config.global.get(full) as T | undefined,
      workspaceValue: config.workspace.get(full) as T | undefined,
      workspaceFolderValue: undefined as T | undefined,
    };
  }
  update(key: string, value: unknown, target?: ConfigurationTarget | boolean): Promise<void> {
    const scope = target === ConfigurationTarget.Workspace || target === false ? 'workspace' : 'global';
    const full = this.key(key);
    if (value === undefined) mock.state.config[scope].delete(full);
    else mock.state.config[scope].set(full, value);
    mock.state.configurationEmitter.fire({ affectsConfiguration: (s: string) => full === s || full.startsWith(`${s}.`) });
    return Promise.resolve();
  }
}

export const workspace = {
  workspaceFolders: undefined as { uri: Uri; name: string; index: number }[] | undefined,
  textDocuments: [] as unknown[],
  notebookDocuments: [] as unknown[],
  getConfiguration: (section = '') => new Configuration(section),
  get onDidChangeConfiguration() {
    return mock.state.configurationEmitter.event;
  },
  get onDidOpenTextDocument() {
    return mock.state.documentEmitter.event;
  },
  onDidCloseTextDocument: noop,
  get onDidChangeTextDocument() {
    return mock.state.changeEmitter.event;
  },
  onDidSaveTextDocument: noop,
  onWillSaveTextDocument: noop,
  onDidChangeWorkspaceFolders: noop,
  onDidOpenNotebookDocument: noop,
  onDidCloseNotebookDocument: noop,
  onDidChangeNotebookDocument: noop,
  onDidSaveNotebookDocument: noop,
  onDidCreateFiles: noop,
  onDidRenameFiles: noop,
  onDidDeleteFiles: noop,
  onWillCreateFiles: noop,
  onWillRenameFiles: noop,
  onWillDeleteFiles: noop,
  createFileSystemWatcher: () => ({
    onDidCreate: noop,
    onDidChange: noop,
    onDidDelete: noop,
    dispose: () => undefined,
  }),
  registerTextDocumentContentProvider: noop,
  /** Applies the edits to the open documents they name, each document's at once. */
  applyEdit: (edit: WorkspaceEdit) => {
    mock.state.appliedEdits.push(edit);
    for (const document of workspace.textDocuments as TextDocument[]) {
      const changes = edit.edits.filter((e) => e.uri.toString() === document.uri.toString());
      if (changes.length) document.applyChanges(changes);
    }
    return Promise.resolve(true);
  },
  asRelativePath: (target: Uri | string): string => {
    const fsPath = typeof target === 'string' ? target : target.fsPath;
    const folder = workspace.workspaceFolders?.find((f) => fsPath.startsWith(f.uri.fsPath + path.sep));
    return folder ? path.relative(folder.uri.fsPath, fsPath) : fsPath;
  },
  openTextDocument: (uri: Uri) => {
    mock.state.openedDocuments.push(uri.toString());
    return Promise.resolve({ uri });
  },
};

export const window = {
  activeTextEditor: undefined as TextEditor | undefined,
  visibleTextEditors: [] as unknown[],
  tabGroups: { all: [], onDidChangeTabs: noop, onDidChangeTabGroups: noop },
  get onDidChangeActiveTextEditor() {
    return mock.state.activeEditorEmitter.event;
  },
  get onDidChangeTextEditorSelection() {
    return mock.state.selectionEmitter.event;
  },
  createTextEditorDecorationType: (options: unknown) => {
    const type = new DecorationType(options);
    mock.state.decorationTypes.push(type);
    return type;
  },
  onDidChangeVisibleTextEditors: noop,
  showErrorMessage: (message: string, ...rest: unknown[]) => record('error', message, rest),
  showWarningMessage: (message: string, ...rest: unknown[]) => record('warning', message, rest),
  showInformationMessage: (message: string, ...rest: unknown[]) => record('info', message, rest),
  showInputBox: () => Promise.resolve(mock.state.inputAnswers.shift()),
  showQuickPick: async <T extends QuickPickItemLike>(items: readonly T[] | Promise<readonly T[]>) => {
    const resolved = await items;
    mock.state.shownPicks.push([...resolved]);
    const choose = mock.state.pickAnswers.shift();
    return choose ? (choose(resolved) as T | undefined) : undefined;
  },
  showTextDocument: (document: { uri: Uri }, options?: { selection?: Range }) => {
    const editor = {
      document,
      selection: options?.selection,
      revealRange: (range: Range) => mock.state.revealed.push({ uri: document.uri.toString(), range }),
    };
    if (options?.selection) editor.revealRange(options.selection);
    return Promise.resolve(editor);
  },
  createStatusBarItem: (idOrAlignment?: string | StatusBarAlignment, alignment?: StatusBarAlignment, priority?: number) => {
    const item = new StatusBarItemMock(
      typeof idOrAlignment === 'number' ? idOrAlignment : (alignment ?? StatusBarAlignment.Left),
      priority,
    );
    mock.state.statusBarItems.push(item);
    return item;
  },
  createOutputChannel: (name: string) => {
    const channel = new OutputChannelMock(name);
    mock.state.outputChannels.push(channel);
    return channel;
  },
  withProgress: <R>(
    options: { title?: string },
    task: (progress: { report(value: unknown): void }, token: CancellationTokenSource['token']) => Promise<R>,
  ) => {
    const reports: unknown[] = [];
    mock.state.progress.push({ title: options.title, reports });
    return task({ report: (value) => reports.push(value) }, new CancellationTokenSource().token);
  },
};

export const commands = {
  registerCommand: (command: string, callback: (...args: unknown[]) => unknown) => {
    if (mock.state.commands.has(command)) throw new Error(`command '${command}' already exists`);
    mock.state.commands.set(command, callback);
    return new Disposable(() => mock.state.commands.delete(command));
  },
  executeCommand: async (command: string, ...args: unknown[]) => {
    mock.state.executed.push({ command, args });
    if (command === 'setContext') mock.state.context.set(args[0] as string, args[1]);
    return mock.state.commands.get(command)?.(...args);
  },
};

const registration = (): Disposable => new Disposable(() => undefined);

interface DocumentFilterLike {
  scheme?: string;
  language?: string;
}

/** Like VS Code's: 10 when a filter's scheme and language (those it names) fit the document. */
function matchSelector(selector: unknown, document: TextDocument): number {
  const filters = (Array.isArray(selector) ? selector : [selector]) as (DocumentFilterLike | string)[];
  const fits = filters.some((filter) =>
    typeof filter === 'string'
      ? filter === document.languageId
      : (filter.scheme === undefined || filter.scheme === document.uri.scheme) &&
        (filter.language === undefined || filter.language === document.languageId),
  );
  return fits ? 10 : 0;
}

export const languages = {
  match: matchSelector,
  createDiagnosticCollection: () => ({ set: () => undefined, delete: () => undefined, clear: () => undefined, dispose: () => undefined }),
  registerInlineCompletionItemProvider: (selector: unknown, provider: InlineProvider) => {
    const entry = { selector, provider };
    mock.state.inlineProviders.push(entry);
    return new Disposable(() => {
      mock.state.inlineProviders = mock.state.inlineProviders.filter((e) => e !== entry);
    });
  },
  registerCompletionItemProvider: registration,
  registerHoverProvider: registration,
  registerSignatureHelpProvider: registration,
  registerDefinitionProvider: registration,
  registerReferenceProvider: registration,
  registerDocumentHighlightProvider: registration,
  registerDocumentSymbolProvider: registration,
  registerWorkspaceSymbolProvider: registration,
  registerCodeActionsProvider: registration,
  registerCodeLensProvider: registration,
  registerDocumentFormattingEditProvider: registration,
  registerDocumentRangeFormattingEditProvider: registration,
  registerOnTypeFormattingEditProvider: registration,
  registerRenameProvider: registration,
  registerDocumentLinkProvider: registration,
  registerColorProvider: registration,
  registerFoldingRangeProvider: registration,
  registerDeclarationProvider: registration,
  registerImplementationProvider: registration,
  registerTypeDefinitionProvider: registration,
  registerSelectionRangeProvider: registration,
  registerCallHierarchyProvider: registration,
  registerTypeHierarchyProvider: registration,
  registerLinkedEditingRangeProvider: registration,
  registerInlayHintsProvider: registration,
  registerInlineValuesProvider: registration,
  registerDocumentSemanticTokensProvider: registration,
  registerDocumentRangeSemanticTokensProvider: registration,
};

export const env = {
  appName: 'Visual Studio Code',
  language: 'en',
  machineId: 'someValue.machineId',
  get isTelemetryEnabled() {
    return mock.state.telemetryEnabled;
  },
  get onDidChangeTelemetryEnabled() {
    return mock.state.telemetryEmitter.event;
  },
  openExternal: () => Promise.resolve(true),
};

export const extensions = {
  getExtension: (id: string) => mock.state.extensions.get(id),
};

/* Value classes the language client subclasses or builds; they keep their arguments. */
class Value {
  readonly args: unknown[];
  constructor(...args: unknown[]) {
    this.args = args;
  }
}
export class CompletionItem extends Value {}
export class CompletionList extends Value {}
export class CodeLens extends Value {}
export class CodeAction extends Value {}
export class Diagnostic extends Value {}
export class DocumentLink extends Value {}
export class InlayHint extends Value {}
export class SymbolInformation extends Value {}
export class CallHierarchyItem extends Value {}
export class TypeHierarchyItem extends Value {}
export class Location extends Value {}
export class SnippetString extends Value {}
export class TextEdit extends Value {}
export class Hover extends Value {}
export class RelativePattern extends Value {}

export class CodeActionKind {
  static readonly Empty = new CodeActionKind('');
  static readonly QuickFix = new CodeActionKind('quickfix');
  static readonly Refactor = new CodeActionKind('refactor');
  static readonly RefactorExtract = new CodeActionKind('refactor.extract');
  static readonly RefactorInline = new CodeActionKind('refactor.inline');
  static readonly RefactorMove = new CodeActionKind('refactor.move');
  static readonly RefactorRewrite = new CodeActionKind('refactor.rewrite');
  static readonly Source = new CodeActionKind('source');
  static readonly SourceOrganizeImports = new CodeActionKind('source.organizeImports');
  static readonly SourceFixAll = new CodeActionKind('source.fixAll');
  static readonly Notebook = new CodeActionKind('notebook');
  constructor(readonly value: string) {}
  append(part: string): CodeActionKind {
    return new CodeActionKind(this.value ? `${this.value}.${part}` : part);
  }
}
export enum InlineCompletionTriggerKind {
  Invoke = 0,
  Automatic = 1,
}
