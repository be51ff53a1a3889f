// The table of intents run through every mode's tracer. Hundreds of flows
// per IP family (table.ts): every combination of internal and external traffic policy,
// endpoint set (local+remote, remote only, local only, terminating only, none) and session
// affinity, on a LoadBalancer Service with a NodePort, an LB IP and an external IP, reached
// from a pod on this node, from the node itself and from outside.
//
// The requirement, one test per (family, mode) so a failure names its mode:
// - iptables gives exactly the oracle's result (upstream's iptables mode, table.ts oracle());
// - nftables gives exactly what iptables gives (upstream's nftables mode was written to
//   behave as its iptables mode; its proxier_test.go shares the flow tables);
// - the sharded nftables mode (K = 2 and K = 3 tables `kube-proxy-<n>` in each family, forced
//   by a low threshold) gives exactly what the one-table nftables mode gives, and
//   the flows cross every table;
// - ipvs and userspace give the oracle's result except where upstream's semantics for those
//   modes deliberately differ: each such difference is an entry of EXCEPTIONS below, with the
//   result that mode must give instead and the upstream source that says so.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import { resolveConfig, type ModeName } from '../../src/config/config.ts';
import { modes } from '../../src/modes/registry.ts';
import { tracePlanned } from '../../src/modes/nftables/index.ts';
import type { TraceResult } from '../../src/modes/trace-types.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import type { CommandRunner } from '../../src/kernel/runner.ts';
import {
  FAMILIES,
  NODE_NAME,
  categorize,
  flows,
  oracle,
  serviceCases,
  serviceObject,
  sliceObject,
  type Expected,
  type Family,
  type Flow,
} from './table.ts';

const MODES: ModeName[] = ['iptables', 'nftables', 'ipvs', 'userspace'];

/** non-live traces never run a command: any call is a bug */
const throwingRunner: CommandRunner = {
  run(cmd) {
    throw new Error(`a planned trace ran ${cmd}`);
  },
};

function planInput(family: Family): PlanInput {
  const fp = FAMILIES[family];
  const t = new ProxyStateTracker(family, NODE_NAME, (msg, obj) => {
    throw new Error(`table object refused: ${obj}: ${msg}`);
  });
  for (const s of serviceCases()) {
    t.services.update(null, serviceObject(fp, s));
    const slice = sliceObject(fp, s);
    if (slice) t.endpoints.update(null, slice);
  }
  t.apply();
  const config = resolveConfig({ clusterCIDR: fp.clusterCIDR }, {});
  return { state: t.state, config, node: { nodeName: NODE_NAME, nodeIPs: [fp.nodeIP], nodeLabels: {}, family } };
}

// ---------------------------------------------------------------------------------------
// Deliberate, upstream-documented differences of the ipvs and userspace modes. The first
// entry of a mode whose predicate holds gives the result that mode must show for the flow.
// ---------------------------------------------------------------------------------------

interface Exception {
  mode: ModeName;
  id: string;
  applies(f: Flow): boolean;
  expect(f: Flow): Expected;
  why: string;
}

const cat = (f: Flow) => categorize(FAMILIES[f.family], f.svc);
const external = (f: Flow) => f.frontend !== 'clusterIP';
const endpointList = (o: string) => o !== '' && o !== 'REJECT' && o !== 'DROP' && o !== 'ACCEPT' && !o.startsWith('THROW');

export const EXCEPTIONS: Exception[] = [
  {
    mode: 'ipvs',
    id: 'ipvs-etp-local-one-real-server-set',
    // (an outside client with a local endpoint is left to the oracle: both modes give the local endpoints, no masq)
    applies: (f) => external(f) && f.svc.etp === 'Local' && cat(f).hasAny && (f.source !== 'outside' || cat(f).local.length === 0),
    expect: (f) => ({ output: (cat(f).local.length ? cat(f).local : cat(f).cluster).join(', '), masq: false }),
    why:
      'upstream ipvs proxier.go syncEndpoint: a virtual server has one real-server set for every source; with a Local ' +
      'policy it is the local endpoints, or, when there are none, the cluster endpoints ("Allow access from local PODs ' +
      'even if no local endpoints exist", kubernetes/kubernetes#97081, which only partially fixes #93456). So no pod ' +
      'short-circuit and no DROP; and the KUBE-NODE-PORT / KUBE-LOAD-BALANCER / externalIP rules RETURN without ' +
      'KUBE-MARK-MASQ for Local services, for the node itself too (ipvs has no "masquerade LOCAL traffic" rule).',
  },
  {
    mode: 'ipvs',
    id: 'ipvs-itp-local-falls-back-to-cluster',
    applies: (f) => f.frontend === 'clusterIP' && f.svc.itp === 'Local' && cat(f).hasAny && cat(f).local.length === 0,
    expect: (f) => ({ output: cat(f).cluster.join(', '), masq: f.source !== 'pod' }),
    why:
      'upstream ipvs syncEndpoint uses the same fallback (#97081) for the ClusterIP virtual server with ' +
      'internalTrafficPolicy Local: no local endpoint means the cluster endpoints, where iptables DROPs; the ' +
      'KUBE-CLUSTER-IP "! -s clusterCIDR" masquerade is unchanged.',
  },
  {
    mode: 'userspace',
    id: 'userspace-always-masquerades',
    applies: (f) => endpointList(f.expected.output) && !f.expected.masq,
    expect: (f) => ({ output: f.expected.output, masq: true }),
    why:
      'the proxy re-originates every connection from the node (upstream userspace proxysocket.go dials the endpoint ' +
      'itself), so the backend never sees the client address: masquerade in effect for every forwarded flow.',
  },
];

// ---------------------------------------------------------------------------------------

interface Outcome {
  flow: Flow;
  got: Expected;
  notes?: string[];
}

const norm = (o: string) => (endpointList(o) ? o.split(', ').sort().join(', ') : o);
const same = (a: Expected, b: Expected) => norm(a.output) === norm(b.output) && a.masq === b.masq;
const show = (e: Expected) => `${JSON.stringify(e.output)} masq=${e.masq}`;

async function traceAll(mode: ModeName, input: PlanInput, fl: Flow[]): Promise<Outcome[]> {
  const m = modes[mode];
  assert.ok(m.trace, `${mode} has no tracer`);
  const out: Outcome[] = [];
  for (const flow of fl) {
    let r: TraceResult;
    try {
      r = await m.trace({ from: flow.from, to: flow.to, port: flow.port, protocol: flow.protocol, input, live: false }, { runner: throwingRunner });
    } catch (e) {
      r = { output: `THROW ${(e as Error).message.split('\n')[0]}`, masq: false, rules: [] };
    }
    out.push({ flow, got: { output: r.output, masq: r.masq }, notes: r.notes });
  }
  return out;
}

const cache = new Map<string, Promise<Outcome[]>>();
function outcomes(family: Family, mode: ModeName): Promise<Outcome[]> {
  const key = `${family}/${mode}`;
  let p = cache.get(key);
  if (!p) {
    const input = planInput(family);
    p = traceAll(mode, input, flows(family));
    cache.set(key, p);
  }
  return p;
}

/**
 * The flows through the sharded nftables mode: the 40 Services over exactly k tables (the
 * mode's thresholds lowered: threshold 1, ⌈40 / k⌉ per table, at most k tables; the mode's
 * own hash spread). Also which tables the flows' matched rules came from.
 */
const shardedCache = new Map<string, Promise<{ outcomes: Outcome[]; tables: string[]; tablesMatched: Set<string> }>>();
function shardedOutcomes(family: Family, k: number) {
  const key = `${family}/${k}`;
  let p = shardedCache.get(key);
  if (!p) {
    p = (async () => {
      const input = planInput(family);
      const shards = { threshold: 1, perTable: Math.ceil(serviceCases().length / k), maxTables: k };
      const out: Outcome[] = [];
      let tables: string[] = [];
      const tablesMatched = new Set<string>();
      for (const flow of flows(family)) {
        const r = tracePlanned({ from: flow.from, to: flow.to, port: flow.port, protocol: flow.protocol, input, live: false }, shards);
        tables = r.tables;
        // a matched rule is shown as "<table> <chain>: <rule>" when there are several tables
        for (const m of r.rules) tablesMatched.add(m.split(' ')[0]);
        out.push({ flow, got: { output: r.output, masq: r.masq }, notes: r.notes });
      }
      return { outcomes: out, tables, tablesMatched };
    })();
    shardedCache.set(key, p);
  }
  return p;
}

interface Disagreement {
  flow: Flow;
  got: Expected;
  want: Expected;
  against: string;
}

function describe(d: Disagreement): string {
  return `${d.flow.name} (${d.flow.from} → ${d.flow.to}:${d.flow.port}): got ${show(d.got)}, want ${show(d.want)} (${d.against})`;
}

/** disagreements grouped by policies, source and kind of frontend (affinity and endpoint set listed) */
function categories(bad: Disagreement[]): string[] {
  const groups = new Map<string, { n: number; sets: Set<string>; frontends: Set<string> }>();
  for (const d of bad) {
    const s = d.flow.svc;
    const kind = d.flow.frontend === 'clusterIP' ? 'clusterIP' : 'external frontends';
    const key = `iTP ${s.itp} + eTP ${s.etp}, ${d.flow.source} → ${kind}`;
    let g = groups.get(key);
    if (!g) groups.set(key, (g = { n: 0, sets: new Set(), frontends: new Set() }));
    g.n++;
    g.sets.add(s.endpoints);
    g.frontends.add(d.flow.frontend);
  }
  return [...groups].sort((a, b) => b[1].n - a[1].n).map(([k, g]) => `  ${g.n} × ${k} (endpoints ${[...g.sets].join('/')}; ${[...g.frontends].join(', ')})`);
}

function report(family: Family, mode: ModeName, checked: number, viaException: Map<string, number>, bad: Disagreement[]): string {
  const agreeing = checked - bad.length;
  const lines = [`IPv${family} ${mode}: ${checked} flows checked, ${agreeing} agree, ${bad.length} disagree`];
  for (const [id, n] of viaException) lines.push(`  ${n} flows where exception ${id} changes the expected result`);
  if (bad.length) lines.push('disagreements by category:', ...categories(bad), 'first disagreements:');
  for (const d of bad.slice(0, 10)) lines.push(`  ✗ ${describe(d)}`);
  if (bad.length > 10) lines.push(`  … and ${bad.length - 10} more`);
  return lines.join('\n');
}

// The oracle restated against upstream's own flow tables (kubernetes/kubernetes
// pkg/proxy/iptables/proxier_test.go; copies in ../shared/conformance/flows): the same intent
// in the same words, so an oracle that drifted from upstream fails here, not silently.
test('the oracle agrees with upstream flow tables on the intents they share', () => {
  const fp = FAMILIES[4];
  const svc = (itp: 'Cluster' | 'Local', etp: 'Cluster' | 'Local', endpoints: 'lr' | 'r' | 'l' | 't' | 'none') =>
    serviceCases().find((s) => s.itp === itp && s.etp === etp && s.endpoints === endpoints && s.affinity === 'None')!;
  const eps = (s: ReturnType<typeof svc>, ...which: Array<'L' | 'R'>) =>
    which.map((w) => fp.endpointKey(w === 'L' ? fp.localEndpoint(s.n) : fp.remoteEndpoint(s.n))).sort().join(', ');
  const cases: Array<[string, ReturnType<typeof svc>, Parameters<typeof oracle>[2], Parameters<typeof oracle>[3], Expected]> = [];
  // TestNoEndpointsReject: every frontend REJECTs, from pods and from outside
  const none = svc('Cluster', 'Cluster', 'none');
  for (const fe of ['clusterIP', 'nodePort', 'loadBalancerIP', 'externalIP'] as const) {
    for (const src of ['pod', 'outside'] as const) cases.push([`TestNoEndpointsReject ${src} → ${fe}`, none, fe, src, { output: 'REJECT', masq: false }]);
  }
  // TestExternalTrafficPolicyLocal: pods reach both endpoints unmasqueraded, outside only the local one
  const etpl = svc('Cluster', 'Local', 'lr');
  for (const fe of ['nodePort', 'loadBalancerIP', 'externalIP'] as const) {
    cases.push([`TestExternalTrafficPolicyLocal pod → ${fe}`, etpl, fe, 'pod', { output: eps(etpl, 'L', 'R'), masq: false }]);
    cases.push([`TestExternalTrafficPolicyLocal external → ${fe}`, etpl, fe, 'outside', { output: eps(etpl, 'L'), masq: false }]);
  }
  cases.push(['TestExternalTrafficPolicyLocal pod → cluster IP', etpl, 'clusterIP', 'pod', { output: eps(etpl, 'L', 'R'), masq: false }]);
  // TestLoadBalancer (eTP Cluster): outside and node to LB / NodePort masqueraded, pod to cluster IP not
  const lb = svc('Cluster', 'Cluster', 'l');
  cases.push(['TestLoadBalancer external → nodePort', lb, 'nodePort', 'outside', { output: eps(lb, 'L'), masq: true }]);
  cases.push(['TestLoadBalancer external → LB', lb, 'loadBalancerIP', 'outside', { output: eps(lb, 'L'), masq: true }]);
  cases.push(['TestLoadBalancer node → LB', lb, 'loadBalancerIP', 'node', { output: eps(lb, 'L'), masq: true }]);
  cases.push(['TestLoadBalancer pod → cluster IP', lb, 'clusterIP', 'pod', { output: eps(lb, 'L'), masq: false }]);
  // TestInternalTrafficPolicy: iTP Local uses only local endpoints; none local → DROP
  const itpl = svc('Local', 'Cluster', 'lr');
  cases.push(['TestInternalTrafficPolicy local endpoint only', itpl, 'clusterIP', 'pod', { output: eps(itpl, 'L'), masq: false }]);
  cases.push(['TestInternalTrafficPolicy no local endpoint', svc('Local', 'Cluster', 'r'), 'clusterIP', 'pod', { output: 'DROP', masq: false }]);
  // TestTerminatingEndpoints*: no ready endpoint → the serving-terminating ones (cluster and local)
  const term = svc('Cluster', 'Local', 't');
  cases.push(['TestTerminatingEndpointsTrafficPolicyCluster', term, 'clusterIP', 'pod', { output: eps(term, 'L', 'R'), masq: false }]);
  cases.push(['TestTerminatingEndpointsTrafficPolicyLocal', term, 'loadBalancerIP', 'outside', { output: eps(term, 'L'), masq: false }]);
  for (const [name, s, fe, src, want] of cases) assert.deepEqual(oracle(fp, s, fe, src), want, name);
});

for (const family of [4, 6] as const) {
  for (const k of [2, 3]) {
    test(`IPv${family} nftables over ${k} tables: every flow of the intent table as the one-table nftables mode`, async (t) => {
      const { outcomes: got, tables, tablesMatched } = await shardedOutcomes(family, k);
      const one = await outcomes(family, 'nftables');
      assert.deepEqual(tables, Array.from({ length: k }, (_, i) => `kube-proxy-${i}`));
      // every table took part: some flow matched a rule of each (its Services' dispatch)
      assert.deepEqual([...tablesMatched].filter((x) => x.startsWith('kube-proxy-')).sort(), tables);
      const bad: Disagreement[] = [];
      got.forEach((o, i) => {
        assert.equal(o.flow.name, one[i].flow.name);
        if (!same(o.got, one[i].got)) bad.push({ flow: o.flow, got: o.got, want: one[i].got, against: 'nftables, one table' });
      });
      const summary = report(family, 'nftables' as ModeName, got.length, new Map(), bad).replace('nftables:', `nftables over ${k} tables:`);
      for (const line of summary.split('\n')) t.diagnostic(line);
      if (bad.length) assert.fail(`${summary}\n\nall disagreeing flows:\n${bad.map((d) => `  ${describe(d)}`).join('\n')}`);
      // and so, as the one table, exactly what iptables gives
      const ipt = await outcomes(family, 'iptables');
      assert.deepEqual(got.filter((o, i) => !same(o.got, ipt[i].got)).map((o) => o.flow.name), []);
    });
  }

  test(`IPv${family}: the intent table has hundreds of flows over every combination`, () => {
    const fl = flows(family);
    assert.ok(fl.length >= 400, `only ${fl.length} flows`);
    assert.equal(new Set(fl.map((f) => f.name)).size, fl.length, 'flow names are unique');
    // planning the table refuses none of its objects (planInput throws on any report)
    const input = planInput(family);
    assert.equal(input.state.services.size, serviceCases().length);
  });

  for (const mode of MODES) {
    test(`IPv${family} ${mode}: every flow of the intent table as upstream's ${mode} mode`, async (t) => {
      const got = await outcomes(family, mode);
      const bad: Disagreement[] = [];
      const viaException = new Map<string, number>();
      if (mode === 'nftables') {
        // nftables must give exactly what iptables gives; the oracle comparison is reported too
        const ipt = await outcomes(family, 'iptables');
        got.forEach((o, i) => {
          if (!same(o.got, ipt[i].got)) bad.push({ flow: o.flow, got: o.got, want: ipt[i].got, against: 'iptables' });
        });
        const vsOracle = got.filter((o) => !same(o.got, o.flow.expected)).length;
        t.diagnostic(`IPv${family} nftables vs the oracle: ${vsOracle} of ${got.length} flows disagree`);
      } else {
        for (const o of got) {
          const ex = EXCEPTIONS.find((e) => e.mode === mode && e.applies(o.flow));
          const want = ex ? ex.expect(o.flow) : o.flow.expected;
          if (ex && !same(want, o.flow.expected)) viaException.set(ex.id, (viaException.get(ex.id) ?? 0) + 1);
          if (!same(o.got, want)) bad.push({ flow: o.flow, got: o.got, want, against: ex ? `exception ${ex.id}` : 'oracle' });
        }
      }
      // an exception that changes no flow is dead weight (or hides that a mode moved): remove it
      for (const e of EXCEPTIONS.filter((x) => x.mode === mode)) {
        assert.ok(viaException.get(e.id), `exception ${e.id} no longer changes any IPv${family} flow`);
      }
      const summary = report(family, mode, got.length, viaException, bad);
      for (const line of summary.split('\n')) t.diagnostic(line);
      if (bad.length) {
        assert.fail(`${summary}\n\nall disagreeing flows:\n${bad.map((d) => `  ${describe(d)}`).join('\n')}`);
      }
    });
  }
}
