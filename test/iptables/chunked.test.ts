// Full syncs applied in chunks (full.ts chunkedPayloads; the nf_tables backend's default):
// - the kernel after a chunked full sync equals the kernel after a one-payload full sync, in
//   both families, over 40 seeded random changes where every third sync is a forced full
//   sync over the previous state (stale chains, changed services) and the rest are partial;
// - between two chunks, every service reachable from KUBE-SERVICES / KUBE-NODEPORTS is
//   entirely its old or entirely its new version (traffic never sees half a service), each
//   Service's dispatch rules (every dispatch chain, both tables) are all old or all new, and on
//   a cold start (no service chain installed) each chunk publishes its own services whole,
//   and the nat jumps into KUBE-SERVICES come with the last restore;
// - leaf chains first, the dispatch rules and stale-chain deletions in the last chunk, each
//   chunk a restore of its own, at most about chunkLines lines, whole services; on a cold
//   start, each chunk's dispatch rules after its services' chains, the catch-all last; over
//   installed rules (the restart form) the dispatch chains edited in consecutive restores
//   (several, with 4 lines per dispatch restore), only the stale chains' flush and deletion
//   after them;
// - (fast-check) the chunked dispatch edits turn any installed dispatch chains into the
//   planned ones on a fake that models positions, each restore within its budget, each
//   Service's edits in one restore;
// - the backend decides: legacy is never chunked, nf_tables is by default;
// - a full sync's restores reach iptables-restore in parts, made as they are read, with the
//   text plan's lines, chunked or not, in both families;
// - a refused line in a middle chunk (a cold start's, or a restart's dispatch restore) still
//   excludes only its Service.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import type { CommandRunner, RunOptions, RunResult } from '../../src/kernel/runner.ts';
import { FakeIptables } from '../../src/kernel/iptables/fake.ts';
import { silentLogger } from '../../src/log.ts';
import { DEFAULT_FACTS, optionsFromConfig } from '../../src/modes/iptables/options.ts';
import { planFull } from '../../src/modes/iptables/full.ts';
import { planPartial } from '../../src/modes/iptables/partial.ts';
import { dispatchBudget } from '../../src/modes/iptables/restart.ts';
import { canonicalRule } from '../../src/modes/iptables/canonical.ts';
import { chunkedDispatchEdits, STATIC_GROUP, type DispatchChain } from '../../src/modes/iptables/dispatch-chunks.ts';
import { chunkLinesFor, DEFAULT_CHUNK_LINES, IptablesProxier } from '../../src/modes/iptables/proxier.ts';
import { planInput, slice, svc, testConfig, tracker } from './helpers.ts';
import { kernelState, rng } from '../support/iptables-state.ts';
import { inputText } from '../../src/kernel/runner.ts';

/** The nat chains reachable from `chain` (its own service's chains), with their rules. */
function closure(k: FakeIptables, chain: string): string {
  const seen = new Set<string>();
  const out: string[] = [];
  const walk = (c: string) => {
    if (seen.has(c) || !/^KUBE-(SVC|SVL|EXT|FW|SEP)-/.test(c)) return;
    seen.add(c);
    if (!k.chains('nat').includes(c)) {
      out.push(`${c}: MISSING`);
      return;
    }
    const rules = k.rules('nat', c);
    out.push(`${c}: ${rules.join(' | ')}`);
    for (const r of rules) {
      const m = / -j (\S+)/.exec(` ${r}`);
      if (m) walk(m[1]);
    }
  };
  walk(chain);
  return out.join('\n');
}

/** Every service entry point: target of a nat KUBE-SERVICES / KUBE-NODEPORTS rule → its closure. */
function reachable(k: FakeIptables): Map<string, string> {
  const out = new Map<string, string>();
  for (const top of ['KUBE-SERVICES', 'KUBE-NODEPORTS']) {
    if (!k.chains('nat').includes(top)) continue;
    for (const r of k.rules('nat', top)) {
      const m = / -j (KUBE-(?:SVC|SVL|EXT|FW)-\S+)/.exec(` ${r}`);
      if (m) out.set(m[1], closure(k, m[1]));
    }
  }
  return out;
}

const DISPATCH: Array<[string, string]> = [
  ['nat', 'KUBE-SERVICES'], ['nat', 'KUBE-NODEPORTS'], ['filter', 'KUBE-SERVICES'], ['filter', 'KUBE-EXTERNAL-SERVICES'],
  ['filter', 'KUBE-NODEPORTS'], ['filter', 'KUBE-PROXY-FIREWALL'],
];

/** Each Service's dispatch rules (both tables, every dispatch chain), by the Service its comment names. */
function dispatchRules(k: FakeIptables): Map<string, string> {
  const out = new Map<string, string[]>();
  for (const [table, chain] of DISPATCH) {
    for (const r of k.rules(table, chain)) {
      const m = /--comment "?(ns\d+\/svc\d+):/.exec(r);
      if (!m) continue;
      let l = out.get(m[1]);
      if (!l) out.set(m[1], (l = []));
      l.push(`${table} ${chain} ${r}`);
    }
  }
  return new Map([...out].map(([s, l]) => [s, l.sort().join('\n')]));
}

/** A runner around a fake that snapshots what traffic could reach after every restore. */
class Watching implements CommandRunner {
  snapshots: Array<Map<string, string>> = [];
  dispatch: Array<Map<string, string>> = [];
  restores: string[] = [];
  constructor(readonly k: FakeIptables) {}
  async run(cmd: string, args: string[], opts?: RunOptions): Promise<RunResult> {
    const r = await this.k.run(cmd, args, opts);
    if (cmd.endsWith('-restore') && r.code === 0 && (inputText(opts?.input).includes('*nat') || inputText(opts?.input).includes('*filter'))) {
      this.restores.push(inputText(opts?.input));
      this.snapshots.push(reachable(this.k));
      this.dispatch.push(dispatchRules(this.k));
    }
    return r;
  }
}

interface Model {
  exists: boolean;
  port: number;
  type: 'ClusterIP' | 'NodePort' | 'LoadBalancer';
  etp: 'Local' | 'Cluster';
  eps: number[];
  svcObj: K8sService | null;
  sliceObj: K8sEndpointSlice | null;
}

for (const family of [4, 6] as const) {
  const ip = (kind: 'cluster' | 'lb' | 'ep', i: number) =>
    family === 4
      ? { cluster: `172.30.1.${i + 1}`, lb: `1.2.3.${i + 1}`, ep: `10.180.${i >> 8}.${i & 255}` }[kind]
      : { cluster: `fd00:172:30::${(i + 1).toString(16)}`, lb: `fd00:1:2:3::${(i + 1).toString(16)}`, ep: `fd00:10:180::${i.toString(16)}` }[kind];

  test(`IPv${family}: chunked full syncs leave the kernel as one-payload full syncs; no half service is ever reachable`, async () => {
    const random = rng(20261203 + family);
    const pick = <T>(xs: T[]): T => xs[Math.floor(random() * xs.length)];
    const config = testConfig();
    const k = new FakeIptables(family);
    const w = new Watching(k);
    // 40 lines per chunk: the 14 services below make several chunks per full sync; 4 lines
    // per dispatch restore: a restart form's dispatch edits often span several.
    const p = new IptablesProxier({ runner: w, log: silentLogger(), config, chunkLines: 40, dispatchChunkLines: 4 });
    const t = tracker(family);
    const N = 14;
    const models: Model[] = [];
    let nextEp = 1;
    const put = (i: number) => {
      const m = models[i];
      const s = m.exists
        ? svc(`ns${i}`, `svc${i}`, {
            clusterIP: ip('cluster', i),
            port: m.port,
            type: m.type,
            nodePort: m.type === 'ClusterIP' ? undefined : 30000 + i,
            etp: m.type === 'ClusterIP' ? undefined : m.etp,
            lbIPs: m.type === 'LoadBalancer' ? [ip('lb', i)] : undefined,
            sourceRanges: m.type === 'LoadBalancer' && i % 2 ? [family === 4 ? '203.0.113.0/25' : 'fd00:203::/64'] : undefined,
          })
        : null;
      const e = m.exists && m.eps.length
        ? slice(`ns${i}`, `svc${i}`, `svc${i}-1`, m.eps.map((n) => ({ ip: ip('ep', n), nodeName: n % 3 === 0 ? 'test-node' : 'other' })), [{ port: 8080 }], family)
        : null;
      if (m.svcObj || s) t.services.update(m.svcObj, s);
      if (m.sliceObj || e) t.endpoints.update(m.sliceObj, e);
      m.svcObj = s;
      m.sliceObj = e;
    };
    for (let i = 0; i < N; i++) {
      models.push({ exists: i < 11, port: 80, type: pick(['ClusterIP', 'NodePort', 'LoadBalancer']), etp: 'Cluster', eps: [nextEp++, nextEp++, nextEp++], svcObj: null, sliceObj: null });
      put(i);
    }
    const input = () => planInput(t, config, family, [family === 4 ? '192.168.0.2' : 'fd00:192::2']);

    // Cold start: several restores, each publishing whole services (the cold-start form:
    // every chunk's dispatch rules ride with its services' chains); whatever is reachable
    // after a chunk is exactly what the last chunk leaves, and more of it chunk after chunk.
    await p.sync(input(), t.apply(), true);
    assert.ok(w.restores.length >= 4, `${w.restores.length} restores`);
    const cold = w.snapshots.at(-1)!;
    assert.ok(cold.size > 0);
    for (const [n, snap] of w.snapshots.entries()) {
      for (const [entry, content] of snap) assert.equal(content, cold.get(entry), `cold chunk ${n}: ${entry} half written`);
      if (n) assert.ok(snap.size >= w.snapshots[n - 1].size);
    }
    assert.ok(w.snapshots.filter((s) => s.size > 0).length >= 3, 'services published chunk by chunk');
    // (restores[0] is the jump rules' restore)
    assert.match(w.restores[1], /^\*filter/, 'the filter table first');
    // The last restore: the NodePort catch-all, then the nat jumps into KUBE-SERVICES, which
    // no earlier restore made (so no chunk's commit re-validates the services published before it).
    assert.match(w.restores.at(-1)!, /^\*nat\n-A KUBE-SERVICES .*must be the last rule in this chain.*\nCOMMIT\n\*nat\n-I OUTPUT .*-j KUBE-SERVICES\n-I PREROUTING .*-j KUBE-SERVICES\nCOMMIT\n$/, 'the NodePort catch-all last, with the jumps');
    const natOf = (r: string) => r.split(/^\*/m).filter((t) => t.startsWith('nat\n')).join('');
    for (const r of w.restores.slice(0, -1)) assert.doesNotMatch(natOf(r), /^-I (PREROUTING|OUTPUT) .*-j KUBE-SERVICES$/m);
    assert.equal(k.rules('nat', 'PREROUTING').filter((r) => r.endsWith('-j KUBE-SERVICES')).length, 1);
    let chunkedFullSyncs = 1;
    let multiDispatch = 0;

    const kinds = ['endpoint-add', 'endpoint-remove', 'service-add', 'service-remove', 'port', 'policy', 'type'] as const;
    for (let step = 0; step < 40; step++) {
      // Several changes at once, so a forced full sync rewrites many services and drops chains
      // (more before a full sync: its dispatch edits then span several restores).
      const full = step % 3 === 0;
      for (let c = 0; c < (full ? 8 : 3); c++) {
        const kind = pick([...kinds]);
        const i = Math.floor(random() * N);
        const m = models[i];
        if (kind === 'endpoint-add') m.eps.push(nextEp++);
        else if (kind === 'endpoint-remove') m.eps.splice(Math.floor(random() * m.eps.length), 1);
        else if (kind === 'service-add') m.exists = true;
        else if (kind === 'service-remove') m.exists = false;
        else if (kind === 'port') m.port = m.port === 80 ? 81 : 80;
        else if (kind === 'policy') m.etp = m.etp === 'Local' ? 'Cluster' : 'Local';
        else m.type = pick(['ClusterIP', 'NodePort', 'LoadBalancer']);
        put(i);
      }
      const before = reachable(k);
      const dispatchBefore = dispatchRules(k);
      w.snapshots = [];
      w.dispatch = [];
      w.restores = [];
      await p.sync(input(), t.apply(), full);
      const after = reachable(k);
      const dispatchAfter = dispatchRules(k);
      if (full && w.restores.length > 1) chunkedFullSyncs++;
      // Between chunks: each reachable service is wholly old or wholly new, and so are each
      // Service's dispatch rules (all of them, in every dispatch chain of both tables).
      for (const snap of w.snapshots.slice(0, -1)) {
        for (const [entry, content] of snap) {
          assert.ok(content === before.get(entry) || content === after.get(entry), `step ${step}: ${entry} half written:\n${content}`);
        }
      }
      for (const [n, snap] of w.dispatch.entries()) {
        for (const s of new Set([...snap.keys(), ...dispatchBefore.keys(), ...dispatchAfter.keys()])) {
          const now = snap.get(s);
          assert.ok(now === dispatchBefore.get(s) || now === dispatchAfter.get(s), `step ${step}, after restore ${n}: ${s}'s dispatch rules half switched:\n${now}\nbefore:\n${dispatchBefore.get(s)}\nafter:\n${dispatchAfter.get(s)}\n${w.restores.join("---\n")}`);
        }
      }
      if (full) {
        // A full sync over installed rules (the restart form): leaf chunks, then the restores
        // that edit the dispatch chains (and the filter table), one after the other, then only
        // the stale chains' flush and deletion.
        const touches = (r: string) => /^(:KUBE-(SERVICES|NODEPORTS) |-[AID] KUBE-(SERVICES|NODEPORTS) |\*filter)/m.test(r);
        const d = w.restores.map((r, n) => (touches(r) ? n : -1)).filter((n) => n >= 0);
        if (d.length) assert.deepEqual(d, Array.from({ length: d.length }, (_, i) => d[0] + i), `step ${step}: the dispatch restores are consecutive`);
        if (d.length > 1) multiDispatch++;
        for (const [n, r] of w.restores.entries()) {
          if (d.length && n > d.at(-1)!) assert.deepEqual(r.split('\n').filter((l) => l && l !== '*nat' && l !== 'COMMIT' && !/^(-X |:KUBE-(SVC|SVL|EXT|FW|SEP)-)/.test(l)), [], 'after them only flushes and deletions');
          if (d.length && n < d.at(-1)!) assert.doesNotMatch(r, /^-X /m, 'no deletion before the last dispatch restore');
        }
      }
      const fresh = new FakeIptables(family);
      await new IptablesProxier({ runner: fresh, log: silentLogger(), config, chunkLines: 0 }).sync(input(), new Set(), true);
      assert.equal(kernelState(k), kernelState(fresh), `step ${step}`);
    }
    assert.ok(chunkedFullSyncs >= 10, `${chunkedFullSyncs} chunked full syncs`);
    assert.ok(multiDispatch >= 3, `${multiDispatch} full syncs with several dispatch restores`);
  });
}

/** 50 NodePort Services of 3 endpoints each, and the iptables options of an IPv4 node */
function fiftyNodePorts() {
  const t = tracker();
  for (let i = 0; i < 50; i++) {
    t.services.update(null, svc(`ns${i}`, `svc${i}`, { clusterIP: `172.30.0.${i + 1}`, type: 'NodePort', nodePort: 30000 + i }));
    t.endpoints.update(null, slice(`ns${i}`, `svc${i}`, 's', [1, 2, 3].map((e) => ({ ip: `10.180.${e}.${i}` })), [{ port: 8080 }]));
  }
  t.apply();
  const opts = optionsFromConfig(testConfig(), { nodeName: 'test-node', nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4 }, DEFAULT_FACTS);
  return { t, opts };
}

test('chunks hold whole services, about chunkLines lines each, leaf chains first and the dispatch rules last', () => {
  const { t, opts } = fiftyNodePorts();
  const one = planFull({ state: t.state, opts });
  const plan = planFull({ state: t.state, opts, chunkLines: 100 });
  assert.equal(one.chunks, undefined);
  assert.equal(plan.payload, '');
  const chunks = plan.chunks!;
  assert.ok(chunks.length >= 8, `${chunks.length} chunks`);
  // The same lines overall (only the *nat / COMMIT framing repeats).
  const body = (s: string) => s.split('\n').filter((l) => l && l !== '*nat' && l !== 'COMMIT').sort();
  assert.deepEqual(body(chunks.join('')), body(one.payload));
  const serviceOf = (chain: string) => chain.replace(/^KUBE-(SVC|EXT|SEP)-.*/, '$1') && chain;
  const chunkOfService = new Map<string, number>();
  chunks.forEach((c, n) => {
    const lines = c.split('\n').filter(Boolean);
    if (n < chunks.length - 1) assert.ok(lines.length <= 100 + 3, `chunk ${n}: ${lines.length} lines`);
    for (const l of lines) {
      const m = /^-A (KUBE-(?:SVC|EXT|SEP)-\S+) .*--comment "?(ns\d+\/svc\d+:p80)/.exec(l);
      if (!m) continue;
      const key = m[2];
      assert.equal(chunkOfService.get(key) ?? n, n, `${key} (${serviceOf(m[1])}) split over chunks`);
      chunkOfService.set(key, n);
    }
  });
  assert.equal(chunkOfService.size, 50);
  assert.match(chunks[0], /^:KUBE-MARK-MASQ /m, 'the masquerade mark chain comes first: every KUBE-SEP jumps to it');
  assert.match(chunks.at(-1)!, /^\*filter/);
  assert.match(chunks.at(-1)!, /^:KUBE-SERVICES /m);
  // Small payloads stay one restore.
  assert.equal(planFull({ state: t.state, opts, chunkLines: 100_000 }).chunks, undefined);
  // Partial syncs are never chunked.
  assert.equal(planPartial({ state: t.state, opts, changed: new Set(['ns1/svc1']) }).chunks, undefined);
});

test('a cold start (no service chain installed) publishes each chunk\'s services with it; any installed service chain: the classic form', () => {
  const { t, opts } = fiftyNodePorts();
  const one = planFull({ state: t.state, opts });
  const cold = planFull({ state: t.state, opts, chunkLines: 100, installedNatChains: new Set(['KUBE-SERVICES', 'KUBE-MARK-MASQ']) }).chunks!;
  const body = (s: string) => s.split('\n').filter((l) => l && l !== '*nat' && l !== 'COMMIT').sort();
  assert.deepEqual(body(cold.join('')), body(one.payload));
  assert.match(cold[0], /^\*filter\n/);
  assert.match(cold[0], /^:KUBE-SERVICES /m);
  assert.equal(cold.at(-1), `*nat\n${one.payload.split('\n').filter((l) => l.includes('must be the last rule')).join('\n')}\nCOMMIT\n`);
  for (const [n, c] of cold.entries()) {
    if (n < cold.length - 1) assert.ok(c.split('\n').filter((l) => l.startsWith('-A ')).length <= 100, `chunk ${n}`);
    // every dispatch rule jumps to a chain its own chunk declares, after all of the chunk's chain rules
    const declared = new Set([...c.matchAll(/^:(\S+) /gm)].map((m) => m[1]));
    const lines = c.split('\n');
    const firstTop = lines.findIndex((l) => /^-A KUBE-(SERVICES|NODEPORTS) .* -j KUBE-(SVC|EXT)-/.test(l));
    for (const [i, l] of lines.entries()) {
      const m = /^-A KUBE-(?:SERVICES|NODEPORTS) .* -j (KUBE-(?:SVC|EXT)-\S+)$/.exec(l);
      if (m) assert.ok(declared.has(m[1]), `chunk ${n}: ${m[1]} not created with its dispatch rule`);
      else if (firstTop >= 0 && i > firstTop && l.startsWith('-A ')) assert.fail(`chunk ${n}: a chain rule after the dispatch rules: ${l}`);
    }
  }
  assert.ok(cold.filter((c) => /^-A KUBE-SERVICES /m.test(c)).length >= 8, 'published chunk by chunk');
  // One service chain installed (a restart over old rules): the dispatch chains are replaced at once, last.
  const warm = planFull({ state: t.state, opts, chunkLines: 100, installedNatChains: new Set(['KUBE-SVC-ABCDEFGHIJKLMNOP']) }).chunks!;
  for (const c of warm.slice(0, -1)) assert.doesNotMatch(c, /^-A KUBE-(SERVICES|NODEPORTS) /m);
  assert.match(warm.at(-1)!, /-X KUBE-SVC-ABCDEFGHIJKLMNOP/);
  // No knowledge of what is installed (the conformance adapter): the classic form.
  const unknown = planFull({ state: t.state, opts, chunkLines: 100 }).chunks!;
  for (const c of unknown.slice(0, -1)) assert.doesNotMatch(c, /^-A KUBE-(SERVICES|NODEPORTS) /m);
});

test('the backend decides: nf_tables chunks by default, legacy never', async () => {
  assert.equal(chunkLinesFor('nf_tables'), DEFAULT_CHUNK_LINES);
  assert.equal(chunkLinesFor('unknown'), DEFAULT_CHUNK_LINES);
  assert.equal(chunkLinesFor('legacy'), 0);
  assert.equal(chunkLinesFor('legacy', 7), 7);
  // A legacy binary (as update-alternatives makes it) says so in --version.
  for (const [version, chunked] of [['iptables v1.8.9 (legacy)', false], ['iptables v1.8.9 (nf_tables)', true]] as const) {
    const k = new FakeIptables();
    const runner: CommandRunner = {
      run: (cmd, args, opts) => (args[0] === '--version' ? Promise.resolve({ code: 0, stdout: `${version}\n`, stderr: '' }) : k.run(cmd, args, opts)),
    };
    const t = tracker();
    // Just over DEFAULT_CHUNK_LINES nat lines.
    for (let i = 0; i < 700; i++) {
      t.services.update(null, svc(`ns${i}`, `svc${i}`, { clusterIP: `172.30.${i >> 8}.${(i & 255) + 1}` }));
      t.endpoints.update(null, slice(`ns${i}`, `svc${i}`, 's', [{ ip: `10.180.${i >> 8}.${i & 255}` }, { ip: `10.181.${i >> 8}.${i & 255}` }], [{ port: 8080 }]));
    }
    const p = new IptablesProxier({ runner, log: silentLogger(), config: testConfig() });
    await p.sync(planInput(t), t.apply(), true);
    const services = k.calls.filter((c) => c.cmd === 'iptables-restore' && c.input?.includes('KUBE-SVC-'));
    assert.equal(services.length > 1, chunked, `${version}: ${services.length} restores`);
  }
});

test('a line refused in a middle chunk excludes only its Service; the others are programmed', async () => {
  const k = new FakeIptables(4, {
    // The "kernel" refuses one service's DNAT target, as iptables-restore refuses a bad address.
    check: (_table, spec) => (spec.includes('10.180.9.9') ? `host/network \`10.180.9.9' not found` : null),
  });
  const t = tracker();
  for (let i = 0; i < 30; i++) {
    t.services.update(null, svc(`ns${i}`, `svc${i}`, { clusterIP: `172.30.0.${i + 1}` }));
    t.endpoints.update(null, slice(`ns${i}`, `svc${i}`, 's', [{ ip: i === 17 ? '10.180.9.9' : `10.180.0.${i}` }], [{ port: 8080 }]));
  }
  const p = new IptablesProxier({ runner: k, log: silentLogger(), config: testConfig(), chunkLines: 30 });
  const stats = await p.sync(planInput(t), t.apply(), true);
  assert.deepEqual(stats.excludedServices, ['ns17/svc17']);
  const top = k.rules('nat', 'KUBE-SERVICES').join('\n');
  for (let i = 0; i < 30; i++) assert.equal(top.includes(`ns${i}/svc${i}:p80 cluster IP`), i !== 17, `svc${i}`);
});

/** A dispatch chain's rule for Service `i` in version `v` (0, 1: re-ported, 2: other comment text), or the static catch-all. */
type RuleKind = 'svc' | 'np' | 'reject' | 'ext' | 'static' | 'bare-svc' | 'bare-reject';
const CHAIN_OF: Record<RuleKind, [('nat' | 'filter'), string]> = {
  svc: ['nat', 'KUBE-SERVICES'], static: ['nat', 'KUBE-SERVICES'], 'bare-svc': ['nat', 'KUBE-SERVICES'],
  np: ['nat', 'KUBE-NODEPORTS'], reject: ['filter', 'KUBE-SERVICES'], 'bare-reject': ['filter', 'KUBE-SERVICES'],
  ext: ['filter', 'KUBE-EXTERNAL-SERVICES'],
};
function dispatchRule(kind: RuleKind, i: number, v: number): string {
  const old = v === 2 ? ' old' : '';
  const port = 80 + (v === 1 ? 1 : 0);
  switch (kind) {
    case 'svc': return `-A KUBE-SERVICES -m comment --comment "ns/s${i}:p cluster IP${old}" -m tcp -p tcp -d 172.30.0.${i} --dport ${port} -j KUBE-SVC-${i}`;
    case 'np': return `-A KUBE-NODEPORTS -m comment --comment ${v === 2 ? `"ns/s${i}:p nodeport"` : `ns/s${i}:p`} -m tcp -p tcp --dport ${30000 + i + (v === 1 ? 100 : 0)} -j KUBE-EXT-${i}`;
    case 'reject': return `-A KUBE-SERVICES -m comment --comment "ns/s${i}:p has no endpoints${old}" -m tcp -p tcp -d 172.30.0.${i} --dport ${port} -j REJECT`;
    case 'ext': return `-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns/s${i}:p has no local endpoints${old}" -m tcp -p tcp -d 1.2.3.${i} --dport ${port} -j DROP`;
    case 'static': return `-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports${old}" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS`;
    // an older version's text without kproxy's comment
    case 'bare-svc': return `-A KUBE-SERVICES -m tcp -p tcp -d 172.30.0.${i} --dport ${port} -j KUBE-SVC-${i}`;
    case 'bare-reject': return `-A KUBE-SERVICES -m tcp -p tcp -d 172.30.9.${i} --dport ${port} -j REJECT`;
  }
}

/** Who a rule (as the fake holds it) belongs to, as a reader of the rules would tell: a Service, 'static', or null (nobody). */
function observedOwner(rule: string): string | null {
  const m = /-j KUBE-(?:SVC|EXT)-(\d+)/.exec(rule) ?? /--comment "?ns\/s(\d+):/.exec(rule);
  if (m) return `ns/s${m[1]}`;
  return /-j KUBE-NODEPORTS/.test(rule) ? 'static' : null;
}

test('chunked dispatch edits (fast-check): any installed dispatch chains become the planned ones; each restore within its budget; each Service in one restore', () => {
  const tables = ['filter', 'nat'] as const;
  const chainNames: Array<[('filter' | 'nat'), string]> = [['filter', 'KUBE-SERVICES'], ['filter', 'KUBE-EXTERNAL-SERVICES'], ['nat', 'KUBE-SERVICES'], ['nat', 'KUBE-NODEPORTS']];
  const kinds: RuleKind[] = ['svc', 'np', 'reject', 'ext', 'static', 'bare-svc', 'bare-reject'];
  const anyRule = fc.record({ kind: fc.constantFrom(...kinds), i: fc.integer({ min: 0, max: 7 }), v: fc.integer({ min: 0, max: 2 }) });
  // a planned Service: present or not, its version, which dispatch rules it has
  const plannedService = fc.record({ present: fc.boolean(), v: fc.integer({ min: 0, max: 2 }), kinds: fc.subarray(['svc', 'np', 'reject', 'ext'] as RuleKind[]) });
  fc.assert(
    fc.property(
      fc.array(anyRule, { maxLength: 30 }),
      fc.array(plannedService, { minLength: 8, maxLength: 8 }),
      fc.record({ static: fc.boolean(), staticV: fc.integer({ min: 0, max: 2 }) }),
      fc.subarray([0, 1, 2, 3]),
      fc.integer({ min: 1, max: 12 }),
      (installedRules, planned, stat, missing, budget) => {
        // planned: per chain, the Services' rules in key order, the catch-all last
        const chains: DispatchChain[] = chainNames.map(([table, name]) => ({ table, name, rules: [], owners: [], installed: undefined }));
        const chainOf = (kind: RuleKind) => chains.find((c) => c.table === CHAIN_OF[kind][0] && c.name === CHAIN_OF[kind][1])!;
        planned.forEach((p, i) => {
          if (!p.present) return;
          for (const kind of p.kinds) {
            const c = chainOf(kind);
            (c.rules as string[]).push(dispatchRule(kind, i, p.v));
            (c.owners as string[]).push(`ns/s${i}`);
          }
        });
        if (stat.static) {
          (chainOf('static').rules as string[]).push(dispatchRule('static', 0, stat.staticV));
          (chainOf('static').owners as string[]).push(STATIC_GROUP);
        }
        // installed: any rules, in any order, as iptables-save prints them; some chains missing
        const kernel = new Map<string, string[]>();
        chains.forEach((c, n) => {
          const lines = installedRules.filter((r) => CHAIN_OF[r.kind][0] === c.table && CHAIN_OF[r.kind][1] === c.name)
            .map((r) => dispatchRule(r.kind, r.i, r.v).replace(/-m tcp -p tcp -d (\S+)/, '-d $1/32 -p tcp -m tcp'));
          if (missing.includes(n) && !lines.length) return;
          c.installed = { digest: '', lines, canon: lines.map(canonicalRule) };
          kernel.set(`${c.table} ${c.name}`, lines.map((l) => l.slice(l.indexOf(' ', 3) + 1)));
        });
        const chainOwners = new Map(planned.flatMap((p, i) => (p.present ? [[`#${i}`, `ns/s${i}`] as [string, string]] : [])));
        const d = chunkedDispatchEdits(chains, budget, chainOwners);
        // apply restore by restore, as the kernel would: -I/-D positions must be in range
        const touched = new Map<string, Set<number>>();
        d.chunks.forEach((chunk, n) => {
          const owners = new Set<string>();
          let edits = 0;
          let free = 0;
          for (const table of tables) {
            for (const l of chunk[table]) {
              const decl = /^:(\S+) - \[0:0\]$/.exec(l);
              if (decl) {
                assert.equal(n, 0, 'declarations in the first restore');
                assert.ok(!kernel.has(`${table} ${decl[1]}`), `${decl[1]} declared though installed`);
                kernel.set(`${table} ${decl[1]}`, []);
                continue;
              }
              edits++;
              // an append: the planned rule after every rule the chain holds
              const a = /^-A (\S+) (.*)$/.exec(l);
              const m = a ? ['', 'I', a[1], String((kernel.get(`${table} ${a[1]}`)?.length ?? 0) + 1), a[2]] : /^-([ID]) (\S+) (\d+)(?: (.*))?$/.exec(l);
              assert.ok(m, `an edit by position or an append: ${l}`);
              const rules = kernel.get(`${table} ${m[2]}`);
              assert.ok(rules, `${table} ${m[2]} exists`);
              const pos = Number(m[3]);
              let rule: string;
              if (m[1] === 'I') {
                // past the last rule only as an append (`-I` there costs iptables-nft and the kernel a walk of the chain)
                if (a) assert.ok(pos === rules.length + 1);
                else assert.ok(pos >= 1 && pos <= rules.length, `-I at ${pos} of ${rules.length}`);
                rule = m[4];
                rules.splice(pos - 1, 0, rule);
              } else {
                assert.equal(m[4], undefined);
                assert.ok(pos >= 1 && pos <= rules.length, `-D at ${pos} of ${rules.length}`);
                rule = rules.splice(pos - 1, 1)[0];
              }
              const o = observedOwner(rule);
              if (o === null) free++;
              else owners.add(o);
              if (o !== null) {
                if (!touched.has(o)) touched.set(o, new Set());
                touched.get(o)!.add(n);
              }
            }
          }
          assert.ok(edits > 0, `restore ${n} edits something`);
          // within the budget, unless one group alone is larger
          if (edits > budget) assert.equal(owners.size + free, 1, `restore ${n}: ${edits} edits > ${budget}, of ${[...owners]} and ${free} free`);
        });
        // Every Service in one restore; a removed one too, unless some of its old rules carry no
        // comment (nothing links them to the others: it goes away over several restores)
        const bare = new Set(installedRules.filter((r) => r.kind === 'bare-svc').map((r) => `ns/s${r.i}`));
        const present = new Set(planned.flatMap((p, i) => (p.present ? [`ns/s${i}`] : [])));
        for (const [o, chunks] of touched) if (present.has(o) || !bare.has(o)) assert.equal(chunks.size, 1, `${o} edited in restores ${[...chunks]}`);
        for (const c of chains) {
          const now = kernel.get(`${c.table} ${c.name}`) ?? [];
          assert.deepEqual(now.map((r) => canonicalRule(`-A ${c.name} ${r}`)), c.rules.map(canonicalRule), `${c.table} ${c.name}`);
        }
        const inserted = d.chunks.flatMap((x) => [...x.filter, ...x.nat]).filter((l) => l.startsWith('-I ') || l.startsWith('-A ')).length;
        assert.equal(d.written.filter + d.written.nat, inserted);
      },
    ),
    { numRuns: 500, seed: 20261204 },
  );
});

test('a restart whose dispatch edits span restores: a rule refused in a middle one excludes only its Service; the others are programmed', async () => {
  // The "kernel" refuses svc17's dispatch rule once it is re-ported (as iptables-restore refuses a bad rule).
  const k = new FakeIptables(4, { check: (_table, spec) => (/--dport 81 .*-j KUBE-SVC-/.test(spec) ? 'refused' : null) });
  /** 30 Services; `restarted`: svc10..29 re-ported to 91, svc17 to 81 (or left out: null) */
  const state = (restarted: boolean, with17 = true) => {
    const t = tracker();
    for (let i = 0; i < 30; i++) {
      if (i === 17 && !with17) continue;
      const port = !restarted || i < 10 ? 80 : i === 17 ? 81 : 91;
      t.services.update(null, svc(`ns${i}`, `svc${i}`, { clusterIP: `172.30.0.${i + 1}`, port }));
      t.endpoints.update(null, slice(`ns${i}`, `svc${i}`, 's', [{ ip: `10.180.0.${i}` }], [{ port: 8080 }]));
    }
    return t;
  };
  const old = state(false);
  await new IptablesProxier({ runner: k, log: silentLogger(), config: testConfig(), chunkLines: 30 }).sync(planInput(old), old.apply(), true);
  // A restart: 20 Services' dispatch edits (2 lines each), 6 lines per dispatch restore.
  const next = state(true);
  const w = new Watching(k);
  const p = new IptablesProxier({ runner: w, log: silentLogger(), config: testConfig(), chunkLines: 30, dispatchChunkLines: 6 });
  const before = k.calls.length;
  const stats = await p.sync(planInput(next), next.apply(), true);
  assert.deepEqual(stats.excludedServices, ['ns17/svc17']);
  // the refused restore came after dispatch restores that were applied
  const restores = k.calls.slice(before).filter((c) => c.cmd === 'iptables-restore').map((c) => c.input ?? '');
  const refused = restores.findIndex((r) => /--dport 81 .*-j KUBE-SVC-/.test(r));
  assert.ok(restores.slice(0, refused).filter((r) => /^-I KUBE-SERVICES /m.test(r)).length >= 2, `refused in restore ${refused}`);
  const top = k.rules('nat', 'KUBE-SERVICES').join('\n');
  for (let i = 0; i < 30; i++) {
    if (i === 17) assert.doesNotMatch(top, /ns17\/svc17:/);
    else assert.match(top, new RegExp(`ns${i}/svc${i}:p80 cluster IP" .*--dport ${i < 10 ? 80 : 91} `), `svc${i}`);
  }
  // the kernel holds what a fresh full sync without svc17 writes, rule order included
  const fresh = new FakeIptables(4);
  const without = state(true, false);
  await new IptablesProxier({ runner: fresh, log: silentLogger(), config: testConfig(), chunkLines: 0 }).sync(planInput(without), without.apply(), true);
  assert.equal(kernelState(k), kernelState(fresh));
});

test('the dispatch restores\' default budget: the chunk size, a quarter of the dispatch rules when more, at most twice the chunk size; a restart keeps to it', async () => {
  assert.equal(dispatchBudget(0, 40_001), 0, 'no chunks (legacy): one restore');
  assert.equal(dispatchBudget(5000, 20_001), 5000, '10,000 Services: the chunk size');
  assert.equal(dispatchBudget(5000, 40_001), 10_000, '20,000 Services: a quarter of the dispatch rules');
  assert.equal(dispatchBudget(5000, 200_001), 10_000, 'at most twice the chunk size');
  // 120 Services, every one re-ported while kproxy was down: 120 dispatch rules differ, a
  // budget of 30 lines (chunk size 20)
  const k = new FakeIptables(4);
  const state = (port: number) => {
    const t = tracker();
    for (let i = 0; i < 120; i++) {
      t.services.update(null, svc(`ns${i}`, `svc${i}`, { clusterIP: `172.30.0.${i + 1}`, port }));
      t.endpoints.update(null, slice(`ns${i}`, `svc${i}`, 's', [{ ip: `10.180.0.${i}` }], [{ port: 8080 }]));
    }
    return t;
  };
  const old = state(80);
  await new IptablesProxier({ runner: k, log: silentLogger(), config: testConfig(), chunkLines: 20 }).sync(planInput(old), old.apply(), true);
  const next = state(90);
  const before = k.calls.length;
  await new IptablesProxier({ runner: k, log: silentLogger(), config: testConfig(), chunkLines: 20 }).sync(planInput(next), next.apply(), true);
  const dispatch = k.calls.slice(before).filter((c) => c.cmd === 'iptables-restore').map((c) => c.input ?? '').filter((r) => /^-[ADI] KUBE-SERVICES /m.test(r));
  const sizes = dispatch.map((r) => r.split('\n').filter((l) => /^-[ADI] KUBE-SERVICES /.test(l)).length);
  const budget = dispatchBudget(20, 120);
  assert.equal(budget, 30);
  assert.ok(sizes.every((n) => n <= budget), `dispatch restores of ${sizes} lines`);
  assert.ok(sizes.some((n) => n > 20), `a dispatch restore above the chunk size: ${sizes}`);
  assert.ok(sizes.length >= 8, `${sizes.length} dispatch restores`);
  const fresh = new FakeIptables(4);
  await new IptablesProxier({ runner: fresh, log: silentLogger(), config: testConfig(), chunkLines: 0 }).sync(planInput(next), next.apply(), true);
  assert.equal(kernelState(k), kernelState(fresh));
});

test('a full sync reaches iptables-restore in parts, made as it is read: the same text as the plan, chunked or not, in both families', async () => {
  for (const family of [4, 6] as const) {
    for (const chunkLines of [0, 2_000]) {
      const k = new FakeIptables(family);
      const inputs: Array<{ streamed: boolean; parts: number; text: string }> = [];
      const runner: CommandRunner = {
        run: (cmd, args, opts?: RunOptions) => {
          if (cmd.endsWith('-restore') && opts?.input !== undefined) {
            const streamed = typeof opts.input === 'function';
            const parts = streamed ? [...(opts.input as () => Iterable<string>)()].length : 1;
            inputs.push({ streamed, parts, text: inputText(opts.input) });
          }
          return k.run(cmd, args, opts);
        },
      };
      const t = tracker(family);
      for (let i = 0; i < 400; i++) {
        const ip = family === 6 ? `fd00:172:30::${i.toString(16)}` : `172.30.${i >> 8}.${(i & 255) + 1}`;
        t.services.update(null, svc(`ns${i}`, `svc${i}`, { clusterIP: ip, type: 'NodePort', nodePort: 30000 + i }));
        const eps = [1, 2, 3].map((e) => ({ ip: family === 6 ? `fd00:10:180::${i.toString(16)}:${e}` : `10.${180 + e}.${i >> 8}.${i & 255}` }));
        t.endpoints.update(null, slice(`ns${i}`, `svc${i}`, 's', eps, [{ port: 8080 }], family));
      }
      const input = planInput(t, testConfig(), family, [family === 6 ? 'fd00::2' : '192.168.0.2']);
      const p = new IptablesProxier({ runner, log: silentLogger(), config: testConfig(), chunkLines });
      await p.sync(input, t.apply(), true);
      const what = `IPv${family}, chunkLines ${chunkLines}`;
      const services = inputs.filter((x) => x.text.includes('KUBE-SVC-'));
      assert.ok(services.length >= 1 && services.every((x) => x.streamed), `${what}: every service restore made as it is read`);
      if (chunkLines === 0) assert.ok(services[0].parts >= 3, `${what}: one restore in ${services[0].parts} parts`);
      else assert.ok(services.length > 3, `${what}: ${services.length} chunks`);
      // The lines written are the text plan's (the jumps into KUBE-SERVICES aside, which a cold start appends).
      const plan = planFull({ state: input.state, opts: optionsFromConfig(testConfig(), input.node, DEFAULT_FACTS), chunkLines, installedNatChains: new Set(['KUBE-SERVICES', 'KUBE-NODEPORTS']) });
      const body = (s: string) => s.split('\n').filter((l) => l && l !== '*nat' && l !== '*filter' && l !== 'COMMIT' && !/^-I (PREROUTING|OUTPUT) /.test(l)).sort();
      assert.deepEqual(body(inputs.filter((x) => x.streamed).map((x) => x.text).join('')), body(plan.chunks ? plan.chunks.join('') : plan.payload), what);
    }
  }
});
