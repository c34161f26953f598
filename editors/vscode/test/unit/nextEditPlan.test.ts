import * as assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { offersNextEdit } from '../../src/nextEditConnection';
import { isOnScreen, offsetAfterApply, oneLine, readPrediction, renderPlan, type NextEditItem } from '../../src/nextEditPlan';

const URI = 'file:///ws/area.py';

function item(range: [number, number, number, number], text: string, id = 'p1', version = 4): NextEditItem {
  const [sl, sc, el, ec] = range;
  return {
    id,
    textDocument: { uri: URI, version },
    range: { start: { line: sl, character: sc }, end: { line: el, character: ec } },
    text,
    command: { title: 'Accept next edit', command: 'tabloop.acceptNextEdit', arguments: [id] },
  };
}

describe('reading an answer', () => {
  it('keeps the items of one prediction for the document and version asked about', () => {
    const edits = [item([1, 11, 1, 16], 'w'), item([1, 19, 1, 25], 'h')];
    const prediction = readPrediction({ edits }, URI, 4);
    assert.deepEqual(prediction, { id: 'p1', uri: URI, version: 4, items: edits });
  });

  it('is nothing for "no change", null, or an answer that breaks the protocol', () => {
    const cases: [string, unknown][] = [
      ['no change', { edits: [] }],
      ['null', null],
      ['no edits field', {}],
      ['another version', { edits: [item([0, 0, 0, 1], 'x', 'p1', 3)] }],
      ['another document', { edits: [{ ...item([0, 0, 0, 1], 'x'), textDocument: { uri: 'file:///ws/other.py', version: 4 } }] }],
      ['two predictions', { edits: [item([0, 0, 0, 1], 'x'), item([2, 0, 2, 1], 'y', 'p2')] }],
      ['overlapping ranges', { edits: [item([0, 0, 1, 4], 'x'), item([1, 2, 1, 5], 'y')] }],
      ['unsorted ranges', { edits: [item([3, 0, 3, 1], 'x'), item([1, 0, 1, 1], 'y')] }],
      ['an inverted range', { edits: [item([2, 5, 2, 1], 'x')] }],
      ['a negative position', { edits: [item([-1, 0, 0, 1], 'x')] }],
      ['an empty id', { edits: [item([0, 0, 0, 1], 'x', '')] }],
      ['edits that change nothing', { edits: [item([0, 3, 0, 3], '')] }],
    ];
    for (const [what, answer] of cases) assert.equal(readPrediction(answer, URI, 4), undefined, what);
  });

  it('accepts adjacent ranges (one ends where the next starts)', () => {
    assert.ok(readPrediction({ edits: [item([0, 0, 0, 4], 'a'), item([0, 4, 0, 6], 'b')] }, URI, 4));
  });
});

describe('what is drawn', () => {
  it('strikes deleted ranges and shows inserted text after them; an insertion at the cursor is ghost text', () => {
    const prediction = readPrediction(
      { edits: [item([1, 11, 1, 16], 'w'), item([2, 4, 2, 4], 'print(w)\n    '), item([5, 8, 5, 8], ', h')] },
      URI,
      4,
    )!;
    const plan = renderPlan(prediction, { line: 5, character: 8 });
    assert.deepEqual(plan.deletions, [prediction.items[0]!.range]);
    assert.deepEqual(plan.insertions, [
      { at: { line: 1, character: 16 }, text: 'w', ghost: false },
      { at: { line: 2, character: 4 }, text: 'print(w)\n    ', ghost: false },
      { at: { line: 5, character: 8 }, text: ', h', ghost: true },
    ]);
  });

  it('writes line breaks of an insertion as ⏎ on one line', () => {
    assert.equal(oneLine('a\nb\r\nc'), 'a ⏎ b ⏎ c');
  });

  it('is on screen only when every line it touches is visible', () => {
    const prediction = readPrediction({ edits: [item([10, 0, 10, 2], 'x'), item([14, 0, 14, 1], 'y')] }, URI, 4)!;
    const visible = (first: number, last: number) => [{ start: { line: first, character: 0 }, end: { line: last, character: 0 } }];
    assert.equal(isOnScreen(prediction, visible(0, 40)), true);
    assert.equal(isOnScreen(prediction, visible(0, 12)), false);
    assert.equal(isOnScreen(prediction, visible(30, 60)), false);
    assert.equal(isOnScreen(prediction, [...visible(0, 5), ...visible(9, 20)]), true);
  });
});

describe('the cursor after accepting', () => {
  it('ends up after the last inserted text, earlier edits accounted for', () => {
    const text = 'def area(w, h):\n    return width * height\n';
    const lineStarts = [0, 16, 42];
    const offsetAt = (p: { line: number; character: number }) => lineStarts[p.line]! + p.character;
    const prediction = readPrediction({ edits: [item([1, 11, 1, 16], 'w'), item([1, 19, 1, 25], 'h')] }, URI, 4)!;
    const offset = offsetAfterApply(prediction, offsetAt);
    const after = 'def area(w, h):\n    return w * h\n';
    assert.equal(after.slice(0, offset), 'def area(w, h):\n    return w * h');
    assert.equal(text.length - after.length, 9);
  });
});

describe('the server capability', () => {
  it('is read from capabilities.experimental.tabloop.nextEdit', () => {
    assert.equal(offersNextEdit({ experimental: { tabloop: { nextEdit: true } } }), true);
    assert.equal(offersNextEdit({ experimental: { tabloop: { nextEdit: false } } }), false);
    assert.equal(offersNextEdit({ experimental: { other: true } }), false);
    assert.equal(offersNextEdit({}), false);
    assert.equal(offersNextEdit(undefined), false);
  });
});
