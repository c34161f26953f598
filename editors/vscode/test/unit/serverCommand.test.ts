import * as assert from 'node:assert/strict';
import { promises as fs } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { describe, it } from 'node:test';

import {
  CLI_SERVER_ARGS,
  PYTHON_SERVER_ARGS,
  isFound,
  isPythonExecutable,
  notFoundMessage,
  resolveServer,
  which,
  type LaunchProbe,
} from '../../src/serverCommand';

function probe(overrides: Partial<LaunchProbe> = {}): LaunchProbe & { imported: string[][] } {
  const imported: string[][] = [];
  return {
    configuredPath: '',
    pythonInterpreter: async () => undefined,
    canImportServer: async (python) => {
      imported.push(python);
      return false;
    },
    which: async () => undefined,
    env: { PATH: '/usr/bin', HOME: '/home/me' },
    imported,
    ...overrides,
  };
}

describe('resolveServer', () => {
  it('uses tabloop.server.path as a tabloop executable', async () => {
    const launch = await resolveServer(probe({ configuredPath: '/opt/tabloop/bin/tabloop' }));
    assert.ok(isFound(launch));
    assert.equal(launch.command, '/opt/tabloop/bin/tabloop');
    assert.deepEqual(launch.args, CLI_SERVER_ARGS);
    assert.equal(launch.source, 'setting');
  });

  it('runs a configured Python interpreter as python -m lsp_server', async () => {
    const launch = await resolveServer(probe({ configuredPath: ' /venv/bin/python3.11 ' }));
    assert.ok(isFound(launch));
    assert.equal(launch.command, '/venv/bin/python3.11');
    assert.deepEqual(launch.args, ['-m', 'lsp_server', '--stdio']);
  });

  it('prefers the selected interpreter when it has the server, keeping its prefix', async () => {
    const p = probe({
      pythonInterpreter: async () => ['conda', 'run', '-n', 'dev', 'python'],
      canImportServer: async () => true,
      which: async () => '/usr/local/bin/tabloop',
    });
    const launch = await resolveServer(p);
    assert.ok(isFound(launch));
    assert.equal(launch.source, 'python');
    assert.equal(launch.command, 'conda');
    assert.deepEqual(launch.args, ['run', '-n', 'dev', 'python', ...PYTHON_SERVER_ARGS]);
    assert.deepEqual(launch.env, { PATH: '/usr/bin', HOME: '/home/me' });
  });

  it('falls back to PATH when the interpreter lacks the server', async () => {
    const p = probe({ pythonInterpreter: async () => ['/usr/bin/python3'], which: async (name) => `/usr/local/bin/${name}` });
    const launch = await resolveServer(p);
    assert.deepEqual(p.imported, [['/usr/bin/python3']]);
    assert.ok(isFound(launch));
    assert.equal(launch.source, 'path');
    assert.equal(launch.command, '/usr/local/bin/tabloop');
    assert.deepEqual(launch.args, ['serve', '--stdio']);
  });

  it('explains every place it looked when nothing is found', async () => {
    const result = await resolveServer(probe({ pythonInterpreter: async () => ['/usr/bin/python3'] }));
    assert.ok(!isFound(result));
    const message = notFoundMessage(result);
    assert.match(message, /tabloop\.server\.path/);
    assert.match(message, /pip install tabloop/);
    assert.match(message, /\/usr\/bin\/python3\) cannot import lsp_server/);
    assert.match(message, /no `tabloop` executable on PATH/);
  });

  it('copies the environment so the launch cannot change it', async () => {
    const env = { PATH: '/bin' };
    const launch = await resolveServer(probe({ configuredPath: 'tabloop', env }));
    assert.ok(isFound(launch));
    launch.env.EXTRA = '1';
    assert.deepEqual(env, { PATH: '/bin' });
  });
});

describe('isPythonExecutable', () => {
  for (const [file, expected] of [
    ['/usr/bin/python', true],
    ['/usr/bin/python3', true],
    ['C:\\Python311\\python.exe', process.platform === 'win32'],
    ['/venv/bin/python3.11', true],
    ['/usr/local/bin/tabloop', false],
    ['/home/me/pythonista', false],
  ] as const) {
    it(`${file} -> ${expected}`, () => assert.equal(isPythonExecutable(file), expected));
  }
});

describe('which', () => {
  it('finds executables and skips non-executable files and directories', async () => {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'tabloop-which-'));
    try {
      const first = path.join(dir, 'a');
      const second = path.join(dir, 'b');
      await fs.mkdir(first);
      await fs.mkdir(second);
      await fs.writeFile(path.join(first, 'tabloop'), 'not executable', { mode: 0o644 });
      await fs.mkdir(path.join(first, 'other'));
      await fs.writeFile(path.join(second, 'tabloop'), '#!/bin/sh\n', { mode: 0o755 });
      const env = { PATH: [first, second].join(path.delimiter) };
      assert.equal(await which('tabloop', env), path.join(second, 'tabloop'));
      assert.equal(await which('other', env), undefined);
      assert.equal(await which('tabloop', { PATH: '' }), undefined);
    } finally {
      await fs.rm(dir, { recursive: true, force: true });
    }
  });
});
