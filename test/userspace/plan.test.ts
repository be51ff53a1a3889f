// Unit tests of the userspace mode's pure parts (planner, rule text, tracer), the balancer
// with an injected clock, and cleanup against a fake runner that models the nat table.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { RoundRobinBalancer } from '../../src/dataplane/balancer.ts';
import { removalPayload, removeRedirects } from '../../src/dataplane/redirect.ts';
import { ExecError, type CommandRunner } from '../../src/exec/runner.ts';
import { silentLogger } from '../../src/log.ts';
import { mode } from '../../src/proxy/userspace/index.ts';
import { planUserspace, restorePayload } from '../../src/modes/userspace/plan.ts';
import { traceUserspace } from '../../src/modes/userspace/trace.ts';
import { planInput, slice, svc, testConfig } from './helpers.ts';
import { FakeIptables } from '../../src/iptables/fake.ts';

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
  test('local addresses get listeners, others a shared proxy port per policy with REDIRECT rules', () => {
    const input = planInput([...WEB, svc('demo', { clusterIP: '127.0.10.1', ports: [{ port: 80 }] })]);
    const plan = planUserspace(input, { redirect: true });
    const byId = Object.fromEntries(plan.listeners.map((l) => [l.id, l]));
    assert.deepEqual(Object.keys(byId).sort(), [
      'ns/demo:/TCP/vip/127.0.10.1:80',
      'ns/web:http/TCP/proxy/cluster',
      'ns/web:http/TCP/proxy/local',
      'ns/web:http/TCP/vip/192.168.0.2:80',
    ]);
    assert.deepEqual(byId['ns/web:http/TCP/proxy/cluster'].endpoints.map((e) => e.key), ['10.180.1.2:8080', '10.180.2.2:8080']);
    assert.deepEqual(byId['ns/web:http/TCP/proxy/local'].endpoints.map((e) => e.key), ['10.180.1.2:8080']);
    assert.equal(byId['ns/web:http/TCP/vip/192.168.0.2:80'].policy, 'local');

    const ports: Record<string, number> = { 'ns/web:http/TCP/proxy/cluster': 40001, 'ns/web:http/TCP/proxy/local': 40002 };
    assert.equal(
      restorePayload(plan, (id) => ports[id]),
      [
        '*nat',
        ':KPROXY-USERSPACE-PORTALS - [0:0]',
        ':KPROXY-USERSPACE-NODEPORTS - [0:0]',
        '-A KPROXY-USERSPACE-PORTALS -m comment --comment "ns/web:http cluster IP" -p tcp -m tcp -d 172.30.0.10/32 --dport 80 -j REDIRECT --to-ports 40001',
        '-A KPROXY-USERSPACE-PORTALS -m comment --comment "ns/web:http external IP" -p tcp -m tcp -d 203.0.113.9/32 --dport 80 -j REDIRECT --to-ports 40002',
        '-A KPROXY-USERSPACE-PORTALS -m comment --comment "ns/web:http loadbalancer IP" -p tcp -m tcp -d 1.2.3.4/32 --dport 80 -j REDIRECT --to-ports 40002',
        '-A KPROXY-USERSPACE-PORTALS -m addrtype --dst-type LOCAL -j KPROXY-USERSPACE-NODEPORTS',
        '-A KPROXY-USERSPACE-NODEPORTS -m comment --comment "ns/web:http" -p tcp -m tcp --dport 30080 -j REDIRECT --to-ports 40002',
        'COMMIT',
        '',
      ].join('\n'),
    );
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

  test('SCTP ports and a second service on the same local VIP:port are reported and skipped', () => {
    const plan = planUserspace(
      planInput([
        svc('a', { clusterIP: '127.0.10.1', ports: [{ port: 80 }] }),
        // a Service with several ports names each (upstream's validation)
        svc('b', { clusterIP: '127.0.10.1', ports: [{ name: 'http', port: 80 }, { name: 's', port: 90, protocol: 'SCTP' }] }),
      ]),
      { redirect: false },
    );
    assert.deepEqual(plan.listeners.map((l) => l.id), ['ns/a:/TCP/vip/127.0.10.1:80']);
    assert.equal(plan.notes.length, 2);
    assert.match(plan.notes.join('\n'), /already served by ns\/a:/);
    assert.match(plan.notes.join('\n'), /SCTP/);
  });

  test('render prints listeners and the REDIRECT payload with proxy-port placeholders', () => {
    const text = mode.render(planInput(WEB));
    assert.match(text, /^listen TCP 0\.0\.0\.0:<proxy-port-1> ns\/web:http policy=cluster$/m);
    assert.match(text, /^listen TCP 192\.168\.0\.2:80 ns\/web:http policy=local$/m);
    assert.match(text, /--to-ports <proxy-port-2>$/m);
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
