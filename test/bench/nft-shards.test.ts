// The sharding experiment's pure parts (bench/nft-shards.ts): a stable assignment, tables
// renamed in every command, and the one-endpoint transaction in kproxy's partial forms.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { buildShards, renameTable, shardOf } from '../../bench/nft-shards.ts';

test('shardOf is stable, in range and spreads Services', () => {
  const keys = Array.from({ length: 1000 }, (_, i) => `bench/svc-${String(i).padStart(5, '0')}`);
  const counts = new Array<number>(8).fill(0);
  for (const k of keys) {
    const s = shardOf(k, 8);
    assert.equal(shardOf(k, 8), s);
    assert.ok(s >= 0 && s < 8);
    counts[s]++;
  }
  assert.ok(Math.min(...counts) > 60, `uneven: ${counts.join(',')}`);
  assert.equal(shardOf(keys[0], 1), 0);
});

test('each shard is a complete table of its own Services, renamed in every command', () => {
  const shards = buildShards(20, 2, 4);
  assert.deepEqual(shards.flatMap((s) => s.services).sort((a, b) => a - b), Array.from({ length: 20 }, (_, i) => i));
  for (const [s, sh] of shards.entries()) {
    const text = sh.render();
    const lines = text.split('\n').filter(Boolean);
    assert.ok(lines.every((l) => l.includes(` ip kube-proxy-${s} `)), `shard ${s} has a line in another table`);
    assert.ok(lines.some((l) => l.startsWith(`add chain ip kube-proxy-${s} nat-prerouting { type nat hook prerouting`)));
    for (const i of sh.services) assert.ok(text.includes(`bench/svc-${String(i).padStart(5, '0')}/tcp/http`));
    for (let i = 0; i < 20; i++) if (!sh.services.includes(i)) assert.ok(!text.includes(`bench/svc-${String(i).padStart(5, '0')}/`));
  }
  assert.equal(renameTable('add rule ip kube-proxy x jump y', 'kube-proxy'), 'add rule ip kube-proxy x jump y');
});

test('the semantics check\'s endpoint-less Service is REJECTed, and its sticky Service has affinity sets, in its own table only', () => {
  const shards = buildShards(20, 2, 4, true);
  const owner = shards.findIndex((sh) => sh.services.includes(20));
  assert.ok(owner >= 0);
  for (const [s, sh] of shards.entries()) {
    const text = sh.render();
    const reject = text.includes(`add element ip kube-proxy-${s} no-endpoint-services { 172.30.0.21 . tcp . 80 comment "bench/svc-00020:http" : goto reject-chain }`);
    assert.equal(reject, s === owner, `table ${s}`);
    assert.equal(text.includes(`no-endpoint-nodeports { tcp . 30020 `), s === owner, `table ${s}`);
    const sticky = shards.findIndex((x) => x.services.includes(21));
    const sets = text.split('\n').filter((l) => l.startsWith(`add set ip kube-proxy-${s} affinity-`) && l.includes('bench/svc-00021/'));
    assert.equal(sets.length, s === sticky ? 2 : 0, `table ${s}`);
  }
});

test('addEndpoint: the new endpoint chain, and the service chain flushed and re-declared', () => {
  const [sh] = buildShards(3, 2, 1);
  const tx = sh.addEndpoint(1).trim().split('\n');
  const endpoint = tx.filter((l) => l.startsWith('add chain ip kube-proxy endpoint-'));
  assert.equal(endpoint.length, 1);
  assert.match(endpoint[0], /svc-00001\/tcp\/http__10\.180\.0\.21\/8080 \{ ip saddr 10\.180\.0\.21 jump mark-for-masquerade ; meta l4proto tcp dnat to 10\.180\.0\.21:8080 ; \}$/);
  assert.ok(tx.some((l) => /^flush chain ip kube-proxy service-\S+svc-00001\/tcp\/http$/.test(l)));
  assert.ok(tx.some((l) => /^add chain ip kube-proxy service-\S+svc-00001\/tcp\/http \{ .*numgen random mod 3 0 goto /.test(l)));
  assert.ok(!tx.some((l) => l.includes('svc-00000') || l.includes('svc-00002')));
});
