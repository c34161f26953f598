import * as assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { describeStatus, describeTraining, indexProgress, type ServerStatus } from '../../src/status';

const READY: ServerStatus = {
  version: '0.1.0',
  model: { state: 'ready', modelId: 'tiny', error: '' },
  policy: { version: 'v3' },
  telemetry: { level: 'metrics' },
  decisions: { shown: 4, accepted: 1 },
};

describe('describeStatus', () => {
  it('says it is starting before the first answer', () => {
    const view = describeStatus(undefined, true);
    assert.match(view.text, /sync~spin/);
    assert.equal(view.busy, true);
  });

  it('shows the loading model as busy', () => {
    const view = describeStatus({ ...READY, model: { state: 'loading' } }, true);
    assert.equal(view.text, '$(sync~spin) tabloop: loading model');
    assert.equal(view.busy, true);
  });

  it('shows the serving policy version when ready', () => {
    const view = describeStatus(READY, true);
    assert.equal(view.text, '$(sparkle) tabloop · policy v3');
    assert.equal(view.busy, false);
    assert.match(view.tooltip, /model: ready \(tiny\)/);
    assert.match(view.tooltip, /shown 4, accepted 1/);
    assert.match(view.tooltip, /telemetry: metrics/);
  });

  it('marks suggestions switched off', () => {
    assert.match(describeStatus(READY, false).text, /^\$\(circle-slash\)/);
  });

  it('says off when the server has completion disabled', () => {
    const view = describeStatus({ ...READY, model: { state: 'disabled' } }, false);
    assert.equal(view.text, '$(circle-slash) tabloop: off');
    assert.equal(view.busy, false);
  });

  it('reports a model error', () => {
    const view = describeStatus({ ...READY, model: { state: 'error', error: 'no such model' } }, true);
    assert.equal(view.error, true);
    assert.equal(view.busy, false);
    assert.match(view.tooltip, /no such model/);
  });

  it('summarises the index as the server reports it', () => {
    const index = { root: '/ws', state: 'indexing', files: 3, chunks: 40, stage: 'index', done: 3, total: 12, merkleRoot: 'ab12', error: '' };
    const view = describeStatus({ ...READY, index }, true);
    assert.equal(view.text, '$(sync~spin) tabloop: indexing 25%');
    assert.match(view.tooltip, /index: state indexing, files 3, chunks 40, done 3, total 12\n/);
  });

  it('shows indexing progress over readiness', () => {
    const view = describeStatus({ ...READY, index: { state: 'indexing', indexedFiles: 30, totalFiles: 120 } }, true);
    assert.equal(view.text, '$(sync~spin) tabloop: indexing 25%');
    assert.equal(view.busy, true);
    assert.match(view.tooltip, /index: state indexing\n/);
  });
});

describe('indexProgress', () => {
  for (const [index, expected] of [
    [undefined, undefined],
    [{ state: 'ready', indexedFiles: 10, totalFiles: 10 }, undefined],
    [{ state: 'disabled' }, undefined],
    [{ state: 'indexing', progress: 0.5 }, 'indexing 50%'],
    [{ state: 'scanning' }, 'scanning'],
    [{ state: 'new' }, 'indexing'],
    [{ state: 'failed', done: 1, total: 9 }, undefined],
    [{ filesIndexed: 1, filesTotal: 4 }, 'indexing 25%'],
    [{ done: 4, total: 4 }, undefined],
  ] as const) {
    it(`${JSON.stringify(index)} -> ${expected}`, () => assert.equal(indexProgress(index), expected));
  }
});

describe('describeTraining', () => {
  it('shows a run in progress, paused or judging', () => {
    const run = { step: 12, samples: 96, fraction: 0.4 };
    assert.equal(describeTraining({ state: 'training', run }), 'training 40% (step 12)');
    assert.equal(describeTraining({ state: 'paused', run }), 'paused 40% (step 12)');
    assert.equal(describeTraining({ state: 'judging', run }), 'judging 40% (step 12)');
  });

  it('says what it waits for, why it is off, and how the last run ended', () => {
    const waiting = describeTraining({
      state: 'waiting',
      reason: 'an idle editor',
      lastRun: { outcome: 'promoted', version: 'v0002' },
    });
    assert.equal(waiting, 'waiting for an idle editor; last run promoted v0002');
    assert.equal(describeTraining({ state: 'off', reason: 'training.auto is off' }), 'off (training.auto is off)');
    assert.equal(describeTraining(undefined), 'not reported');
  });

  it('is a line of the status tooltip', () => {
    const view = describeStatus({ ...READY, training: { state: 'paused', run: { step: 3 } } }, true);
    assert.match(view.tooltip, /training: paused \(step 3\)/);
  });
});
