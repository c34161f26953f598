/*
 * Next-edit predictions as the server sends them (`textDocument/copilotInlineEdit`), checked, and
 * what to draw for one: the ranges it deletes and the text it inserts. Plain data and LSP
 * positions only, so that it is tested without an editor.
 */

export interface LspPosition {
  line: number;
  character: number;
}

export interface LspRange {
  start: LspPosition;
  end: LspPosition;
}

/** One edit of a prediction; every item of an answer has the same id and document version. */
export interface NextEditItem {
  id: string;
  textDocument: { uri: string; version: number };
  range: LspRange;
  text: string;
  command?: { title: string; command: string; arguments?: unknown[] };
}

/** A checked answer: the edits of one prediction, sorted, for one version of one document. */
export interface Prediction {
  id: string;
  uri: string;
  version: number;
  items: NextEditItem[];
}

/** What to draw: ranges struck out, and text shown where it would go (ghost text at the cursor). */
export interface RenderPlan {
  deletions: LspRange[];
  insertions: { at: LspPosition; text: string; ghost: boolean }[];
}

export function comparePositions(a: LspPosition, b: LspPosition): number {
  return a.line - b.line || a.character - b.character;
}

function isPosition(value: unknown): value is LspPosition {
  const p = value as LspPosition | undefined;
  return !!p && Number.isInteger(p.line) && Number.isInteger(p.character) && p.line >= 0 && p.character >= 0;
}

function isItem(value: unknown): value is NextEditItem {
  const item = value as NextEditItem | undefined;
  return (
    !!item &&
    typeof item.id === 'string' &&
    item.id !== '' &&
    typeof item.text === 'string' &&
    typeof item.textDocument?.uri === 'string' &&
    Number.isInteger(item.textDocument?.version) &&
    isPosition(item.range?.start) &&
    isPosition(item.range?.end) &&
    comparePositions(item.range.start, item.range.end) <= 0
  );
}

/**
 * The prediction in a server's answer for the document `uri` at `version`, or undefined when the
 * answer is "no change", is for another document or version, or breaks the protocol (items of
 * several ids, overlapping or unsorted ranges, a malformed item).
 */
export function readPrediction(result: unknown, uri: string, version: number): Prediction | undefined {
  const edits = (result as { edits?: unknown } | null | undefined)?.edits;
  if (!Array.isArray(edits) || edits.length === 0 || !edits.every(isItem)) return undefined;
  const [first] = edits as NextEditItem[];
  const items = edits as NextEditItem[];
  if (items.some((item) => item.id !== first!.id || item.textDocument.uri !== uri || item.textDocument.version !== version)) return undefined;
  for (let i = 1; i < items.length; i += 1) {
    if (comparePositions(items[i - 1]!.range.end, items[i]!.range.start) > 0) return undefined;
  }
  if (items.every((item) => item.text === '' && comparePositions(item.range.start, item.range.end) === 0)) return undefined;
  return { id: first!.id, uri, version, items };
}

/** Deleted ranges and inserted texts; an insertion with nothing deleted at the cursor, on one line, is ghost text. */
export function renderPlan(prediction: Prediction, cursor: LspPosition): RenderPlan {
  const plan: RenderPlan = { deletions: [], insertions: [] };
  for (const { range, text } of prediction.items) {
    const empty = comparePositions(range.start, range.end) === 0;
    if (!empty) plan.deletions.push(range);
    if (text !== '') {
      const ghost = empty && comparePositions(range.start, cursor) === 0 && !text.includes('\n');
      plan.insertions.push({ at: range.end, text, ghost });
    }
  }
  return plan;
}

/** How an inserted text reads on one line (a decoration cannot break lines): line breaks as ⏎. */
export function oneLine(text: string): string {
  return text.replace(/\r?\n/g, ' ⏎ ');
}

/** The lines the prediction touches, first and last (0-based). */
export function lineSpan(prediction: Prediction): { first: number; last: number } {
  return { first: prediction.items[0]!.range.start.line, last: prediction.items.at(-1)!.range.end.line };
}

/** Whether the lines the prediction touches all lie within one of `visible` (the editor's visible ranges). */
export function isOnScreen(prediction: Prediction, visible: readonly LspRange[]): boolean {
  const { first, last } = lineSpan(prediction);
  return visible.some((range) => range.start.line <= first && last <= range.end.line);
}

/**
 * Where the cursor goes once the prediction is applied, as an offset in the new text: the end of
 * the last inserted text. `offsetAt` reads offsets in the document before the edit.
 */
export function offsetAfterApply(prediction: Prediction, offsetAt: (position: LspPosition) => number): number {
  let shift = 0;
  for (const item of prediction.items.slice(0, -1)) {
    shift += item.text.length - (offsetAt(item.range.end) - offsetAt(item.range.start));
  }
  const last = prediction.items.at(-1)!;
  return offsetAt(last.range.start) + shift + last.text.length;
}
