/*
 * The whole extension, activated in the mocked VS Code host with the real vscode-languageclient
 * and the real server: server discovery from `tabloop.server.path`, settings through
 * initializationOptions and the `workspace/configuration` middleware, the status bar reaching
 * ready, the inline completion provider the client registers, the accept command it forwards,
 * and a settings change reaching the server. The completion model is scripted (a loopback
 * OpenAI-compatible server whose answers the test chooses), so the suggestion is known exactly;
 * the index uses the embedding model the server bundles. Needs the project's .venv; prints why
 * when it skips.
 */
import * as assert from 'node:assert/strict';
import { promises as fs } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { performance } from 'node:perf_hooks';
import { after, before, describe, it } from 'node:test';

import * as vscode from 'vscode';

import { activate, deactivate, type TabloopExtension } from '../../src/extension';
import type { ShowingInlineCompletionItemProvider } from '../../src/inline';
import { mock, type InlineCompletionList, type TextDocument } from '../mock/vscode';
import { EXTENSION_DIR, venvPython } from '../paths';
import {
  CURSOR,
  READY_TIMEOUT_MS,
  SCRIPT,
  scriptedCompletionSettings,
  scriptedModelId,
  SEARCH_QUERY,
  SETTINGS_LOADER,
  SOURCE,
  sleep,
  startScriptedModel,
  SUGGESTION,
  waitFor,
  type ScriptedModelServer,
} from './fixtures';

const python = venvPython();
const skipReason = python ? undefined : 'no Python environment at .venv (run `make venv`); skipping the extension smoke test';
if (skipReason) process.stdout.write(`# ${skipReason}\n`);


describe('the extension in a VS Code host, against the real server', { skip: skipReason, timeout: 600_000 }, () => {
  let home: string;
  let workspace: string;
  let extension: TabloopExtension;
  let document: TextDocument;
  let model: ScriptedModelServer;
  const timings: Record<string, number> = {};

  before(async () => {
    model = await startScriptedModel(python!, SCRIPT);
    home = await fs.mkdtemp(path.join(os.tmpdir(), 'tabloop-ext-'));
    workspace = path.join(home, 'ws');
    await fs.mkdir(workspace);
    await fs.writeFile(path.join(workspace, 'words.py'), SOURCE);
    await fs.writeFile(path.join(workspace, 'settings_loader.py'), SETTINGS_LOADER);
    process.env.XDG_CONFIG_HOME = path.join(home, 'config');
    mock.reset();
    mock.setWorkspaceFolders([workspace]);
    // What a user would put in settings.json.
    const settings: Record<string, unknown> = {
      'tabloop.server.path': python,
      ...Object.fromEntries(Object.entries(scriptedCompletionSettings(model.url)).map(([key, value]) => [`tabloop.${key}`, value])),
      'tabloop.cacheDir': path.join(home, 'cache'),
      'tabloop.index.enabled': true,
      'tabloop.policy.showFloor': 1.0,
      'tabloop.telemetry.level': 'off',
    };
    for (const [key, value] of Object.entries(settings)) mock.setConfig('global', key, value);
  });

  after(async () => {
    await deactivate();
    if (model) await model.close();
    if (Object.keys(timings).length) process.stdout.write(`# extension timings (ms): ${JSON.stringify(timings)}\n`);
    if (home) await fs.rm(home, { recursive: true, force: true });
  });

  it('activates, starts the server and shows it ready in the status bar', async () => {
    const packageJSON = JSON.parse(await fs.readFile(path.join(EXTENSION_DIR, 'package.json'), 'utf8'));
    const started = performance.now();
    extension = await activate({ subscriptions: [], extension: { packageJSON } } as unknown as vscode.ExtensionContext);
    timings.activateReturned = performance.now() - started;
    assert.equal(extension.launch?.source, 'setting');
    assert.deepEqual(extension.launch?.args, ['-m', 'lsp_server', '--stdio']);
    const text = await waitFor(`the status bar to say ready (${extension.statusItem.text})`, READY_TIMEOUT_MS, () => {
      const current = extension.statusItem.text;
      return /policy/.test(current) ? current : undefined;
    });
    timings.activationToReady = performance.now() - started;
    assert.match(text, /^\$\(sparkle\) tabloop · policy \S+$/);
    assert.equal(extension.lastStatus?.model?.state, 'ready');
    assert.equal(extension.lastStatus?.model?.modelId, scriptedModelId(model.url));
    assert.ok(mock.state.commands.has('tabloop.accept'), 'the client registers the server command');
    // The server's work-done progress (model loading) reaches VS Code's progress UI.
    const titles = mock.state.progress.map((p) => p.title);
    process.stdout.write(`# progress shown: ${JSON.stringify(titles)}\n`);
    assert.ok(titles.some((title) => title && /tabloop|model/i.test(title)), `no progress shown: ${JSON.stringify(titles)}`);
  });

  it('provides inline completions through the client, and the accept command reaches the server', async () => {
    document = mock.openDocument(path.join(workspace, 'words.py'), 'python', SOURCE);
    const [entry] = mock.state.inlineProviders;
    assert.ok(entry, 'the client registered an inline completion provider');
    const token = new vscode.CancellationTokenSource().token;
    const started = performance.now();
    const result = (await entry.provider.provideInlineCompletionItems(
      document,
      new vscode.Position(CURSOR.line, CURSOR.character),
      { triggerKind: vscode.InlineCompletionTriggerKind.Automatic, selectedCompletionInfo: undefined },
      token,
    )) as InlineCompletionList;
    timings.inlineCompletion = performance.now() - started;
    assert.equal(result.items.length, 1, `expected one suggestion\n${model.stderr().slice(-2000)}`);
    const [item] = result.items;
    assert.equal(item!.insertText, SUGGESTION);
    assert.deepEqual(
      [item!.range?.start.line, item!.range?.start.character, item!.range?.end.line, item!.range?.end.character],
      [CURSOR.line, CURSOR.character, CURSOR.line, CURSOR.character],
    );
    const command = item!.command as { command: string; arguments: unknown[] };
    assert.equal(command.command, 'tabloop.accept');

    // One provider, the client's, and it tells the server which suggestion VS Code shows.
    assert.equal(mock.state.inlineProviders.length, 1);
    const sent: { method: string; params: unknown }[] = [];
    const client = extension.client!;
    const send = client.sendNotification.bind(client);
    client.sendNotification = ((method: string, params: unknown) => {
      sent.push({ method, params });
      return send(method, params);
    }) as typeof client.sendNotification;
    (entry.provider as unknown as ShowingInlineCompletionItemProvider).handleDidShowCompletionItem(item as unknown as vscode.InlineCompletionItem, SUGGESTION);
    client.sendNotification = send;
    assert.deepEqual(sent, [{ method: 'tabloop/didShow', params: { decisionId: command.arguments[0] } }]);

    // What VS Code does when the user takes the suggestion.
    await vscode.commands.executeCommand(command.command, ...command.arguments);
    const status = await extension.fetchStatus();
    assert.equal(status?.decisions?.shown, 1);
    assert.equal(status?.decisions?.accepted, 1);
  });

  it('searches the codebase and opens the hit picked', async () => {
    // The index builds in the background: search again until it answers.
    const picked = await waitFor('search results', READY_TIMEOUT_MS, async () => {
      mock.state.inputAnswers.push(SEARCH_QUERY);
      mock.state.pickAnswers.push((items) => items[0]);
      const hit = await extension.search();
      if (!hit) await sleep(500);
      return hit;
    });
    assert.ok(picked.hit.uri.endsWith('/settings_loader.py'), picked.hit.uri);
    assert.match(picked.label, /settings_loader\.py:\d+$/);
    assert.deepEqual(mock.state.openedDocuments.at(-1), picked.hit.uri);
    assert.equal(mock.state.revealed.at(-1)!.range.start.line, picked.hit.range.start.line);
    await extension.fetchStatus();
    assert.equal(extension.renderStatus().busy, false);
    assert.match(String(extension.statusItem.tooltip), /index: state ready, files 2, /);
  });

  it('sends a settings change, which the server pulls and applies', async () => {
    await extension.toggleSuggestions(); // completion.enabled: false, in the user settings
    const [entry] = mock.state.inlineProviders;
    const token = new vscode.CancellationTokenSource().token;
    const result = await waitFor('suggestions to stop', 30_000, async () => {
      const answer = (await entry!.provider.provideInlineCompletionItems(
        document,
        new vscode.Position(CURSOR.line, CURSOR.character),
        { triggerKind: vscode.InlineCompletionTriggerKind.Automatic, selectedCompletionInfo: undefined },
        token,
      )) as InlineCompletionList | undefined;
      return answer && answer.items.length === 0 ? answer : undefined;
    });
    assert.equal(result.items.length, 0);
    assert.match(extension.statusItem.text, /circle-slash/);
  });
});
