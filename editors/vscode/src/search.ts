/* The codebase search: a query, `tabloop/search`, a quick pick of hits, and a jump to the one picked. */

/** One hit of `tabloop/search` (`SearchHit` in lsp_server/protocol.py). */
export interface SearchHit {
  uri: string;
  range: { start: { line: number; character: number }; end: { line: number; character: number } };
  score: number;
  preview: string;
}

export interface HitItem {
  label: string;
  description: string;
  detail: string;
  hit: SearchHit;
}

export const SEARCH_RESULTS = 20;

/** Quick pick items for hits, best first; `relativePath` shortens a file URI for display. */
export function hitItems(hits: readonly SearchHit[], relativePath: (uri: string) => string): HitItem[] {
  return [...hits]
    .sort((a, b) => b.score - a.score)
    .map((hit) => {
      const file = relativePath(hit.uri);
      const name = file.split(/[\\/]/).pop() ?? file;
      const preview = hit.preview.split('\n').map((line) => line.trim()).filter(Boolean).join(' ⏎ ');
      return {
        label: `$(file-code) ${name}:${hit.range.start.line + 1}`,
        description: `${file} · ${hit.score.toFixed(2)}`,
        detail: preview.length > 160 ? `${preview.slice(0, 157)}...` : preview,
        hit,
      };
    });
}
