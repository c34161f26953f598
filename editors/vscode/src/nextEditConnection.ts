/* The language client as the next-edit controller sees it (nextEdit.ts's `NextEditConnection`). */
import type * as vscode from 'vscode';
import { ExecuteCommandRequest, State, type BaseLanguageClient } from 'vscode-languageclient/node';

import type { NextEditConnection } from './nextEdit';
import { NEXT_EDIT_CAPABILITY, NEXT_EDIT_REQUEST } from './protocol';

/** Whether the server's `initialize` answer offers next edits (`capabilities.experimental.tabloop.nextEdit`). */
export function offersNextEdit(capabilities: { experimental?: unknown } | undefined): boolean {
  const experimental = capabilities?.experimental as { tabloop?: Record<string, unknown> } | undefined;
  return experimental?.tabloop?.[NEXT_EDIT_CAPABILITY] === true;
}

/** Requests and notifications through the client `getClient` returns, while it runs. */
export function clientConnection(getClient: () => BaseLanguageClient | undefined): NextEditConnection {
  const running = () => {
    const client = getClient();
    return client?.state === State.Running ? client : undefined;
  };
  return {
    available: () => offersNextEdit(running()?.initializeResult?.capabilities),
    uri: (document: vscode.TextDocument) => getClient()?.code2ProtocolConverter.asUri(document.uri) ?? document.uri.toString(),
    request: (params, token) => {
      const client = running();
      return client ? client.sendRequest(NEXT_EDIT_REQUEST, params, token) : Promise.reject(new Error('the server is not running'));
    },
    notify: (method, params) => void running()?.sendNotification(method, params).catch(() => undefined),
    executeCommand: (command, args) => running()?.sendRequest(ExecuteCommandRequest.type, { command, arguments: args }) ?? Promise.resolve(undefined),
  };
}
