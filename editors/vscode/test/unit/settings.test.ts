import * as assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { serverKeys, serverSettings, type ConfigurationReader } from '../../src/settings';

type Scopes = { global?: Record<string, unknown>; workspace?: Record<string, unknown>; folder?: Record<string, unknown> };

function reader(scopes: Scopes): ConfigurationReader {
  return {
    inspect<T>(key: string) {
      return {
        defaultValue: undefined as T | undefined,
        globalValue: scopes.global?.[key] as T | undefined,
        workspaceValue: scopes.workspace?.[key] as T | undefined,
        workspaceFolderValue: scopes.folder?.[key] as T | undefined,
      };
    },
  };
}

const KEYS = serverKeys({
  'tabloop.cacheDir': {},
  'tabloop.completion.model': {},
  'tabloop.completion.maxNewTokens': {},
  'tabloop.index.exclude': {},
  'tabloop.server.path': {},
  'tabloop.trace.server': {},
  'editor.fontSize': {},
});

describe('serverKeys', () => {
  it('keeps server settings and drops the extension-only ones', () => {
    assert.deepEqual(KEYS, ['cacheDir', 'completion.model', 'completion.maxNewTokens', 'index.exclude']);
  });
});

describe('serverSettings', () => {
  it('sends only explicit values, nested, with the telemetry switch', () => {
    const settings = serverSettings(
      reader({ global: { 'completion.model': '/models/tiny', 'completion.maxNewTokens': 16, 'server.path': '/x' } }),
      KEYS,
      false,
    );
    assert.deepEqual(settings, {
      completion: { model: '/models/tiny', maxNewTokens: 16 },
      telemetry: { clientEnabled: false },
    });
  });

  it('lets the most specific scope win', () => {
    const settings = serverSettings(
      reader({
        global: { cacheDir: '/global', 'completion.model': 'global-model' },
        workspace: { cacheDir: '/workspace', 'completion.model': 'ws-model' },
        folder: { 'completion.model': 'folder-model' },
      }),
      KEYS,
      true,
    );
    assert.deepEqual(settings, {
      cacheDir: '/workspace',
      completion: { model: 'folder-model' },
      telemetry: { clientEnabled: true },
    });
  });

  it('keeps falsy values that were set on purpose', () => {
    const settings = serverSettings(reader({ global: { cacheDir: '', 'index.exclude': [] } }), KEYS, true);
    assert.deepEqual(settings, { cacheDir: '', index: { exclude: [] }, telemetry: { clientEnabled: true } });
  });
});
