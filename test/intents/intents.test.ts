// The table of intents run through every mode's tracer (issue 8, item 8). Hundreds of flows
// per IP family (table.ts): every combination of internal and external traffic policy,
// endpoint set (local+remote, remote only, local only, terminating only, none) and session
// affinity, on a LoadBalancer Service with a NodePort, an LB IP and an external IP, reached
// from a pod on this node, from the node itself and from outside.
//
// The requirement, one test per (family, mode) so a failure names its mode:
// - iptables gives exactly the oracle's result (upstream's iptables mode, table.ts oracle());
// - nftables gives exactly what iptables gives (upstream's nftables mode was written to
//   behave as its iptables mode; its proxier_test.go shares the flow tables);
// - ipvs and userspace give the oracle's result except where upstream's semantics for those
//   modes deliberately differ: each such difference is an entry of EXCEPTIONS below, with the
//   result that mode must give instead and the upstream source that says so.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import { resolveConfig, type ModeName } from '../../src/config/config.ts';
import { modes } from '../../src/proxy/registry.ts';
import type { PlanInput, TraceResult } from '../../src/modes/types.ts';
import type { CommandRunner } from '../../src/exec/runner.ts';
import {
  FAMILIES,
  NODE_NAME,
  categorize,
  flows,
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
    applies: (f) => external(f) && f.svc.etp === 'Local' && cat(f).hasAny,
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
    id: 'userspace-policy-set-for-every-source',
    applies: (f) => external(f) && f.svc.etp === 'Local' && f.source !== 'outside' && cat(f).hasAny,
    expect: (f) => (cat(f).local.length ? { output: cat(f).local.join(', '), masq: true } : { output: 'REJECT', masq: false }),
    why:
      'the userspace proxy has one listener per (service port, policy), reached through REDIRECT: it has no rule ' +
      'that sends pods or the node itself to the cluster endpoints of an eTP Local service (upstream\'s userspace ' +
      'proxier, pkg/proxy/userspace, removed in v1.26, had no source-based rules at all).',
  },
  {
    mode: 'userspace',
    id: 'userspace-reset-not-drop',
    applies: (f) => f.expected.output === 'DROP',
    expect: () => ({ output: 'REJECT', masq: false }),
    why:
      'a userspace listener accepts the connection and, with no endpoint to dial, closes it at once (upstream ' +
      'userspace proxysocket.go: "Couldn\'t find an endpoint" then close): a reset, never a silent drop.',
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

interface Disagreement {
  flow: Flow;
  got: Expected;
  want: Expected;
  against: string;
}

function describe(d: Disagreement): string {
  return `${d.flow.name} (${d.flow.from} → ${d.flow.to}:${d.flow.port}): got ${show(d.got)}, want ${show(d.want)} (${d.against})`;
}

function report(family: Family, mode: ModeName, checked: number, viaException: Map<string, number>, bad: Disagreement[]): string {
  const agreeing = checked - bad.length;
  const lines = [`IPv${family} ${mode}: ${checked} flows checked, ${agreeing} agree, ${bad.length} disagree`];
  for (const [id, n] of viaException) lines.push(`  ${n} flows judged by exception ${id}`);
  for (const d of bad.slice(0, 10)) lines.push(`  ✗ ${describe(d)}`);
  if (bad.length > 10) lines.push(`  … and ${bad.length - 10} more`);
  return lines.join('\n');
}

for (const family of [4, 6] as const) {
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
          if (ex) viaException.set(ex.id, (viaException.get(ex.id) ?? 0) + 1);
          if (!same(o.got, want)) bad.push({ flow: o.flow, got: o.got, want, against: ex ? `exception ${ex.id}` : 'oracle' });
        }
      }
      const summary = report(family, mode, got.length, viaException, bad);
      for (const line of summary.split('\n')) t.diagnostic(line);
      if (bad.length) {
        assert.fail(`${summary}\n\nall disagreeing flows:\n${bad.map((d) => `  ${describe(d)}`).join('\n')}`);
      }
    });
  }
}
