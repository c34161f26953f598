/*
 * Records the `initialize` params vscode-languageclient sends, as tests/profiles/vscode.json.
 * Runs the real LanguageClient (in the mocked `vscode` host) against the recording stand-in server:
 *   node --require ./out/test/mock/register.js out/test/captureProfile.js PYTHON RECORD_SERVER OUT
 */
import { LanguageClient } from 'vscode-languageclient/node';

export async function captureProfile(python: string, recordServer: string, out: string): Promise<void> {
  const client = new LanguageClient(
    'tabloop',
    'tabloop',
    { command: python, args: [recordServer, out] },
    { documentSelector: [{ scheme: 'file' }], initializationOptions: { telemetry: { clientEnabled: false } } },
  );
  await client.start();
  await client.stop(5000);
}

if (require.main === module) {
  const [python, recordServer, out] = process.argv.slice(2);
  if (!python || !recordServer || !out) throw new Error('usage: captureProfile PYTHON RECORD_SERVER OUT');
  captureProfile(python, recordServer, out).then(
    () => process.stdout.write(`recorded ${out}\n`),
    (error: unknown) => {
      process.stderr.write(`${String(error)}\n`);
      process.exit(1);
    },
  );
}
