/* Where the repository, its Python environment and the test fixtures are, seen from out/test/. */
import { existsSync } from 'node:fs';
import * as path from 'node:path';

export const EXTENSION_DIR = path.resolve(__dirname, '..', '..');
export const REPO_ROOT = path.resolve(EXTENSION_DIR, '..', '..');
export const PROFILES_DIR = path.join(REPO_ROOT, 'tests', 'profiles');

/** The project's virtual environment interpreter (`TABLOOP_TEST_PYTHON` overrides), if present. */
export function venvPython(): string | undefined {
  const candidates = [
    process.env.TABLOOP_TEST_PYTHON,
    path.join(REPO_ROOT, '.venv', 'bin', 'python'),
    path.join(REPO_ROOT, '.venv', 'Scripts', 'python.exe'),
  ];
  return candidates.find((candidate): candidate is string => !!candidate && existsSync(candidate));
}
