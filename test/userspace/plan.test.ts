// Unit tests of the userspace mode's pure parts (planner, rule text, tracer), the balancer
// with an injected clock, and cleanup against a fake runner that models the nat table.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { RoundRobinBalancer } from '../../src/modes/userspace/dataplane/balancer.ts';
import { removalPayload, removeRedirects } from '../../src/modes/userspace/dataplane/redirect.ts';
import { ExecError, type CommandRunner } from '../../src/kernel/runner.ts';
import { silentLogger } from '../../src/log.ts';
import { mode } from '../../src/modes/userspace/index.ts';
import { planUserspace, renderPlan, restorePayload } from '../../src/modes/userspace/plan.ts';
import { traceUserspace } from '../../src/modes/userspace/trace.ts';
import { planInput, slice, svc, testConfig } from './helpers.ts';
import { FakeIptables } from '../../src/kernel/iptables/fake.ts';
import { stateOf } from '../../src/conformance/case.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';

const eps = (...keys: string[]) => keys.map((k) => ({ key: k, ip: k.split(':')[0], port: Number(k.split(':')[1]) }));

describe('RoundRobinBalancer', () => {
  test('rotates over endpoints and skips excluded ones', () => {
    const b = new RoundRobinBalancer({ stickyMaxAgeSeconds: 0 });
    b.setEndpoints(eps('10.0.0.1:80', '10.0.0.2:80', '10.0.0.3:80'));
    assert.deepEqual([1, 2, 3, 4].map(() => b.next('c')!.key), ['10.0.0.1:80', '10.0.0.2:80', '10.0.0.3:80', '10.0.0.1:80']);
    assert.equal(b.next('c', false, new Set(['10.0.0.2:80']))!.key, '10.0.0.3:80');
    assert.equal(b.next('c', false, new Set(['10.0.0.1:80', '10.0.0.2:80', '10.0.0.3:80'])), null);
    b.setEndpoints([]);
    assert.equal(b.next('c'), null);
  });

  test('ClientIP affinity slides with use, expires, resets after a failure, and forgets removed endpoints', () => {
    let now = 0;
    const b = new RoundRobinBalancer({ stickyMaxAgeSeconds: 10, now: () => now });
    b.setEndpoints(eps('10.0.0.1:80', '10.0.0.2:80'));
    assert.equal(b.next('a')!.key, '10.0.0.1:80');
    assert.equal(b.next('b')!.key, '10.0.0.2:80');
    now = 9_000;
    assert.equal(b.next('a')!.key, '10.0.0.1:80');
    now = 18_000; // 9s after the last use: still sticky
    assert.equal(b.next('a')!.key, '10.0.0.1:80');
    now = 28_001; // 10s after the last use: expired, balanced again
    assert.equal(b.next('a')!.key, '10.0.0.1:80', 'the round robin turn happens to be 10.0.0.1 again');
    assert.equal(b.next('a', true)!.key, '10.0.0.2:80', 'reset after a failed dial moves the client');
    assert.equal(b.next('a')!.key, '10.0.0.2:80', 'and the new choice sticks');
    b.setEndpoints(eps('10.0.0.1:80'));
    assert.equal(b.affinities().has('a'), false, 'affinity to a removed endpoint is dropped');
    assert.equal(b.next('a')!.key, '10.0.0.1:80');
  });
});

const WEB = [
  svc('web', {
    type: 'LoadBalancer',
    clusterIP: '172.30.0.10',
    externalIPs: ['192.168.0.2', '203.0.113.9'],
    lbIPs: ['1.2.3.4'],
    ports: [{ name: 'http', port: 80, nodePort: 30080 }],
    externalTrafficPolicy: 'Local',
  }),
  slice('web', [{ ip: '10.180.1.2' }, { ip: '10.180.2.2', node: 'node-b' }], [{ name: 'http', port: 8080 }]),
];

describe('userspace planner', () => {
  test('loopback VIPs get listeners; every other frontend is DNATed to a proxy port per policy on the node IP', () => {
    const input = planInput([...WEB, svc('demo', { clusterIP: '127.0.10.1', ports: [{ port: 80 }] })], { config: testConfig({ clusterCIDR: '10.0.0.0/8' }) });
    const plan = planUserspace(input, { redirect: true });
    const byId = Object.fromEntries(plan.listeners.map((l) => [l.id, l]));
    assert.deepEqual(Object.keys(byId).sort(), ['ns/demo:/TCP/vip/127.0.10.1:80', 'ns/web:http/TCP/proxy/cluster', 'ns/web:http/TCP/proxy/local']);
    assert.deepEqual(byId['ns/web:http/TCP/proxy/cluster'].endpoints.map((e) => e.key), ['10.180.1.2:8080', '10.180.2.2:8080']);
    assert.deepEqual(byId['ns/web:http/TCP/proxy/local'].endpoints.map((e) => e.key), ['10.180.1.2:8080']);
    assert.equal(byId['ns/web:http/TCP/proxy/local'].host, '192.168.0.2', 'proxy ports listen on the node IP, not the wildcard');

    const ports: Record<string, number> = { 'ns/web:http/TCP/proxy/cluster': 40001, 'ns/web:http/TCP/proxy/local': 40002 };
    const to = (port: number) => `-j DNAT --to-destination 192.168.0.2:${port}`;
    const ext = (kind: string, d: string) => [
      `-A KPROXY-USERSPACE-PORTALS -m comment --comment "ns/web:http ${kind} (pods to every endpoint)" -s 10.0.0.0/8 -p tcp -m tcp -d ${d} --dport 80 ${to(40001)}`,
      `-A KPROXY-USERSPACE-PORTALS -m comment --comment "ns/web:http ${kind} (the node to every endpoint)" -m addrtype --src-type LOCAL -p tcp -m tcp -d ${d} --dport 80 ${to(40001)}`,
      `-A KPROXY-USERSPACE-PORTALS -m comment --comment "ns/web:http ${kind}" -p tcp -m tcp -d ${d} --dport 80 ${to(40002)}`,
    ];
    assert.equal(
      restorePayload(plan, (id) => ports[id]),
      [
        '*nat',
        ':KPROXY-USERSPACE-PORTALS - [0:0]',
        ':KPROXY-USERSPACE-NODEPORTS - [0:0]',
        `-A KPROXY-USERSPACE-PORTALS -m comment --comment "ns/web:http cluster IP" -p tcp -m tcp -d 172.30.0.10/32 --dport 80 ${to(40001)}`,
        ...ext('external IP', '192.168.0.2/32'),
        ...ext('external IP', '203.0.113.9/32'),
        ...ext('loadbalancer IP', '1.2.3.4/32'),
        '-A KPROXY-USERSPACE-PORTALS -m addrtype --dst-type LOCAL -j KPROXY-USERSPACE-NODEPORTS',
        `-A KPROXY-USERSPACE-NODEPORTS -m comment --comment "ns/web:http nodePort (pods to every endpoint)" -s 10.0.0.0/8 -p tcp -m tcp --dport 30080 ${to(40001)}`,
        `-A KPROXY-USERSPACE-NODEPORTS -m comment --comment "ns/web:http nodePort (the node to every endpoint)" -m addrtype --src-type LOCAL -p tcp -m tcp --dport 30080 ${to(40001)}`,
        `-A KPROXY-USERSPACE-NODEPORTS -m comment --comment "ns/web:http nodePort" -p tcp -m tcp --dport 30080 ${to(40002)}`,
        'COMMIT',
        '*filter',
        ':KPROXY-USERSPACE-FILTER - [0:0]',
        'COMMIT',
        '',
      ].join('\n'),
    );
  });

  test('the local-traffic detector: an interface detector matches -i, none leaves only the node short-circuit', () => {
    const bridge = planUserspace(planInput(WEB, { config: testConfig({ detectLocalMode: 'BridgeInterface', detectLocal: { bridgeInterface: 'cbr0' } }) }), { redirect: true });
    assert.ok(bridge.redirects.some((r) => r.match.join(' ') === '-i cbr0' && r.dst === '1.2.3.4/32'));
    const prefix = planUserspace(planInput(WEB, { config: testConfig({ detectLocalMode: 'InterfaceNamePrefix', detectLocal: { interfaceNamePrefix: 'veth' } }) }), { redirect: true });
    assert.ok(prefix.redirects.some((r) => r.match.join(' ') === '-i veth+'));
    const none = planUserspace(planInput(WEB), { redirect: true });
    assert.deepEqual([...new Set(none.redirects.map((r) => r.match.join(' ')))].sort(), ['', '-m addrtype --src-type LOCAL']);
  });

  test('a Local policy without local endpoints is a filter DROP; no endpoints at all is a listener that resets', () => {
    const objs = [
      svc('itp', { clusterIP: '172.30.0.11', ports: [{ port: 80 }], internalTrafficPolicy: 'Local' }),
      slice('itp', [{ ip: '10.180.2.2', node: 'node-b' }], [{ port: 8080 }]),
      svc('etp', { type: 'LoadBalancer', clusterIP: '172.30.0.12', lbIPs: ['1.2.3.5'], ports: [{ port: 80, nodePort: 30081 }], externalTrafficPolicy: 'Local' }),
      slice('etp', [{ ip: '10.180.2.3', node: 'node-b' }], [{ port: 8080 }]),
      svc('none', { clusterIP: '172.30.0.13', ports: [{ port: 80 }], internalTrafficPolicy: 'Local' }),
    ];
    const plan = planUserspace(planInput(objs, { config: testConfig({ clusterCIDR: '10.0.0.0/8' }) }), { redirect: true });
    assert.deepEqual(plan.drops.map((d) => `${d.dst ?? 'LOCAL'}:${d.dport} ${d.comment}`), [
      '1.2.3.5/32:80 ns/etp: loadbalancer IP has no local endpoints',
      'LOCAL:30081 ns/etp: nodePort has no local endpoints',
      '172.30.0.11/32:80 ns/itp: cluster IP has no local endpoints',
    ]);
    // eTP Local with no local endpoint: pods and the node still reach the remote endpoint
    const lb = plan.redirects.filter((r) => r.dst === '1.2.3.5/32');
    assert.deepEqual(lb.map((r) => r.match.join(' ')), ['-s 10.0.0.0/8', '-m addrtype --src-type LOCAL']);
    assert.ok(plan.listeners.some((l) => l.id === 'ns/none:/TCP/proxy/local' && l.endpoints.length === 0), 'no endpoints at all: accepted and reset');
    const payload = restorePayload(plan, () => 40000);
    assert.match(payload, /^-A KPROXY-USERSPACE-FILTER -m comment --comment "ns\/itp: cluster IP has no local endpoints" -p tcp -m tcp -d 172\.30\.0\.11\/32 --dport 80 -j DROP$/m);
    assert.match(payload, /^-A KPROXY-USERSPACE-FILTER -m comment --comment "ns\/etp: nodePort has no local endpoints" -m addrtype --dst-type LOCAL -p tcp -m tcp --dport 30081 -j DROP$/m);
  });

  test('loadBalancerSourceRanges: the LB IPs get their own proxy port admitting the ranges; NodePort and external IPs are not firewalled', () => {
    const fw = (ranges: string[], name = 'fw') => [
      svc(name, { type: 'LoadBalancer', clusterIP: '172.30.0.14', externalIPs: ['203.0.113.10'], lbIPs: ['1.2.3.6'], ports: [{ port: 80, nodePort: 30082 }], sourceRanges: ranges }),
      slice(name, [{ ip: '10.180.1.2' }], [{ port: 8080 }]),
    ];
    const plan = planUserspace(planInput(fw(['203.0.113.0/25'])), { redirect: true });
    const fwl = plan.listeners.filter((l) => l.allowedSources);
    assert.equal(fwl.length, 1);
    assert.equal(fwl[0].id, 'ns/fw:/TCP/proxy/cluster/fw=203.0.113.0/25');
    assert.deepEqual(fwl[0].frontends.map((f) => f.kind), ['loadBalancerIP']);
    assert.deepEqual(plan.redirects.filter((r) => r.listenerId === fwl[0].id).map((r) => r.dst), ['1.2.3.6/32']);
    const open = plan.listeners.find((l) => l.id === 'ns/fw:/TCP/proxy/cluster')!;
    assert.deepEqual(open.frontends.map((f) => f.kind), ['clusterIP', 'externalIP', 'nodePort']);
    // upstream allowFromNode: the node inside the ranges admits the LB IPs as sources too
    const withNode = planUserspace(planInput(fw(['192.168.0.0/24'])), { redirect: true });
    assert.deepEqual(withNode.listeners.find((l) => l.allowedSources)!.allowedSources, ['192.168.0.0/24', '1.2.3.6/32']);
    // a /0 admits everyone: no firewalled listener (kubernetes#132722)
    assert.equal(planUserspace(planInput(fw(['0.0.0.0/0'])), { redirect: true }).listeners.filter((l) => l.allowedSources).length, 0);
    // the tracer: inside the ranges forwarded, outside reset, the NodePort open to all
    const input = planInput(fw(['203.0.113.0/25']));
    assert.equal(traceUserspace(input, { from: '203.0.113.7', to: '1.2.3.6', port: 80, protocol: 'TCP' }).output, '10.180.1.2:8080');
    const denied = traceUserspace(input, { from: '203.0.113.200', to: '1.2.3.6', port: 80, protocol: 'TCP' });
    assert.equal(denied.output, 'REJECT');
    assert.match(denied.notes!.join(' '), /outside loadBalancerSourceRanges/);
    assert.equal(traceUserspace(input, { from: '203.0.113.200', to: '192.168.0.2', port: 30082, protocol: 'TCP' }).output, '10.180.1.2:8080');
    // a change of ranges opens a new proxy port (its admission is fixed at open)
    const changed = planUserspace(planInput(fw(['203.0.113.0/24'])), { redirect: true });
    assert.ok(changed.listeners.some((l) => l.id === 'ns/fw:/TCP/proxy/cluster/fw=203.0.113.0/24'));
  });

  test('listeners never bind the wildcard address, with or without iptables, in both families', () => {
    const v6svc = svc('v6', { type: 'LoadBalancer', clusterIP: 'fd00:172:30::10', lbIPs: ['fd00:1:2:3::4'], ports: [{ port: 80, nodePort: 30090 }] });
    const v6: PlanInput = {
      state: stateOf({ mode: 'userspace', nodeName: 'node-a', ipFamily: 'IPv6' }, [v6svc]),
      config: testConfig(),
      node: { nodeName: 'node-a', nodeIPs: ['fd00::2'], nodeLabels: {}, family: 6 },
    };
    const cases = [
      planUserspace(planInput(WEB), { redirect: true }),
      planUserspace(planInput(WEB), { redirect: false }),
      planUserspace(planInput(WEB, { config: testConfig({ nodePortAddresses: ['192.168.0.0/24'] }) }), { redirect: false }),
      planUserspace(v6, { redirect: true }),
      // no node address on this host: loopback, said in a note
      planUserspace(planInput(WEB), { redirect: true, localAddresses: [] }),
    ];
    for (const plan of cases) {
      assert.ok(plan.listeners.length > 0, 'the case plans listeners');
      for (const l of plan.listeners) assert.ok(!['0.0.0.0', '::'].includes(l.host), `${l.id} on ${l.host}`);
    }
    assert.equal(cases[3].listeners[0].host, 'fd00::2');
    assert.match(restorePayload(cases[3], () => 40000), /-j DNAT --to-destination \[fd00::2\]:40000$/m);
    assert.equal(cases[4].listeners[0].host, '127.0.0.1');
    assert.match(cases[4].notes.join('\n'), /proxy ports listen on 127\.0\.0\.1/);
  });

  test('without REDIRECT: NodePorts listen on node addresses, non-local VIPs are reported, not served', () => {
    const plan = planUserspace(planInput(WEB), { redirect: false });
    assert.deepEqual(plan.listeners.map((l) => l.id).sort(), ['ns/web:http/TCP/vip/192.168.0.2:30080', 'ns/web:http/TCP/vip/192.168.0.2:80']);
    assert.equal(plan.redirects.length, 0);
    assert.equal(plan.notes.filter((n) => /not a local address/.test(n)).length, 3);
  });

  test('localhostNodePorts false and nodePortAddresses shape the NodePort jump', () => {
    const noLocalhost = planUserspace(planInput(WEB, { config: testConfig({ iptables: { localhostNodePorts: false } }) }), { redirect: true });
    assert.deepEqual(noLocalhost.nodePortJumps, [['!', '-d', '127.0.0.0/8', '-m', 'addrtype', '--dst-type', 'LOCAL']]);
    const cidrs = planUserspace(planInput(WEB, { config: testConfig({ nodePortAddresses: ['192.168.0.0/24'] }) }), { redirect: true });
    assert.deepEqual(cidrs.nodePortJumps, [['-d', '192.168.0.0/24', '-m', 'addrtype', '--dst-type', 'LOCAL']]);
  });

  test('SCTP ports are refused at plan time (rendered as a comment, traced with the reason); a second service on a local VIP:port is skipped', () => {
    const input = planInput([
      svc('a', { clusterIP: '127.0.10.1', ports: [{ port: 80 }] }),
      // a Service with several ports names each (upstream's validation)
      svc('b', { clusterIP: '127.0.10.1', ports: [{ name: 'http', port: 80 }, { name: 's', port: 90, protocol: 'SCTP' }] }),
    ]);
    const plan = planUserspace(input, { redirect: false });
    assert.deepEqual(plan.listeners.map((l) => l.id), ['ns/a:/TCP/vip/127.0.10.1:80']);
    assert.deepEqual(plan.sctpRefused, ['ns/b:s']);
    assert.equal(plan.notes.length, 1);
    assert.match(plan.notes[0], /already served by ns\/a:/);
    assert.match(renderPlan(plan), /^# ns\/b:s: SCTP is not served by the userspace mode \(Node has no SCTP sockets\); use the iptables, ipvs or nftables mode for it$/m);
    const t = traceUserspace(input, { from: '10.0.0.5', to: '127.0.10.1', port: 90, protocol: 'SCTP' });
    assert.equal(t.output, '');
    assert.match(t.notes!.join(' '), /ns\/b:s: SCTP is not served/);
  });

  test('render prints listeners and the DNAT payload with proxy-port placeholders', () => {
    const text = mode.render(planInput(WEB));
    assert.match(text, /^listen TCP 192\.168\.0\.2:<proxy-port-1> ns\/web:http policy=cluster$/m);
    assert.match(text, /^listen TCP 192\.168\.0\.2:<proxy-port-2> ns\/web:http policy=local$/m);
    assert.match(text, /-j DNAT --to-destination 192\.168\.0\.2:<proxy-port-2>$/m);
  });
});

describe('userspace trace', () => {
  const input = planInput([
    ...WEB,
    svc('sticky', { clusterIP: '172.30.0.20', ports: [{ port: 53, protocol: 'UDP' }], affinitySeconds: 60 }),
    slice('sticky', [{ ip: '10.180.2.2' }, { ip: '10.180.1.2' }], [{ port: 5353, protocol: 'UDP' }]),
    svc('empty', { clusterIP: '172.30.0.30', ports: [{ port: 80 }] }),
  ]);
  const flows: [string, string, number, 'TCP' | 'UDP', string][] = [
    ['cluster IP', '172.30.0.10', 80, 'TCP', '10.180.1.2:8080, 10.180.2.2:8080'],
    ['external IP with policy Local', '203.0.113.9', 80, 'TCP', '10.180.1.2:8080'],
    ['LB IP with policy Local', '1.2.3.4', 80, 'TCP', '10.180.1.2:8080'],
    ['NodePort on the node IP', '192.168.0.2', 30080, 'TCP', '10.180.1.2:8080'],
    ['NodePort on localhost', '127.0.0.1', 30080, 'TCP', '10.180.1.2:8080'],
    ['UDP with affinity, sorted', '172.30.0.20', 53, 'UDP', '10.180.1.2:5353, 10.180.2.2:5353'],
    ['no endpoints', '172.30.0.30', 80, 'TCP', 'REJECT'],
    ['wrong protocol', '172.30.0.10', 80, 'UDP', ''],
    ['unknown address', '172.30.0.99', 80, 'TCP', ''],
  ];
  for (const [name, to, port, protocol, output] of flows) {
    test(name, () => {
      const r = traceUserspace(input, { from: '10.0.0.5', to, port, protocol });
      assert.equal(r.output, output);
      assert.equal(r.masq, output !== '' && output !== 'REJECT');
    });
  }
  test('affinity is listed in the notes', () => {
    const r = traceUserspace(input, { from: '10.0.0.5', to: '172.30.0.20', port: 53, protocol: 'UDP' });
    assert.ok(r.notes?.includes('sessionAffinity ClientIP, timeout 60s'), JSON.stringify(r.notes));
  });
});

/**
 * The iptables package's stateful fake for IPv4, loaded with `saved`; ip6tables is not
 * installed. Every command is recorded.
 */
async function fakeIptables(saved: string): Promise<{ runner: CommandRunner; calls: string[]; kernel: FakeIptables }> {
  const kernel = new FakeIptables(4);
  if (saved) assert.equal((await kernel.run('iptables-restore', ['--noflush'], { input: saved })).code, 0, 'the fake takes the saved state');
  const calls: string[] = [];
  return {
    calls,
    kernel,
    runner: {
      run: async (cmd, args, opts) => {
        calls.push([cmd, ...args].join(' '));
        if (cmd.startsWith('ip6tables')) throw new ExecError('KPROXY_EXEC_MISSING', `${cmd} not found`);
        return kernel.run(cmd, args, opts);
      },
    },
  };
}

const SAVED = `# Generated by iptables-save
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KPROXY-USERSPACE-PORTALS - [0:0]
:KPROXY-USERSPACE-NODEPORTS - [0:0]
:OTHER - [0:0]
-A PREROUTING -m comment --comment "kproxy userspace portals" -j KPROXY-USERSPACE-PORTALS
-A PREROUTING -j OTHER
-A OUTPUT -m comment --comment "kproxy userspace portals" -j KPROXY-USERSPACE-PORTALS
-A KPROXY-USERSPACE-PORTALS -m addrtype --dst-type LOCAL -j KPROXY-USERSPACE-NODEPORTS
COMMIT
`;

describe('userspace cleanup', () => {
  test('removes our chains and the jumps to them, and nothing else', () => {
    assert.equal(
      removalPayload(SAVED),
      [
        '*nat',
        ':KPROXY-USERSPACE-PORTALS - [0:0]',
        ':KPROXY-USERSPACE-NODEPORTS - [0:0]',
        '-D PREROUTING -m comment --comment "kproxy userspace portals" -j KPROXY-USERSPACE-PORTALS',
        '-D OUTPUT -m comment --comment "kproxy userspace portals" -j KPROXY-USERSPACE-PORTALS',
        '-X KPROXY-USERSPACE-PORTALS',
        '-X KPROXY-USERSPACE-NODEPORTS',
        'COMMIT',
        '',
      ].join('\n'),
    );
    assert.equal(removalPayload('*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n'), null);
    assert.equal(removalPayload(''), null);
  });

  test('cleanup writes one restore when something is there, nothing when clean, and tolerates a missing ip6tables', async () => {
    const dirty = await fakeIptables(SAVED);
    await removeRedirects(dirty.runner, silentLogger());
    assert.equal(dirty.calls.filter((c) => c.startsWith('iptables-restore')).length, 1);
    assert.deepEqual(dirty.calls.filter((c) => c.startsWith('ip6tables')), ['ip6tables-save -t nat']);
    assert.deepEqual(dirty.kernel.chains('nat').filter((c) => c.startsWith('KPROXY-')), [], 'our chains are gone');
    assert.deepEqual(dirty.kernel.rules('nat', 'PREROUTING'), ['-j OTHER'], 'the jumps to them are gone, the others stay');
    assert.deepEqual(dirty.kernel.rules('nat', 'OUTPUT'), []);
    assert.ok(dirty.kernel.chains('nat').includes('OTHER'));
    const clean = await fakeIptables('');
    await mode.cleanup(clean.runner, silentLogger());
    assert.equal(clean.calls.filter((c) => c.startsWith('iptables-restore')).length, 0);
  });

  test('cleanup does not fail when iptables is not installed at all', async () => {
    const missing: CommandRunner = {
      run: async (cmd) => {
        throw new ExecError('KPROXY_EXEC_MISSING', `${cmd} not found; install the package that provides it`);
      },
    };
    await mode.cleanup(missing, silentLogger());
  });
});
