import * as assert from 'node:assert/strict';
import { promises as fs } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { it } from 'node:test';

import { which } from '../../src/serverCommand';
import { captureProfile } from '../captureProfile';
import { PROFILES_DIR } from '../paths';

it('tests/profiles/vscode.json is what vscode-languageclient sends', async (t) => {
  // The stand-in server needs only the standard library: any Python 3 will do.
  const python = (await which('python3')) ?? (await which('python'));
  if (!python) {
    t.skip('no python3 on PATH to run tests/profiles/capture/record_server.py');
    return;
  }
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'tabloop-profile-'));
  try {
    const out = path.join(dir, 'vscode.json');
    await captureProfile(python, path.join(PROFILES_DIR, 'capture', 'record_server.py'), out);
    const fresh = JSON.parse(await fs.readFile(out, 'utf8'));
    const recorded = JSON.parse(await fs.readFile(path.join(PROFILES_DIR, 'vscode.json'), 'utf8'));
    assert.deepEqual(fresh, recorded, 'vscode-languageclient changed: recapture tests/profiles/vscode.json (see its README)');
    assert.deepEqual(fresh.capabilities.textDocument.inlineCompletion, { dynamicRegistration: true });
  } finally {
    await fs.rm(dir, { recursive: true, force: true });
  }
});
