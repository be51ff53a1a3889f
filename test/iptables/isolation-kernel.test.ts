// Real kernel, real iptables-restore / ip6tables-restore: in a namespace this
// test creates (kpd1-ipt-<pid>),
// - the payload of a Service with 63+63+15-character names passes `iptables-restore --test`
//   and `ip6tables-restore --test` (comments within XT_MAX_COMMENT_LEN);
// - a Service iptables-restore really refuses (an IPv6 endpoint in an IPv4 payload) is left
//   out and reported, and the other Services are in iptables-save after the same sync;
// - a loopback ClusterIP gets no rule.
// The namespace is removed in `after`, also on failure.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import pino from 'pino';
import { hostRunner, type CommandRunner } from '../../src/kernel/runner.ts';
import { DEFAULT_FACTS, optionsFromConfig } from '../../src/modes/iptables/options.ts';
import { planFull } from '../../src/modes/iptables/full.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { IptablesProxier } from '../../src/modes/iptables/proxier.ts';
import { Netns } from '../support/netns.ts';
import { endpoint, label63, port, stateOf } from '../support/ports.ts';
import { testConfig } from './helpers.ts';

const NS = `kpd1-ipt-${process.pid}`;
const config = testConfig();
const node = (family: 4 | 6) => ({ nodeName: 'test-node', nodeIPs: [family === 4 ? '192.168.0.2' : 'fd00:192::2'], nodeLabels: {}, family });
let ns: Netns;

const runner: CommandRunner = { run: (cmd, args, opts) => hostRunner.run('ip', ['netns', 'exec', NS, cmd, ...args], { timeoutMs: 30_000, ...opts }) };

before(() => {
  ns = Netns.create(NS);
});
after(async () => {
  await ns?.destroy();
});

test('the payload of a 63+63+15-character Service passes iptables-restore --test and ip6tables-restore --test', async () => {
  for (const family of [4, 6] as const) {
    const v6 = family === 6;
    const sp = port(label63('n'), label63('s'), 'abcdefghijklmno', {
      family,
      clusterIP: v6 ? 'fd00:172:30::1' : '172.30.0.1',
      nodePort: 30080,
      loadBalancerVIPs: [v6 ? 'fd00:1:2:3::5' : '1.2.3.5'],
      loadBalancerSourceRanges: [v6 ? 'fd00:203::/64' : '203.0.113.0/24'],
      externalPolicyLocal: true,
      healthCheckNodePort: 30081,
      stickyMaxAgeSeconds: 300,
    });
    const ep = endpoint(v6 ? 'fd00:1234:5678:9abc:def0:1234:5678:9abc' : '10.180.0.1', 65535);
    const noEps = port(label63('m'), label63('t'), 'abcdefghijklmno', { family, clusterIP: v6 ? 'fd00:172:30::2' : '172.30.0.2', nodePort: 30082 });
    const opts = optionsFromConfig(config, node(family), DEFAULT_FACTS);
    const { payload } = planFull({ state: stateOf([[sp, [ep]], [noEps, []]]), opts });
    const r = await runner.run(v6 ? 'ip6tables-restore' : 'iptables-restore', ['--test', '--noflush'], { input: payload });
    assert.equal(r.code, 0, `IPv${family}: ${r.stderr}`);
  }
});

test('a Service iptables-restore refuses is left out and reported; the others are in the kernel after the same sync', async () => {
  const logs: Array<{ msg: string; service?: string }> = [];
  const log = pino({ level: 'info' }, new Writable({ write(c, _e, cb) { for (const l of String(c).split('\n')) if (l) logs.push(JSON.parse(l)); cb(); } }));
  const state = stateOf([
    [port('ns', 'good1', 'http', { clusterIP: '172.30.0.1' }), [endpoint('10.180.0.1')]],
    [port('ns', 'bad', 'http', { clusterIP: '172.30.0.2' }), [endpoint('fd00::66')]],
    [port('ns', 'bad', 'dns', { clusterIP: '172.30.0.2', port: 53 }), [endpoint('10.180.1.2', 5353)]],
    [port('ns', 'good2', 'http', { clusterIP: '172.30.0.3', nodePort: 30003 }), [endpoint('10.180.0.3')]],
    [port('ns', 'lo', 'http', { clusterIP: '127.0.0.1' }), []],
  ]);
  const input: PlanInput = { state, config, node: node(4) };
  const p = new IptablesProxier({ runner, log, config });
  const stats = await p.sync(input, new Set(), true);
  assert.deepEqual(stats.excludedServices, ['ns/bad']);

  const saved = (await runner.run('iptables-save', [])).stdout;
  assert.match(saved, /-A KUBE-SERVICES -d 172\.30\.0\.1\/32 -p tcp -m comment --comment "ns\/good1:http cluster IP"/);
  assert.match(saved, /-A KUBE-SERVICES -d 172\.30\.0\.3\/32 -p tcp -m comment --comment "ns\/good2:http cluster IP"/);
  assert.match(saved, /-A KUBE-NODEPORTS -p tcp -m comment --comment "?ns\/good2:http"? -m tcp --dport 30003/);
  assert.ok(!saved.includes('172.30.0.2') && !saved.includes('ns/bad'), 'nothing of the refused Service');
  assert.ok(!saved.includes('127.0.0.1/32'), 'no rule for the loopback VIP');
  const warn = logs.find((l) => l.msg.startsWith('KPROXY_SYNC_SERVICE_EXCLUDED'));
  assert.equal(warn?.service, 'ns/bad');
  assert.match(warn!.msg, /iptables-restore refused the rules of Service ns\/bad \(line \d+: host\/network `fd00::66' not found/);

  // Fixed: programmed by the next (partial) sync, the others untouched.
  const fixed = stateOf([...state.services.values()].map((sp) => [sp, sp.key === 'ns/bad:http' ? [endpoint('10.180.1.1')] : (state.endpoints.get(sp.key) ?? [])]));
  const s2 = await p.sync({ ...input, state: fixed }, new Set(['ns/bad']), false);
  assert.equal(s2.excludedServices, undefined);
  const saved2 = (await runner.run('iptables-save', [])).stdout;
  assert.match(saved2, /-d 172\.30\.0\.2\/32 -p tcp -m comment --comment "ns\/bad:http cluster IP"/);
  assert.match(saved2, /-d 172\.30\.0\.1\/32 -p tcp -m comment --comment "ns\/good1:http cluster IP"/);
});
