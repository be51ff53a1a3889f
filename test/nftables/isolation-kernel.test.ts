// Real kernel, real nft: in a namespace this test creates (kpd1-nft-<pid>),
// - a Service with 63+63+15-character names renders a table `nft -f` accepts (the
//   untruncated comment is refused, so the limit is real);
// - a Service nft really refuses (an IPv6 endpoint in an IPv4 table, as nothing but a bug
//   upstream of the planner could produce) is left out and reported, and the other Services
//   are in the kernel's table after the same sync;
// - a loopback ClusterIP never reaches the table.
// The namespace is removed in `after`, also on failure.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import pino from 'pino';
import { resolveConfig } from '../../src/config/config.ts';
import { hostRunner, type CommandRunner } from '../../src/kernel/runner.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { optionsFromInput, planRuleset } from '../../src/modes/nftables/plan.ts';
import { dumpRuleset } from '../../src/modes/nftables/ruleset.ts';
import { NftProxier } from '../../src/modes/nftables/proxier.ts';
import { Netns } from '../support/netns.ts';
import { endpoint, label63, port, stateOf } from '../support/ports.ts';

const NS = `kpd1-nft-${process.pid}`;
const NODE = { nodeName: 'node-a', nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4 as const };
const config = resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8' });
const input = (state: PlanInput['state']): PlanInput => ({ state, config, node: NODE });
let ns: Netns;

const runner: CommandRunner = { run: (cmd, args, opts) => hostRunner.run('ip', ['netns', 'exec', NS, cmd, ...args], { timeoutMs: 30_000, ...opts }) };

async function nft(args: string[], stdin?: string) {
  return runner.run('nft', args, { input: stdin, timeoutMs: 30_000 });
}

before(() => {
  ns = Netns.create(NS);
});
after(async () => {
  await ns?.destroy();
});

test('a 63+63+15-character Service: the rendered table is accepted by nft, the untruncated comment is not', async () => {
  const sp = port(label63('n'), label63('s'), 'abcdefghijklmno', { nodePort: 30080, externalIPs: ['1.2.3.4'], loadBalancerVIPs: ['1.2.3.5'], loadBalancerSourceRanges: ['203.0.113.0/24'], stickyMaxAgeSeconds: 300 });
  const noEps = port(label63('m'), label63('t'), 'abcdefghijklmno', { clusterIP: '172.30.0.7', nodePort: 30081, externalIPs: ['1.2.3.4'] });
  const state = stateOf([[sp, [endpoint('10.180.0.1'), endpoint('10.180.0.2')]], [noEps, []]]);
  const text = dumpRuleset(planRuleset(state, optionsFromInput(input(state))));
  const check = await nft(['-c', '-f', '-'], text);
  assert.equal(check.code, 0, check.stderr);

  // The same table with the untruncated "ns/name:port" comment: nft refuses it.
  const full = text.replace(/comment "[^"]*\.\.\."/g, `comment "${noEps.key}"`);
  assert.notEqual(full, text);
  const refused = await nft(['-c', '-f', '-'], full);
  assert.notEqual(refused.code, 0);
  assert.match(refused.stderr, /comment too long/);

  // Applied for real through the proxier.
  const p = new NftProxier({ runner, log: pino({ level: 'silent' }) });
  await p.sync(input(state), new Set(), true);
  const listed = await nft(['list', 'table', 'ip', 'kube-proxy']);
  assert.equal(listed.code, 0, listed.stderr);
  assert.ok(listed.stdout.includes(`comment "${noEps.key.slice(0, 125)}..."`), 'the truncated comment is in the kernel');
  await nft(['delete', 'table', 'ip', 'kube-proxy']);
});

test('a Service nft refuses is left out and reported; the other Services are in the kernel after the same sync', async () => {
  const logs: Array<{ msg: string; service?: string }> = [];
  const log = pino({ level: 'info' }, new Writable({ write(c, _e, cb) { for (const l of String(c).split('\n')) if (l) logs.push(JSON.parse(l)); cb(); } }));
  const state = stateOf([
    [port('ns', 'good1', 'http', { clusterIP: '172.30.0.1' }), [endpoint('10.180.0.1')]],
    [port('ns', 'bad', 'http', { clusterIP: '172.30.0.2' }), [endpoint('fd00::66')]],
    [port('ns', 'bad', 'dns', { clusterIP: '172.30.0.2', port: 53 }), [endpoint('10.180.1.2', 5353)]],
    [port('ns', 'good2', 'http', { clusterIP: '172.30.0.3', nodePort: 30003 }), [endpoint('10.180.0.3')]],
    // item 7: never in the table, whatever validation let through
    [port('ns', 'lo', 'http', { clusterIP: '127.0.0.1' }), []],
  ]);
  const p = new NftProxier({ runner, log });
  const stats = await p.sync(input(state), new Set(), true);
  assert.deepEqual(stats.excludedServices, ['ns/bad']);

  const listed = await nft(['list', 'table', 'ip', 'kube-proxy']);
  assert.equal(listed.code, 0, listed.stderr);
  assert.match(listed.stdout, /172\.30\.0\.1 \. tcp \. 80 : goto service-/);
  assert.match(listed.stdout, /172\.30\.0\.3 \. tcp \. 80 : goto service-/);
  assert.match(listed.stdout, /tcp \. 30003 : goto external-/);
  assert.ok(!listed.stdout.includes('172.30.0.2'), 'nothing of the refused Service');
  assert.ok(!listed.stdout.includes('127.0.0.1'), 'no loopback VIP');
  const warn = logs.find((l) => l.msg.startsWith('KPROXY_SYNC_SERVICE_EXCLUDED'));
  assert.equal(warn?.service, 'ns/bad');
  assert.match(warn!.msg, /nft refused the rules of Service ns\/bad \(line \d+: Could not resolve hostname/);
  assert.ok(logs.some((l) => l.msg.startsWith('KPROXY_SERVICE_IP_SKIPPED: ns/lo:http clusterIP 127.0.0.1: loopback address')));

  // Fixed: the Service changes and is programmed by the next (partial) sync.
  const fixed = stateOf([...state.services.values()].map((sp) => [sp, sp.key === 'ns/bad:http' ? [endpoint('10.180.1.1')] : (state.endpoints.get(sp.key) ?? [])]));
  const s2 = await p.sync(input(fixed), new Set(['ns/bad']), false);
  assert.equal(s2.excludedServices, undefined);
  const after2 = await nft(['list', 'table', 'ip', 'kube-proxy']);
  assert.match(after2.stdout, /172\.30\.0\.2 \. tcp \. 80 : goto service-/);
  assert.match(after2.stdout, /172\.30\.0\.1 \. tcp \. 80 : goto service-/);
  await nft(['delete', 'table', 'ip', 'kube-proxy']);
});
