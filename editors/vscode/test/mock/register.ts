/* Loaded with `node --require`: makes `require('vscode')` resolve to the in-memory mock. */
import Module = require('node:module');
import * as path from 'node:path';

const mockPath = path.join(__dirname, 'vscode.js');
type Resolve = (request: string, ...rest: unknown[]) => string;
const internals = Module as unknown as { _resolveFilename: Resolve };
const original = internals._resolveFilename;
internals._resolveFilename = function (request: string, ...rest: unknown[]): string {
  return request === 'vscode' ? mockPath : original.call(this, request, ...rest);
};
