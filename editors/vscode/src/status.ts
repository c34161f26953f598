/* What the status bar item says, from the server's `tabloop/status` answer. */

export interface ServerStatus {
  version?: string;
  model?: { state?: string; modelId?: string; error?: string };
  index?: { [key: string]: unknown };
  policy?: { version?: string };
  telemetry?: { level?: string };
  decisions?: { [key: string]: number };
  training?: TrainingStatus;
}

/** The server's background training of the workspace's next adapter (docs/learning.md). */
export interface TrainingStatus {
  state?: string;
  reason?: string | null;
  run?: { step?: number; samples?: number; fraction?: number };
  lastRun?: { outcome?: string | null; version?: string | null; reason?: string };
}

export interface StatusView {
  text: string;
  tooltip: string;
  /** Still loading or indexing: poll again soon. */
  busy: boolean;
  error: boolean;
}

const BUSY_INDEX_STATES = new Set(['new', 'starting', 'loading', 'scanning', 'indexing', 'embedding', 'syncing']);
/** The index facts worth a tooltip line, in order; the rest (hashes, paths) stay in the details. */
const INDEX_SUMMARY_KEYS = ['state', 'files', 'chunks', 'done', 'total', 'error'];

function num(value: unknown): number | undefined {
  return typeof value === 'number' && Number.isFinite(value) ? value : undefined;
}

/** `indexing 40%` while the index is being built, otherwise undefined. */
export function indexProgress(index: ServerStatus['index']): string | undefined {
  if (!index) return undefined;
  const state = typeof index.state === 'string' ? index.state : undefined;
  const done = num(index.indexedFiles) ?? num(index.filesIndexed) ?? num(index.done);
  const total = num(index.totalFiles) ?? num(index.filesTotal) ?? num(index.total);
  const fraction = num(index.progress);
  const busy = state !== undefined ? BUSY_INDEX_STATES.has(state) : done !== undefined && total !== undefined && done < total;
  if (!busy) return undefined;
  if (done !== undefined && total !== undefined && total > 0) return `indexing ${Math.floor((100 * done) / total)}%`;
  if (fraction !== undefined) return `indexing ${Math.floor(100 * fraction)}%`;
  return state === 'scanning' ? 'scanning' : 'indexing';
}

function describeIndex(index: ServerStatus['index']): string {
  if (!index) return 'not reported';
  const known = INDEX_SUMMARY_KEYS.filter((key) => key in index);
  const keys = known.length > 0 ? known : Object.keys(index);
  const parts = keys
    .map((key) => [key, index[key]] as const)
    .filter(([, value]) => value !== '' && value !== null && typeof value !== 'object')
    .map(([key, value]) => `${key} ${String(value)}`);
  return parts.join(', ') || 'not reported';
}

/** `training 40% (step 12)`, `paused`, `waiting for ...`, `off (...)`, and the last run's outcome. */
export function describeTraining(training: TrainingStatus | undefined): string {
  if (!training) return 'not reported';
  const state = training.state ?? 'unknown';
  let now: string = state;
  if (state === 'training' || state === 'paused' || state === 'judging') {
    const fraction = num(training.run?.fraction);
    const step = num(training.run?.step);
    const done = fraction !== undefined ? ` ${Math.floor(100 * fraction)}%` : '';
    now = `${state}${done}${step !== undefined ? ` (step ${step})` : ''}`;
  } else if (training.reason) {
    now = state === 'waiting' ? `waiting for ${training.reason}` : `${state} (${training.reason})`;
  }
  const last = training.lastRun;
  if (!last?.outcome) return now;
  return `${now}; last run ${last.outcome}${last.version ? ` ${last.version}` : ''}`;
}

/** Status bar text and tooltip; `status` is undefined until the server answered once. */
export function describeStatus(status: ServerStatus | undefined, suggestionsEnabled: boolean): StatusView {
  if (!status) return { text: '$(sync~spin) tabloop', tooltip: 'tabloop: starting the language server', busy: true, error: false };
  const model = status.model ?? {};
  const policy = status.policy?.version || 'none';
  const decisions = status.decisions ?? {};
  const tooltip = [
    `tabloop ${status.version ?? ''}`.trim(),
    `model: ${model.state ?? 'unknown'}${model.modelId ? ` (${model.modelId})` : ''}${model.error ? `: ${model.error}` : ''}`,
    `policy: ${policy}`,
    `index: ${describeIndex(status.index)}`,
    `telemetry: ${status.telemetry?.level ?? 'unknown'}`,
    `training: ${describeTraining(status.training)}`,
    `suggestions: ${suggestionsEnabled ? 'on' : 'off'}; shown ${decisions.shown ?? 0}, accepted ${decisions.accepted ?? 0}`,
    'Click for details.',
  ].join('\n');

  if (model.state === 'error') return { text: '$(error) tabloop: model error', tooltip, busy: false, error: true };
  if (model.state === 'disabled') return { text: '$(circle-slash) tabloop: off', tooltip, busy: false, error: false };
  const indexing = indexProgress(status.index);
  if (model.state !== 'ready') {
    return { text: `$(sync~spin) tabloop: loading model${indexing ? `, ${indexing}` : ''}`, tooltip, busy: true, error: false };
  }
  if (indexing) return { text: `$(sync~spin) tabloop: ${indexing}`, tooltip, busy: true, error: false };
  const icon = suggestionsEnabled ? '$(sparkle)' : '$(circle-slash)';
  return { text: `${icon} tabloop · policy ${policy}`, tooltip, busy: false, error: false };
}

/** The lines of the status details shown by the `tabloop.showStatus` command. */
export function statusDetails(status: ServerStatus): string {
  return JSON.stringify(status, null, 2);
}
