-- Generated from lsp_server/protocol.py by editors/vscode/scripts/gen_protocol.py; do not edit.
return {
  CONFIGURATION_SECTION = 'tabloop',
  ACCEPT_COMMAND = 'tabloop.accept',
  STATUS_REQUEST = 'tabloop/status',
  TIMINGS_REQUEST = 'tabloop/timings',
  SEARCH_REQUEST = 'tabloop/search',
  DID_SHOW_NOTIFICATION = 'tabloop/didShow',
  DID_DISMISS_NOTIFICATION = 'tabloop/didDismiss',
  TELEMETRY_ENABLED_NOTIFICATION = 'tabloop/telemetryEnabled',
  MODEL_PROGRESS_TITLE = 'tabloop',
  INDEX_PROGRESS_TITLE = 'tabloop index',
  ADAPTER_PROGRESS_TITLE = 'tabloop adapter',
  MODEL_PROGRESS_TOKEN_PREFIX = 'tabloop-model-',
  INDEX_PROGRESS_TOKEN_PREFIX = 'tabloop-index-',
  ADAPTER_PROGRESS_TOKEN_PREFIX = 'tabloop-adapter-',
  SEARCH_K_DEFAULT = 10,
  SEARCH_K_MAX = 100,
}
