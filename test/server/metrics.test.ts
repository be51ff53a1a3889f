// Sync records reach the metrics: services left out of an atomic transaction (a gauge of the
// last sync) and objects the kernel refused (a counter).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Metrics } from '../../src/server/servers.ts';
import type { SyncRecord } from '../../src/sync/controller.ts';

const rec = (stats: SyncRecord['stats']): SyncRecord => ({ at: Date.now(), full: true, durationMs: 5, ok: true, stats, changed: [] });

async function value(m: Metrics, name: string): Promise<number> {
  const text = await m.registry.metrics();
  const line = text.split('\n').find((l) => l.startsWith(`${name} `));
  assert.ok(line, `${name} exported`);
  return Number(line.split(' ')[1]);
}

test('excluded services and refused objects are exported per sync', async () => {
  const m = new Metrics();
  m.record(rec({ rulesWritten: 3, rulesTotal: 3, excludedServices: ['ns/a', 'ns/b'], rejected: 2 }), 4);
  assert.equal(await value(m, 'kproxy_sync_excluded_services'), 2);
  assert.equal(await value(m, 'kproxy_sync_rejected_objects_total'), 2);
  m.record(rec({ rulesWritten: 1, rulesTotal: 3, rejected: 1 }), 4);
  assert.equal(await value(m, 'kproxy_sync_excluded_services'), 0, 'the gauge follows the last sync');
  assert.equal(await value(m, 'kproxy_sync_rejected_objects_total'), 3, 'the counter adds up');
});
