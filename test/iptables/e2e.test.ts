// Real kernel, real packets: the iptables proxier programs a "node" network namespace that
// routes between a client namespace and three pod namespaces. Backends answer with their
// identity and the source address they saw. Everything lives in namespaces this test
// creates (kpt-ipt-<pid>-*) and is removed in `after`, also on failure.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { hostRunner, type CommandRunner, runChecked } from '../../src/kernel/runner.ts';
import { mode } from '../../src/modes/iptables/index.ts';
import type { Proxier } from '../../src/modes/types.ts';
import { silentLogger } from '../../src/log.ts';
import { planInput, slice, svc, testConfig, tracker } from './helpers.ts';

const P = `kpt-ipt-${process.pid}`;
const NODE = `${P}-node`;
const CLIENT = `${P}-cl`;
const PODS = [1, 2, 3].map((i) => ({
  ns: `${P}-p${i}`, ip: `10.180.${i}.2`, gw: `10.180.${i}.1`, ip6: `fd00:10:180:${i}::2`, gw6: `fd00:10:180:${i}::1`,
  id: `p${i}`, node: i === 1 ? 'test-node' : 'other-node',
}));
const CLIENT_IP = '203.0.113.2';
const CLIENT_IP6 = '2001:db8:203::2';
const NODE_IP = '192.168.0.2';
const NODE_IP6 = '2001:db8:203::1';

/** Runs commands inside the node namespace: `ip netns exec NS cmd args...` (an argument array). */
const nodeRunner: CommandRunner = {
  run: (cmd, args, opts) => hostRunner.run('ip', ['netns', 'exec', NODE, cmd, ...args], opts),
};

const sh = (...args: string[]) => runChecked(hostRunner, args[0], args.slice(1), { timeoutMs: 20_000 });
const inNs = (ns: string, ...args: string[]) => sh('ip', 'netns', 'exec', ns, ...args);

const BACKEND = `
const net = require('node:net'); const dgram = require('node:dgram');
const [id, tcpPort, udpPort] = process.argv.slice(1);
net.createServer((s) => { s.on('error', () => {}); s.end(id + ' ' + String(s.remoteAddress).replace(/^::ffff:/, '') + '\\n'); }).listen(Number(tcpPort), '::');
const u = dgram.createSocket('udp4');
u.on('message', (m, r) => u.send(id + ' ' + r.address + '\\n', r.port, r.address));
u.bind(Number(udpPort), '0.0.0.0', () => console.log('ready'));
`;

// Makes `count` connections (one new socket each), `gapMs` apart, stopping at `budgetMs`.
const CLIENT_SCRIPT = `
const net = require('node:net'); const dgram = require('node:dgram');
const [proto, host, port, count, gapMs, budgetMs] = process.argv.slice(1);
const end = Date.now() + Number(budgetMs);
const once = () => new Promise((resolve) => {
  const t0 = Date.now();
  const done = (r) => resolve({ ...r, ms: Date.now() - t0 });
  if (proto === 'udp') {
    const s = dgram.createSocket('udp4');
    const timer = setTimeout(() => { s.close(); done({ ok: false, err: 'TIMEOUT' }); }, 1500);
    s.on('message', (m) => { clearTimeout(timer); s.close(); done({ ok: true, id: String(m).trim() }); });
    s.on('error', (e) => { clearTimeout(timer); s.close(); done({ ok: false, err: e.code }); });
    s.send('hi', Number(port), host);
    return;
  }
  const c = net.connect({ host, port: Number(port) });
  let data = '';
  c.setTimeout(2000, () => { c.destroy(); done({ ok: false, err: 'TIMEOUT' }); });
  c.on('data', (d) => (data += d));
  c.on('end', () => done({ ok: true, id: data.trim() }));
  c.on('error', (e) => done({ ok: false, err: e.code }));
});
(async () => {
  const out = [];
  for (let i = 0; i < Number(count) && Date.now() < end; i++) {
    out.push(await once());
    await new Promise((r) => setTimeout(r, Number(gapMs)));
  }
  console.log(JSON.stringify(out));
})();
`;

interface Reply {
  ok: boolean;
  id?: string;
  err?: string;
  ms: number;
}

async function fromClient(proto: 'tcp' | 'udp', host: string, port: number, count: number, gapMs = 0, budgetMs = 15_000): Promise<Reply[]> {
  const r = await hostRunner.run('ip', ['netns', 'exec', CLIENT, process.execPath, '-e', CLIENT_SCRIPT, proto, host, String(port), String(count), String(gapMs), String(budgetMs)], { timeoutMs: budgetMs + 10_000 });
  assert.equal(r.code, 0, r.stderr);
  return JSON.parse(r.stdout) as Reply[];
}

const ids = (rs: Reply[]) => new Set(rs.map((r) => (r.ok ? r.id!.split(' ')[0] : `ERR:${r.err}`)));

const backends: ChildProcess[] = [];
let proxier: Proxier;
const t = tracker();
const config = testConfig({ syncPeriodMs: 30_000 });
const t6 = tracker(6);
const config6 = testConfig({ syncPeriodMs: 30_000, clusterCIDRs: ['fd00:10::/32'] });

function setEndpoints(name: string, pods: typeof PODS, port = 8080, protocol = 'TCP', portName = 'p80'): void {
  t.endpoints.update(null, slice('e2e', name, `${name}-1`, pods.map((p) => ({ ip: p.ip, nodeName: p.node })), [{ name: portName, port, protocol }]));
}

async function sync(full = false) {
  return proxier.sync(planInput(t, config, 4, [NODE_IP]), t.apply(), full);
}

describe('iptables mode on a real kernel', { timeout: 180_000 }, () => {
  before(async () => {
    for (const ns of [NODE, CLIENT, ...PODS.map((p) => p.ns)]) await sh('ip', 'netns', 'add', ns);
    await inNs(NODE, 'sysctl', '-qw', 'net.ipv4.ip_forward=1');
    // A real node has a default route: service VIPs are routed (then filtered) like any address.
    await inNs(NODE, 'ip', 'link', 'add', 'kptd0', 'type', 'veth', 'peer', 'name', 'kptd1');
    await inNs(NODE, 'ip', 'link', 'set', 'kptd0', 'up');
    await inNs(NODE, 'ip', 'route', 'add', 'default', 'dev', 'kptd0');
    await inNs(NODE, 'sysctl', '-qw', 'net.ipv6.conf.all.forwarding=1');
    await inNs(NODE, 'ip', '-6', 'route', 'add', 'default', 'dev', 'kptd0');
    for (const ns of [NODE, CLIENT, ...PODS.map((p) => p.ns)]) await inNs(ns, 'ip', 'link', 'set', 'lo', 'up');
    // client <-> node
    await sh('ip', 'link', 'add', 'kptc0', 'netns', CLIENT, 'type', 'veth', 'peer', 'name', 'kptn0', 'netns', NODE);
    await inNs(CLIENT, 'ip', 'addr', 'add', `${CLIENT_IP}/24`, 'dev', 'kptc0');
    await inNs(CLIENT, 'ip', 'link', 'set', 'kptc0', 'up');
    await inNs(CLIENT, 'ip', 'route', 'add', 'default', 'via', '203.0.113.1');
    await inNs(CLIENT, 'ip', '-6', 'addr', 'add', `${CLIENT_IP6}/64`, 'dev', 'kptc0', 'nodad');
    await inNs(CLIENT, 'ip', '-6', 'route', 'add', 'default', 'via', NODE_IP6);
    await inNs(NODE, 'ip', '-6', 'addr', 'add', `${NODE_IP6}/64`, 'dev', 'kptn0', 'nodad');
    await inNs(NODE, 'ip', 'addr', 'add', '203.0.113.1/24', 'dev', 'kptn0');
    await inNs(NODE, 'ip', 'addr', 'add', `${NODE_IP}/24`, 'dev', 'kptn0');
    await inNs(NODE, 'ip', 'link', 'set', 'kptn0', 'up');
    // pods <-> node
    for (const [i, p] of PODS.entries()) {
      await sh('ip', 'link', 'add', 'eth0', 'netns', p.ns, 'type', 'veth', 'peer', 'name', `kptp${i + 1}`, 'netns', NODE);
      await inNs(p.ns, 'ip', 'addr', 'add', `${p.ip}/24`, 'dev', 'eth0');
      await inNs(p.ns, 'ip', 'link', 'set', 'eth0', 'up');
      await inNs(p.ns, 'ip', 'route', 'add', 'default', 'via', p.gw);
      await inNs(p.ns, 'ip', '-6', 'addr', 'add', `${p.ip6}/64`, 'dev', 'eth0', 'nodad');
      await inNs(p.ns, 'ip', '-6', 'route', 'add', 'default', 'via', p.gw6);
      await inNs(NODE, 'ip', '-6', 'addr', 'add', `${p.gw6}/64`, 'dev', `kptp${i + 1}`, 'nodad');
      await inNs(NODE, 'ip', 'addr', 'add', `${p.gw}/24`, 'dev', `kptp${i + 1}`);
      await inNs(NODE, 'ip', 'link', 'set', `kptp${i + 1}`, 'up');
      const child = spawn('ip', ['netns', 'exec', p.ns, process.execPath, '-e', BACKEND, p.id, '8080', '5353'], { stdio: ['ignore', 'pipe', 'inherit'] });
      backends.push(child);
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`backend ${p.id} did not start`)), 10_000);
        child.stdout!.once('data', () => { clearTimeout(timer); resolve(); });
        child.once('exit', (c) => { clearTimeout(timer); reject(new Error(`backend ${p.id} exited ${c}`)); });
      });
    }
    // Services and endpoints, built as the API would send them.
    t.services.update(null, svc('e2e', 'web', { clusterIP: '172.30.0.10', type: 'NodePort', nodePort: 30080 }));
    setEndpoints('web', PODS);
    t.services.update(null, svc('e2e', 'dns', { clusterIP: '172.30.0.11', port: 53, protocol: 'UDP', portName: 'dns' }));
    setEndpoints('dns', PODS, 5353, 'UDP', 'dns');
    t.services.update(null, svc('e2e', 'empty', { clusterIP: '172.30.0.12' }));
    t.services.update(null, svc('e2e', 'sticky', { clusterIP: '172.30.0.13', affinitySeconds: 600 }));
    setEndpoints('sticky', PODS);
    t.services.update(null, svc('e2e', 'local', { clusterIP: '172.30.0.14', type: 'NodePort', nodePort: 30081, etp: 'Local' }));
    setEndpoints('local', PODS.slice(0, 2));
    t.services.update(null, svc('e2e', 'churn', { clusterIP: '172.30.0.15' }));
    setEndpoints('churn', PODS);
    t6.services.update(null, svc('e2e', 'web6', { clusterIP: 'fd00:172:30::10', type: 'NodePort', nodePort: 30090 }));
    t6.endpoints.update(null, slice('e2e', 'web6', 'web6-1', PODS.map((p) => ({ ip: p.ip6, nodeName: p.node })), [{ name: 'p80', port: 8080 }], 6));
    proxier = await mode.createProxier({ runner: nodeRunner, log: silentLogger(), config });
    const first = await sync();
    assert.ok(first.rulesTotal > 0);
    const first6 = await proxier.sync(planInput(t6, config6, 6, [NODE_IP6]), t6.apply(), false);
    assert.ok(first6.rulesTotal > 0);
  });

  after(async () => {
    for (const b of backends) if (b.exitCode === null) b.kill('SIGKILL');
    for (const ns of [NODE, CLIENT, ...PODS.map((p) => p.ns)]) await hostRunner.run('ip', ['netns', 'del', ns]);
  });

  test('jump rules from the built-in chains are installed once', async () => {
    await sync(true);
    const nat = (await inNs(NODE, 'iptables-save', '-t', 'nat')).stdout;
    assert.equal(nat.split('\n').filter((l) => l.startsWith('-A PREROUTING') && l.includes('-j KUBE-SERVICES')).length, 1);
    assert.match(nat, /-A POSTROUTING .*-j KUBE-POSTROUTING/);
  });

  test('TCP via ClusterIP reaches every endpoint', async () => {
    const rs = await fromClient('tcp', '172.30.0.10', 80, 30);
    assert.ok(rs.every((r) => r.ok), JSON.stringify(rs.filter((r) => !r.ok)));
    assert.deepEqual([...ids(rs)].sort(), ['p1', 'p2', 'p3']);
  });

  test('UDP via ClusterIP reaches every endpoint', async () => {
    const rs = await fromClient('udp', '172.30.0.11', 53, 30);
    assert.ok(rs.every((r) => r.ok), JSON.stringify(rs.filter((r) => !r.ok)));
    assert.deepEqual([...ids(rs)].sort(), ['p1', 'p2', 'p3']);
  });

  test('IPv6 through ip6tables: ClusterIP and NodePort reach every endpoint', async () => {
    const rules = (await inNs(NODE, 'ip6tables-save', '-t', 'nat')).stdout;
    assert.match(rules, /-A PREROUTING .*-j KUBE-SERVICES/);
    for (const [host, port] of [['fd00:172:30::10', 80], [NODE_IP6, 30090]] as const) {
      const rs = await fromClient('tcp', host, port, 24);
      assert.ok(rs.every((r) => r.ok), JSON.stringify(rs.filter((r) => !r.ok)));
      assert.deepEqual([...ids(rs)].sort(), ['p1', 'p2', 'p3'], `${host}:${port}`);
    }
  });

  test('live trace reads the kernel rules', async () => {
    const r = await mode.trace!({ from: CLIENT_IP, to: '172.30.0.10', port: 80, protocol: 'TCP', live: true }, { runner: nodeRunner });
    assert.equal(r.output, PODS.map((p) => `${p.ip}:8080`).join(', '));
    assert.equal(r.masq, true, 'off-cluster client to a cluster IP is masqueraded');
  });

  test('NodePort works from the client namespace', async () => {
    const rs = await fromClient('tcp', NODE_IP, 30080, 24);
    assert.ok(rs.every((r) => r.ok), JSON.stringify(rs.filter((r) => !r.ok)));
    assert.deepEqual([...ids(rs)].sort(), ['p1', 'p2', 'p3']);
  });

  test('a service without endpoints refuses at once', async () => {
    const rs = await fromClient('tcp', '172.30.0.12', 80, 3);
    for (const r of rs) {
      assert.equal(r.ok, false);
      assert.equal(r.err, 'ECONNREFUSED');
      assert.ok(r.ms < 1000, `took ${r.ms} ms`);
    }
  });

  test('ClientIP affinity keeps one client on one endpoint', async () => {
    const rs = await fromClient('tcp', '172.30.0.13', 80, 15);
    assert.ok(rs.every((r) => r.ok));
    assert.equal(ids(rs).size, 1, JSON.stringify([...ids(rs)]));
  });

  test('externalTrafficPolicy Local: NodePort reaches only the local endpoint and keeps the client IP', async () => {
    const rs = await fromClient('tcp', NODE_IP, 30081, 15);
    assert.ok(rs.every((r) => r.ok), JSON.stringify(rs));
    assert.deepEqual([...new Set(rs.map((r) => r.id))], [`p1 ${CLIENT_IP}`]);
  });

  test('endpoint churn during a connection loop fails no connection to a ready endpoint', async () => {
    const loop = fromClient('tcp', '172.30.0.15', 80, 150, 20, 20_000);
    const sets = [[PODS[0], PODS[1]], [PODS[1]], [PODS[1], PODS[2]], PODS, [PODS[0]], PODS];
    let partial = 0;
    for (const pods of sets) {
      await new Promise((r) => setTimeout(r, 300));
      setEndpoints('churn', pods);
      const s = await sync();
      if (!/^full/.test(s.diff ?? '')) partial++;
    }
    const rs = await loop;
    assert.ok(partial > 0, 'churn syncs were partial');
    assert.ok(rs.length >= 20, `only ${rs.length} connections`);
    const failed = rs.filter((r) => !r.ok);
    assert.deepEqual(failed, [], `${failed.length} of ${rs.length} connections failed`);
    // Stale endpoint chains of churned endpoints were removed again.
    const nat = (await inNs(NODE, 'iptables-save', '-t', 'nat')).stdout;
    const seps = nat.split('\n').filter((l) => l.startsWith(':KUBE-SEP-')).length;
    const expected = 3 /* web */ + 3 /* dns */ + 3 /* sticky */ + 2 /* local */ + 3 /* churn */;
    assert.equal(seps, expected);
  });

  test('cleanup removes every chain and jump of kube-proxy\'s in the node namespace, both families', async () => {
    await mode.cleanup(nodeRunner, silentLogger());
    for (const save of ['iptables-save', 'ip6tables-save']) {
      for (const table of ['nat', 'filter', 'mangle']) {
        // KUBE-FIREWALL is the kubelet's chain (kube-proxy only duplicates it): it stays, as upstream
        const text = (await inNs(NODE, save, '-t', table)).stdout.split('\n').filter((l) => !l.includes('KUBE-FIREWALL')).join('\n');
        assert.doesNotMatch(text, /KUBE-/, `${save} ${table}`);
      }
    }
  });
});
