// The scale bench's phases on the real kernel. It measures the nftables mode as shipped: from 1,000 Services the mode writes
// K tables `kube-proxy-<n>` (src/modes/nftables/shards.ts), not one `kube-proxy`. Real kernel,
// in namespaces the tests create and remove: the cold phase's read-back (bench/measure.ts)
// finds the changes in the shards, and the run phase's kernel poll (bench/kproxy-run.ts
// nftTableOf + endpointCheck) asks the table that holds the Service. And the cold phase's raw
// references can leave out the flushing iptables-restore (--raw-iptables-max: > 400 s at 50k).
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { measure } from '../../bench/measure.ts';
import { rawReferences } from '../../bench/cold.ts';
import { endpointCheck, kubeProxyTables, nftTableOf } from '../../bench/kproxy-run.ts';
import { Namespaces, TimedRunner } from '../../bench/netns.ts';
import { benchConfig, serviceName, Workload } from '../../bench/workload.ts';
import { NftExecutor } from '../../src/kernel/nft/exec.ts';
import { silentLogger } from '../../src/log.ts';
import { serviceKey } from '../../src/core/model.ts';
import { kubeProxyTableNames, shardOf, TABLE } from '../../src/modes/nftables/names.ts';
import { getMode } from '../../src/modes/registry.ts';

const nss = new Namespaces();
after(async () => {
  await nss.deleteAll();
});

test('nftTableOf: upstream\'s table below the threshold; the Service\'s shard among K listed tables; a missing table is an error', () => {
  assert.equal(nftTableOf(['kube-proxy', 'other'], 7), TABLE);
  const k = 4;
  const tables = Array.from({ length: k }, (_, s) => `kube-proxy-${s}`);
  const seen = new Set<string>();
  for (let i = 0; i < 40; i++) {
    const t = nftTableOf([...tables, 'filter'], i);
    assert.equal(t, `kube-proxy-${shardOf(serviceKey('bench', serviceName(i)), k)}`);
    seen.add(t);
  }
  assert.ok(seen.size > 1, 'the Services spread over the tables');
  assert.throws(() => nftTableOf(['filter'], 1), /KPROXY_BENCH_RUN: no kube-proxy table/);
  // K = 3 listed but the Service's shard for K = 3 missing: refused, not guessed
  const i = [...Array(40).keys()].find((x) => shardOf(serviceKey('bench', serviceName(x)), 3) === 2)!;
  assert.throws(() => nftTableOf(['kube-proxy-0', 'kube-proxy-1', 'kube-proxy-5'], i), /is not in the kernel/);
});

test('cold phase at 1,000 Services: kproxy\'s sharded tables are read back and hold the changes', { timeout: 120_000 }, async () => {
  const s = await measure('nftables', getMode('nftables'), nss, { n: 1000, endpoints: 2, rep: 0, changes: 2, raw: false, verify: true, rawTimeoutMs: 60_000 });
  assert.equal(s.error, undefined, s.error);
  assert.equal(s.changes.length, 2);
  assert.deepEqual(s.kernel?.tables, ['kube-proxy-0', 'kube-proxy-1'], 'K = 2 at 1,000 Services, no `kube-proxy` table');
  assert.equal(s.kernel?.changesPresent, true, 'the endpoints the changes added are in the shards');
});

test('run phase\'s kernel poll at 1,000 Services: the endpoint chain is found in its Service\'s shard, not in the others', { timeout: 120_000 }, async () => {
  const w = new Workload(1000, 2, benchConfig('nftables'));
  const ns = await nss.create('shp');
  const runner = new TimedRunner(ns);
  const proxier = await getMode('nftables').createProxier({ config: w.config, log: silentLogger(), runner });
  try {
    await proxier.sync(w.input(), w.serviceKeys, true);
    const i = 321;
    const changed = w.addEndpoint(i);
    await proxier.sync(w.input(), changed, false);
    const ep = w.newestEndpoint(i);
    // another program's table: never taken for one of kproxy's
    assert.equal((await runner.run('nft', ['add', 'table', 'ip', 'kube-proxy-x'], { timeoutMs: 10_000 })).code, 0);
    const tables = await kubeProxyTables(runner);
    assert.deepEqual([...tables].sort(), (await new NftExecutor(runner).existingTables('ip', kubeProxyTableNames())).sort(), 'the netlink dump finds what kproxy\'s probe by name finds');
    assert.equal(tables.length, 2);
    const table = nftTableOf(tables, i);
    const poll = async (t: string, e: string) => {
      const c = endpointCheck('nftables', i, e, t);
      return (await runner.run(c.cmd, c.args, { timeoutMs: 20_000 })).code;
    };
    assert.equal(await poll(table, ep), 0, `the new endpoint's chain in ${table}`);
    assert.equal(await poll(tables.find((t) => t !== table)!, ep), 1, 'not in the other shard');
    assert.equal(await poll(table, ep.replace(/:8080$/, ':9999')), 1, 'a chain that does not exist');
  } finally {
    await proxier.stop();
    await nss.delete(ns);
  }
});

test('cold phase\'s raw references: the flushing iptables-restore runs unless left out; nft -f always', { timeout: 60_000 }, async () => {
  const all = await rawReferences(nss, 20, 2, ['iptables', 'iptables-legacy', 'nftables'], 30_000);
  for (const k of ['iptablesFlush', 'legacyFlush', 'nft'] as const) assert.ok(all[k]! > 0 && Number.isFinite(all[k]), `${k}: ${all[k]}`);
  const some = await rawReferences(nss, 20, 2, ['iptables', 'iptables-legacy', 'nftables'], 30_000, false);
  assert.equal(some.iptablesFlush, undefined);
  assert.equal(some.legacyFlush, undefined);
  assert.ok(some.nft! > 0 && Number.isFinite(some.nft));
});
