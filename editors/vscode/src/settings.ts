/*
 * The settings the server receives. Only values the user set explicitly are sent: the server
 * layers its own sources (user file, `tabloop.toml`, environment) under the client's, so sending
 * VS Code's defaults would hide a workspace's `tabloop.toml`.
 */

import { CONFIGURATION_SECTION } from './protocol';

const PREFIX = `${CONFIGURATION_SECTION}.`;

/** Keys of the `tabloop` section that configure the extension itself, never sent to the server. */
export const CLIENT_ONLY_KEYS = ['server.path', 'trace.server'];

/** The part of `vscode.WorkspaceConfiguration` used here. */
export interface ConfigurationReader {
  inspect<T>(key: string):
    | { globalValue?: T; workspaceValue?: T; workspaceFolderValue?: T; defaultValue?: T }
    | undefined;
}

export type SettingsObject = { [key: string]: unknown };

/** The `tabloop.*` keys (without the prefix) that are server settings, from the contributed properties. */
export function serverKeys(contributedProperties: Record<string, unknown>): string[] {
  return Object.keys(contributedProperties)
    .filter((key) => key.startsWith(PREFIX))
    .map((key) => key.slice(PREFIX.length))
    .filter((key) => !CLIENT_ONLY_KEYS.includes(key));
}

export function explicitValue<T>(config: ConfigurationReader, key: string): T | undefined {
  const info = config.inspect<T>(key);
  if (!info) return undefined;
  // Most specific scope first, as VS Code resolves them.
  return info.workspaceFolderValue ?? info.workspaceValue ?? info.globalValue;
}

function setPath(target: SettingsObject, dotted: string, value: unknown): void {
  const parts = dotted.split('.');
  let node = target;
  for (const part of parts.slice(0, -1)) {
    const next = node[part];
    node[part] = typeof next === 'object' && next !== null ? next : {};
    node = node[part] as SettingsObject;
  }
  node[parts[parts.length - 1]!] = value;
}

/**
 * The nested, camelCase settings object for `initializationOptions` and for the `tabloop` section
 * of `workspace/configuration`: explicitly set values, plus the editor's telemetry switch.
 */
export function serverSettings(config: ConfigurationReader, keys: readonly string[], telemetryEnabled: boolean): SettingsObject {
  const settings: SettingsObject = {};
  for (const key of keys) {
    const value = explicitValue(config, key);
    if (value !== undefined) setPath(settings, key, value);
  }
  setPath(settings, 'telemetry.clientEnabled', telemetryEnabled);
  return settings;
}
