/*
 * How a next-edit prediction looks in the editor, with the stable decoration API: deleted text
 * struck through on the diff editor's "removed" background, inserted text after it on the
 * "inserted" background (an insertion at the cursor as ghost text instead), and, when the edit is
 * off screen, a hint at the cursor that Tab jumps there. The whole inserted text is in the hover.
 */
import * as vscode from 'vscode';

import { oneLine, type LspPosition, type LspRange, type RenderPlan } from './nextEditPlan';

export const JUMP_HINT = 'Tab: jump to the next edit';

const position = (p: LspPosition) => new vscode.Position(p.line, p.character);
const range = (r: LspRange) => new vscode.Range(position(r.start), position(r.end));

/** What `NextEditView.show` drew, per decoration type (read by tests). */
export interface DrawnDecorations {
  deleted: vscode.DecorationOptions[];
  inserted: vscode.DecorationOptions[];
  ghost: vscode.DecorationOptions[];
  jump: vscode.DecorationOptions[];
}

export class NextEditView implements vscode.Disposable {
  private readonly types = {
    deleted: vscode.window.createTextEditorDecorationType({
      backgroundColor: new vscode.ThemeColor('diffEditor.removedTextBackground'),
      textDecoration: 'line-through',
    }),
    inserted: vscode.window.createTextEditorDecorationType({
      after: { backgroundColor: new vscode.ThemeColor('diffEditor.insertedTextBackground') },
    }),
    ghost: vscode.window.createTextEditorDecorationType({
      after: { color: new vscode.ThemeColor('editorGhostText.foreground') },
    }),
    jump: vscode.window.createTextEditorDecorationType({
      after: { color: new vscode.ThemeColor('editorGhostText.foreground'), margin: '0 0 0 2em' },
    }),
  };

  /** Draws `plan` in `editor`; `jump` (the edit's first line) adds the jump hint at `hintAt`, the end of the cursor's line. */
  show(editor: vscode.TextEditor, plan: RenderPlan, jump?: { line: number; hintAt: LspPosition }): DrawnDecorations {
    const drawn: DrawnDecorations = { deleted: [], inserted: [], ghost: [], jump: [] };
    const hover = new vscode.MarkdownString('**tabloop: next edit** (Tab accepts, Escape dismisses)');
    for (const deleted of plan.deletions) drawn.deleted.push({ range: range(deleted), hoverMessage: hover });
    for (const { at, text, ghost } of plan.insertions) {
      const where = new vscode.Range(position(at), position(at));
      const details = new vscode.MarkdownString().appendCodeblock(text);
      (ghost ? drawn.ghost : drawn.inserted).push({
        range: where,
        hoverMessage: [hover, details],
        renderOptions: { after: { contentText: oneLine(text) } },
      });
    }
    if (jump) {
      const where = new vscode.Range(position(jump.hintAt), position(jump.hintAt));
      drawn.jump.push({ range: where, renderOptions: { after: { contentText: `⇥ ${JUMP_HINT} (line ${jump.line + 1})` } } });
    }
    for (const key of Object.keys(this.types) as (keyof DrawnDecorations)[]) editor.setDecorations(this.types[key], drawn[key]);
    return drawn;
  }

  clear(editor: vscode.TextEditor): void {
    for (const type of Object.values(this.types)) editor.setDecorations(type, []);
  }

  dispose(): void {
    for (const type of Object.values(this.types)) type.dispose();
  }
}
