/*
 * Starts the real tabloop server exactly as the extension does (its server resolution, command
 * line, environment and settings) and talks LSP to it with vscode-languageserver-protocol: the
 * initialize handshake with vscode-languageclient's capabilities, model readiness, an inline
 * completion and its acceptance. The model is scripted (a loopback OpenAI-compatible server whose
 * answers the test chooses, reached through the HTTP runner), so every suggestion is known exactly.
 * Needs the project's .venv; prints why when it skips.
 */
import * as assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { promises as fs } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { performance } from 'node:perf_hooks';
import { after, before, describe, it } from 'node:test';
import { pathToFileURL } from 'node:url';

import {
  ConfigurationRequest,
  createProtocolConnection,
  ExecuteCommandRequest,
  InitializeRequest,
  InlineCompletionRequest,
  InlineCompletionTriggerKind,
  RegistrationRequest,
  StreamMessageReader,
  StreamMessageWriter,
  WorkDoneProgressCreateRequest,
  type InlineCompletionList,
  type ProtocolConnection,
} from 'vscode-languageserver-protocol/node';

import { isFound, resolveServer, which, canImportServer, type ServerLaunch } from '../../src/serverCommand';
import { serverKeys, serverSettings, type ConfigurationReader } from '../../src/settings';
import type { ServerStatus } from '../../src/status';
import { EXTENSION_DIR, PROFILES_DIR, REPO_ROOT, venvPython } from '../paths';
import {
  CURSOR,
  READY_TIMEOUT_MS,
  SCRIPT,
  scriptedCompletionSettings,
  scriptedModelId,
  SOURCE,
  sleep,
  startScriptedModel,
  SUGGESTION,
  type ScriptedModelServer,
} from './fixtures';

/** A `tabloop.*` configuration as VS Code would hold it, explicit values only. */
function userConfiguration(values: Record<string, unknown>): ConfigurationReader {
  return { inspect: <T>(key: string) => ({ globalValue: values[key] as T | undefined }) };
}

const python = venvPython();
const skipReason = python ? undefined : `no Python environment at ${path.join(REPO_ROOT, '.venv')} (run \`make venv\`); skipping the server smoke test`;
if (skipReason) process.stdout.write(`# ${skipReason}\n`);

describe('the extension starts the real server', { skip: skipReason, timeout: 600_000 }, () => {
  let workspace: string;
  let server: ChildProcess;
  let connection: ProtocolConnection;
  let launch: ServerLaunch;
  let settings: Record<string, unknown>;
  let model: ScriptedModelServer;
  let stderr = '';
  let activatedAt = 0;
  const timings: Record<string, number> = {};

  before(async () => {
    model = await startScriptedModel(python!, SCRIPT);
    workspace = await fs.mkdtemp(path.join(os.tmpdir(), 'tabloop-smoke-'));
    await fs.writeFile(path.join(workspace, 'words.py'), SOURCE);
    // No developer config or cache leaks in; this is what a fresh user would have.
    process.env.XDG_CONFIG_HOME = path.join(workspace, '.config');

    activatedAt = performance.now();
    // As when the Python extension has the project's environment selected.
    const found = await resolveServer({
      configuredPath: '',
      pythonInterpreter: async () => [python!],
      canImportServer: (cmd) => canImportServer(cmd, process.env),
      which: (name) => which(name, process.env),
      env: { ...process.env },
    });
    assert.ok(isFound(found), 'the selected interpreter should have the server');
    launch = found;
    timings.resolveServer = performance.now() - activatedAt;
    const packageJson = JSON.parse(await fs.readFile(path.join(EXTENSION_DIR, 'package.json'), 'utf8'));
    const keys = serverKeys(packageJson.contributes.configuration.properties);
    settings = serverSettings(
      userConfiguration({
        ...scriptedCompletionSettings(model.url),
        cacheDir: path.join(workspace, '.cache'),
        'index.enabled': false,
        // Always show: this test is about the protocol, not the policy.
        'policy.showFloor': 1.0,
      }),
      keys,
      false,
    );

    // What vscode-languageclient does with the extension's ServerOptions (no transport: stdio).
    server = spawn(launch.command, launch.args, { env: launch.env, cwd: workspace });
    server.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    connection = createProtocolConnection(new StreamMessageReader(server.stdout!), new StreamMessageWriter(server.stdin!));
    connection.onRequest(ConfigurationRequest.type, (params) => params.items.map((item) => (item.section === 'tabloop' ? settings : null)));
    connection.onRequest(WorkDoneProgressCreateRequest.type, () => undefined);
    connection.onRequest(RegistrationRequest.type, () => undefined);
    connection.listen();
  });

  after(async () => {
    if (connection) {
      await Promise.race([connection.sendRequest('shutdown'), new Promise((r) => setTimeout(r, 5000))]).catch(() => undefined);
      await connection.sendNotification('exit').catch(() => undefined);
      connection.dispose();
    }
    if (server && server.exitCode === null) {
      const exited = new Promise((resolve) => server.once('exit', resolve));
      await Promise.race([exited, new Promise((r) => setTimeout(r, 5000))]);
      if (server.exitCode === null) server.kill();
    }
    if (model) await model.close();
    if (workspace) await fs.rm(workspace, { recursive: true, force: true });
    if (Object.keys(timings).length) process.stdout.write(`# smoke timings (ms): ${JSON.stringify(timings)}\n`);
  });

  it('is started from the selected interpreter with --stdio', () => {
    assert.equal(launch.source, 'python');
    assert.equal(launch.command, python);
    assert.deepEqual(launch.args, ['-m', 'lsp_server', '--stdio']);
  });

  it('answers initialize at once, then becomes ready', async () => {
    const profile = JSON.parse(await fs.readFile(path.join(PROFILES_DIR, 'vscode.json'), 'utf8'));
    const root = pathToFileURL(workspace).href;
    const result = await connection.sendRequest(InitializeRequest.type, {
      processId: process.pid,
      clientInfo: profile.clientInfo,
      capabilities: profile.capabilities,
      rootUri: root,
      workspaceFolders: [{ uri: root, name: 'ws' }],
      initializationOptions: settings,
    });
    timings.initialize = performance.now() - activatedAt;
    assert.ok(result.capabilities.inlineCompletionProvider, 'inline completion offered');
    assert.ok(result.capabilities.executeCommandProvider?.commands.includes('tabloop.accept'));
    await connection.sendNotification('initialized', {});

    const deadline = performance.now() + READY_TIMEOUT_MS;
    let status: ServerStatus;
    for (;;) {
      status = await connection.sendRequest<ServerStatus>('tabloop/status', {});
      if (status.model?.state !== 'loading' || performance.now() > deadline) break;
      await sleep(100);
    }
    timings.ready = performance.now() - activatedAt;
    assert.equal(status.model?.state, 'ready', `model not ready: ${JSON.stringify(status.model)}\n${stderr.slice(-2000)}`);
    assert.equal(status.model?.modelId, scriptedModelId(model.url));
  });

  it('suggests inline, with the accept command, and records the acceptance', async () => {
    const uri = pathToFileURL(path.join(workspace, 'words.py')).href;
    await connection.sendNotification('textDocument/didOpen', { textDocument: { uri, languageId: 'python', version: 1, text: SOURCE } });
    const started = performance.now();
    const answer = (await connection.sendRequest(InlineCompletionRequest.type, {
      textDocument: { uri },
      position: CURSOR,
      context: { triggerKind: InlineCompletionTriggerKind.Automatic },
    })) as InlineCompletionList;
    timings.firstInlineCompletion = performance.now() - started;
    timings.firstSuggestion = performance.now() - activatedAt;
    assert.equal(answer.items.length, 1, `expected one suggestion\n${stderr.slice(-2000)}\n${model.stderr().slice(-2000)}`);
    const [item] = answer.items;
    assert.equal(item!.insertText, SUGGESTION);
    assert.deepEqual(item!.range, { start: CURSOR, end: CURSOR });
    assert.equal(item!.command?.command, 'tabloop.accept');
    const decisionId = item!.command!.arguments![0];

    await connection.sendRequest(ExecuteCommandRequest.type, { command: 'tabloop.accept', arguments: [decisionId] });
    const status = await connection.sendRequest<ServerStatus>('tabloop/status', {});
    assert.equal(status.decisions?.requests, 1);
    assert.equal(status.decisions?.shown, 1);
    assert.equal(status.decisions?.silenced, 0);
    assert.equal(status.decisions?.accepted, 1);
    // One call for the request; a second may be the prefetch of what follows the accepted text.
    const prefetched = (status as { prefetchStarted?: number }).prefetchStarted ?? 0;
    const calls = (status.model as { calls?: number } | undefined)?.calls ?? 0;
    assert.ok(calls >= 1 && calls <= 1 + Math.min(prefetched, 1), `model calls: ${calls}`);
  });
});
