/*
 * Where the language server comes from. In order: the `tabloop.server.path` setting, the Python
 * interpreter selected in the Python extension (when tabloop is installed in it), `tabloop` on
 * PATH. Pure logic over an injected `LaunchProbe`, so tests can drive every branch.
 */
import { execFile } from 'node:child_process';
import { constants as fsConstants, promises as fs } from 'node:fs';
import * as path from 'node:path';

export type ServerSource = 'setting' | 'python' | 'path';

/** The exact process the extension starts: command, arguments and environment. */
export interface ServerLaunch {
  command: string;
  args: string[];
  env: NodeJS.ProcessEnv;
  source: ServerSource;
}

export interface ServerNotFound {
  source: 'none';
  /** Why each place was passed over, for the log. */
  tried: string[];
}

export interface LaunchProbe {
  /** `tabloop.server.path`: a `tabloop` executable or a Python interpreter; empty when unset. */
  configuredPath: string;
  /** The interpreter the Python extension selected, as a command line (`[python]` or `[conda, run, ...]`). */
  pythonInterpreter(): Promise<string[] | undefined>;
  /** Whether `python` can import the server package. */
  canImportServer(python: string[]): Promise<boolean>;
  /** The full path of an executable found on PATH. */
  which(name: string): Promise<string | undefined>;
  env: NodeJS.ProcessEnv;
}

const PYTHON_NAME = /^python(\d+(\.\d+)*)?(\.exe)?$/i;

/** Arguments that start the server from a Python interpreter. */
export const PYTHON_SERVER_ARGS = ['-m', 'lsp_server', '--stdio'];
/** Arguments that start the server from the `tabloop` executable. */
export const CLI_SERVER_ARGS = ['serve', '--stdio'];

export function isPythonExecutable(file: string): boolean {
  return PYTHON_NAME.test(path.basename(file));
}

function launchFrom(commandLine: string[], serverArgs: string[], source: ServerSource, env: NodeJS.ProcessEnv): ServerLaunch {
  const [command, ...prefix] = commandLine;
  return { command: command!, args: [...prefix, ...serverArgs], env: { ...env }, source };
}

export async function resolveServer(probe: LaunchProbe): Promise<ServerLaunch | ServerNotFound> {
  const tried: string[] = [];
  const configured = probe.configuredPath.trim();
  if (configured) {
    // An explicit setting wins and is not second-guessed: a wrong path should fail loudly.
    const args = isPythonExecutable(configured) ? PYTHON_SERVER_ARGS : CLI_SERVER_ARGS;
    return launchFrom([configured], args, 'setting', probe.env);
  }
  tried.push('tabloop.server.path is not set');

  const python = await probe.pythonInterpreter();
  if (python && python.length > 0) {
    if (await probe.canImportServer(python)) return launchFrom(python, PYTHON_SERVER_ARGS, 'python', probe.env);
    tried.push(`the selected Python interpreter (${python.join(' ')}) cannot import lsp_server`);
  } else {
    tried.push('no Python interpreter selected (or the Python extension is not installed)');
  }

  const onPath = await probe.which('tabloop');
  if (onPath) return launchFrom([onPath], CLI_SERVER_ARGS, 'path', probe.env);
  tried.push('no `tabloop` executable on PATH');
  return { source: 'none', tried };
}

export function isFound(result: ServerLaunch | ServerNotFound): result is ServerLaunch {
  return result.source !== 'none';
}

/** The message shown when no server was found, with the fix. */
export function notFoundMessage(result: ServerNotFound): string {
  return (
    'tabloop: no language server found. Install it into the selected Python environment ' +
    '(`pip install tabloop`), put `tabloop` on PATH, or set `tabloop.server.path`. ' +
    `(${result.tried.join('; ')})`
  );
}

/** Finds an executable on PATH, honouring PATHEXT on Windows. */
export async function which(name: string, env: NodeJS.ProcessEnv = process.env): Promise<string | undefined> {
  const dirs = (env.PATH ?? env.Path ?? '').split(path.delimiter).filter(Boolean);
  const exts = process.platform === 'win32' ? (env.PATHEXT ?? '.EXE;.CMD;.BAT').split(';') : [''];
  for (const dir of dirs) {
    for (const ext of exts) {
      const candidate = path.join(dir, name + ext);
      try {
        const stat = await fs.stat(candidate);
        if (!stat.isFile()) continue;
        await fs.access(candidate, fsConstants.X_OK);
        return candidate;
      } catch {
        // not here
      }
    }
  }
  return undefined;
}

/** Runs `python -c "import lsp_server"` with a time limit. */
export function canImportServer(python: string[], env: NodeJS.ProcessEnv = process.env, timeoutMs = 15000): Promise<boolean> {
  const [command, ...prefix] = python;
  return new Promise((resolve) => {
    execFile(command!, [...prefix, '-c', 'import lsp_server'], { env, timeout: timeoutMs }, (error) => resolve(!error));
  });
}
