// `kproxy trace --mode ipvs --live` reads one virtual server, one kube-ipvs0 address and the
// ipset entries its walk tests: its answer must be the one the walk gives over the whole
// kernel state (`ipvsadm -Sn`, `ipset save`, every kube-ipvs0 address, `iptables-save -t nat`),
// for every kind of flow, on the stateful fake host a proxier sync has filled.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mode } from '../../src/modes/ipvs/index.ts';
import { masqConfigFromIptables, traceIpvs } from '../../src/modes/ipvs/trace.ts';
import { Ipvsadm } from '../../src/kernel/ipvs/exec.ts';
import { IPSetExec } from '../../src/kernel/ipset/exec.ts';
import { parseTestAnswers } from '../../src/kernel/ipset/model.ts';
import { IptablesExecutor } from '../../src/kernel/iptables/exec.ts';
import { Links } from '../../src/kernel/links.ts';
import type { RawConfig } from '../../src/config/config.ts';
import type { Protocol } from '../../src/core/model.ts';
import type { TraceResult } from '../../src/modes/trace-types.ts';
import { FakeHost } from './fake.ts';
import { ep, fakeHostProxier, input, svc } from './support.ts';

type Flow = [from: string, to: string, port: number, protocol: Protocol];

const SERVICES_V4 = [
  [svc('web', '172.30.0.10', 80, { nodePort: 30080, stickyMaxAgeSeconds: 600 }), [ep('10.180.0.1', 8080), ep('10.180.0.2', 8080, { isLocal: true })]],
  [svc('lb', '172.30.0.20', 80, { nodePort: 30081, loadBalancerVIPs: ['1.2.3.4'], loadBalancerSourceRanges: ['203.0.113.0/25', '198.51.100.9/32'] }), [ep('10.180.0.3', 80)]],
  [svc('lblocal', '172.30.0.21', 80, { nodePort: 30082, loadBalancerVIPs: ['1.2.3.5'], externalPolicyLocal: true, healthCheckNodePort: 30900 }), [ep('10.180.0.4', 80, { isLocal: true })]],
  [svc('ext', '172.30.0.30', 80, { externalIPs: ['198.51.100.7'] }), [ep('10.180.0.5', 80)]],
  [svc('dns', '172.30.0.53', 53, { protocol: 'UDP', nodePort: 30053 }), [ep('10.180.0.6', 5353)]],
  [svc('sctp', '172.30.0.60', 9999, { protocol: 'SCTP', nodePort: 30060 }), [ep('10.180.0.7', 9999)]],
  [svc('empty', '172.30.0.12', 80, { nodePort: 30083 }), []],
] as const;

const SOURCES_V4 = ['10.180.0.9', '10.180.0.2', '10.180.0.4', '203.0.113.5', '203.0.113.200', '198.51.100.9', '127.0.0.1', '172.30.0.20', '192.168.0.2'];
const TARGETS_V4: Array<[string, number, Protocol]> = [
  ['172.30.0.10', 80, 'TCP'], ['192.168.0.2', 30080, 'TCP'], ['172.30.0.20', 80, 'TCP'], ['1.2.3.4', 80, 'TCP'], ['192.168.0.2', 30081, 'TCP'],
  ['1.2.3.5', 80, 'TCP'], ['192.168.0.2', 30082, 'TCP'], ['198.51.100.7', 80, 'TCP'], ['172.30.0.30', 80, 'TCP'], ['172.30.0.53', 53, 'UDP'],
  ['192.168.0.2', 30053, 'UDP'], ['172.30.0.60', 9999, 'SCTP'], ['192.168.0.2', 30060, 'SCTP'], ['172.30.0.12', 80, 'TCP'], ['192.168.0.2', 30083, 'TCP'],
  ['172.30.0.99', 80, 'TCP'], ['172.30.0.10', 81, 'TCP'], ['172.30.0.10', 80, 'UDP'],
];

const SERVICES_V6 = [
  [svc('web6', 'fd00:30::10', 80, { nodePort: 30080 }), [ep('fd00:10:180::1', 8080), ep('fd00:10:180::2', 8080, { isLocal: true })]],
  [svc('lb6', 'fd00:30::20', 80, { loadBalancerVIPs: ['2001:db8::4'], loadBalancerSourceRanges: ['2001:db8:1::/64'] }), [ep('fd00:10:180::3', 80)]],
  [svc('empty6', 'fd00:30::12', 80), []],
] as const;
const SOURCES_V6 = ['fd00:10:180::9', 'fd00:10:180::2', '2001:db8:1::5', '2001:db8:2::5', '::1'];
const TARGETS_V6: Array<[string, number, Protocol]> = [['fd00:30::10', 80, 'TCP'], ['fd00::2', 30080, 'TCP'], ['fd00:30::20', 80, 'TCP'], ['2001:db8::4', 80, 'TCP'], ['fd00:30::12', 80, 'TCP'], ['fd00:30::99', 80, 'TCP']];

/** The walk over the whole kernel state, read as the ipvs trace read it before narrowing: every virtual server, set and VIP. */
async function wholeStateTrace(host: FakeHost, [from, to, port, protocol]: Flow): Promise<TraceResult> {
  const family = to.includes(':') ? 6 : 4;
  const nat = await new IptablesExecutor(host, family).save('nat');
  return traceIpvs(
    {
      family,
      table: await new Ipvsadm(host).save(),
      sets: await new IPSetExec(host).save(),
      masq: masqConfigFromIptables(nat, family),
      nodeIPs: await new Links(host).addresses('kube-ipvs0'),
    },
    { from, to, port, protocol },
  );
}

async function syncedHost(raw: RawConfig, family: 4 | 6): Promise<FakeHost> {
  const host = new FakeHost();
  const px = await fakeHostProxier(host, { config: raw });
  const services = family === 4 ? SERVICES_V4 : SERVICES_V6;
  const node = family === 4 ? {} : { nodeIPs: ['fd00::2'], family: 6 as const };
  await px.sync(input(services.map(([s, eps]) => [s, [...eps]]), raw, node), new Set(), true);
  await px.stop();
  return host;
}

const CONFIGS: Array<[string, RawConfig]> = [
  ['clusterCIDR', { clusterCIDR: '10.0.0.0/8' }],
  ['masqueradeAll', { clusterCIDR: '10.0.0.0/8', iptables: { masqueradeAll: true } }],
  ['no cluster CIDR', {}],
  ['detectLocal by interface', { detectLocalMode: 'InterfaceNamePrefix', detectLocal: { interfaceNamePrefix: 'veth' } }],
];

for (const [name, raw] of CONFIGS) {
  test(`live trace over the narrowed reads answers as the walk over the whole state (IPv4, ${name})`, async () => {
    const host = await syncedHost(raw, 4);
    let compared = 0;
    for (const from of SOURCES_V4) {
      for (const [to, port, protocol] of TARGETS_V4) {
        const flow: Flow = [from, to, port, protocol];
        const want = await wholeStateTrace(host, flow);
        host.calls = [];
        const got = await mode.trace!({ from, to, port, protocol, live: true }, { runner: host });
        assert.deepEqual(got, want, `${from} → ${to}:${port}/${protocol}`);
        // one virtual server, one address, the nat table and one ipset session: nothing that lists every Service
        assert.deepEqual(host.calls.filter((c) => /^ipvsadm -Sn|^ipvsadm -Ln$|^ipset save|^ip -o addr show dev kube-ipvs0$/.test(c)), [], `${from} → ${to}:${port}: ${host.calls.join('; ')}`);
        assert.equal(host.calls.filter((c) => c === 'ipset -').length, 1, `one ipset session answers the walk: ${from} → ${to}:${port}/${protocol}`);
        compared++;
      }
    }
    // the flows reach every verdict
    const outputs = new Set<string>();
    for (const [from, to, port] of [['10.180.0.9', '172.30.0.12', 80], ['203.0.113.200', '1.2.3.4', 80], ['10.180.0.9', '172.30.0.99', 80]] as const) {
      outputs.add((await mode.trace!({ from, to, port, protocol: 'TCP', live: true }, { runner: host })).output);
    }
    assert.deepEqual([...outputs].sort(), ['', 'DROP', 'REJECT']);
    assert.equal(compared, SOURCES_V4.length * TARGETS_V4.length);
  });
}

test('live trace over the narrowed reads answers as the walk over the whole state (IPv6)', async () => {
  const host = await syncedHost({ clusterCIDR: 'fd00:10::/32' }, 6);
  for (const from of SOURCES_V6) {
    for (const [to, port, protocol] of TARGETS_V6) {
      const flow: Flow = [from, to, port, protocol];
      const want = await wholeStateTrace(host, flow);
      const got = await mode.trace!({ from, to, port, protocol, live: true }, { runner: host });
      assert.deepEqual(got, want, `${from} → ${to}:${port}/${protocol}`);
    }
  }
  const hairpin = await mode.trace!({ from: 'fd00:10:180::2', to: 'fd00:30::10', port: 80, protocol: 'TCP', live: true }, { runner: host });
  assert.equal(hairpin.masq, true, JSON.stringify(hairpin));
});

test('live trace: the hairpin and source-range answers come from the kernel sets, not from a guess', async () => {
  const host = await syncedHost({ clusterCIDR: '10.0.0.0/8' }, 4);
  const hairpin = await mode.trace!({ from: '10.180.0.2', to: '172.30.0.10', port: 80, protocol: 'TCP', live: true }, { runner: host });
  assert.equal(hairpin.masq, true);
  assert.ok(hairpin.rules.some((r) => r.includes('hairpin 10.180.0.2,tcp:8080,10.180.0.2')), hairpin.rules.join('\n'));
  // the /32 range is a host entry; a range's neighbour is outside it
  assert.equal((await mode.trace!({ from: '198.51.100.9', to: '1.2.3.4', port: 80, protocol: 'TCP', live: true }, { runner: host })).output, '10.180.0.3:80');
  assert.equal((await mode.trace!({ from: '198.51.100.10', to: '1.2.3.4', port: 80, protocol: 'TCP', live: true }, { runner: host })).output, 'DROP');
  // an entry removed behind kproxy's back changes the answer
  host.sets.get('KUBE-LOAD-BALANCER-SOURCE-CIDR')!.entries.clear();
  assert.equal((await mode.trace!({ from: '203.0.113.5', to: '1.2.3.4', port: 80, protocol: 'TCP', live: true }, { runner: host })).output, 'DROP');
});

test('live trace without a kube-ipvs0 device or ipsets: no virtual server, nothing else to read', async () => {
  const host = new FakeHost();
  const r = await mode.trace!({ from: '10.180.0.9', to: '172.30.0.10', port: 80, protocol: 'TCP', live: true }, { runner: host });
  assert.deepEqual([r.output, r.masq], ['', false]);
  assert.deepEqual(r.rules, ['ipvs: no virtual server 172.30.0.10:80/TCP']);
});

// stderr of `ipset -` (ipset v7.17) for: test T1 172.30.0.1,tcp:80 / test T1 1.1.1.1,tcp:80 /
// test B1 30000 / test C1 1.2.3.4,tcp:80,203.0.113.5 / test NOPE 1 / test B1 80
const IPSET_INTERACTIVE_STDERR = `Warning: 172.30.0.1,tcp:80 is in set T1.
1.1.1.1,tcp:80 is NOT in set T1.
Warning: 30000 is in set B1.
Warning: 1.2.3.4,tcp:80,203.0.113.5 is in set C1.
ipset v7.17: The set with the given name does not exist
80 is NOT in set B1.
`;

test("ipset's interactive answers: one per question, in order; anything else is not trusted", () => {
  const qs = ['T1', 'T1', 'B1', 'C1', 'NOPE', 'B1'].map((set) => ({ set }));
  assert.deepEqual(parseTestAnswers(IPSET_INTERACTIVE_STDERR, qs), [true, false, true, true, false, false]);
  assert.equal(parseTestAnswers(IPSET_INTERACTIVE_STDERR, qs.slice(1)), null, 'a line more than questions');
  assert.equal(parseTestAnswers(IPSET_INTERACTIVE_STDERR, qs.map(() => ({ set: 'T1' }))), null, 'an answer about another set');
  assert.equal(parseTestAnswers('ipset v7.17: Syntax error: cannot parse 1.2.3: resolving to IPv4 address failed\n', [{ set: 'T1' }]), null);
});
