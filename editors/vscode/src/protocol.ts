/* Generated from lsp_server/protocol.py by editors/vscode/scripts/gen_protocol.py; do not edit. */

export const CONFIGURATION_SECTION = 'tabloop';
export const ACCEPT_COMMAND = 'tabloop.accept';
export const STATUS_REQUEST = 'tabloop/status';
export const TIMINGS_REQUEST = 'tabloop/timings';
export const SEARCH_REQUEST = 'tabloop/search';
export const DID_SHOW_NOTIFICATION = 'tabloop/didShow';
export const DID_DISMISS_NOTIFICATION = 'tabloop/didDismiss';
export const TELEMETRY_ENABLED_NOTIFICATION = 'tabloop/telemetryEnabled';
export const NEXT_EDIT_REQUEST = 'textDocument/copilotInlineEdit';
export const TABLOOP_NEXT_EDIT_REQUEST = 'tabloop/nextEdit';
export const DID_SHOW_INLINE_EDIT_NOTIFICATION = 'textDocument/didShowInlineEdit';
export const NEXT_EDIT_SHOWN_NOTIFICATION = 'tabloop/nextEditShown';
export const NEXT_EDIT_REJECTED_NOTIFICATION = 'tabloop/nextEditRejected';
export const ACCEPT_NEXT_EDIT_COMMAND = 'tabloop.acceptNextEdit';
export const ACCEPT_NEXT_EDIT_TITLE = 'Accept next edit';
export const NEXT_EDIT_TIMINGS_REQUEST = 'tabloop/nextEditTimings';
export const NEXT_EDIT_CAPABILITY = 'nextEdit';
export const MODEL_PROGRESS_TITLE = 'tabloop';
export const INDEX_PROGRESS_TITLE = 'tabloop index';
export const ADAPTER_PROGRESS_TITLE = 'tabloop adapter';
export const MODEL_PROGRESS_TOKEN_PREFIX = 'tabloop-model-';
export const INDEX_PROGRESS_TOKEN_PREFIX = 'tabloop-index-';
export const ADAPTER_PROGRESS_TOKEN_PREFIX = 'tabloop-adapter-';
export const SEARCH_K_DEFAULT = 10;
export const SEARCH_K_MAX = 100;
