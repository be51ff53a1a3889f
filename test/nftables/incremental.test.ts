// Partial syncs replan only the changed services (cached per-port fragments) and leave the
// kernel holding the table a full render of the same state gives; the nft executor reports a
// killed `nft -f` as a timeout. The proxier runs the real nft in a network namespace this
// file creates; after each sync its table, as `nft -j list table` gives it, is compared with
// the full render loaded by `nft -f` into a second namespace (test/support/nft-kernel.ts: the
// kernel's word, not kproxy's parser). Namespaces kpt-nft-incr-*, removed in `after`.
import { renderOps } from '../../src/kernel/nft/model.ts';
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import { hostRunner, runChecked, type CommandRunner, type RunOptions, inputText } from '../../src/kernel/runner.ts';
import { applyTimeoutMs, NftExecutor } from '../../src/kernel/nft/exec.ts';
import { silentLogger } from '../../src/log.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { optionsFromInput, planRuleset } from '../../src/modes/nftables/plan.ts';
import { countObjects, dumpRuleset, elementKey, type NftElement } from '../../src/modes/nftables/ruleset.ts';
import { partialTransaction } from '../../src/modes/nftables/transaction.ts';
import { NftProxier } from '../../src/modes/nftables/proxier.ts';
import { diffTables, readTable, verdictTarget, type KernelTable } from '../support/nft-kernel.ts';
import { uniqueName } from '../support/netns.ts';
import { nsRunner } from './objects.ts';
import { makeSlice, nodePortService, type ServiceSpec } from '../support/builders.ts';

const NODE = { nodeName: 'node-a', nodeIPs: ['192.168.0.2'], nodeLabels: { 'kubernetes.io/hostname': 'node-a' }, family: 4 as const };

function service(i: number, extra: Partial<ServiceSpec> = {}): K8sService {
  return nodePortService(i, {
    ports: [
      { name: 'http', protocol: 'TCP', port: 80, nodePort: 30000 + i },
      { name: 'dns', protocol: 'UDP', port: 53, nodePort: 31000 + i },
    ],
    ...extra,
  });
}

function endpoints(i: number, ips: string[], local: string[] = []): K8sEndpointSlice {
  return makeSlice('ns', `svc${i}`, {
    name: `svc${i}-x`,
    endpoints: ips.map((ip) => ({ ip, node: local.includes(ip) ? 'node-a' : 'node-b', ready: true })),
    ports: [
      { name: 'http', port: 8080 },
      { name: 'dns', port: 5353, protocol: 'UDP' },
    ],
  });
}

const P = uniqueName('kpt-nft-incr');
/** `partial`: the proxier's; `full`: the full render, loaded fresh for each comparison. */
const NS = { partial: `${P}-a`, full: `${P}-b` };

before(async () => {
  for (const ns of Object.values(NS)) await runChecked(hostRunner, 'ip', ['netns', 'add', ns], { timeoutMs: 10_000 });
});

after(async () => {
  for (const ns of Object.values(NS)) await hostRunner.run('ip', ['netns', 'del', ns], { timeoutMs: 10_000 });
});

/** The real nft in the partial namespace, keeping the text of every transaction it applied. */
class RecordingNft implements CommandRunner {
  texts: string[] = [];
  private readonly inner = nsRunner(NS.partial);
  async run(cmd: string, args: string[], opts: RunOptions = {}) {
    const r = await this.inner.run(cmd, args, opts);
    if (cmd === 'nft' && args[0] === '-f' && r.code === 0) this.texts.push(inputText(opts.input));
    return r;
  }
}

/** Both namespaces without a kube-proxy table. */
async function emptyTables(): Promise<void> {
  for (const ns of Object.values(NS)) await nsRunner(ns).run('nft', ['delete', 'table', 'ip', 'kube-proxy'], { timeoutMs: 10_000 });
}

/** The kernel's table for a full render (`nft -f` into the `full` namespace, replacing what it held). */
async function kernelOf(render: string): Promise<KernelTable> {
  await nsRunner(NS.full).run('nft', ['delete', 'table', 'ip', 'kube-proxy'], { timeoutMs: 10_000 });
  await runChecked(nsRunner(NS.full), 'nft', ['-f', '-'], { input: render, timeoutMs: 20_000 });
  return readTable(nsRunner(NS.full), 'ip');
}

/**
 * How the partial namespace's table differs from the full render's beyond what partial syncs
 * leave for later, each checked: chains under a Service's name that are flushed (retired),
 * affinity sets no rule names (retired), and exactly the elements the proxier reports as
 * lingering, each in the kernel and harmless (a ClusterIP, or a jump into an empty chain).
 * Empty when all is well.
 */
async function unexplained(lingering: Array<{ set: string; el: NftElement }>, render: string): Promise<string[]> {
  const partial = await readTable(nsRunner(NS.partial), 'ip');
  const d = diffTables(partial, await kernelOf(render));
  const problems = [...d.differences];
  for (const name of d.extraChains) {
    if (!name.includes('/') || partial.chains.get(name)!.rules.length > 0) problems.push(`chain ${name}: only in the partial table, and not a flushed Service chain`);
  }
  const rules = JSON.stringify([...partial.chains.values()].flatMap((c) => c.rules));
  for (const name of d.extraSets) {
    if (!name.startsWith('affinity-') || rules.includes(`"@${name}"`) || partial.sets.get(name)!.elements.size > 0) problems.push(`set ${name}: only in the partial table, and not a retired affinity set`);
  }
  const lingers = new Map<string, number>();
  for (const { set } of lingering) lingers.set(set, (lingers.get(set) ?? 0) + 1);
  for (const set of new Set([...lingers.keys(), ...d.extraElements.keys()])) {
    const extra = d.extraElements.get(set) ?? new Map<string, string>();
    if (extra.size !== (lingers.get(set) ?? 0)) problems.push(`${set}: ${extra.size} elements beyond the full render, ${lingers.get(set) ?? 0} reported lingering`);
    if (set === 'cluster-ips') continue;
    for (const [key, value] of extra) {
      const target = verdictTarget(value);
      if (target === undefined || (partial.chains.get(target)?.rules.length ?? 1) > 0) problems.push(`${set} ${key}: goes to ${target ?? value}, not to an empty chain`);
    }
  }
  for (const { set, el } of lingering) {
    const r = await nsRunner(NS.partial).run('nft', ['get', 'element', 'ip', 'kube-proxy', set, `{ ${elementKey(el.key)} }`], { timeoutMs: 10_000 });
    if (r.code !== 0) problems.push(`lingering ${set} { ${elementKey(el.key)} } is not in the kernel: ${r.stderr.trim()}`);
  }
  return problems;
}

const sorted = (text: string) => text.split('\n').filter(Boolean).sort();

test('a partial sync replans only the changed service and yields the full render of the state', async () => {
  const config = resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8' });
  const tracker = new ProxyStateTracker(4, NODE.nodeName);
  const N = 30;
  for (let i = 0; i < N; i++) {
    let extra: Partial<NonNullable<K8sService['spec']>> = {};
    if (i % 5 === 1) extra = { sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: 60 } } };
    if (i % 5 === 2) extra = { type: 'LoadBalancer', externalTrafficPolicy: 'Local', loadBalancerSourceRanges: ['203.0.113.0/24'] };
    // Two services claim the same external IP and port: their map element is shared.
    if (i === 3 || i === 4) extra = { externalIPs: ['1.2.3.9'] };
    tracker.services.update(null, service(i, extra));
    if (i !== 7) tracker.endpoints.update(null, endpoints(i, [`10.180.${i}.1`, `10.180.${i}.2`], [`10.180.${i}.2`]));
  }
  const lbStatus = (i: number): K8sService => ({ ...service(i, { type: 'LoadBalancer', externalTrafficPolicy: 'Local', loadBalancerSourceRanges: ['203.0.113.0/24'] }), status: { loadBalancer: { ingress: [{ ip: `1.2.3.${i}` }] } } });
  tracker.services.update(service(2), lbStatus(2));
  const all = tracker.apply();
  const input: PlanInput = { state: tracker.state, config, node: NODE };
  const o = optionsFromInput(input);
  await emptyTables();
  const nft = new RecordingNft();
  const proxier = new NftProxier({ runner: nft, log: silentLogger(), staleChainDelayMs: 0 });

  await proxier.sync(input, all, true);
  assert.equal(proxier.planner.plannedTotal, 2 * N, 'the full sync plans every port');
  assert.equal(proxier.dump(), dumpRuleset(planRuleset(tracker.state, o)));

  const steps: Array<{ name: string; change: () => void; planned: number }> = [
    { name: 'one endpoint added', change: () => tracker.endpoints.update(endpoints(5, ['10.180.5.1', '10.180.5.2']), endpoints(5, ['10.180.5.1', '10.180.5.2', '10.180.5.3'])), planned: 2 },
    { name: 'sticky service loses an endpoint', change: () => tracker.endpoints.update(endpoints(6, ['10.180.6.1', '10.180.6.2']), endpoints(6, ['10.180.6.2'])), planned: 2 },
    { name: 'service without endpoints gets one', change: () => tracker.endpoints.update(null, endpoints(7, ['10.180.7.1'])), planned: 2 },
    { name: 'local-policy LB loses its local endpoint', change: () => tracker.endpoints.update(endpoints(2, ['10.180.2.1', '10.180.2.2'], ['10.180.2.2']), endpoints(2, ['10.180.2.1'])), planned: 2 },
    { name: 'one of two services sharing an external IP is deleted', change: () => tracker.services.update(service(4, { externalIPs: ['1.2.3.9'] }), null), planned: 0 },
    { name: 'a service is added', change: () => tracker.services.update(null, service(40)), planned: 2 },
    { name: 'a service port changes', change: () => tracker.services.update(service(8), service(8, { ports: [{ name: 'http', protocol: 'TCP', port: 8080, nodePort: 30008 }] })), planned: 1 },
  ];
  for (const step of steps) {
    const prevFull = planRuleset(tracker.state, o);
    step.change();
    const changed = tracker.apply();
    assert.equal(changed.size, 1, step.name);
    const before = proxier.planner.plannedTotal;
    const prevTx = proxier.lastTransactionText();
    const lingeringBefore = new Map<string, Map<string, NftElement>>();
    for (const { set, el } of proxier.lingeringElements()) {
      if (!lingeringBefore.has(set)) lingeringBefore.set(set, new Map());
      lingeringBefore.get(set)!.set(elementKey(el.key), el);
    }
    const stats = await proxier.sync(input, changed, false);
    assert.equal(proxier.planner.plannedTotal - before, step.planned, `${step.name}: ports replanned`);
    // The object count is kept by the patch, not recounted: it must equal a recount.
    assert.equal(stats.rulesTotal, countObjects(planRuleset(tracker.state, o)), `${step.name}: rulesTotal`);

    const fullRender = dumpRuleset(planRuleset(tracker.state, o));
    assert.equal(proxier.dump(), fullRender, `${step.name}: the proxier's table is the full render`);
    // The kernel, after the partial transaction, holds exactly the full render, plus what
    // the proxier left for later: each lingering element harmless (a ClusterIP, or a jump
    // into a chain flushed in this sync), retired chains flushed.
    assert.deepEqual(await unexplained(proxier.lingeringElements(), fullRender), [], `${step.name}: the kernel's table`);
    // Same commands as the whole-table diff would write.
    const expected = partialTransaction(planRuleset(tracker.state, o), prevFull, { lingering: lingeringBefore });
    assert.ok(expected.ops.length > 0, step.name);
    assert.notEqual(proxier.lastTransactionText(), prevTx, step.name);
    // Plus, when it deletes elements (nft then lists every chain anyway), the chains and
    // affinity sets retired by earlier syncs ride along.
    const leftBefore = new Set([...lingeringBefore].flatMap(([set, els]) => [...els.keys()].map((k) => `delete element ip kube-proxy ${set} { ${k} }`)));
    const isRider = (l: string) => l.startsWith('delete chain ') || l.startsWith('delete set ip kube-proxy affinity-') || (leftBefore.has(l) && !renderOps(expected.ops).includes(l));
    const [riders, rest] = [sorted(proxier.lastTransactionText()).filter(isRider), sorted(proxier.lastTransactionText()).filter((l) => !isRider(l))];
    if (riders.length) assert.match(proxier.lastTransactionText(), /^delete element /m, `${step.name}: retired chains ride only with deletes`);
    assert.deepEqual(rest, sorted(renderOps(expected.ops)), `${step.name}: transaction`);
  }
  // The shared external IP element now leads to the service that still claims it.
  assert.match(proxier.dump(), /service-ips \{ 1\.2\.3\.9 \. tcp \. 80 : goto external-[A-Z0-9]+-ns\/svc3\/tcp\/http \}/);

  // Nothing changed: nothing replanned, nothing written.
  const before = proxier.planner.plannedTotal;
  const stats = await proxier.sync(input, new Set(), false);
  assert.equal(stats.rulesWritten, 0);
  assert.equal(proxier.planner.plannedTotal, before);

  // A full sync replans everything again and writes the same table, nothing left lingering.
  await proxier.sync(input, new Set(), true);
  assert.equal(proxier.dump(), dumpRuleset(planRuleset(tracker.state, o)));
  assert.deepEqual(await unexplained([], proxier.dump()), []);
});

test('nft -f limit scales with the transaction; a killed nft reports KPROXY_NFT_TIMEOUT', async () => {
  assert.equal(applyTimeoutMs(3), 31_000);
  assert.equal(applyTimeoutMs(240_000), 270_000);
  assert.equal(applyTimeoutMs(5_000_000), 600_000);

  const seen: number[] = [];
  // `nft` here is a real process that outlives the limit and is killed by the runner.
  const slow: CommandRunner = {
    run: (_cmd, _args, opts) => {
      seen.push(opts?.timeoutMs ?? 0);
      return hostRunner.run('sleep', ['10'], opts);
    },
  };
  const exec = new NftExecutor(slow, { timeoutMs: 100 });
  const t0 = Date.now();
  await assert.rejects(
    exec.apply('add table ip kube-proxy\nadd chain ip kube-proxy x\n'),
    (e: Error) => {
      assert.match(e.message, /^KPROXY_NFT_TIMEOUT: nft did not finish within 1s \(transaction of 2 lines\); the previous ruleset is unchanged; /);
      return true;
    },
  );
  assert.deepEqual(seen, [1100]);
  assert.ok(Date.now() - t0 < 5000);

  // A rejected transaction still names its line, not a timeout.
  const rejecting: CommandRunner = { run: async () => ({ code: 1, stdout: '', stderr: '/dev/stdin:2:1-3: Error: syntax error' }) };
  await assert.rejects(new NftExecutor(rejecting).apply('add table ip kube-proxy\nbad\n'), /KPROXY_NFT_APPLY: nft rejected the transaction at line 2: bad/);
});

test('retired chains are deleted after an idle sync, or once due staleChainMaxWaitMs, never by a sync that carries a change', async () => {
  const config = resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8' });
  const tracker = new ProxyStateTracker(4, NODE.nodeName);
  const ips = (i: number, n: number) => Array.from({ length: n }, (_, k) => `10.180.${i}.${k + 1}`);
  const count = new Map<number, number>();
  for (let i = 0; i < 6; i++) {
    tracker.services.update(null, service(i));
    tracker.endpoints.update(null, endpoints(i, ips(i, 3)));
    count.set(i, 3);
  }
  const setEndpoints = (i: number, n: number) => {
    tracker.endpoints.update(endpoints(i, ips(i, count.get(i)!)), endpoints(i, ips(i, n)));
    count.set(i, n);
    return tracker.apply();
  };
  const input: PlanInput = { state: tracker.state, config, node: NODE };
  let now = 0;
  await emptyTables();
  const nft = new RecordingNft();
  const proxier = new NftProxier({ runner: nft, log: silentLogger(), now: () => now, staleChainDelayMs: 1000, staleChainBatchMs: 0, staleChainMaxWaitMs: 60_000 });
  await proxier.sync(input, tracker.apply(), true);
  /** the transactions a step sent */
  const step = async (at: number, changed: Set<string>): Promise<string> => {
    now = at;
    const from = nft.texts.length;
    await proxier.sync(input, changed, false);
    return nft.texts.slice(from).join('');
  };
  const deleted = (text: string) => text.split('\n').filter((l) => l.startsWith('delete chain ')).map((l) => l.split(' ').at(-1)).sort();

  // svc0 loses an endpoint: its two endpoint chains (tcp and udp) are flushed, not deleted.
  const retired = 2;
  let tx = await step(0, setEndpoints(0, 2));
  assert.deepEqual(deleted(tx), []);
  const flushed = tx.split('\n').filter((l) => /^flush chain .*10\.180\.0\.3/.test(l));
  assert.equal(flushed.length, retired, tx);
  // A stream of changes, long after they are due: no sync that carries a change deletes them.
  for (let k = 1; k <= 5; k++) {
    tx = await step(k * 5000, setEndpoints(k, 4));
    assert.deepEqual(deleted(tx), [], `change at ${k * 5} s`);
    for (const l of tx.split('\n').filter(Boolean)) assert.match(l, /^(add chain|flush chain) /, `change at ${k * 5} s`);
  }
  // The first idle sync deletes them, in a transaction of their own.
  tx = await step(26_000, new Set());
  assert.deepEqual(deleted(tx), flushed.map((l) => l.split(' ').at(-1)).sort());
  assert.equal(tx.split('\n').filter(Boolean).length, retired, 'only the deletions');
  assert.deepEqual(deleted(await step(27_000, new Set())), [], 'deleted once');

  // Under a stream that never pauses they go once due for staleChainMaxWaitMs.
  tx = await step(30_000, setEndpoints(5, 2));
  const second = tx.split('\n').filter((l) => /^flush chain .*10\.180\.5\.[34]/.test(l)).map((l) => l.split(' ').at(-1)).sort();
  assert.equal(second.length, 4, tx);
  let n = 4;
  for (let at = 35_000; at < 30_000 + 1000 + 60_000; at += 5000) assert.deepEqual(deleted(await step(at, setEndpoints(1, ++n))), [], `change at ${at / 1000} s`);
  tx = await step(91_000, setEndpoints(2, 5));
  assert.deepEqual(deleted(tx), second, 'deleted after the change of the sync that found them overdue');
  // And the kernel holds the full render of the state.
  assert.deepEqual(await unexplained([], dumpRuleset(planRuleset(tracker.state, optionsFromInput(input)))), []);
});
