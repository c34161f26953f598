/*
 * Inline completions with `tabloop/didShow`: the server attributes what the user does to the
 * candidate on screen, so the client says which one VS Code shows, each time that changes (the
 * first when a suggestion appears, another when the user cycles with Alt+] / Alt+[).
 *
 * VS Code tells a provider which item it shows through `handleDidShowCompletionItem`. The
 * provider vscode-languageclient registers has no such method, and VS Code reads whether a
 * provider has it when the provider is registered, so `TabloopLanguageClient` puts this feature,
 * the same request and middleware plus that method, in place of the built-in one.
 */
import { randomUUID } from 'node:crypto';

import * as vscode from 'vscode';
import {
  type ClientCapabilities,
  type DocumentSelector,
  type FeatureClient,
  InlineCompletionRequest,
  type InlineCompletionOptions,
  type InlineCompletionRegistrationOptions,
  LanguageClient,
  type Middleware,
  type ServerCapabilities,
  TextDocumentLanguageFeature,
  type DynamicFeature,
  type StaticFeature,
} from 'vscode-languageclient/node';

import { ACCEPT_COMMAND, DID_SHOW_NOTIFICATION } from './protocol';

/** What VS Code calls on an inline completion provider (`inlineCompletionsAdditions`, not yet in @types/vscode 1.91). */
export interface ShowingInlineCompletionItemProvider extends vscode.InlineCompletionItemProvider {
  handleDidShowCompletionItem(item: vscode.InlineCompletionItem, updatedInsertText: string): void;
}

/** The tabloop decision id of an item: the argument of its `tabloop.accept` command. */
export function decisionIdOf(item: vscode.InlineCompletionItem): string | undefined {
  const command = item.command as { command?: string; arguments?: unknown[] } | undefined;
  const id = command?.command === ACCEPT_COMMAND ? command.arguments?.[0] : undefined;
  return typeof id === 'string' && id ? id : undefined;
}

/** Sends `tabloop/didShow` for the item shown, once per change of the item on screen. */
export class ShownReporter {
  private current: string | undefined;

  constructor(private readonly send: (decisionId: string) => void) {}

  shown(item: vscode.InlineCompletionItem): void {
    const decisionId = decisionIdOf(item);
    if (!decisionId || decisionId === this.current) return;
    this.current = decisionId;
    this.send(decisionId);
  }
}

type InlineFeatureClient = FeatureClient<Middleware>;

/** The provider: asks the server (through the middleware, as the built-in one does) and reports items shown. */
export function inlineCompletionProvider(client: InlineFeatureClient, reporter: ShownReporter): ShowingInlineCompletionItemProvider {
  const ask = async (
    document: vscode.TextDocument,
    position: vscode.Position,
    context: vscode.InlineCompletionContext,
    token: vscode.CancellationToken,
  ): Promise<vscode.InlineCompletionItem[] | vscode.InlineCompletionList | undefined | null> => {
    try {
      const params = client.code2ProtocolConverter.asInlineCompletionParams(document, position, context);
      const result = await client.sendRequest(InlineCompletionRequest.type, params, token);
      if (token.isCancellationRequested) return null;
      return await client.protocol2CodeConverter.asInlineCompletionResult(result, token);
    } catch (error) {
      return client.handleFailedRequest(InlineCompletionRequest.type, token, error, null);
    }
  };
  return {
    provideInlineCompletionItems: (document, position, context, token) => {
      const middleware = client.middleware.provideInlineCompletionItems;
      return middleware ? middleware(document, position, context, token, ask) : ask(document, position, context, token);
    },
    handleDidShowCompletionItem: (item) => reporter.shown(item),
  };
}

/** The inline completion feature, registering `inlineCompletionProvider`. */
export class ShowingInlineCompletionFeature extends TextDocumentLanguageFeature<
  boolean | InlineCompletionOptions,
  InlineCompletionRegistrationOptions,
  ShowingInlineCompletionItemProvider,
  Middleware
> {
  readonly reporter: ShownReporter;

  constructor(client: InlineFeatureClient) {
    super(client, InlineCompletionRequest.type);
    this.reporter = new ShownReporter((decisionId) => {
      if (client.isRunning()) void client.sendNotification(DID_SHOW_NOTIFICATION, { decisionId }).catch(() => undefined);
    });
  }

  fillClientCapabilities(capabilities: ClientCapabilities): void {
    capabilities.textDocument = capabilities.textDocument ?? {};
    capabilities.textDocument.inlineCompletion = { dynamicRegistration: true };
  }

  initialize(capabilities: ServerCapabilities, documentSelector: DocumentSelector | undefined): void {
    const options = this.getRegistrationOptions(documentSelector, capabilities.inlineCompletionProvider);
    if (options) this.register({ id: randomUUID(), registerOptions: options });
  }

  protected registerLanguageProvider(options: InlineCompletionRegistrationOptions): [vscode.Disposable, ShowingInlineCompletionItemProvider] {
    const provider = inlineCompletionProvider(this._client, this.reporter);
    const selector = this._client.protocol2CodeConverter.asDocumentSelector(options.documentSelector ?? []);
    return [vscode.languages.registerInlineCompletionItemProvider(selector, provider), provider];
  }
}

type Feature = StaticFeature | DynamicFeature<unknown>;

function isInlineCompletionFeature(feature: Feature): boolean {
  const registration = (feature as { registrationType?: { method?: string } }).registrationType;
  return registration?.method === InlineCompletionRequest.method;
}

/** The language client with `ShowingInlineCompletionFeature` in place of the built-in inline completion feature. */
export class TabloopLanguageClient extends LanguageClient {
  override registerFeature(feature: Feature): void {
    if (isInlineCompletionFeature(feature) && !(feature instanceof ShowingInlineCompletionFeature)) {
      super.registerFeature(new ShowingInlineCompletionFeature(this));
      return;
    }
    super.registerFeature(feature);
  }
}
