// Real kernel: what a partial sync sends to `nft -f`. nft 1.0.6 lists every chain of the
// table (60,000 at 10,000 Services) before `add table` with a body, `add rule`, `add
// element` and any `delete` (src/cache.c), which made a one-Service change at 10k cost a
// second; a partial sync writes only the forms whose cache is the table list (add chain
// with a body, add set/map with an elements body, flush chain), and `delete` only when an
// element must go at once: a deleted Service's elements (harmless: its ClusterIP, jumps into
// its chains flushed in the same transaction) linger until an idle sync deletes them. The text asserted on is the text the proxier sent; the
// kernel table after it equals a fresh full sync's. A table changed behind kproxy's back
// makes the partial transaction fail, and the same sync() call repairs it with a full one.
// Namespaces come from uniqueName() and are removed in `after`.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import { hostRunner, runChecked, type CommandRunner, inputText } from '../../src/kernel/runner.ts';
import { silentLogger } from '../../src/log.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { dumpRuleset } from '../../src/modes/nftables/ruleset.ts';
import { PARTIAL_O1_COMMANDS } from '../../src/modes/nftables/transaction.ts';
import { NftProxier } from '../../src/modes/nftables/proxier.ts';
import { dropFlushedChains, dropLingering, dropRetiredAffinitySets, kernelTable, tableLines } from '../support/nft-retired.ts';
import { uniqueName } from '../support/netns.ts';
import { nsRunner } from './objects.ts';
import { clientIPAffinity, lbStatus, nodePortService, numberedSlice } from '../support/builders.ts';

const NS = { partial: uniqueName('kpt-nft-pf-a'), full: uniqueName('kpt-nft-pf-b') };
const NODE = { nodeName: 'node-a', nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4 as const };

/** Runs in a namespace and keeps every transaction given to `nft -f`. */
class RecordingRunner implements CommandRunner {
  sent: string[] = [];
  constructor(private readonly ns: string) {}
  run(cmd: string, args: string[], opts?: Parameters<CommandRunner['run']>[2]) {
    if (cmd === 'nft' && args[0] === '-f') this.sent.push(inputText(opts?.input));
    return hostRunner.run('ip', ['netns', 'exec', this.ns, cmd, ...args], opts);
  }
  take(): string[] {
    const out = this.sent;
    this.sent = [];
    return out;
  }
}

function service(i: number, opts: { sticky?: boolean; local?: boolean; port?: number } = {}): K8sService {
  return nodePortService(i, {
    type: 'LoadBalancer',
    ports: [{ name: 'http', protocol: 'TCP', port: opts.port ?? 80, nodePort: 30000 + i }],
    externalTrafficPolicy: opts.local ? 'Local' : 'Cluster',
    ...(opts.sticky ? clientIPAffinity(60) : {}),
  }, lbStatus(`1.2.3.${i + 1}`));
}

const slice = (i: number, n: number): K8sEndpointSlice => numberedSlice(i, n, (k) => (k % 2 === 0 ? 'node-a' : 'node-b'));

/** The kernel's table, sorted lines; `proxier`: leave out exactly its lingering elements, after checking each is there and harmless. */
async function table(ns: string, proxier?: NftProxier, o: { strict?: boolean } = {}): Promise<string[]> {
  const t = await kernelTable(nsRunner(ns), 'ip', 'kube-proxy');
  if (proxier) assert.deepEqual(dropLingering(t, proxier.lingeringElements()), []);
  if (o.strict) return tableLines(t);
  // Chains retired by a partial sync are flushed now and deleted later.
  dropFlushedChains(t);
  dropRetiredAffinitySets(t);
  return tableLines(t);
}

/** The table a fresh proxier writes for the same state with one full sync. */
async function freshTable(input: PlanInput, o: { strict?: boolean } = {}): Promise<string[]> {
  await nsRunner(NS.full).run('nft', ['delete', 'table', 'ip', 'kube-proxy'], { timeoutMs: 10_000 });
  await new NftProxier({ runner: nsRunner(NS.full), log: silentLogger() }).sync(input, new Set(), true);
  return table(NS.full, undefined, o);
}

function lines(text: string): string[] {
  return text.split('\n').filter(Boolean);
}

before(async () => {
  for (const ns of Object.values(NS)) await runChecked(hostRunner, 'ip', ['netns', 'add', ns], { timeoutMs: 10_000 });
});

after(async () => {
  for (const ns of Object.values(NS)) await hostRunner.run('ip', ['netns', 'del', ns], { timeoutMs: 10_000 });
});

test('a partial sync sends only commands nft runs without listing the table, a Service deletion too; only removals that are not harmless delete at once', async () => {
  const config = resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8' });
  const tracker = new ProxyStateTracker(4, NODE.nodeName);
  for (let i = 0; i < 12; i++) {
    tracker.services.update(null, service(i, { sticky: i % 4 === 1, local: i % 3 === 2 }));
    tracker.endpoints.update(null, slice(i, 3));
  }
  const input: PlanInput = { state: tracker.state, config, node: NODE };
  const runner = new RecordingRunner(NS.partial);
  let clock = 1_000_000;
  const proxier = new NftProxier({ runner, log: silentLogger(), staleChainDelayMs: 60_000, now: () => clock });
  await proxier.sync(input, tracker.apply(), true);
  assert.match(runner.take()[0], /^add table ip kube-proxy/, 'the first sync is a full one');

  // Changes that add, replace or retire chains and add elements, but remove no element.
  const additive: Array<[string, () => void]> = [
    ['endpoint added', () => tracker.endpoints.update(slice(0, 3), slice(0, 4))],
    ['endpoint removed', () => tracker.endpoints.update(slice(3, 3), slice(3, 2))],
    ['endpoint added to a sticky service', () => tracker.endpoints.update(slice(5, 3), slice(5, 5))],
    ['endpoint added to a Local service', () => tracker.endpoints.update(slice(2, 3), slice(2, 4))],
    [
      'service created',
      () => {
        tracker.services.update(null, service(20, { sticky: true }));
        tracker.endpoints.update(null, slice(20, 2));
      },
    ],
  ];
  for (const [what, change] of additive) {
    change();
    await proxier.sync(input, tracker.apply(), false);
    const sent = runner.take();
    assert.equal(sent.length, 1, `${what}: one transaction`);
    const bad = lines(sent[0]).filter((l) => !PARTIAL_O1_COMMANDS.test(l));
    assert.deepEqual(bad, [], `${what}: commands that make nft 1.0.6 list every chain`);
    assert.match(sent[0], /^add chain ip kube-proxy (service|endpoint)-/m, `${what}: a chain was written`);
    assert.deepEqual(await table(NS.partial), await freshTable(input), `${what}: table after the partial sync`);
  }

  // A Service deleted: no `delete element` either (nft 1.0.6 would list every chain for it):
  // its ClusterIP and its dispatch elements, which jump into its chains flushed now, linger.
  tracker.services.update(service(7), null);
  tracker.endpoints.update(slice(7, 3), null);
  await proxier.sync(input, tracker.apply(), false);
  let sent = runner.take();
  assert.equal(sent.length, 1);
  assert.deepEqual(lines(sent[0]).filter((l) => !PARTIAL_O1_COMMANDS.test(l)), [], 'service deleted: only table-list forms');
  const left = proxier.lingeringElements();
  assert.deepEqual(left.map(({ set }) => set).sort(), ['cluster-ips', 'service-ips', 'service-ips', 'service-nodeports']);
  for (const { el } of left) assert.match(el.key.join(' . '), /^(172\.30\.0\.8|1\.2\.3\.8|tcp \. 30007)\b/, 'only its own elements linger');
  assert.deepEqual(await table(NS.partial, proxier), await freshTable(input), 'service deleted (modulo what lingers)');

  // Endpoints emptied: the dispatch element lingers (its chain is flushed); endpoints back:
  // it is used again as it is, and the no-endpoint reject, not harmless, goes at once.
  tracker.endpoints.update(slice(8, 3), slice(8, 0));
  await proxier.sync(input, tracker.apply(), false);
  sent = runner.take();
  assert.deepEqual(lines(sent[0]).filter((l) => !PARTIAL_O1_COMMANDS.test(l)), [], 'endpoints emptied: only table-list forms');
  assert.deepEqual(await table(NS.partial, proxier), await freshTable(input), 'endpoints emptied');
  tracker.endpoints.update(slice(8, 0), slice(8, 2));
  await proxier.sync(input, tracker.apply(), false);
  sent = runner.take();
  for (const l of lines(sent[0]).filter((l) => !PARTIAL_O1_COMMANDS.test(l))) {
    assert.match(l, /^delete element ip kube-proxy no-endpoint-(services|nodeports) \{ (172\.30\.0\.9|1\.2\.3\.9|tcp \. 30008)\b/, 'endpoints back: only its no-endpoint verdicts are deleted');
  }
  assert.match(sent[0], /^delete element ip kube-proxy no-endpoint-services \{ 172\.30\.0\.9 \. tcp \. 80 \}/m);
  assert.doesNotMatch(sent[0], /^add map ip kube-proxy service-ips .*172\.30\.0\.9 /m, 'the lingering dispatch element is used again, not re-added');
  assert.deepEqual(await table(NS.partial, proxier), await freshTable(input), 'endpoints back');

  // After the delay, an idle sync deletes what lingers, then the retired chains: exactly a fresh full sync's table.
  clock += 61_000;
  await proxier.sync(input, new Set(), false);
  assert.deepEqual(proxier.lingeringElements(), []);
  assert.deepEqual(await table(NS.partial, undefined, { strict: true }), await freshTable(input, { strict: true }), 'after the idle sync');
  assert.equal(proxier.partialFallbacks, 0, 'no partial transaction was refused');
});

test('a table changed behind kproxy\'s back: the refused partial sync is repaired by a full sync in the same call', async () => {
  const config = resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8' });
  const tracker = new ProxyStateTracker(4, NODE.nodeName);
  for (let i = 0; i < 6; i++) {
    tracker.services.update(null, service(i));
    tracker.endpoints.update(null, slice(i, 2));
  }
  const input: PlanInput = { state: tracker.state, config, node: NODE };
  const runner = new RecordingRunner(NS.partial);
  await runner.run('nft', ['delete', 'table', 'ip', 'kube-proxy'], { timeoutMs: 10_000 });
  const proxier = new NftProxier({ runner, log: silentLogger() });
  await proxier.sync(input, tracker.apply(), true);
  runner.take();

  // 1. The whole table deleted: a partial sync has no `add table`, so nft refuses it.
  await runChecked(runner, 'nft', ['delete', 'table', 'ip', 'kube-proxy'], { timeoutMs: 10_000 });
  tracker.endpoints.update(slice(1, 2), slice(1, 3));
  const stats = await proxier.sync(input, tracker.apply(), false);
  let sent = runner.take();
  assert.equal(sent.length, 2, 'the refused partial transaction, then a full one');
  assert.doesNotMatch(sent[0], /^add table/m);
  assert.match(sent[1], /^add table ip kube-proxy/);
  assert.equal(proxier.partialFallbacks, 1);
  assert.equal(stats.excludedServices, undefined, 'no Service is blamed for the drift');
  assert.deepEqual(await table(NS.partial), await freshTable(input), 'table repaired');

  // 2. An element kproxy is about to add already there with another verdict.
  await runChecked(runner, 'nft', ['add', 'element', 'ip', 'kube-proxy', 'service-ips', '{ 172.30.0.10 . tcp . 80 : drop }'], { timeoutMs: 10_000 });
  runner.take();
  tracker.services.update(null, service(9));
  tracker.endpoints.update(null, slice(9, 2));
  await proxier.sync(input, tracker.apply(), false);
  sent = runner.take();
  assert.equal(sent.length, 2, 'refused partial, then full');
  assert.match(sent[0], /^add map ip kube-proxy service-ips .*172\.30\.0\.10 \. tcp \. 80 : goto service-/m);
  assert.equal(proxier.partialFallbacks, 2);
  assert.deepEqual(await table(NS.partial), await freshTable(input), 'conflicting element replaced');

  // 3. The next change is a partial sync again.
  tracker.endpoints.update(slice(2, 2), slice(2, 1));
  await proxier.sync(input, tracker.apply(), false);
  sent = runner.take();
  assert.equal(sent.length, 1);
  assert.doesNotMatch(sent[0], /^add table/m);
  assert.deepEqual(await table(NS.partial), await freshTable(input));
});

test('options changed (node address and masquerade-all): the whole-table diff uses the same forms and lands on a fresh full sync\'s table', async () => {
  const tracker = new ProxyStateTracker(4, NODE.nodeName);
  for (let i = 0; i < 6; i++) {
    tracker.services.update(null, service(i, { sticky: i === 1, local: i === 2 }));
    tracker.endpoints.update(null, slice(i, 2));
  }
  const config = resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8' });
  const runner = new RecordingRunner(NS.partial);
  await runner.run('nft', ['delete', 'table', 'ip', 'kube-proxy'], { timeoutMs: 10_000 });
  const proxier = new NftProxier({ runner, log: silentLogger() });
  await proxier.sync({ state: tracker.state, config, node: NODE }, tracker.apply(), true);
  runner.take();

  const input: PlanInput = { state: tracker.state, config: { ...config, masqueradeAll: true }, node: { ...NODE, nodeIPs: ['192.168.0.3'] } };
  const stats = await proxier.sync(input, new Set(), false);
  const sent = runner.take();
  assert.equal(sent.length, 1);
  assert.ok(stats.rulesWritten > 0);
  assert.deepEqual(lines(sent[0]).filter((l) => !PARTIAL_O1_COMMANDS.test(l) && !/^delete element /.test(l)), []);
  assert.match(sent[0], /jump mark-for-masquerade/);
  assert.equal(proxier.partialFallbacks, 0);
  assert.deepEqual(await table(NS.partial), await freshTable(input));
});

test('a stream batch (endpoints added and removed across Services) is one transaction of table-list forms; retired chains go after an idle sync and the table is then exactly a fresh full sync\'s', async () => {
  const config = resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8' });
  const tracker = new ProxyStateTracker(4, NODE.nodeName);
  const counts = new Map<number, number>();
  for (let i = 0; i < 12; i++) {
    tracker.services.update(null, service(i, { sticky: i % 4 === 1, local: i % 3 === 2 }));
    tracker.endpoints.update(null, slice(i, 3));
    counts.set(i, 3);
  }
  const setEndpoints = (i: number, n: number) => {
    tracker.endpoints.update(slice(i, counts.get(i)!), slice(i, n));
    counts.set(i, n);
  };
  const input: PlanInput = { state: tracker.state, config, node: NODE };
  const runner = new RecordingRunner(NS.partial);
  await runner.run('nft', ['delete', 'table', 'ip', 'kube-proxy'], { timeoutMs: 10_000 });
  let now = 0;
  const proxier = new NftProxier({ runner, log: silentLogger(), now: () => now, staleChainDelayMs: 1000, staleChainBatchMs: 0 });
  await proxier.sync(input, tracker.apply(), true);
  runner.take();

  const batches: Array<Array<[number, number]>> = [
    [[0, 4], [2, 4], [5, 5], [3, 2], [4, 1], [6, 2]],
    [[7, 4], [1, 2], [8, 1], [9, 5], [10, 2]],
  ];
  for (const [b, batch] of batches.entries()) {
    now = 5000 * (b + 1);
    for (const [i, n] of batch) setEndpoints(i, n);
    await proxier.sync(input, tracker.apply(), false);
    const sent = runner.take();
    assert.equal(sent.length, 1, `batch ${b}: one transaction`);
    assert.deepEqual(lines(sent[0]).filter((l) => !PARTIAL_O1_COMMANDS.test(l)), [], `batch ${b}: commands that make nft 1.0.6 list every chain`);
    assert.match(sent[0], /^flush chain ip kube-proxy endpoint-\S+10\.180\.\d+\.3\/8080$/m, `batch ${b}: a removed endpoint's chain is flushed`);
    if (b === 1) assert.match(sent[0], /^flush set ip kube-proxy affinity-\S+ns\/svc1\/tcp\/http__10\.180\.1\.3\/8080$/m, 'a sticky Service\'s removed endpoint: its affinity set is flushed, not deleted');
    assert.deepEqual(await table(NS.partial), await freshTable(input), `batch ${b}: table after the partial sync`);
  }
  // Idle: the retired chains are deleted, and nothing is left that a fresh sync would not write.
  now = 20_000;
  await proxier.sync(input, new Set(), false);
  const sent = runner.take();
  assert.equal(sent.length, 1);
  assert.deepEqual(lines(sent[0]).filter((l) => !/^delete (chain ip kube-proxy endpoint-|set ip kube-proxy affinity-)/.test(l)), [], 'only retired endpoint chains and affinity sets');
  assert.match(sent[0], /^delete set ip kube-proxy affinity-\S+ns\/svc1\/tcp\/http__10\.180\.1\.3\/8080$/m, 'the sticky Service\'s retired affinity set');
  await freshTable(input);
  assert.deepEqual(await table(NS.partial, undefined, { strict: true }), await table(NS.full, undefined, { strict: true }), 'no empty chain left behind');
  assert.equal(proxier.partialFallbacks, 0);
});
