import * as assert from 'node:assert/strict';
import { beforeEach, describe, it } from 'node:test';

import * as vscode from 'vscode';
import { InlineCompletionRequest, type FeatureClient, type Middleware } from 'vscode-languageclient/node';

import {
  decisionIdOf,
  inlineCompletionProvider,
  ShowingInlineCompletionFeature,
  ShownReporter,
  TabloopLanguageClient,
} from '../../src/inline';
import { ACCEPT_COMMAND, DID_SHOW_NOTIFICATION } from '../../src/protocol';
import { mock } from '../mock/vscode';

/** An item as the server sends it: its decision id in the `tabloop.accept` command. */
function candidate(text: string, decisionId: string): vscode.InlineCompletionItem {
  return new vscode.InlineCompletionItem(text, undefined, { title: 'Accept', command: ACCEPT_COMMAND, arguments: [decisionId] });
}

const FIRST = candidate('width * height', 'd1');
const SECOND = candidate('height * width', 'd2');
const THIRD = candidate('abs(width * height)', 'd3');

/** Stands in for the language client: answers the inline completion request, records notifications. */
class FakeFeatureClient {
  notifications: { method: string; params: unknown }[] = [];
  requests: unknown[] = [];
  middleware: Middleware = {};
  running = true;
  answer: unknown = { items: [{ insertText: 'width * height', command: { title: 'Accept', command: ACCEPT_COMMAND, arguments: ['d1'] } }] };
  code2ProtocolConverter = {
    asInlineCompletionParams: (_document: unknown, position: vscode.Position, context: vscode.InlineCompletionContext) => ({
      position: { line: position.line, character: position.character },
      context: { triggerKind: context.triggerKind },
    }),
  };
  protocol2CodeConverter = {
    asInlineCompletionResult: async (result: { items: { insertText: string; command: vscode.Command }[] } | null) =>
      result && new vscode.InlineCompletionList(result.items.map((item) => new vscode.InlineCompletionItem(item.insertText, undefined, item.command))),
    asDocumentSelector: (selector: unknown) => selector,
  };
  isRunning(): boolean {
    return this.running;
  }
  async sendRequest(type: { method: string }, params: unknown): Promise<unknown> {
    assert.equal(type.method, InlineCompletionRequest.method);
    this.requests.push(params);
    return this.answer;
  }
  async sendNotification(method: string, params: unknown): Promise<void> {
    this.notifications.push({ method, params });
  }
  handleFailedRequest<T>(_type: unknown, _token: unknown, _error: unknown, defaultValue: T): T {
    return defaultValue;
  }
  shown(): unknown[] {
    return this.notifications.filter((n) => n.method === DID_SHOW_NOTIFICATION).map((n) => n.params);
  }
}

const asClient = (fake: FakeFeatureClient) => fake as unknown as FeatureClient<Middleware>;
const token = () => new vscode.CancellationTokenSource().token;
const INVOKED = { triggerKind: vscode.InlineCompletionTriggerKind.Invoke, selectedCompletionInfo: undefined };

describe('the decision id of an item', () => {
  it('is the argument of its tabloop.accept command', () => {
    assert.equal(decisionIdOf(SECOND), 'd2');
  });
  it('is absent for an item of another provider or without a command', () => {
    assert.equal(decisionIdOf(new vscode.InlineCompletionItem('x', undefined, { title: 'x', command: 'other.accept', arguments: ['d9'] })), undefined);
    assert.equal(decisionIdOf(new vscode.InlineCompletionItem('x')), undefined);
    assert.equal(decisionIdOf(new vscode.InlineCompletionItem('x', undefined, { title: 'x', command: ACCEPT_COMMAND, arguments: [42] })), undefined);
  });
});

describe('ShownReporter', () => {
  it('reports each change of the item on screen once, cycling included', () => {
    const sent: string[] = [];
    const reporter = new ShownReporter((id) => sent.push(id));
    reporter.shown(FIRST);
    reporter.shown(FIRST); // shown again, unchanged
    reporter.shown(SECOND); // Alt+]
    reporter.shown(THIRD); // Alt+]
    reporter.shown(FIRST); // Alt+] wraps around
    reporter.shown(THIRD); // Alt+[
    assert.deepEqual(sent, ['d1', 'd2', 'd3', 'd1', 'd3']);
  });
  it('says nothing for an item that is not a tabloop suggestion', () => {
    const sent: string[] = [];
    const reporter = new ShownReporter((id) => sent.push(id));
    reporter.shown(new vscode.InlineCompletionItem('x'));
    assert.deepEqual(sent, []);
  });
});

describe('the inline completion provider', () => {
  let fake: FakeFeatureClient;
  beforeEach(() => {
    fake = new FakeFeatureClient();
  });

  it('asks the server and sends tabloop/didShow for each candidate VS Code shows', async () => {
    const provider = inlineCompletionProvider(asClient(fake), new ShownReporter((decisionId) => void fake.sendNotification(DID_SHOW_NOTIFICATION, { decisionId })));
    const answer = (await provider.provideInlineCompletionItems({} as vscode.TextDocument, new vscode.Position(6, 13), INVOKED, token())) as vscode.InlineCompletionList;
    assert.deepEqual(fake.requests, [{ position: { line: 6, character: 13 }, context: { triggerKind: vscode.InlineCompletionTriggerKind.Invoke } }]);
    assert.equal(answer.items[0]!.insertText, 'width * height');
    provider.handleDidShowCompletionItem(answer.items[0]!, 'width * height');
    provider.handleDidShowCompletionItem(SECOND, 'height * width');
    provider.handleDidShowCompletionItem(SECOND, 'height * width');
    assert.deepEqual(fake.shown(), [{ decisionId: 'd1' }, { decisionId: 'd2' }]);
  });

  it('goes through the middleware, as the built-in provider does', async () => {
    const seen: number[] = [];
    fake.middleware = {
      provideInlineCompletionItems: (document, position, context, cancel, next) => {
        seen.push(context.triggerKind);
        return next(document, position, context, cancel);
      },
    };
    const provider = inlineCompletionProvider(asClient(fake), new ShownReporter(() => undefined));
    await provider.provideInlineCompletionItems({} as vscode.TextDocument, new vscode.Position(0, 0), INVOKED, token());
    assert.deepEqual(seen, [vscode.InlineCompletionTriggerKind.Invoke]);
    assert.equal(fake.requests.length, 1);
  });

  it('answers null when the request fails', async () => {
    fake.sendRequest = async () => {
      throw new Error('server gone');
    };
    const provider = inlineCompletionProvider(asClient(fake), new ShownReporter(() => undefined));
    assert.equal(await provider.provideInlineCompletionItems({} as vscode.TextDocument, new vscode.Position(0, 0), INVOKED, token()), null);
  });
});

describe('the feature', () => {
  beforeEach(() => mock.reset());

  it('registers the reporting provider for the server capability and sends didShow while running', () => {
    const fake = new FakeFeatureClient();
    const feature = new ShowingInlineCompletionFeature(asClient(fake));
    feature.initialize({ inlineCompletionProvider: true }, [{ scheme: 'file' }]);
    const [entry] = mock.state.inlineProviders;
    assert.ok(entry);
    assert.equal(mock.state.inlineProviders.length, 1);
    const provider = entry.provider as unknown as { handleDidShowCompletionItem(item: vscode.InlineCompletionItem, text: string): void };
    provider.handleDidShowCompletionItem(SECOND, 'height * width');
    fake.running = false;
    provider.handleDidShowCompletionItem(THIRD, 'abs(width * height)'); // the server has stopped: nothing sent
    assert.deepEqual(fake.shown(), [{ decisionId: 'd2' }]);
    feature.clear();
    assert.equal(mock.state.inlineProviders.length, 0);
  });

  it('registers nothing when the server offers no inline completion', () => {
    const feature = new ShowingInlineCompletionFeature(asClient(new FakeFeatureClient()));
    feature.initialize({}, [{ scheme: 'file' }]);
    assert.equal(mock.state.inlineProviders.length, 0);
  });

  it('takes the place of the built-in inline completion feature in the language client', () => {
    const client = new TabloopLanguageClient('tabloop', 'tabloop', { command: 'tabloop-server-not-started' }, {});
    const feature = (client as unknown as { getFeature(method: string): unknown }).getFeature(InlineCompletionRequest.method);
    assert.ok(feature instanceof ShowingInlineCompletionFeature);
  });
});
