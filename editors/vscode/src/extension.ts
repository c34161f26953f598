/*
 * The tabloop extension: starts the tabloop language server, which answers inline completions
 * (vscode-languageclient 10's feature, with the item VS Code shows reported: see inline.ts), and
 * adds commands, a status bar item and the editor's telemetry switch on top.
 */
import * as vscode from 'vscode';
import {
  DidChangeConfigurationNotification,
  type LanguageClient,
  type LanguageClientOptions,
  type ServerOptions,
  State,
} from 'vscode-languageclient/node';

import { TabloopLanguageClient } from './inline';
import { NextEditController } from './nextEdit';
import { clientConnection } from './nextEditConnection';
import {
  CONFIGURATION_SECTION,
  SEARCH_REQUEST,
  STATUS_REQUEST,
  TELEMETRY_ENABLED_NOTIFICATION,
} from './protocol';
import { hitItems, SEARCH_RESULTS, type HitItem, type SearchHit } from './search';
import {
  canImportServer,
  isFound,
  notFoundMessage,
  resolveServer,
  which,
  type LaunchProbe,
  type ServerLaunch,
} from './serverCommand';
import { serverKeys, serverSettings, type SettingsObject } from './settings';
import { describeStatus, statusDetails, type ServerStatus } from './status';

export const SECTION = CONFIGURATION_SECTION;
export const COMMANDS = {
  toggleSuggestions: 'tabloop.toggleSuggestions',
  search: 'tabloop.search',
  showStatus: 'tabloop.showStatus',
  restart: 'tabloop.restartServer',
  showLogs: 'tabloop.showLogs',
} as const;

/** Polling of `tabloop/status`: quick while something loads, slow once everything is ready. */
export const POLL_BUSY_MS = 1000;
export const POLL_IDLE_MS = 15000;

interface PythonExtensionApi {
  environments?: {
    getActiveEnvironmentPath(resource?: vscode.Uri): { path: string } | undefined;
    resolveEnvironment(env: { path: string } | string): Promise<{ executable: { uri?: vscode.Uri } } | undefined>;
    onDidChangeActiveEnvironmentPath?: vscode.Event<unknown>;
  };
  settings?: { getExecutionDetails(resource?: vscode.Uri): { execCommand: string[] | undefined } };
}

/** The interpreter the Python extension selected for the first workspace folder, if any. */
export async function selectedPythonInterpreter(): Promise<string[] | undefined> {
  const extension = vscode.extensions.getExtension<PythonExtensionApi>('ms-python.python');
  if (!extension) return undefined;
  try {
    const api = extension.isActive ? extension.exports : await extension.activate();
    const resource = vscode.workspace.workspaceFolders?.[0]?.uri;
    if (api?.environments) {
      const active = api.environments.getActiveEnvironmentPath(resource);
      const resolved = active ? await api.environments.resolveEnvironment(active) : undefined;
      const executable = resolved?.executable.uri?.fsPath;
      if (executable) return [executable];
    }
    const command = api?.settings?.getExecutionDetails(resource).execCommand;
    return command && command.length > 0 ? command : undefined;
  } catch {
    return undefined;
  }
}

export function defaultProbe(): LaunchProbe {
  const env = { ...process.env };
  return {
    configuredPath: vscode.workspace.getConfiguration(SECTION).get<string>('server.path', ''),
    pythonInterpreter: selectedPythonInterpreter,
    canImportServer: (python) => canImportServer(python, env),
    which: (name) => which(name, env),
    env,
  };
}

export function serverOptions(launch: ServerLaunch): ServerOptions {
  // The arguments already carry `--stdio`; no `transport`, so the client adds nothing to them.
  return { command: launch.command, args: launch.args, options: { env: launch.env } };
}

export class TabloopExtension implements vscode.Disposable {
  client: LanguageClient | undefined;
  launch: ServerLaunch | undefined;
  readonly statusItem: vscode.StatusBarItem;
  readonly output: vscode.LogOutputChannel;
  readonly nextEdit: NextEditController;
  lastStatus: ServerStatus | undefined;
  private pollTimer: NodeJS.Timeout | undefined;
  private readonly disposables: vscode.Disposable[] = [];
  private readonly keys: string[];

  constructor(
    contributedProperties: Record<string, unknown>,
    private readonly probe: () => LaunchProbe = defaultProbe,
  ) {
    this.keys = serverKeys(contributedProperties);
    this.output = vscode.window.createOutputChannel('tabloop', { log: true });
    this.statusItem = vscode.window.createStatusBarItem('tabloop.status', vscode.StatusBarAlignment.Right, 100);
    this.statusItem.name = 'tabloop';
    this.statusItem.command = COMMANDS.showStatus;
    this.nextEdit = new NextEditController(clientConnection(() => this.client));
    this.disposables.push(
      this.nextEdit,
      this.output,
      this.statusItem,
      vscode.commands.registerCommand(COMMANDS.toggleSuggestions, () => this.toggleSuggestions()),
      vscode.commands.registerCommand(COMMANDS.search, () => this.search()),
      vscode.commands.registerCommand(COMMANDS.showStatus, () => this.showStatus()),
      vscode.commands.registerCommand(COMMANDS.restart, () => this.restart()),
      vscode.commands.registerCommand(COMMANDS.showLogs, () => this.output.show(true)),
      vscode.env.onDidChangeTelemetryEnabled((enabled) => this.telemetryChanged(enabled)),
      vscode.workspace.onDidChangeConfiguration((event) => {
        if (event.affectsConfiguration(`${SECTION}.server`)) void this.restart();
        else if (event.affectsConfiguration(SECTION)) void this.configurationChanged();
      }),
    );
  }

  /** Settings for the server: explicit `tabloop.*` values and the telemetry switch. */
  settings(): SettingsObject {
    return serverSettings(vscode.workspace.getConfiguration(SECTION), this.keys, vscode.env.isTelemetryEnabled);
  }

  suggestionsEnabled(): boolean {
    return vscode.workspace.getConfiguration(SECTION).get<boolean>('completion.enabled', true);
  }

  clientOptions(): LanguageClientOptions {
    return {
      documentSelector: [{ scheme: 'file' }, { scheme: 'untitled' }],
      outputChannel: this.output,
      initializationOptions: this.settings(),
      middleware: {
        workspace: {
          // Answer the `tabloop` section ourselves: explicit values only (see settings.ts).
          configuration: async (params, token, next) => {
            const answers = await next(params, token);
            if (!Array.isArray(answers)) return answers;
            return params.items.map((item, i) => (item.section === SECTION ? this.settings() : answers[i]));
          },
        },
      },
    };
  }

  async start(): Promise<void> {
    this.renderStatus();
    const found = await resolveServer(this.probe());
    if (!isFound(found)) {
      const message = notFoundMessage(found);
      this.output.error(message);
      this.statusItem.text = '$(error) tabloop: no server';
      this.statusItem.tooltip = message;
      this.statusItem.show();
      const choice = await vscode.window.showErrorMessage(message, 'Open Settings', 'Show Logs');
      if (choice === 'Open Settings') await vscode.commands.executeCommand('workbench.action.openSettings', `${SECTION}.server.path`);
      if (choice === 'Show Logs') this.output.show(true);
      return;
    }
    this.launch = found;
    this.output.info(`starting the server (${found.source}): ${[found.command, ...found.args].join(' ')}`);
    const client = new TabloopLanguageClient('tabloop', 'tabloop', serverOptions(found), this.clientOptions());
    this.client = client;
    client.onDidChangeState((event) => {
      if (event.newState === State.Running) void this.configurationChanged();
      this.schedulePoll(0);
    });
    try {
      await client.start();
    } catch (error) {
      this.output.error(`the server did not start: ${String(error)}`);
      this.statusItem.text = '$(error) tabloop';
      this.statusItem.tooltip = `tabloop: the server did not start (${String(error)}). Click for details.`;
      this.statusItem.show();
      const choice = await vscode.window.showErrorMessage(
        `tabloop: the language server did not start (${[found.command, ...found.args].join(' ')}). See the log for its error.`,
        'Show Logs',
      );
      if (choice === 'Show Logs') this.output.show(true);
      return;
    }
    this.schedulePoll(0);
  }

  async stop(): Promise<void> {
    this.clearPoll();
    const client = this.client;
    this.client = undefined;
    this.lastStatus = undefined;
    if (client && client.state !== State.Stopped) await client.stop(5000).catch(() => undefined);
    if (client) await client.dispose().catch(() => undefined);
  }

  async restart(): Promise<void> {
    this.output.info('restarting the server');
    await this.stop();
    await this.start();
  }

  /** Fetches `tabloop/status`, or undefined while the server is not running. */
  async fetchStatus(): Promise<ServerStatus | undefined> {
    const client = this.client;
    if (!client || client.state !== State.Running) return undefined;
    try {
      this.lastStatus = await client.sendRequest<ServerStatus>(STATUS_REQUEST, {});
    } catch (error) {
      this.output.warn(`${STATUS_REQUEST} failed: ${String(error)}`);
    }
    return this.lastStatus;
  }

  renderStatus(): { busy: boolean } {
    const view = describeStatus(this.lastStatus, this.suggestionsEnabled());
    this.statusItem.text = view.text;
    this.statusItem.tooltip = view.tooltip;
    this.statusItem.backgroundColor = view.error ? new vscode.ThemeColor('statusBarItem.errorBackground') : undefined;
    this.statusItem.show();
    return view;
  }

  private clearPoll(): void {
    if (this.pollTimer) clearTimeout(this.pollTimer);
    this.pollTimer = undefined;
  }

  private schedulePoll(delayMs: number): void {
    this.clearPoll();
    if (!this.client) return;
    this.pollTimer = setTimeout(async () => {
      await this.fetchStatus();
      const { busy } = this.renderStatus();
      if (this.client?.state === State.Running) this.schedulePoll(busy ? POLL_BUSY_MS : POLL_IDLE_MS);
    }, delayMs);
    this.pollTimer.unref?.();
  }

  async configurationChanged(): Promise<void> {
    this.renderStatus();
    const client = this.client;
    if (!client || client.state !== State.Running) return;
    // The server pulls `workspace/configuration` again when told something changed.
    await client.sendNotification(DidChangeConfigurationNotification.type, { settings: { [SECTION]: this.settings() } });
    this.schedulePoll(0);
  }

  async telemetryChanged(enabled: boolean): Promise<void> {
    const client = this.client;
    if (!client || client.state !== State.Running) return;
    await client.sendNotification(TELEMETRY_ENABLED_NOTIFICATION, { enabled });
  }

  async toggleSuggestions(): Promise<boolean> {
    const config = vscode.workspace.getConfiguration(SECTION);
    const info = config.inspect<boolean>('completion.enabled');
    const next = !this.suggestionsEnabled();
    // Change the value where it is set, so a workspace setting does not silently win.
    const target =
      info?.workspaceFolderValue !== undefined
        ? vscode.ConfigurationTarget.WorkspaceFolder
        : info?.workspaceValue !== undefined
          ? vscode.ConfigurationTarget.Workspace
          : vscode.ConfigurationTarget.Global;
    await config.update('completion.enabled', next, target);
    void vscode.window.showInformationMessage(`tabloop suggestions ${next ? 'on' : 'off'}`);
    return next;
  }

  async search(): Promise<HitItem | undefined> {
    const client = this.client;
    if (!client || client.state !== State.Running) {
      void vscode.window.showWarningMessage('tabloop: the language server is not running.');
      return undefined;
    }
    const editor = vscode.window.activeTextEditor;
    const selected = editor && !editor.selection.isEmpty ? editor.document.getText(editor.selection) : '';
    const query = await vscode.window.showInputBox({
      title: 'tabloop: search the codebase',
      prompt: 'Describe the code you are looking for',
      value: selected.slice(0, 200),
    });
    if (!query?.trim()) return undefined;
    let hits: SearchHit[];
    try {
      hits = await vscode.window.withProgress(
        { location: vscode.ProgressLocation.Window, title: 'tabloop: searching' },
        () => client.sendRequest<SearchHit[]>(SEARCH_REQUEST, { query, k: SEARCH_RESULTS }),
      );
    } catch (error) {
      void vscode.window.showErrorMessage(`tabloop: search failed: ${String(error)}`);
      return undefined;
    }
    if (!hits || hits.length === 0) {
      void vscode.window.showInformationMessage(`tabloop: nothing found for "${query}"`);
      return undefined;
    }
    const items = hitItems(hits, (uri) => vscode.workspace.asRelativePath(vscode.Uri.parse(uri)));
    const picked = await vscode.window.showQuickPick(items, {
      title: `tabloop: ${hits.length} results for "${query}"`,
      matchOnDescription: true,
      matchOnDetail: true,
    });
    if (!picked) return undefined;
    const { start, end } = picked.hit.range;
    const document = await vscode.workspace.openTextDocument(vscode.Uri.parse(picked.hit.uri));
    const range = new vscode.Range(start.line, start.character, end.line, end.character);
    await vscode.window.showTextDocument(document, { selection: new vscode.Selection(range.start, range.start) });
    return picked;
  }

  async showStatus(): Promise<void> {
    const status = await this.fetchStatus();
    this.renderStatus();
    if (!status) {
      const choice = await vscode.window.showWarningMessage('tabloop: the language server is not running.', 'Restart', 'Show Logs');
      if (choice === 'Restart') await this.restart();
      if (choice === 'Show Logs') this.output.show(true);
      return;
    }
    this.output.info(`status:\n${statusDetails(status)}`);
    const view = describeStatus(status, this.suggestionsEnabled());
    const choice = await vscode.window.showInformationMessage(
      view.text.replace(/\$\([^)]*\)\s*/g, ''),
      { modal: true, detail: view.tooltip.replace(/\nClick for details\.$/, '') },
      'Show Logs',
      'Restart Server',
    );
    if (choice === 'Show Logs') this.output.show(true);
    if (choice === 'Restart Server') await this.restart();
  }

  dispose(): void {
    void this.stop();
    for (const disposable of this.disposables) disposable.dispose();
  }
}

let extension: TabloopExtension | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<TabloopExtension> {
  const packageJson = context.extension.packageJSON as { contributes?: { configuration?: { properties?: Record<string, unknown> } } };
  extension = new TabloopExtension(packageJson.contributes?.configuration?.properties ?? {});
  context.subscriptions.push(extension);
  await extension.start();
  return extension;
}

export async function deactivate(): Promise<void> {
  await extension?.stop();
  extension = undefined;
}
