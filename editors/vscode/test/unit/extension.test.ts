import * as assert from 'node:assert/strict';
import { afterEach, beforeEach, describe, it } from 'node:test';

import * as vscode from 'vscode';
import { State, type LanguageClient } from 'vscode-languageclient/node';

import { COMMANDS, TabloopExtension } from '../../src/extension';
import type { LaunchProbe } from '../../src/serverCommand';
import { mock } from '../mock/vscode';

const PROPERTIES = {
  'tabloop.completion.enabled': {},
  'tabloop.completion.model': {},
  'tabloop.server.path': {},
  'tabloop.trace.server': {},
};

const NOTHING: LaunchProbe = {
  configuredPath: '',
  pythonInterpreter: async () => undefined,
  canImportServer: async () => false,
  which: async () => undefined,
  env: {},
};

/** Stands in for the running LanguageClient: records what the extension sends. */
class FakeClient {
  state = State.Running;
  notifications: { method: string; params: unknown }[] = [];
  requests: { method: string; params: unknown }[] = [];
  answers = new Map<string, unknown>();
  sendNotification(type: string | { method: string }, params: unknown): Promise<void> {
    this.notifications.push({ method: typeof type === 'string' ? type : type.method, params });
    return Promise.resolve();
  }
  stopped = 0;
  stop(): Promise<void> {
    this.stopped += 1;
    this.state = State.Stopped;
    return Promise.resolve();
  }
  dispose(): Promise<void> {
    return Promise.resolve();
  }
  sendRequest<R>(method: string, params: unknown): Promise<R> {
    this.requests.push({ method, params });
    return Promise.resolve(this.answers.get(method) as R);
  }
}

let extension: TabloopExtension | undefined;

function running(): { extension: TabloopExtension; client: FakeClient } {
  extension = new TabloopExtension(PROPERTIES, () => NOTHING);
  const client = new FakeClient();
  extension.client = client as unknown as LanguageClient;
  return { extension, client };
}

beforeEach(() => mock.reset());
afterEach(async () => {
  await extension?.stop();
  extension?.dispose();
  extension = undefined;
});

describe('TabloopExtension', () => {
  it('registers its commands and a status bar item', () => {
    extension = new TabloopExtension(PROPERTIES, () => NOTHING);
    for (const command of Object.values(COMMANDS)) assert.ok(mock.state.commands.has(command), command);
    assert.equal(mock.state.statusBarItems[0]!.command, COMMANDS.showStatus);
    extension.dispose();
    assert.equal(mock.state.commands.size, 0);
    extension = undefined;
  });

  it('explains how to fix a missing server', async () => {
    extension = new TabloopExtension(PROPERTIES, () => NOTHING);
    mock.state.messageAnswers.push('Open Settings');
    await extension.start();
    const [message] = mock.state.messages;
    assert.equal(message!.kind, 'error');
    assert.match(message!.message, /no language server found/);
    assert.deepEqual(message!.items, ['Open Settings', 'Show Logs']);
    assert.deepEqual(mock.state.executed.at(-1), { command: 'workbench.action.openSettings', args: ['tabloop.server.path'] });
    assert.equal(mock.state.statusBarItems[0]!.text, '$(error) tabloop: no server');
    assert.equal(extension.client, undefined);
  });

  it('sends explicit settings and the telemetry switch at initialize', () => {
    mock.setConfig('defaults', 'tabloop.completion.model', 'bundled');
    mock.setConfig('global', 'tabloop.completion.model', '/models/tiny');
    mock.setConfig('global', 'tabloop.server.path', '/usr/bin/tabloop');
    mock.setTelemetryEnabled(false);
    extension = new TabloopExtension(PROPERTIES, () => NOTHING);
    const options = extension.clientOptions();
    assert.deepEqual(options.initializationOptions, {
      completion: { model: '/models/tiny' },
      telemetry: { clientEnabled: false },
    });
  });

  it('answers workspace/configuration for the tabloop section itself', async () => {
    mock.setConfig('workspace', 'tabloop.completion.enabled', false);
    extension = new TabloopExtension(PROPERTIES, () => NOTHING);
    const middleware = extension.clientOptions().middleware!.workspace!.configuration!;
    const params = { items: [{ section: 'tabloop' }, { section: 'editor' }] };
    const token = new vscode.CancellationTokenSource().token;
    const answers = await middleware(params, token, async () => [{ from: 'default handler' }, { tabSize: 4 }]);
    assert.deepEqual(answers, [{ completion: { enabled: false }, telemetry: { clientEnabled: true } }, { tabSize: 4 }]);
  });

  it('forwards telemetry switch changes to the server', () => {
    const { client } = running();
    mock.setTelemetryEnabled(false);
    mock.setTelemetryEnabled(true);
    assert.deepEqual(client.notifications, [
      { method: 'tabloop/telemetryEnabled', params: { enabled: false } },
      { method: 'tabloop/telemetryEnabled', params: { enabled: true } },
    ]);
  });

  it('tells the server when tabloop settings change, and ignores other sections', async () => {
    const { client } = running();
    mock.setConfig('global', 'editor.fontSize', 14);
    mock.setConfig('global', 'tabloop.completion.model', '/m');
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(client.notifications, [
      {
        method: 'workspace/didChangeConfiguration',
        params: { settings: { tabloop: { completion: { model: '/m' }, telemetry: { clientEnabled: true } } } },
      },
    ]);
  });

  it('toggles suggestions where the setting lives', async () => {
    const { extension } = running();
    assert.equal(await extension.toggleSuggestions(), false);
    assert.equal(mock.state.config.global.get('tabloop.completion.enabled'), false);
    mock.setConfig('workspace', 'tabloop.completion.enabled', false);
    assert.equal(await extension.toggleSuggestions(), true);
    assert.equal(mock.state.config.workspace.get('tabloop.completion.enabled'), true);
    assert.equal(mock.state.config.global.get('tabloop.completion.enabled'), false);
  });

  it('searches, lists hits best first and opens the one picked', async () => {
    const { extension, client } = running();
    client.answers.set('tabloop/search', [
      { uri: 'file:///ws/a.py', range: { start: { line: 3, character: 0 }, end: { line: 8, character: 0 } }, score: 0.2, preview: 'def a(): ...' },
      { uri: 'file:///ws/b.py', range: { start: { line: 10, character: 4 }, end: { line: 12, character: 0 } }, score: 0.7, preview: 'def parse_config(path):' },
    ]);
    mock.state.inputAnswers.push('where is the config parsed');
    mock.state.pickAnswers.push((items) => items[0]);
    const picked = await extension.search();
    assert.deepEqual(client.requests, [{ method: 'tabloop/search', params: { query: 'where is the config parsed', k: 20 } }]);
    assert.equal(mock.state.shownPicks[0]!.length, 2);
    assert.equal(picked!.hit.uri, 'file:///ws/b.py');
    assert.deepEqual(mock.state.openedDocuments, ['file:///ws/b.py']);
    assert.equal(mock.state.revealed[0]!.range.start.line, 10);
    assert.equal(mock.state.revealed[0]!.range.start.character, 4);
  });

  it('does not search for an empty query or when the server is down', async () => {
    const { extension, client } = running();
    mock.state.inputAnswers.push('   ');
    assert.equal(await extension.search(), undefined);
    assert.deepEqual(client.requests, []);
    client.state = State.Stopped;
    assert.equal(await extension.search(), undefined);
    assert.match(mock.state.messages.at(-1)!.message, /not running/);
  });

  it('renders status from tabloop/status', async () => {
    const { extension, client } = running();
    client.answers.set('tabloop/status', {
      model: { state: 'ready', modelId: 'tiny' },
      policy: { version: 'v7' },
      decisions: { shown: 2, accepted: 1 },
    });
    await extension.showStatus();
    assert.equal(mock.state.statusBarItems[0]!.text, '$(sparkle) tabloop · policy v7');
    const message = mock.state.messages.at(-1)!;
    assert.equal(message.message, 'tabloop · policy v7');
    assert.deepEqual(message.items, ['Show Logs', 'Restart Server']);
  });

  it('stops the client and its status polling on stop', async () => {
    const { extension, client } = running();
    await extension.stop();
    assert.equal(client.stopped, 1);
    assert.equal(extension.client, undefined);
    assert.equal(await extension.fetchStatus(), undefined);
  });
});
