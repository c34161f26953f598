/* What the smoke tests share: the project's Python, the tiny test model, a source file. */
import { execFile } from 'node:child_process';

import { REPO_ROOT } from '../paths';

export const READY_TIMEOUT_MS = 180_000;

/** A real function, mid-typing: the cursor goes after "    result = " (line 3, character 13). */
export const SOURCE = [
  'def join_words(words, separator=" "):',
  '    """Join words with a separator, skipping empty ones."""',
  '    kept = [word for word in words if word]',
  '    result = ',
  '    return result',
  '',
].join('\n');
export const CURSOR = { line: 3, character: 13 };

/** A second file, for the codebase search to find. */
export const SETTINGS_LOADER = [
  'import tomllib',
  'from pathlib import Path',
  '',
  '',
  'def load_settings(path: Path) -> dict:',
  '    """Read the user\'s TOML settings file and return its tables as a dictionary."""',
  '    with path.open("rb") as handle:',
  '        return tomllib.load(handle)',
  '',
].join('\n');
export const SEARCH_QUERY = 'read the TOML settings file';

function run(command: string, args: string[], options: { cwd: string; timeout: number }): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(command, args, options, (error, stdout, stderr) => (error ? reject(new Error(`${error.message}\n${stderr}`)) : resolve(stdout)));
  });
}

/** The tiny test model: `TABLOOP_TEST_MODEL`, else built (once, cached) by the Python test support. */
export async function tinyModel(python: string): Promise<string> {
  if (process.env.TABLOOP_TEST_MODEL) return process.env.TABLOOP_TEST_MODEL;
  const code = 'from tests.support.tiny_model import build_tiny_model; print(build_tiny_model())';
  const out = await run(python, ['-c', code], { cwd: REPO_ROOT, timeout: 900_000 });
  return out.trim().split('\n').pop()!;
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
