/* What the smoke tests share: a scripted model served over loopback HTTP, source files, a query. */
import { spawn } from 'node:child_process';
import { promises as fs } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { performance } from 'node:perf_hooks';

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

/** What the scripted model says after "    result = " (SOURCE's cursor); any other prompt gets nothing. */
export const SUGGESTION = 'separator.join(kept)';
export const SCRIPT: ScriptedModelScript = { rules: { '    result = ': SUGGESTION }, default: '' };

/** The script of `tests.support.completion_server`: `rules[key]` answers code before the cursor ending with `key`. */
export interface ScriptedModelScript {
  rules: Record<string, string>;
  default?: string;
  token_delay_s?: number;
}

/** A running loopback OpenAI-compatible server that answers from a script. */
export interface ScriptedModelServer {
  /** Base URL ending in /v1, for `completion.httpUrl`. */
  url: string;
  /** Everything the server wrote to stderr so far (for failure messages). */
  stderr(): string;
  /** Closes its stdin (it stops on that); kills it if it has not exited after `graceMs`. */
  close(graceMs?: number): Promise<void>;
}

/**
 * Starts `python -m tests.support.completion_server --script FILE` from the repository root and
 * waits for the base URL it prints on its first stdout line. A model whose answers the test
 * chooses: the smoke tests are about the editor and the protocol, and must not depend on what a
 * real model generates on this CPU. The server is stopped (and its temp dir removed) on failure.
 */
export async function startScriptedModel(python: string, script: ScriptedModelScript, timeoutMs = 60_000): Promise<ScriptedModelServer> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'tabloop-script-'));
  const scriptPath = path.join(dir, 'script.json');
  await fs.writeFile(scriptPath, JSON.stringify(script));
  const child = spawn(python, ['-m', 'tests.support.completion_server', '--script', scriptPath], {
    cwd: REPO_ROOT,
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  child.stdin!.on('error', () => undefined); // the child may be gone when we close its stdin

  let closed: Promise<void> | undefined;
  const close = (graceMs = 5000): Promise<void> =>
    (closed ??= (async () => {
      if (child.exitCode === null && child.signalCode === null) {
        const exited = new Promise((resolve) => child.once('exit', resolve));
        child.stdin!.end();
        await Promise.race([exited, sleep(graceMs)]);
        if (child.exitCode === null && child.signalCode === null) {
          child.kill('SIGKILL');
          await exited;
        }
      }
      await fs.rm(dir, { recursive: true, force: true });
    })());

  try {
    const url = await new Promise<string>((resolve, reject) => {
      let stdout = '';
      const timer = setTimeout(() => fail(new Error(`the scripted model server printed no URL within ${timeoutMs} ms`)), timeoutMs);
      const onData = (chunk: Buffer) => {
        stdout += chunk.toString();
        const newline = stdout.indexOf('\n');
        if (newline >= 0) {
          cleanup();
          resolve(stdout.slice(0, newline).trim());
        }
      };
      const onExit = (code: number | null, signal: string | null) => fail(new Error(`the scripted model server exited (${code ?? signal}) before printing its URL`));
      const onError = (error: Error) => fail(error);
      function cleanup() {
        clearTimeout(timer);
        child.stdout!.off('data', onData);
        child.off('exit', onExit);
        child.off('error', onError);
      }
      function fail(error: Error) {
        cleanup();
        reject(error);
      }
      child.stdout!.on('data', onData);
      child.once('exit', onExit);
      child.once('error', onError);
    });
    if (!/^http:\/\/127\.0\.0\.1:\d+\/v1$/.test(url)) throw new Error(`unexpected first line from the scripted model server: ${JSON.stringify(url)}`);
    child.stdout!.resume(); // nothing more is expected; keep the pipe drained
    return { url, stderr: () => stderr, close };
  } catch (error) {
    await close(1000);
    throw new Error(`${(error as Error).message}\n${stderr.slice(-2000)}`);
  }
}

/** The `completion.*` settings (keys as under `tabloop.`) that make the server call the scripted model at `url`. */
export function scriptedCompletionSettings(url: string): Record<string, unknown> {
  return {
    'completion.runner': 'http',
    'completion.httpUrl': url,
    'completion.httpModel': 'scripted',
    'completion.fimTemplate': 'qwen',
    'completion.maxNewTokens': 24,
  };
}

/** The model id the server reports for the scripted model at `url` (the HTTP runner's `model@host`). */
export function scriptedModelId(url: string): string {
  return `scripted@${new URL(url).host}`;
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Polls `probe` until it gives something (not undefined, not false); fails after `timeoutMs`. */
export async function waitFor<T>(what: string, timeoutMs: number, probe: () => T | undefined | false | Promise<T | undefined | false>): Promise<T> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined && value !== false) return value;
    if (performance.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(25);
  }
}
