// Partial syncs of the ipvs mode in O(changed): after a full sync the proxier keeps
// its own model of what it applied and writes only the difference for the changed Services,
// without reading the whole IPVS table, the ipsets or kube-ipvs0's addresses back. These tests
// hold it to the same kernel state as a fresh full sync, count the commands a one-endpoint
// change runs, and check the fall-backs: a change made behind kproxy's back is repaired by the
// next full sync, a failed partial apply makes the next sync a full one. (The same equivalence
// runs on the real kernel in the IPVS VM: test/ipvs/fixtures/vm-checks.ts.)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { silentLogger } from '../../src/log.ts';
import { rng } from '../support/rng.ts';
import { FakeHost } from './fake.ts';
import { ep, fakeHostProxier, input, kernelSnapshot, RandomWorld, readsOfWholeState, svc } from './support.ts';

const log = silentLogger();

const proxierOn = (host: FakeHost) => fakeHostProxier(host, { log, config: { clusterCIDR: '10.0.0.0/8' } });

/** the kernel state a fresh proxier's full sync of `inp` makes on an empty host */
async function freshFull(inp: ReturnType<RandomWorld['input']>) {
  const host = new FakeHost();
  const px = await proxierOn(host);
  await px.sync(inp, new Set(), true);
  await px.stop();
  return kernelSnapshot(host);
}

for (const seed of [1, 2, 3, 4, 5, 6]) {
  test(`random partial syncs leave the kernel as a fresh full sync does (seed ${seed}, 40 steps)`, async () => {
    const world = new RandomWorld(rng(seed), 10);
    const host = new FakeHost();
    const px = await proxierOn(host);
    await px.sync(world.input(), new Set(), true);
    for (let i = 0; i < 40; i++) {
      const changed = world.change();
      host.calls.length = 0;
      await px.sync(world.input(), changed, false);
      assert.deepEqual(readsOfWholeState(host.calls), [], `step ${i}: a partial sync reads no whole table`);
      assert.deepEqual(await kernelSnapshot(host), await freshFull(world.input()), `step ${i} (changed ${[...changed].join(', ')})`);
    }
    assert.deepEqual(px.terminating.size, 0, 'the fake has no open connections: nothing drains');
    await px.stop();
  });
}

const web = (ips: string[]) => input([[svc('web', '172.30.0.10', 80, { nodePort: 30080 }), ips.map((ip) => ep(ip, 8080))], [svc('other', '172.30.0.11', 80), [ep('10.180.0.9', 8080)]]]);

test('a one-endpoint change runs one command (ipvsadm -R, two lines); a removal reads only its own virtual servers', async () => {
  const host = new FakeHost();
  const px = await proxierOn(host);
  await px.sync(web(['10.180.0.1', '10.180.0.2']), new Set(), true);

  host.calls.length = 0;
  const s = await px.sync(web(['10.180.0.1', '10.180.0.2', '10.180.0.3']), new Set(['ns/web']), false);
  assert.deepEqual(host.calls, ['ipvsadm -R'], 'an added endpoint: one ipvsadm -R and nothing else');
  assert.equal(s.rulesWritten, 2, 'the ClusterIP and the NodePort virtual server get the real server');

  host.calls.length = 0;
  await px.sync(web(['10.180.0.1', '10.180.0.3']), new Set(['ns/web']), false);
  assert.deepEqual(host.calls.sort(), ['ipvsadm -Ln -t 172.30.0.10:80', 'ipvsadm -Ln -t 192.168.0.2:30080', 'ipvsadm -R'].sort(),
    'a removed endpoint: its two virtual servers read alone (connection counters), then one ipvsadm -R');
  assert.ok(!host.ipvs.get('172.30.0.10:80/TCP')!.reals.has('10.180.0.2:8080'));

  host.calls.length = 0;
  await px.sync(web(['10.180.0.1', '10.180.0.3']), new Set(), false);
  assert.deepEqual(host.calls, [], 'nothing changed: no command at all');
  await px.stop();
});

test('a real server with open connections drains through partial syncs: weight 0, deleted by the check that reads only its virtual server', async () => {
  const host = new FakeHost();
  const px = await proxierOn(host);
  await px.sync(web(['10.180.0.1', '10.180.0.2']), new Set(), true);
  host.setConns('172.30.0.10:80/TCP', '10.180.0.2:8080', 3);
  await px.sync(web(['10.180.0.1']), new Set(['ns/web']), false);
  assert.equal(host.ipvs.get('172.30.0.10:80/TCP')!.reals.get('10.180.0.2:8080')!.weight, 0, 'in use: weight 0');
  assert.ok(!host.ipvs.get('192.168.0.2:30080/TCP')!.reals.has('10.180.0.2:8080'), 'idle on the NodePort: deleted at once');
  assert.deepEqual([...px.terminating], ['172.30.0.10:80/TCP/10.180.0.2:8080']);
  host.calls.length = 0;
  assert.equal(await px.checkGraceful(), 0);
  assert.deepEqual(host.calls, ['ipvsadm -Ln -t 172.30.0.10:80'], 'the check reads only the draining virtual server');
  host.setConns('172.30.0.10:80/TCP', '10.180.0.2:8080', 0);
  assert.equal(await px.checkGraceful(), 1);
  assert.deepEqual(await kernelSnapshot(host), await freshFull(web(['10.180.0.1'])));
  // the model followed the check's delete: a later change does not try it again
  host.calls.length = 0;
  await px.sync(web(['10.180.0.1', '10.180.0.4']), new Set(['ns/web']), false);
  assert.deepEqual(host.calls, ['ipvsadm -R']);
  assert.deepEqual(await kernelSnapshot(host), await freshFull(web(['10.180.0.1', '10.180.0.4'])));
  await px.stop();
});

test('a change made behind kproxy\'s back is not seen by partial syncs and is repaired by the next full sync', async () => {
  const host = new FakeHost();
  const px = await proxierOn(host);
  const inp = web(['10.180.0.1', '10.180.0.2']);
  await px.sync(inp, new Set(), true);
  const want = await kernelSnapshot(host);
  // someone deletes a virtual server, a set entry and a VIP
  host.ipvs.delete('172.30.0.11:80/TCP');
  host.sets.get('KUBE-CLUSTER-IP')!.entries.delete('172.30.0.10,tcp:80');
  host.links.get('kube-ipvs0')!.delete('172.30.0.11');
  host.ipvs.get('172.30.0.10:80/TCP')!.reals.get('10.180.0.1:8080')!.weight = 5;
  await px.sync(inp, new Set(['ns/web']), false);
  assert.notDeepEqual(await kernelSnapshot(host), want, 'a partial sync trusts its model (no read)');
  host.calls.length = 0;
  await px.sync(inp, new Set(), true);
  assert.ok(host.calls.includes('ipvsadm -Ln') && host.calls.includes('ipset save'), 'the full sync reads the kernel');
  assert.deepEqual(await kernelSnapshot(host), want, 'and repairs it');
  await px.stop();
});

test('a failed partial apply keeps the error, and the next sync is a full one that reads the kernel and converges', async () => {
  const host = new FakeHost();
  const px = await proxierOn(host);
  await px.sync(web(['10.180.0.1']), new Set(), true);
  // the kernel refuses the new real server once (as a transient failure)
  host.refuseIpvsLines.push({ match: /10\.180\.0\.7/, error: 'Memory allocation problem' });
  await assert.rejects(px.sync(web(['10.180.0.1', '10.180.0.7']), new Set(['ns/web']), false), /KPROXY_IPVS_APPLY_FAILED|ipvsadm -R failed/);
  host.refuseIpvsLines.length = 0;
  host.calls.length = 0;
  // the sync loop asks for a full sync after a failure; even a partial request falls back to one
  await px.sync(web(['10.180.0.1', '10.180.0.7']), new Set(), false);
  assert.ok(host.calls.includes('ipvsadm -Ln'), `a full sync read the IPVS table: ${host.calls.join(', ')}`);
  assert.deepEqual(await kernelSnapshot(host), await freshFull(web(['10.180.0.1', '10.180.0.7'])));
  await px.stop();
});

test('a change of the node facts (its addresses) re-plans everything: partial request, full sync', async () => {
  const host = new FakeHost();
  const px = await proxierOn(host);
  await px.sync(web(['10.180.0.1']), new Set(), true);
  const moved = { ...web(['10.180.0.1']), node: { ...web([]).node, nodeIPs: ['192.168.0.3'] } };
  await px.sync(moved, new Set(), false);
  assert.ok(host.ipvs.has('192.168.0.3:30080/TCP') && !host.ipvs.has('192.168.0.2:30080/TCP'), [...host.ipvs.keys()].join(', '));
  await px.stop();
});

test('a Service with a loopback VIP added by a partial sync is reported (KPROXY_SERVICE_IP_SKIPPED) and left out', async () => {
  const lines: string[] = [];
  const host = new FakeHost();
  const capture = { ...log, warn: (o: Record<string, unknown>) => void lines.push(String(o.code)), child: () => capture } as unknown as typeof log;
  const px = await fakeHostProxier(host, { log: capture });
  await px.sync(web(['10.180.0.1']), new Set(), true);
  const withLoop = input([...web(['10.180.0.1']).state.services.values()].map((sp) => [sp, web(['10.180.0.1']).state.endpoints.get(sp.key)!] as [typeof sp, ReturnType<typeof ep>[]]).concat([[svc('loop', '127.0.0.5', 80), [ep('10.180.0.3', 8080)]]]));
  await px.sync(withLoop, new Set(['ns/loop']), false);
  assert.deepEqual(lines, ['KPROXY_SERVICE_IP_SKIPPED']);
  assert.ok(![...host.ipvs.keys()].some((k) => k.startsWith('127.')), 'no virtual server on a loopback VIP');
  await px.stop();
});
