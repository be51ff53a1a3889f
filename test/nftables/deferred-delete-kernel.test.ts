// Real kernel, both families: a deleted Service costs no `delete element` on the hot path
// (nft 1.0.6 lists every chain of the table for it: 1.4 s at 10,000 Services). Its dispatch
// elements stay, jumping into its chains, which the same transaction flushes, and its
// ClusterIP stays in cluster-ips; they are deleted later with the retired chains (idle or
// full sync). Checked with packets: a node namespace (kproxy's table, the client) routes
// everything over a veth pair to a pods namespace whose loopback holds the pod ranges
// (`local` routes) and a listener on :8080 that answers with the address it was reached at;
// a connect to a VIP that is DNATed reaches an endpoint address, one that is not does not.
// Namespaces come from uniqueName() and are removed in `after`, with the listener, also on
// failure.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import { hostRunner, runChecked } from '../../src/kernel/runner.ts';
import { silentLogger } from '../../src/log.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { dumpRuleset } from '../../src/modes/nftables/ruleset.ts';
import { NftProxier } from '../../src/modes/nftables/proxier.ts';
import { dropFlushedChains, dropLingering, dropRetiredAffinitySets, kernelTable, tableLines } from '../support/nft-retired.ts';
import { Netns, uniqueName } from '../support/netns.ts';
import { waitFor } from '../support/wait.ts';
import { nsRunner } from './objects.ts';
import { lbStatus, makeService, makeSlice } from '../support/builders.ts';

const NS = { a: uniqueName('kpt-nft-dd-a'), b: uniqueName('kpt-nft-dd-b'), pods: uniqueName('kpt-nft-dd-p') };
let node: Netns;
let pods: Netns;
let ready = '';

const SERVER = `
const net = require('node:net');
net.createServer((s) => { s.on('error', () => {}); s.end(s.localAddress.replace(/^::ffff:/, '') + '\\n'); }).listen(8080, '::', () => console.log('ready'));
setTimeout(() => process.exit(0), 600000).unref();
`;

const CLIENT = `
const net = require('node:net');
const [host, port] = process.argv.slice(1);
const s = net.connect({ host, port: Number(port) }); let buf = '';
const t = setTimeout(() => { s.destroy(); console.log(JSON.stringify({ err: 'TIMEOUT' })); }, 2000);
s.on('data', (d) => (buf += d)); s.on('end', () => { clearTimeout(t); console.log(JSON.stringify({ reply: buf.trim() })); });
s.on('error', (e) => { clearTimeout(t); console.log(JSON.stringify({ err: e.code })); });
`;

/** One TCP connect from the node namespace: the address that answered, or the error. */
async function connect(host: string, port = 80): Promise<{ reply?: string; err?: string }> {
  const r = await nsRunner(NS.a).run(process.execPath, ['-e', CLIENT, host, String(port)], { timeoutMs: 20_000 });
  return JSON.parse(r.stdout.trim().split('\n').at(-1) || '{"err":"NO_OUTPUT"}');
}

type Fam = 4 | 6;
const A = {
  vip: (f: Fam, i: number) => (f === 4 ? `172.30.0.${i + 1}` : `fd00:172:30::${(i + 1).toString(16)}`),
  ep: (f: Fam, i: number, k: number) => (f === 4 ? `10.180.${i}.${k + 1}` : `fd00:10:180::${(i + 1).toString(16)}:${(k + 1).toString(16)}`),
};

function service(f: Fam, i: number, vip = A.vip(f, i)): K8sService {
  return makeService('ns', `svc${i}`, {
    type: 'LoadBalancer',
    clusterIP: vip,
    ipFamilies: [f === 6 ? 'IPv6' : 'IPv4'],
    ports: [{ name: 'http', protocol: 'TCP', port: 80, nodePort: 30000 + i }],
    loadBalancerSourceRanges: i === 2 ? [f === 4 ? '203.0.113.0/24' : 'fd00:203::/64'] : undefined,
  }, lbStatus(f === 4 ? `1.2.3.${i + 1}` : `fd00:1:2:3::${i + 1}`));
}

function slice(f: Fam, i: number): K8sEndpointSlice {
  return makeSlice('ns', `svc${i}`, {
    name: `svc${i}-x`,
    family: f,
    endpoints: [0, 1].map((k) => ({ ip: A.ep(f, i, k), node: 'node-b', ready: true })),
    ports: [{ name: 'http', port: 8080 }],
  });
}

/** The kernel's kube-proxy table (`nft -j list table`). */
const table = (ns: string, fam: 'ip' | 'ip6') => kernelTable(nsRunner(ns), fam, 'kube-proxy');
const lines = tableLines;

before(async () => {
  node = Netns.create(NS.a);
  pods = Netns.create(NS.pods);
  Netns.create(NS.b);
  node.exec('ip', ['link', 'add', 'vn', 'type', 'veth', 'peer', 'name', 'vp', 'netns', NS.pods]);
  for (const [ns, dev, v4, v6, gw4, gw6] of [
    [node, 'vn', '192.168.0.2/24', 'fd00::2/64', '192.168.0.3', 'fd00::3'],
    [pods, 'vp', '192.168.0.3/24', 'fd00::3/64', '', ''],
  ] as const) {
    ns.exec('ip', ['addr', 'add', v4, 'dev', dev]);
    ns.exec('ip', ['-6', 'addr', 'add', v6, 'dev', dev, 'nodad']);
    ns.exec('ip', ['link', 'set', dev, 'up']);
    if (gw4) ns.exec('ip', ['route', 'add', 'default', 'via', gw4]);
    if (gw6) ns.exec('ip', ['-6', 'route', 'add', 'default', 'via', gw6]);
  }
  // Every pod address is the pods namespace's own: a DNATed connect reaches the listener at
  // the endpoint's address.
  pods.exec('ip', ['route', 'add', 'local', '10.0.0.0/8', 'dev', 'lo']);
  pods.exec('ip', ['-6', 'route', 'add', 'local', 'fd00:10::/32', 'dev', 'lo']);
  pods.spawn(process.execPath, ['-e', SERVER], { onOutput: (s) => void (ready += s) });
  await waitFor('the listener to start', () => ready.includes('ready'), 30_000);
});

after(async () => {
  await pods?.destroy();
  await node?.destroy();
  await hostRunner.run('ip', ['netns', 'del', NS.b], { timeoutMs: 10_000 });
});

for (const f of [4, 6] as const) {
  test(`IPv${f}: a deleted Service is not DNATed at once without 'delete element'; re-created, its lingering elements serve again; the idle sync leaves a fresh full sync's table`, async () => {
    const fam = f === 4 ? 'ip' : 'ip6';
    const nodeCtx = { nodeName: 'node-a', nodeIPs: [f === 4 ? '192.168.0.2' : 'fd00::2'], nodeLabels: {}, family: f };
    const config = resolveConfig({}, { mode: 'nftables', clusterCidr: f === 4 ? '10.0.0.0/8' : 'fd00:10::/32' });
    const tracker = new ProxyStateTracker(f, nodeCtx.nodeName);
    const input: PlanInput = { state: tracker.state, config, node: nodeCtx };
    for (let i = 0; i < 3; i++) {
      tracker.services.update(null, service(f, i));
      tracker.endpoints.update(null, slice(f, i));
    }
    for (const ns of Object.values(NS)) await nsRunner(ns).run('nft', ['delete', 'table', fam, 'kube-proxy'], { timeoutMs: 10_000 });
    let clock = 1_000_000;
    const proxier = new NftProxier({ runner: nsRunner(NS.a), log: silentLogger(), now: () => clock, staleChainDelayMs: 1000, staleChainBatchMs: 0 });
    await proxier.sync(input, tracker.apply(), true);
    const eps = (i: number) => [A.ep(f, i, 0), A.ep(f, i, 1)];
    const reached = async (i: number, vip = A.vip(f, i)) => {
      const r = await connect(vip);
      return r.reply !== undefined && eps(i).includes(r.reply) ? 'endpoint' : `not an endpoint: ${JSON.stringify(r)}`;
    };
    assert.equal(await reached(1), 'endpoint', 'before: the VIP is DNATed to an endpoint');

    // 1. Deleted: no `delete element`, the VIP is not DNATed, the others still are.
    tracker.services.update(service(f, 1), null);
    tracker.endpoints.update(slice(f, 1), null);
    await proxier.sync(input, tracker.apply(), false);
    const sent = proxier.lastTransactionText();
    assert.doesNotMatch(sent, /^delete /m, 'no delete on the hot path');
    const left = proxier.lingeringElements().map(({ set }) => set).sort();
    assert.deepEqual(left, ['cluster-ips', 'service-ips', 'service-ips', 'service-nodeports'], 'its ClusterIP, ClusterIP and LB IP dispatch, NodePort linger');
    const r = await connect(A.vip(f, 1));
    assert.ok(r.err !== undefined, `the deleted Service's VIP is not DNATed: ${JSON.stringify(r)}`);
    assert.equal(await reached(0), 'endpoint');
    assert.equal(await reached(2), 'endpoint');
    assert.deepEqual(dropLingering(await table(NS.a, fam), proxier.lingeringElements()), [], 'lingering elements are in the kernel and harmless');

    // 2. Re-created with the same VIP and port before the cleanup: the elements serve again.
    tracker.services.update(null, service(f, 1));
    tracker.endpoints.update(null, slice(f, 1));
    await proxier.sync(input, tracker.apply(), false);
    assert.doesNotMatch(proxier.lastTransactionText(), /^delete /m);
    assert.doesNotMatch(proxier.lastTransactionText(), /service-ips .*elements/, 'the lingering dispatch element is re-used, not re-added');
    assert.deepEqual(proxier.lingeringElements(), []);
    assert.equal(await reached(1), 'endpoint', 're-created: DNATed again');

    // 3. Deleted again, then re-created under the same name with another ClusterIP: the old
    // VIP's lingering element would lead into the live chain again, so it goes now.
    tracker.services.update(service(f, 1), null);
    tracker.endpoints.update(slice(f, 1), null);
    await proxier.sync(input, tracker.apply(), false);
    const newVip = A.vip(f, 9);
    tracker.services.update(null, service(f, 1, newVip));
    tracker.endpoints.update(null, slice(f, 1));
    await proxier.sync(input, tracker.apply(), false);
    assert.match(proxier.lastTransactionText(), new RegExp(`^delete element ${fam} kube-proxy service-ips \\{ ${A.vip(f, 1).replace(/\./g, '\\.')} \\. tcp \\. 80 \\}`, 'm'));
    assert.equal(await reached(1, newVip), 'endpoint', 'the new VIP is DNATed');
    const old = await connect(A.vip(f, 1));
    assert.ok(old.err !== undefined, `the old VIP is not: ${JSON.stringify(old)}`);

    // 4. Deleted once more; the idle sync (after the delay) deletes what lingers, then the chains.
    tracker.services.update(service(f, 1, newVip), null);
    tracker.endpoints.update(slice(f, 1), null);
    await proxier.sync(input, tracker.apply(), false);
    assert.ok(proxier.lingeringElements().length > 0);
    clock += 2000;
    await proxier.sync(input, new Set(), false);
    assert.deepEqual(proxier.lingeringElements(), [], 'nothing lingers after the idle sync');
    await new NftProxier({ runner: nsRunner(NS.b), log: silentLogger() }).sync(input, new Set(), true);
    assert.deepEqual(lines(await table(NS.a, fam)), lines(await table(NS.b, fam)), 'exactly a fresh full sync\'s table');
    assert.equal(proxier.partialFallbacks, 0);
  });
}
