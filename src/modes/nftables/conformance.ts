// Conformance adapter for upstream-format nftables cases (../shared/conformance): golden
// (one full sync judged by flows: derived packets traced through upstream's expected table
// and kproxy's must end the same; and by text: kproxy's table with its endpoint selection
// expanded back into upstream's anonymous maps, selection.ts, must equal the expected text
// after upstream's normalisation), flows (render, then trace each packet), steps (a
// sequence of syncs, each compared, expanded, against the full table afterwards, as
// upstream's tests compare knftables' Fake.Dump()). Pure apart from reading the case.
import { canonicalIP, parseCIDR } from '../../core/ip.ts';
import {
  applyObject,
  caseFamily,
  stateOf,
  trackerFor,
  type CaseConfig,
  type CaseOutcome,
  type ConformanceAdapter,
  type ConformanceCase,
} from '../../conformance/case.ts';
import { isKubeProxyTable, isServiceChainName } from './names.ts';
import { C, caseNodePortIPs, planRuleset, type LocalDetector, type NftPlanOptions } from './plan.ts';
import { dumpRuleset, type Ruleset } from './ruleset.ts';
import { expandSelection } from './selection.ts';
import { parseKubeProxyTable, readNftDump } from './parse.ts';
import { traceRuleset, traceTables, type NftPacket } from './trace.ts';

const OBJECT_ORDER: Record<string, number> = { table: 10, chain: 9, rule: 8, set: 7, map: 6, element: 5 };

/** Upstream's sortNFTablesTransaction: drop blanks and comments, order by object type then name. */
export function sortNftTransaction(text: string): string {
  const lines = text.split('\n').filter((l) => l !== '' && !l.startsWith('#'));
  const keyed = lines.map((line, i) => ({ line, i, w: line.split(' ') }));
  keyed.sort((a, b) => {
    const c = compareLines(a.line, a.w, b.line, b.w);
    return c !== 0 ? c : a.i - b.i;
  });
  return keyed.map((k) => k.line).join('\n');
}

function compareLines(li: string, wi: string[], lj: string, wj: string[]): number {
  if (wi.length < 5 || wj.length < 5) return 0;
  if (wi[1] !== wj[1]) return (OBJECT_ORDER[wj[1]] ?? 0) - (OBJECT_ORDER[wi[1]] ?? 0);
  if (wi[4] !== wj[4]) return wi[4] < wj[4] ? -1 : 1;
  if (wi[1] === 'rule') return 0;
  return li < lj ? -1 : li > lj ? 1 : 0;
}

/** A short unified-style diff of two normalised texts. */
export function lineDiff(expected: string, actual: string, max = 40): string {
  const e = expected.split('\n');
  const a = actual.split('\n');
  const eSet = new Set(e);
  const aSet = new Set(a);
  const out: string[] = [];
  for (const l of e) if (!aSet.has(l)) out.push(`- ${l}`);
  for (const l of a) if (!eSet.has(l)) out.push(`+ ${l}`);
  if (out.length === 0) {
    // same lines, different order (rule order inside a chain)
    for (let i = 0; i < Math.max(e.length, a.length); i++) {
      if (e[i] !== a[i]) {
        out.push(`line ${i + 1}: expected ${e[i] ?? '(none)'}`, `line ${i + 1}:   actual ${a[i] ?? '(none)'}`);
        break;
      }
    }
  }
  return out.slice(0, max).join('\n');
}

function stringList(v: unknown): string[] {
  if (Array.isArray(v)) return v.map(String);
  if (typeof v === 'string') return v.split(',').map((s) => s.trim()).filter(Boolean);
  return [];
}

const FAKE_DEFAULTS = {
  4: { nodeIP: '192.168.0.2', podCIDR: '10.0.0.0/8', serviceCIDR: '172.30.0.0/16' },
  6: { nodeIP: '2001:db8::1', podCIDR: 'fd00:10::/64', serviceCIDR: 'fd00:10:96::/112' },
};
const TEST_NODE_IPS = ['192.168.0.2', '192.168.1.2', '192.168.99.11', '2001:db8::1', '2001:db8:1::2'];

function detectorFrom(cfg: CaseConfig, family: 4 | 6): LocalDetector {
  const hasKey = 'localDetector' in cfg || 'localTrafficDetector' in cfg;
  const raw = (cfg.localDetector ?? cfg.localTrafficDetector) as Record<string, unknown> | null | string | undefined;
  if (!hasKey) return { kind: 'cidr', cidr: FAKE_DEFAULTS[family].podCIDR };
  if (raw === null || raw === undefined || typeof raw === 'string') return null;
  const mode = String(raw.mode ?? '').toLowerCase();
  if (mode === 'clustercidr' || mode === 'nodecidr' || mode === 'cidr') {
    const cidrs = stringList(raw.clusterCIDR ?? raw.cidr ?? raw.nodeCIDR ?? raw.cidrs);
    const c = cidrs.map((x) => parseCIDR(x)).find((x) => x && x.family === family);
    return c ? { kind: 'cidr', cidr: c.text } : null;
  }
  if (mode === 'bridgeinterface' && typeof raw.bridgeInterface === 'string') return { kind: 'interface', name: raw.bridgeInterface };
  if (mode === 'interfacenameprefix' && typeof raw.interfaceNamePrefix === 'string') return { kind: 'interface-prefix', prefix: raw.interfaceNamePrefix };
  return null;
}

function interfaceAddrs(cfg: CaseConfig): string[] | null {
  const itfs = (cfg.hostInterfaces ?? cfg.networkInterfaces) as Record<string, string[]> | undefined;
  if (!itfs || typeof itfs !== 'object') return null;
  return Object.values(itfs).flat().map((c) => String(c).split('/')[0]);
}

/** The planner options a case's config.json describes (upstream's NewFakeProxier by default). */
export function optionsFromCase(cfg: CaseConfig): NftPlanOptions {
  const family = caseFamily(cfg);
  const nodeIPRaw = (cfg.proxierNodeIP ?? cfg.nodeIP) as string | undefined;
  const nodeIP = canonicalIP(String(nodeIPRaw ?? FAKE_DEFAULTS[family].nodeIP));
  const primary = nodeIP && nodeIP.includes(':') === (family === 6) ? nodeIP : FAKE_DEFAULTS[family].nodeIP;
  const localAddrs = interfaceAddrs(cfg) ?? ['127.0.0.1', '::1', ...stringList(cfg.testNodeIPs ?? TEST_NODE_IPS)];
  const npa = 'nodePortAddresses' in cfg ? (cfg.nodePortAddresses === null ? [] : stringList(cfg.nodePortAddresses)) : ['192.168.0.2/32', '2001:db8::1/128'];
  const svcCIDRs = 'serviceCIDRs' in cfg ? stringList(cfg.serviceCIDRs) : [FAKE_DEFAULTS[family].serviceCIDR];
  return {
    family,
    node: {
      nodeName: String(cfg.nodeName ?? 'test-node'),
      nodeLabels: (cfg.nodeLabels as Record<string, string> | undefined) ?? {},
      primaryNodeIP: primary,
      loopbackVIPs: false,
    },
    nodePortIPs: caseNodePortIPs(npa, family, localAddrs, primary),
    localDetector: detectorFrom(cfg, family),
    masqueradeAll: cfg.masqueradeAll === true,
    masqueradeMark: String(cfg.masqueradeMark ?? '0x4000'),
    serviceCIDRs: svcCIDRs.filter((c) => parseCIDR(c)?.family === family),
  };
}

/** IPs the tracer treats as local ("fib ... type local"): exactly the test's node IPs. */
export function tracerLocalIPs(cfg: CaseConfig): string[] {
  return stringList(cfg.tracerLocalIPs ?? cfg.testNodeIPs ?? TEST_NODE_IPS);
}

function compareGolden(expected: string, actual: string, what: string): CaseOutcome {
  const e = sortNftTransaction(expected);
  const a = sortNftTransaction(actual);
  if (e === a) return { ok: true };
  return { ok: false, detail: `${what}: ruleset differs (- expected, + kproxy)\n${lineDiff(e, a)}` };
}

const PROBE_SOURCES = {
  4: ['10.0.0.2', '192.168.0.2', '203.0.113.1'],
  6: ['fd00:10::2', '2001:db8::1', '2001:db8:ffff::1'],
};

/**
 * Packets that exercise every destination a table dispatches: each key of the address maps
 * (service-ips, no-endpoint-services, firewall-ips) and each NodePort at each node-port
 * address (or the primary node IP), from a pod, the node and an outside client.
 */
export function probePackets(tables: Ruleset[], o: NftPlanOptions): NftPacket[] {
  const dests = new Set<string>();
  const nodeAddrs = o.nodePortIPs === 'all' ? [o.node.primaryNodeIP ?? FAKE_DEFAULTS[o.family].nodeIP] : o.nodePortIPs;
  for (const rs of tables) {
    for (const name of [C.serviceIPs, C.noEndpointServices, C.firewallIPs]) {
      for (const el of rs.sets.get(name)?.elements.values() ?? []) if (el.key.length === 3) dests.add(el.key.join(' '));
    }
    for (const name of [C.serviceNodePorts, C.noEndpointNodePorts]) {
      for (const el of rs.sets.get(name)?.elements.values() ?? []) if (el.key.length === 2) for (const a of nodeAddrs) dests.add(`${a} ${el.key.join(' ')}`);
    }
  }
  const out: NftPacket[] = [];
  for (const d of [...dests].sort()) {
    const [destIP, protocol, port] = d.split(' ');
    for (const sourceIP of PROBE_SOURCES[o.family]) out.push({ sourceIP, destIP, protocol, destPort: Number(port) });
  }
  return out;
}

/** Every probe packet must end the same way (endpoints or verdict, masquerade) in both tables. */
function sameFlows(expected: Ruleset, actual: Ruleset, o: NftPlanOptions, local: string[]): { packets: number; failures: string[] } {
  const packets = probePackets([expected, actual], o);
  const failures: string[] = [];
  for (const p of packets) {
    const want = traceRuleset(expected, p, { localIPs: local });
    const got = traceRuleset(actual, p, { localIPs: local });
    if (want.output !== got.output || want.masq !== got.masq) {
      failures.push(
        `flow ${p.sourceIP} -> ${p.destIP}:${p.destPort}/${p.protocol}: upstream's table gives ${JSON.stringify(want.output)} masq=${want.masq}, ` +
          `kproxy's ${JSON.stringify(got.output)} masq=${got.masq}`,
        ...got.rules.map((x) => `    matched ${x}`),
      );
    }
  }
  return { packets: packets.length, failures };
}

/**
 * A golden case: kproxy's table differs from upstream's in one deliberate way, how a
 * service chain picks an endpoint (selection.ts). It is judged by flows (probe packets
 * traced through upstream's expected table and kproxy's) and by its text once the
 * selection is expanded back into upstream's anonymous maps.
 */
function runGolden(c: ConformanceCase): CaseOutcome {
  const o = optionsFromCase(c.config);
  const rs = planRuleset(stateOf(c.config, c.objects), o);
  const expected = parseKubeProxyTable(c.expected ?? '', o.family === 6 ? 'ip6' : 'ip');
  const flows = sameFlows(expected, rs, o, tracerLocalIPs(c.config));
  const judgedBy = `flows (${flows.packets} probe packets) and expanded text`;
  if (flows.packets === 0) return { ok: false, detail: `${c.name}: no probe packets could be derived from the expected table`, judgedBy };
  if (flows.failures.length) return { ok: false, detail: `${c.name}: flows differ from upstream's table\n${flows.failures.join('\n')}`, judgedBy };
  return { ...compareGolden(c.expected ?? '', dumpRuleset(expandSelection(rs)), c.name), judgedBy };
}

/**
 * The tables a flows case traces: its static ruleset (rules.nft, as upstream's
 * TestTracePacketV4/V6: every kube-proxy table of the case's family in it), or the render of
 * its objects.
 */
function flowsTables(c: ConformanceCase, o: NftPlanOptions): { tables: Ruleset[]; problems: string[] } {
  if (!c.rules) return { tables: [planRuleset(stateOf(c.config, c.objects), o)], problems: [] };
  if (c.rules.format !== 'nft') return { tables: [], problems: [`${c.rules.file}: an nftables case traces rules.nft, not ${c.rules.format}`] };
  // Upstream's knftables Fake.ParseDump fails on what it cannot read: so does the case.
  const d = readNftDump(c.rules.text);
  const fam = o.family === 6 ? 'ip6' : 'ip';
  const tables = [...d.tables.values()].filter((t) => t.family === fam && isKubeProxyTable(t.table));
  const problems = d.warnings.map((w) => `${c.rules!.file} ${w}`);
  if (!tables.length) problems.push(`${c.rules.file}: no ${fam} kube-proxy table`);
  return { tables, problems };
}

function runFlows(c: ConformanceCase): CaseOutcome {
  const o = optionsFromCase(c.config);
  const { tables, problems } = flowsTables(c, o);
  if (problems.length) return { ok: false, detail: problems.join('\n') };
  const local = tracerLocalIPs(c.config);
  const failures: string[] = [];
  for (const f of c.flows ?? []) {
    const r = traceTables(tables, f, { localIPs: local });
    if (r.output !== f.output || r.masq !== f.masq) {
      failures.push(
        `flow ${JSON.stringify(f.name)} ${f.sourceIP} -> ${f.destIP}:${f.destPort}/${f.protocol || 'TCP'}: ` +
          `want ${JSON.stringify(f.output)} masq=${f.masq}, got ${JSON.stringify(r.output)} masq=${r.masq}`,
        ...r.rules.map((x) => `    matched ${x}`),
        ...r.notes.map((x) => `    note ${x}`),
      );
    }
  }
  return failures.length ? { ok: false, detail: failures.join('\n') } : { ok: true, ...(c.rules ? { judgedBy: `flows through the static ${c.rules.format} ruleset` } : {}) };
}

/**
 * Steps: one proxier over several syncs. Each step's expected text is the whole table
 * afterwards. Service chains that became unused stay (flushed) for one sync before they
 * are deleted, as upstream delays their deletion.
 */
function runSteps(c: ConformanceCase): CaseOutcome {
  const o = optionsFromCase(c.config);
  const tracker = trackerFor(c.config);
  let previous: Ruleset | null = null;
  let stale = new Set<string>();
  for (const step of c.steps ?? []) {
    for (const obj of step.objects) applyObject(tracker, 'add', obj);
    for (const ev of step.events) applyObject(tracker, ev.op, ev.object);
    tracker.apply();
    const rs = planRuleset(tracker.state, o);
    const nowStale = new Set<string>();
    if (previous) {
      for (const name of previous.chains.keys()) {
        if (isServiceChainName(name) && !rs.chains.has(name) && !stale.has(name)) nowStale.add(name);
      }
    }
    const shown: Ruleset = { ...rs, chains: new Map(rs.chains) };
    for (const name of nowStale) shown.chains.set(name, { name, rules: [] });
    if (step.expected !== undefined) {
      const res = compareGolden(step.expected, dumpRuleset(expandSelection(shown)), `${c.name}/${step.name}`);
      if (!res.ok) return res;
    }
    previous = shown;
    stale = nowStale;
  }
  return { ok: true };
}

export const nftablesConformance: ConformanceAdapter = {
  run(c: ConformanceCase): CaseOutcome {
    if (c.kind === 'golden') return runGolden(c);
    if (c.kind === 'flows') return runFlows(c);
    return runSteps(c);
  },
};
