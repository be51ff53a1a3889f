import { test } from 'node:test';
import assert from 'node:assert/strict';
import { silentLogger } from '../../src/log.ts';
import { createIpvsProxier } from '../../src/modes/ipvs/proxier.ts';
import { mode } from '../../src/modes/ipvs/index.ts';
import { Ipvsadm } from '../../src/kernel/ipvs/exec.ts';
import { resolveConfig } from '../../src/config/config.ts';
import { ensureModules } from '../../src/kernel/modules.ts';
import { FakeHost } from './fake.ts';
import { ep, fakeHostProxier, input, svc } from './support.ts';

const log = silentLogger();

const proxierOn = (host: FakeHost, raw: Parameters<typeof input>[1] = {}, extra: { extraModules?: string[] } = {}) =>
  fakeHostProxier(host, { log, config: raw, ...extra });

const web = (eps = [ep('10.180.0.1', 8080), ep('10.180.0.2', 8080)]) =>
  input([[svc('web', '172.30.0.10', 80, { nodePort: 30080 }), eps]]);

test('first sync builds IPVS, ipsets, addresses and iptables; an unchanged second sync changes nothing', async () => {
  const host = new FakeHost();
  const px = await proxierOn(host);
  const s1 = await px.sync(web(), new Set(), true);
  assert.ok(s1.rulesWritten > 0);
  assert.deepEqual([...host.ipvs.keys()].sort(), ['172.30.0.10:80/TCP', '192.168.0.2:30080/TCP']);
  assert.deepEqual([...host.ipvs.get('172.30.0.10:80/TCP')!.reals.keys()], ['10.180.0.1:8080', '10.180.0.2:8080']);
  assert.deepEqual([...host.links.get('kube-ipvs0')!], ['172.30.0.10']);
  assert.deepEqual([...host.sets.get('KUBE-NODE-PORT-TCP')!.entries], ['30080']);
  assert.ok(host.iptables['4'].nat.get('KUBE-SERVICES')!.length > 0);
  assert.ok(host.jumpsInBuiltins('4').some((r) => r.includes('-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES')));

  host.calls.length = 0;
  const s2 = await px.sync(web(), new Set(), false);
  assert.equal(s2.rulesWritten, 0);
  assert.ok(!host.calls.some((c) => c === 'ipvsadm -R' || c === 'ipset restore' || c.startsWith('ip addr')), host.calls.join('\n'));
  assert.ok(!host.calls.some((c) => c.startsWith('iptables-restore')), 'unchanged iptables text is not restored again');
  await px.sync(web(), new Set(), true);
  assert.equal(host.jumpsInBuiltins('4').filter((r) => r.startsWith('nat/-A OUTPUT')).length, 1, 'a full sync does not duplicate jumps');
  await px.stop();
});

test('only the difference is applied: an added endpoint is one -a line', async () => {
  const host = new FakeHost();
  const px = await proxierOn(host);
  await px.sync(web(), new Set(), true);
  const spy: string[] = [];
  const orig = host.run.bind(host);
  host.run = async (cmd, args, opts) => {
    if (cmd === 'ipvsadm' && args[0] === '-R') spy.push(opts?.input ?? '');
    return orig(cmd, args, opts);
  };
  await px.sync(web([ep('10.180.0.1', 8080), ep('10.180.0.2', 8080), ep('10.180.0.3', 8080)]), new Set(['ns/web']), false);
  assert.deepEqual(spy, ['-a -t 172.30.0.10:80 -r 10.180.0.3:8080 -m -w 1\n-a -t 192.168.0.2:30080 -r 10.180.0.3:8080 -m -w 1\n']);
  await px.stop();
});

test('graceful termination: weight 0 while connections are open, deleted once they drain; UDP at once', async () => {
  const host = new FakeHost();
  const px = await proxierOn(host);
  const both = [ep('10.180.0.1', 8080), ep('10.180.0.2', 8080)];
  const inp = (eps: typeof both) =>
    input([
      [svc('web', '172.30.0.10', 80), eps],
      [svc('dns', '172.30.0.53', 53, { protocol: 'UDP' }), eps.map((e) => ep(e.ip, 53))],
    ]);
  await px.sync(inp(both), new Set(), true);
  host.setConns('172.30.0.10:80/TCP', '10.180.0.2:8080', 1, 0);
  host.setConns('172.30.0.53:53/UDP', '10.180.0.2:53', 0, 1);
  await px.sync(inp([both[0]]), new Set(['ns/web', 'ns/dns']), false);
  assert.equal(host.ipvs.get('172.30.0.10:80/TCP')!.reals.get('10.180.0.2:8080')!.weight, 0);
  assert.ok(!host.ipvs.get('172.30.0.53:53/UDP')!.reals.has('10.180.0.2:53'), 'UDP real server removed at once');
  assert.deepEqual([...px.terminating], ['172.30.0.10:80/TCP/10.180.0.2:8080']);
  assert.equal(await px.checkGraceful(), 0, 'still in use: kept');
  host.setConns('172.30.0.10:80/TCP', '10.180.0.2:8080', 0, 0);
  assert.equal(await px.checkGraceful(), 1);
  assert.ok(!host.ipvs.get('172.30.0.10:80/TCP')!.reals.has('10.180.0.2:8080'));
  assert.equal(px.terminating.size, 0);
  await px.stop();
});

test('an endpoint that returns while draining gets weight 1 back', async () => {
  const host = new FakeHost();
  const px = await proxierOn(host);
  await px.sync(web(), new Set(), true);
  host.setConns('172.30.0.10:80/TCP', '10.180.0.2:8080', 2);
  await px.sync(web([ep('10.180.0.1', 8080)]), new Set(['ns/web']), false);
  assert.equal(host.ipvs.get('172.30.0.10:80/TCP')!.reals.get('10.180.0.2:8080')!.weight, 0);
  await px.sync(web(), new Set(['ns/web']), false);
  assert.equal(host.ipvs.get('172.30.0.10:80/TCP')!.reals.get('10.180.0.2:8080')!.weight, 1);
  assert.equal(px.terminating.size, 0);
  await px.stop();
});

test('a removed service loses its virtual servers, VIP and set entries; foreign virtual servers stay', async () => {
  const host = new FakeHost();
  // someone else's virtual server on an address kproxy does not own
  await new Ipvsadm(host).restore(['-A -t 10.9.9.9:80 -s wrr', '-a -t 10.9.9.9:80 -r 10.180.9.9:80 -m -w 3']);
  const px = await proxierOn(host);
  await px.sync(web(), new Set(), true);
  await px.sync(input([]), new Set(['ns/web']), false);
  assert.deepEqual([...host.ipvs.keys()], ['10.9.9.9:80/TCP']);
  assert.equal(host.ipvs.get('10.9.9.9:80/TCP')!.reals.get('10.180.9.9:80')!.weight, 3);
  assert.deepEqual([...host.links.get('kube-ipvs0')!], []);
  assert.equal(host.sets.get('KUBE-CLUSTER-IP')!.entries.size, 0);
  assert.equal(host.sets.get('KUBE-NODE-PORT-TCP')!.entries.size, 0);
  await px.stop();
});

test('after a restart, stale virtual servers of kproxy are found through kube-ipvs0 and the NodePort set', async () => {
  const host = new FakeHost();
  const px1 = await proxierOn(host);
  await px1.sync(web(), new Set(), true);
  await px1.stop();
  const px2 = await proxierOn(host);
  await px2.sync(input([[svc('other', '172.30.0.11', 80), [ep('10.180.0.5', 80)]]]), new Set(), true);
  assert.deepEqual([...host.ipvs.keys()], ['172.30.0.11:80/TCP']);
  await px2.stop();
});

test('the fake rejects what the kernel rejects, and the executor surfaces it', async () => {
  const host = new FakeHost();
  await assert.rejects(new Ipvsadm(host).restore(['-a -t 10.1.1.1:80 -r 10.180.0.1:80 -m -w 1']), /KPROXY_IPVS_APPLY_FAILED.*Service not defined/);
  const r = await host.run('ipset', ['restore'], { input: 'add KUBE-CLUSTER-IP 10.1.1.1,tcp:80\n' });
  assert.equal(r.code, 1);
  assert.match(r.stderr, /does not exist/);
  const r2 = await host.run('iptables-restore', ['--noflush'], { input: '*nat\n:KUBE-X - [0:0]\n-A KUBE-X -m set --match-set NOPE dst -j ACCEPT\nCOMMIT\n' });
  assert.notEqual(r2.code, 0);
});

test('modules: a missing scheduler module is loaded with modprobe; an unloadable one is a clear error', async () => {
  const host = new FakeHost();
  await proxierOn(host, { ipvs: { scheduler: 'lc' } });
  assert.ok(host.loadedModules.has('ip_vs') && host.loadedModules.has('ip_vs_lc'));
  assert.ok(host.calls.includes('modprobe -- ip_vs_lc'));
  assert.ok(!host.calls.includes('modprobe -- nf_conntrack') || host.loadedModules.has('nf_conntrack'));

  const h2 = new FakeHost();
  h2.availableModules.delete('ip_vs_sed');
  await assert.rejects(
    proxierOn(h2, { ipvs: { scheduler: 'sed' } }),
    (e: Error) =>
      e.message ===
      "KPROXY_IPVS_MODULE_MISSING: kernel module ip_vs_sed is not loaded and could not be loaded (modprobe ip_vs_sed: modprobe: FATAL: Module ip_vs_sed not found in directory /lib/modules/6.1.0-fake); load it with 'modprobe ip_vs_sed' or pick another scheduler",
  );
  await assert.rejects(ensureModules(['ip_vs_bogus'], { runner: h2, fs: h2.moduleFS() }), /KPROXY_IPVS_MODULE_MISSING: kernel module ip_vs_bogus/);
});

test('sysctls and ipvsadm timeouts are applied at creation', async () => {
  const host = new FakeHost();
  await proxierOn(host, { ipvs: { strictARP: true, tcpTimeout: '900s', tcpFinTimeout: '120s', udpTimeout: '300s' } });
  for (const [k, v] of [['net.ipv4.vs.conntrack', '1'], ['net.ipv4.vs.expire_nodest_conn', '1'], ['net.ipv4.vs.expire_quiescent_template', '1'], ['net.ipv4.ip_forward', '1'], ['net.ipv4.conf.all.arp_ignore', '1'], ['net.ipv4.conf.all.arp_announce', '2']]) {
    assert.equal(host.sysctls.get(k), v, k);
  }
  assert.equal(host.sysctls.get('net.ipv4.vs.conn_reuse_mode'), undefined, 'left as-is on kernels >= 5.9, as upstream');
  assert.deepEqual(host.timeouts, ['900', '120', '300']);
  const old = new FakeHost();
  await createIpvsProxier({ config: resolveConfig({ mode: 'ipvs' }), runner: old, log, sysctl: old.sysctl(), moduleFS: old.moduleFS(), gracefulCheckMs: 0, kernelRelease: '5.4.0-1' });
  assert.equal(old.sysctls.get('net.ipv4.vs.conn_reuse_mode'), '0');
});

test('cleanup removes owned virtual servers, kube-ipvs0, chains, jumps and sets; leaves foreign ones', async () => {
  const host = new FakeHost();
  host.links.set('eth0', new Set(['192.168.0.2']));
  await new Ipvsadm(host).restore(['-A -t 10.9.9.9:80 -s wrr']);
  const px = await proxierOn(host);
  await px.sync(web(), new Set(), true);
  await px.stop();
  await mode.cleanup(host, log);
  assert.deepEqual([...host.ipvs.keys()], ['10.9.9.9:80/TCP']);
  assert.ok(!host.links.has('kube-ipvs0'));
  assert.deepEqual([...host.sets.keys()].filter((n) => n.startsWith('KUBE-')), []);
  assert.deepEqual(host.kubeChains('4'), []);
  assert.deepEqual(host.jumpsInBuiltins('4'), []);
  await mode.cleanup(host, log); // idempotent
});

test('cleanup does not fail when ipvsadm, ipset and ip6tables are not installed', async () => {
  const host = new FakeHost();
  for (const b of ['ipvsadm', 'ipset', 'ip6tables', 'ip6tables-restore']) host.missing.add(b);
  await mode.cleanup(host, log);
});

test('trace over a plan: virtual server, sorted candidates, scheduler, persistence, masquerade', async () => {
  const s = svc('web', '172.30.0.10', 80, { nodePort: 30080, stickyMaxAgeSeconds: 600 });
  const inp = input([[s, [ep('10.180.0.2', 8080), ep('10.180.0.1', 8080)]]], { clusterCIDR: '10.0.0.0/8', ipvs: { scheduler: 'sh' } });
  const fromPod = await mode.trace!({ from: '10.180.0.9', to: '172.30.0.10', port: 80, protocol: 'TCP', input: inp, live: false }, { runner: new FakeHost() });
  assert.equal(fromPod.output, '10.180.0.1:8080, 10.180.0.2:8080');
  assert.equal(fromPod.masq, false);
  assert.ok(fromPod.notes!.includes('scheduler sh'));
  assert.ok(fromPod.notes!.includes('persistence 600s (sessionAffinity ClientIP)'));
  const fromOutside = await mode.trace!({ from: '203.0.113.5', to: '172.30.0.10', port: 80, protocol: 'TCP', input: inp, live: false }, { runner: new FakeHost() });
  assert.equal(fromOutside.masq, true);
  const nodePort = await mode.trace!({ from: '203.0.113.5', to: '192.168.0.2', port: 30080, protocol: 'TCP', input: inp, live: false }, { runner: new FakeHost() });
  assert.equal(nodePort.output, '10.180.0.1:8080, 10.180.0.2:8080');
  assert.equal(nodePort.masq, true);
  const none = await mode.trace!({ from: '10.180.0.9', to: '172.30.0.99', port: 80, protocol: 'TCP', input: inp, live: false }, { runner: new FakeHost() });
  assert.equal(none.output, '');
  const empty = input([[svc('e', '172.30.0.12', 80), []]]);
  const rej = await mode.trace!({ from: '10.180.0.9', to: '172.30.0.12', port: 80, protocol: 'TCP', input: empty, live: false }, { runner: new FakeHost() });
  assert.equal(rej.output, 'REJECT');
});

test('trace live reads the kernel: LB source ranges drop others', async () => {
  const host = new FakeHost();
  const px = await proxierOn(host, { clusterCIDR: '10.0.0.0/8' });
  const s = svc('lb', '172.30.0.20', 80, { loadBalancerVIPs: ['1.2.3.4'], loadBalancerSourceRanges: ['203.0.113.0/25'] });
  await px.sync(input([[s, [ep('10.180.0.1', 80)]]], { clusterCIDR: '10.0.0.0/8' }), new Set(), true);
  await px.stop();
  const allowed = await mode.trace!({ from: '203.0.113.5', to: '1.2.3.4', port: 80, protocol: 'TCP', live: true }, { runner: host });
  assert.equal(allowed.output, '10.180.0.1:80');
  assert.equal(allowed.masq, true);
  const denied = await mode.trace!({ from: '203.0.113.200', to: '1.2.3.4', port: 80, protocol: 'TCP', live: true }, { runner: host });
  assert.equal(denied.output, 'DROP');
  const pod = await mode.trace!({ from: '10.180.0.7', to: '172.30.0.20', port: 80, protocol: 'TCP', live: true }, { runner: host });
  assert.deepEqual([pod.output, pod.masq], ['10.180.0.1:80', false]);
});
