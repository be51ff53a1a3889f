// Failure isolation in the ipvs mode: what the kernel refuses for one
// Service (an ipset entry, an ipvsadm line) is left out and reported with the Service's name,
// and every other Service still converges: sets, IPVS table, iptables and addresses.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import pino from 'pino';
import { plan } from '../../src/modes/ipvs/planner.ts';
import { FakeHost } from './fake.ts';
import { ep, fakeHostProxier, input, svc } from './support.ts';

function capturingLogger() {
  const lines: Array<Record<string, unknown>> = [];
  const stream = new Writable({
    write(chunk, _enc, cb) {
      for (const l of String(chunk).split('\n')) if (l.trim()) lines.push(JSON.parse(l));
      cb();
    },
  });
  return {
    log: pino({ level: 'info' }, stream),
    lines,
    refusals: () => lines.filter((l) => l.code === 'KPROXY_IPVS_REFUSED'),
    skippedVIPs: () => lines.filter((l) => l.code === 'KPROXY_SERVICE_IP_SKIPPED'),
  };
}

const proxierOn = (host: FakeHost, log: pino.Logger) => fakeHostProxier(host, { log });

const good = () => svc('good', '172.30.0.10', 80, { nodePort: 30080 });
const lb = (ranges: string[]) =>
  svc('lb', '172.30.0.20', 80, { loadBalancerVIPs: ['1.2.3.4'], loadBalancerSourceRanges: ranges });
const eps = [ep('10.180.0.1', 8080)];

test('loadBalancerSourceRanges 0.0.0.0/0 allows every source: no firewall entry, and the sync goes through', async () => {
  const host = new FakeHost();
  const { log, refusals } = capturingLogger();
  const px = await proxierOn(host, log);
  await px.sync(input([[good(), eps], [lb(['0.0.0.0/0'])!, eps]]), new Set(), true);
  assert.deepEqual([...host.ipvs.keys()].sort(), ['1.2.3.4:80/TCP', '172.30.0.10:80/TCP', '172.30.0.20:80/TCP', '192.168.0.2:30080/TCP']);
  assert.equal(host.sets.get('KUBE-LOAD-BALANCER-FW')!.entries.size, 0, 'no source-range firewall for an allow-all range');
  assert.equal(host.sets.get('KUBE-LOAD-BALANCER-SOURCE-CIDR')!.entries.size, 0);
  assert.deepEqual([...host.sets.get('KUBE-LOAD-BALANCER')!.entries], ['1.2.3.4,tcp:80']);
  assert.equal(refusals().length, 0, 'an allow-all range is not an error');
  await px.stop();
});

test('a /0 next to narrower ranges still allows all; narrower ranges alone still filter', () => {
  const wide = plan(input([[lb(['10.0.0.0/8', '0.0.0.0/0']), eps]]));
  assert.equal(wide.sets.get('KUBE-LOAD-BALANCER-FW')!.entries.size, 0);
  assert.equal(wide.lbNoNodeAccess.length, 0, 'the node is not cut off either');
  const narrow = plan(input([[lb(['10.0.0.0/8']), eps]]));
  assert.deepEqual([...narrow.sets.get('KUBE-LOAD-BALANCER-SOURCE-CIDR')!.entries], ['1.2.3.4,tcp:80,10.0.0.0/8']);
  const v6 = plan(input([[svc('lb6', 'fd00::20', 80, { loadBalancerVIPs: ['2001:db8::4'], loadBalancerSourceRanges: ['::/0'] }), [ep('fd00:10::1', 80)]]], {}, { family: 6, nodeIPs: ['fd00::2'] }));
  assert.equal(v6.sets.get('KUBE-6-LOAD-BALANCER-FW')!.entries.size, 0);
  assert.equal(v6.rejected.length, 0);
});

test('a service address of 0.0.0.0 is left out and reported; the other services converge', async () => {
  const host = new FakeHost();
  const { log, refusals, skippedVIPs } = capturingLogger();
  const px = await proxierOn(host, log);
  const bad = svc('zero', '0.0.0.0', 81, { externalIPs: ['0.0.0.0'] });
  await px.sync(input([[good(), eps], [bad, eps]]), new Set(), true);
  assert.deepEqual([...host.ipvs.keys()].sort(), ['172.30.0.10:80/TCP', '192.168.0.2:30080/TCP']);
  assert.ok(!host.links.get('kube-ipvs0')!.has('0.0.0.0'), '0.0.0.0 is never bound to kube-ipvs0');
  assert.deepEqual([...host.sets.get('KUBE-CLUSTER-IP')!.entries], ['172.30.0.10,tcp:80']);
  // The planner leaves the unspecified VIPs out before any set entry is built (src/core/vip.ts),
  // so the kernel never sees them; the proxier names each once.
  assert.equal(refusals().length, 0, 'nothing reached the kernel to be refused');
  const r = skippedVIPs();
  assert.deepEqual(r.map((l) => `${l.service} ${l.field} ${l.ip}`).sort(), ['ns/zero: clusterIP 0.0.0.0', 'ns/zero: externalIPs 0.0.0.0']);
  // the next sync does not log it again (no flood)
  await px.sync(input([[good(), eps], [bad, eps]]), new Set(), false);
  assert.equal(skippedVIPs().length, r.length);
  await px.stop();
});

test('one ipset entry refused by the kernel: the rest of the sets, IPVS and iptables are applied; it is named, left out of partial syncs, retried on full ones', async () => {
  const host = new FakeHost();
  host.refuseSetEntries.set('KUBE-CLUSTER-IP 172.30.0.30,tcp:80', 'Kernel error received: Invalid argument');
  const { log, refusals } = capturingLogger();
  const px = await proxierOn(host, log);
  const odd = svc('odd', '172.30.0.30', 80);
  const inp = input([[good(), eps], [odd, eps], [svc('zzz', '172.30.0.40', 80), eps]]);
  const stats = await px.sync(inp, new Set(), true);
  assert.deepEqual([...host.sets.get('KUBE-CLUSTER-IP')!.entries].sort(), ['172.30.0.10,tcp:80', '172.30.0.40,tcp:80'], 'entries after the refused line went in');
  assert.ok(host.ipvs.has('172.30.0.30:80/TCP') && host.ipvs.has('172.30.0.40:80/TCP'), 'ipvsadm ran');
  assert.ok(host.iptables['4'].nat.get('KUBE-SERVICES')!.length > 0, 'iptables ran');
  assert.equal(stats.rejected, 1);
  assert.equal(refusals().length, 1);
  assert.equal(refusals()[0].service, 'ns/odd:');
  assert.match(String(refusals()[0].entry), /KUBE-CLUSTER-IP 172\.30\.0\.30,tcp:80/);

  const inputs: string[] = [];
  const orig = host.run.bind(host);
  host.run = async (cmd, args, opts) => {
    if (cmd === 'ipset' && args[0] === 'restore') inputs.push(opts?.input ?? '');
    return orig(cmd, args, opts);
  };
  await px.sync(inp, new Set(), false);
  assert.deepEqual(inputs, [], 'a partial sync does not send the refused line again');
  assert.equal(refusals().length, 1, 'and does not log it again');

  host.refuseSetEntries.clear();
  const s3 = await px.sync(inp, new Set(), true);
  assert.ok(host.sets.get('KUBE-CLUSTER-IP')!.entries.has('172.30.0.30,tcp:80'), 'a full sync tries again');
  assert.equal(s3.rejected, 0);
  await px.stop();
});

test('one ipvsadm line refused: the other virtual servers get in, the refusal names the service, iptables and addresses are applied', async () => {
  const host = new FakeHost();
  host.refuseIpvsLines.push({ match: /^-A -t 172\.30\.0\.30:80 /, error: 'Memory allocation problem' });
  const { log, refusals } = capturingLogger();
  const px = await proxierOn(host, log);
  const inp = input([[good(), eps], [svc('odd', '172.30.0.30', 80), eps], [svc('zzz', '172.30.0.40', 80), eps]]);
  const stats = await px.sync(inp, new Set(), true);
  assert.deepEqual([...host.ipvs.keys()].sort(), ['172.30.0.10:80/TCP', '172.30.0.40:80/TCP', '192.168.0.2:30080/TCP']);
  assert.deepEqual([...host.ipvs.get('172.30.0.40:80/TCP')!.reals.keys()], ['10.180.0.1:8080']);
  assert.ok(host.links.get('kube-ipvs0')!.has('172.30.0.40'));
  const r = refusals();
  assert.ok(r.length >= 1 && r.every((l) => l.service === 'ns/odd:'), JSON.stringify(r));
  assert.ok(r.some((l) => /Memory allocation problem/.test(String(l.reason))));
  assert.ok(stats.rejected! >= 1);
  await px.stop();
});

test('a line that ends the ipvsadm batch (a usage error) early in a big sync: every other service still gets in, with a bounded number of retries', async () => {
  const host = new FakeHost();
  host.refuseIpvsLines.push({ match: /^-A -t 172\.30\.1\.3:80 /, error: 'Zero port specified for non-persistent service', abort: true });
  const { log, refusals } = capturingLogger();
  const px = await proxierOn(host, log);
  const many = Array.from({ length: 60 }, (_, i) => [svc(`s${String(i).padStart(2, '0')}`, `172.30.1.${i + 1}`, 80), eps] as [ReturnType<typeof svc>, typeof eps]);
  host.calls.length = 0;
  await px.sync(input(many), new Set(), true);
  assert.equal(host.ipvs.size, 59);
  assert.ok(!host.ipvs.has('172.30.1.3:80/TCP'));
  for (let i = 0; i < 60; i++) if (i !== 2) assert.equal(host.ipvs.get(`172.30.1.${i + 1}:80/TCP`)?.reals.size, 1, `service ${i}`);
  assert.ok(refusals().every((l) => l.service === 'ns/s02:'), JSON.stringify(refusals()));
  const restores = host.calls.filter((c) => c === 'ipvsadm -R').length;
  assert.ok(restores <= 30, `${restores} ipvsadm -R runs`);
  await px.stop();
});

test('a failed iptables-restore does not stop IPVS and addresses; the sync still reports the failure', async () => {
  const host = new FakeHost();
  const { log } = capturingLogger();
  const px = await proxierOn(host, log);
  const orig = host.run.bind(host);
  host.run = async (cmd, args, opts) => (cmd === 'iptables-restore' ? { code: 4, stdout: '', stderr: 'iptables-restore: lock held' } : orig(cmd, args, opts));
  await assert.rejects(px.sync(input([[good(), eps]]), new Set(), true), /KPROXY_IPVS_IPTABLES_FAILED/);
  assert.ok(host.ipvs.has('172.30.0.10:80/TCP'), 'IPVS applied despite the iptables failure');
  assert.ok(host.links.get('kube-ipvs0')!.has('172.30.0.10'));
  await px.stop();
});
