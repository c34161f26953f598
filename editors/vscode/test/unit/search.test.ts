import * as assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { hitItems, type SearchHit } from '../../src/search';

function hit(uri: string, line: number, score: number, preview: string): SearchHit {
  return { uri, range: { start: { line, character: 0 }, end: { line: line + 3, character: 0 } }, score, preview };
}

describe('hitItems', () => {
  it('orders by score and labels file and 1-based line', () => {
    const items = hitItems(
      [hit('file:///ws/src/a.py', 9, 0.4, 'def a():\n    pass'), hit('file:///ws/lib/b.py', 0, 0.9, 'class B:')],
      (uri) => uri.replace('file:///ws/', ''),
    );
    assert.deepEqual(
      items.map((i) => [i.label, i.description, i.detail]),
      [
        ['$(file-code) b.py:1', 'lib/b.py · 0.90', 'class B:'],
        ['$(file-code) a.py:10', 'src/a.py · 0.40', 'def a(): ⏎ pass'],
      ],
    );
    assert.equal(items[0]!.hit.uri, 'file:///ws/lib/b.py');
  });

  it('shortens long previews', () => {
    const [item] = hitItems([hit('file:///x.py', 0, 1, 'x'.repeat(500))], (uri) => uri);
    assert.equal(item!.detail.length, 160);
    assert.ok(item!.detail.endsWith('...'));
  });
});
