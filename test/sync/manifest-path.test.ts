// kproxy's own path from a manifest write to Proxier.sync: a change of one small
// file among 2,000 Services costs O(that file), counted, not timed: the source stats and
// reads that file only and delivers its one object, the trackers take one event, and the
// node view decides one port again; the proxier is told that one service changed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pino from 'pino';
import { resolveConfig } from '../../src/config/config.ts';
import { nodeViewWork, type PlanInput } from '../../src/core/nodeview.ts';
import type { CommandRunner } from '../../src/kernel/runner.ts';
import type { ModeModule, Proxier } from '../../src/modes/types.ts';
import { ManifestsSource } from '../../src/sources/manifests.ts';
import { ProxyController } from '../../src/sync/controller.ts';
import { waitFor } from '../support/wait.ts';
import { makeService, makeSlice } from '../support/builders.ts';

const N = 2000;
const ip = (base: string, i: number) => `${base}.${(i + 1) >> 8}.${(i + 1) & 255}`;
const service = (i: number) =>
  makeService('bench', `svc-${i}`, { type: 'ClusterIP', clusterIP: ip('172.30', i), ports: [{ name: 'http', protocol: 'TCP', port: 80, targetPort: 8080 }] });
const slice = (i: number, count: number) =>
  makeSlice('bench', `svc-${i}`, {
    name: `svc-${i}-abc`,
    endpoints: Array.from({ length: count }, (_, k) => ({ ip: ip(`10.${180 + k}`, i), ready: true })),
    ports: [{ name: 'http', port: 8080 }],
  });
const docs = (objs: unknown[]) => objs.map((o) => `---\n${JSON.stringify(o)}\n`).join('');

test(`one slice file rewritten among ${N} Services: O(1) work from the write to Proxier.sync`, { timeout: 180_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kproxy-path-'));
  // every Service and most slices in one big file; 20 slices in a file each (the ones that change)
  const hot = Array.from({ length: 20 }, (_, j) => j * 100 + 7);
  const big: unknown[] = [];
  for (let i = 0; i < N; i++) big.push(service(i), ...(hot.includes(i) ? [] : [slice(i, 2)]));
  writeFileSync(join(dir, 'services.yaml'), docs(big));
  for (const i of hot) writeFileSync(join(dir, `hot-${i}.yaml`), docs([slice(i, 2)]));

  const calls: Array<{ input: PlanInput; changed: Set<string>; full: boolean }> = [];
  const proxier: Proxier = {
    sync: async (input, changed, full) => {
      calls.push({ input, changed: new Set(changed), full });
      return { rulesWritten: 0, rulesTotal: 0 };
    },
    dump: () => '',
    stop: async () => {},
  };
  const mode = { name: 'iptables', render: () => '', cleanup: async () => {}, createProxier: async () => proxier } as unknown as ModeModule;
  const config = resolveConfig({ minSyncPeriod: '1ms' } as never, { mode: 'iptables', clusterCidr: '10.0.0.0/8' });
  const log = pino({ level: 'silent' });
  const runner = { run: async () => ({ code: 0, stdout: '', stderr: '' }) } as unknown as CommandRunner;
  // no poll during the test: only the watch event may trigger the scan
  const source = new ManifestsSource({ dir, nodeName: 'node-a', log, pollMs: 3_600_000 });
  const ctrl = new ProxyController({ config, nodeName: 'node-a', mode, allModes: { iptables: mode } as never, source, runner, log, skipCleanup: true, nodeIPs: () => ['192.168.0.2'], families: [4] });
  let events = 0;
  ctrl.onChange(() => void events++);
  try {
    await ctrl.start();
    await waitFor('the first sync', () => ctrl.history.some((r) => r.ok), 60_000);
    assert.equal(calls[0].full, true);
    assert.equal(calls[0].input.view!.ports.size, N);
    assert.equal(events, 2 * N, 'the first load: every object once');

    for (const [round, i] of [hot[3], hot[11], hot[3]].entries()) {
      await ctrl.loop.idle(30_000);
      const work = { ...source.work };
      const view = { ...nodeViewWork };
      const before = { calls: calls.length, events };
      const tmp = join(dir, `.tmp-${i}`);
      writeFileSync(tmp, docs([slice(i, 3 + round)]));
      renameSync(tmp, join(dir, `hot-${i}.yaml`));
      const call = await waitFor(`the sync of change ${round + 1}`, () => calls[before.calls], 60_000);
      await ctrl.loop.idle(30_000);
      const what = `change ${round + 1} (svc-${i})`;
      assert.equal(call.full, false, what);
      assert.deepEqual([...call.changed], [`bench/svc-${i}`], what);
      assert.equal(call.input.view!.ports.get(`bench/svc-${i}:http`)!.endpoints.length, 3 + round, what);
      assert.equal(events - before.events, 1, `${what}: one event from the source`);
      assert.ok(source.work.filesStatted - work.filesStatted <= 3, `${what}: stat calls ${source.work.filesStatted - work.filesStatted}`);
      assert.ok(source.work.filesRead - work.filesRead <= 2, `${what}: files read ${source.work.filesRead - work.filesRead}`);
      assert.ok(source.work.objectsConsidered - work.objectsConsidered <= 2, `${what}: objects looked at ${source.work.objectsConsidered - work.objectsConsidered}`);
      assert.equal(source.work.delivered - work.delivered, 1, what);
      assert.equal(nodeViewWork.incremental - view.incremental, 1, `${what}: an incremental node view`);
      assert.equal(nodeViewWork.portsVisited - view.portsVisited, 1, `${what}: one port decided again`);
    }
  } finally {
    await ctrl.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});
