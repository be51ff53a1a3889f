// The iptables packet tracer: which endpoints can the FIRST packet of a new connection reach,
// is it masqueraded, or is it rejected / dropped, and which rules did it match on the way.
// Semantics are upstream kube-proxy's packet-flow tests (pkg/proxy/iptables/proxier_test.go
// tracePacket) as pinned by ../shared/conformance/README.md "How a flow is judged":
//
// - walk nat PREROUTING (nat KUBE-SERVICES when PREROUTING is empty or missing), following
//   jumps, gotos and RETURN;
// - a rule under `-m statistic` may or may not match, so when what it jumps to terminates,
//   the walk goes on: every candidate DNAT is collected;
// - rules that look at history never match (`recent --rcheck/--update`, `mark`, any
//   `--ctstate`/`--state`, negated or not), as for a first packet;
// - a jump to KUBE-MARK-MASQ, or a MARK target setting the masquerade bit, means masq; a jump
//   to KUBE-MARK-DROP (older kube-proxy versions) means DROP;
// - after the nat walk the first DNAT's address replaces the destination (the port stays,
//   as upstream), then filter KUBE-SERVICES, KUBE-EXTERNAL-SERVICES, KUBE-NODEPORTS and
//   KUBE-PROXY-FIREWALL are walked for ACCEPT / DROP / REJECT;
// - output: DNAT targets sorted by their "ip:port" text, duplicates merged, then verdicts.
//
// Where the tracer cannot know (interfaces, ipsets, source ports, unknown modules) it
// assumes the rule matches, as upstream does, and says so in `notes`. Pure: no I/O.
import { canonicalIP, ipToBigInt, joinHostPort } from '../../core/ip.ts';
import { parseIptablesSave, targetOption, type Cond, type Rule, type Ruleset } from '../../kernel/iptables/parse.ts';
import { KproxyError } from '../../errors.ts';

export interface TracePacket {
  sourceIP: string;
  /** '' means TCP */
  protocol: 'TCP' | 'UDP' | 'SCTP' | '';
  destIP: string;
  destPort: number;
}

export interface TraceOptions {
  /** addresses that are addrtype LOCAL (node IPs); 127.0.0.1 and ::1 always are */
  localIPs: string[];
  /**
   * Told of each jump or goto whose target is neither a chain of the ruleset nor a target the
   * walk knows: a chain not read yet, or an extension target (LOG, CT, ...). A caller that
   * read only part of the rules (trace-live.ts) reads those and walks again.
   */
  onUnknownTarget?: (table: string, name: string) => void;
}

export interface IptablesTraceResult {
  /** "10.180.0.1:80, 10.180.2.1:80" | "REJECT" | "DROP" | "ACCEPT" | "" */
  output: string;
  masq: boolean;
  /** every rule matched, in walk order, as its text appeared */
  rules: string[];
  /** the first filter verdict (ACCEPT / DROP / REJECT), if any */
  verdict?: string;
  /** assumptions made on the way (unknown modules, interfaces, loops), each once */
  notes: string[];
}

export class IptablesTraceError extends KproxyError {
  declare readonly code: 'KPROXY_IPTABLES_TRACE';
  constructor(detail: string) {
    super('KPROXY_IPTABLES_TRACE', detail);
  }
}

/** Chains of the filter table that upstream's tracer checks for verdicts, in order. */
export const FILTER_CHAINS = ['KUBE-SERVICES', 'KUBE-EXTERNAL-SERVICES', 'KUBE-NODEPORTS', 'KUBE-PROXY-FIREWALL'];
export const MARK_MASQ_CHAIN = 'KUBE-MARK-MASQ';
/** older kube-proxy versions' drop-by-mark chain */
const MARK_DROP_CHAIN = 'KUBE-MARK-DROP';
const DEFAULT_MASQ_MARK = 0x4000;
/** Deeper than any sane ruleset (the kernel allows no loops at all). */
export const MAX_DEPTH = 64;
const VERDICTS = new Set(['ACCEPT', 'DROP', 'REJECT']);
/** Targets that end a chain's walk without an output of their own. */
const SILENT_TERMINALS = new Set(['MASQUERADE', 'SNAT', 'QUEUE', 'NFQUEUE']);
const PROTO_NUMBERS: Record<string, string> = { '6': 'tcp', '17': 'udp', '132': 'sctp', '1': 'icmp', '58': 'ipv6-icmp' };

interface Pkt {
  src: string;
  dst: string;
  proto: string;
  dport: number;
  /** numeric forms of src / dst, computed once per walk */
  srcV: bigint;
  dstV: bigint;
}

interface Walk {
  rs: Ruleset;
  onUnknownTarget?: (table: string, name: string) => void;
  local: Set<string>;
  masqMark: number;
  matched: string[];
  dnats: string[];
  verdicts: string[];
  masq: boolean;
  notes: Set<string>;
  /** chains on the current call stack, "table/chain", to refuse loops */
  stack: Set<string>;
}

export function traceIptables(text: string | Ruleset, pkt: TracePacket, opts: TraceOptions): IptablesTraceResult {
  const rs = typeof text === 'string' ? parseIptablesSave(text) : text;
  const p = packetOf(pkt);
  const w: Walk = {
    rs,
    onUnknownTarget: opts.onUnknownTarget,
    local: localSet(opts.localIPs),
    masqMark: masqueradeMarkOf(rs),
    matched: [],
    dnats: [],
    verdicts: [],
    masq: false,
    notes: new Set(),
    stack: new Set(),
  };

  const nat = rs.tables.get('nat');
  if (nat) {
    const pre = nat.chains.get('PREROUTING');
    // Upstream's golden rulesets hold only kube-proxy's own chains, without the
    // PREROUTING → KUBE-SERVICES jump that the proxier adds separately.
    const entry = pre && pre.rules.length > 0 ? 'PREROUTING' : 'KUBE-SERVICES';
    runChain(w, 'nat', entry, p, 0);
  }
  const firstDNAT = w.dnats[0];
  const dnatDst = firstDNAT === undefined ? null : dnatAddress(firstDNAT);
  const filterPkt = dnatDst ? { ...p, dst: dnatDst, dstV: ipToBigInt(dnatDst) } : p;
  const filter = rs.tables.get('filter');
  if (filter) {
    for (const chain of FILTER_CHAINS) {
      if (filter.chains.has(chain)) runChain(w, 'filter', chain, filterPkt, 0);
    }
  }

  const endpoints = [...new Set(w.dnats)].sort(compareText);
  const result: IptablesTraceResult = {
    output: [...endpoints, ...w.verdicts].join(', '),
    masq: w.masq,
    rules: w.matched,
    notes: [...parseNotes(rs), ...w.notes],
  };
  if (w.verdicts.length) result.verdict = w.verdicts[0];
  return result;
}

/** at most this many parse warnings become notes (a hostile dump may hold thousands) */
const MAX_PARSE_NOTES = 20;

/**
 * What the parser could not read, first in the notes: a trace over a dump with unreadable
 * lines says so, and which, instead of a silent "no match".
 */
function parseNotes(rs: Ruleset): string[] {
  const out = rs.warnings.slice(0, MAX_PARSE_NOTES).map((w) => `parse: ${w}`);
  if (rs.warnings.length > MAX_PARSE_NOTES) out.push(`parse: ${rs.warnings.length - MAX_PARSE_NOTES} more warnings not shown`);
  return out;
}

function compareText(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function packetOf(pkt: TracePacket): Pkt {
  const src = canonicalIP(pkt.sourceIP);
  const dst = canonicalIP(pkt.destIP);
  if (!src) throw new IptablesTraceError(`source "${pkt.sourceIP}" is not an IP address; pass --from IP`);
  if (!dst) throw new IptablesTraceError(`destination "${pkt.destIP}" is not an IP address; pass --to IP:PORT`);
  if (!Number.isInteger(pkt.destPort) || pkt.destPort < 0 || pkt.destPort > 65535) {
    throw new IptablesTraceError(`destination port ${pkt.destPort} is not a port; use 0-65535`);
  }
  const proto = (pkt.protocol || 'TCP').toLowerCase();
  if (proto !== 'tcp' && proto !== 'udp' && proto !== 'sctp') {
    throw new IptablesTraceError(`protocol "${pkt.protocol}" is not one of tcp, udp, sctp`);
  }
  return { src, dst, proto, dport: pkt.destPort, srcV: ipToBigInt(src), dstV: ipToBigInt(dst) };
}

function localSet(ips: string[]): Set<string> {
  const s = new Set<string>(['127.0.0.1', '::1']);
  for (const ip of ips) {
    const c = canonicalIP(ip);
    if (c) s.add(c);
  }
  return s;
}

/** The bit(s) KUBE-MARK-MASQ sets, so that an inline MARK target can be recognised too. */
function masqueradeMarkOf(rs: Ruleset): number {
  const chain = rs.tables.get('nat')?.chains.get(MARK_MASQ_CHAIN);
  for (const r of chain?.rules ?? []) {
    const bits = markBitsSet(r);
    if (bits) return bits;
  }
  return DEFAULT_MASQ_MARK;
}

/** Bits a MARK target turns on (0 for anything else). */
function markBitsSet(r: Rule): number {
  if (r.target?.name !== 'MARK') return 0;
  for (const o of r.target.options) {
    const v = o.args[0];
    if (v === undefined) continue;
    if (o.opt === '--or-mark') return parseMark(v);
    const [val, mask] = v.split('/');
    // --set-mark V/M clears M then ORs V: V ends up set.
    if (o.opt === '--set-mark') return parseMark(val);
    // --set-xmark V/M clears M then XORs V: only V's bits inside M are surely set
    // (KUBE-POSTROUTING's "--set-xmark 0x4000/0x0" toggles the bit off again).
    if (o.opt === '--set-xmark') return parseMark(val) & (mask === undefined ? 0xffffffff : parseMark(mask));
  }
  return 0;
}

function parseMark(s: string): number {
  const n = Number(s);
  return Number.isFinite(n) ? n >>> 0 : 0;
}

/** Runs one chain; returns true when the packet reached a terminal action. */
function runChain(w: Walk, table: string, chainName: string, p: Pkt, depth: number): boolean {
  const chain = w.rs.tables.get(table)?.chains.get(chainName);
  if (!chain) return false;
  const key = `${table}/${chainName}`;
  if (w.stack.has(key)) {
    w.notes.add(`chain ${key} is reached again from itself (a loop); not followed twice`);
    return false;
  }
  if (depth > MAX_DEPTH) {
    w.notes.add(`jumps nest deeper than ${MAX_DEPTH} chains at ${key}; not followed`);
    return false;
  }
  w.stack.add(key);
  try {
    for (const rule of chain.rules) {
      if (!ruleMatches(w, rule, p)) continue;
      w.matched.push(rule.text);
      const step = applyTarget(w, table, rule, p, depth);
      if (step === 'continue') continue;
      if (step === 'return') return false;
      return true;
    }
    return false;
  } finally {
    w.stack.delete(key);
  }
}

type Step = 'continue' | 'return' | 'terminal';

function applyTarget(w: Walk, table: string, rule: Rule, p: Pkt, depth: number): Step {
  const t = rule.target;
  if (!t) return 'continue';
  const name = t.name;
  // A probabilistic rule may not have been taken: whatever it did, the walk goes on.
  const ends = (s: Step): Step => (rule.probabilistic ? 'continue' : s);

  if (name === MARK_MASQ_CHAIN) {
    w.masq = true;
    return t.kind === 'goto' ? ends('return') : 'continue';
  }
  if (name === MARK_DROP_CHAIN) {
    // Older kube-proxy versions drop by marking (KUBE-MARK-DROP sets 0x8000) and let the filter
    // table's KUBE-FIREWALL drop marked packets: the mark is the verdict.
    w.verdicts.push('DROP');
    w.notes.add(`line ${rule.line}: a jump to ${MARK_DROP_CHAIN} marks the packet, which KUBE-FIREWALL (filter) drops`);
    return ends('terminal');
  }
  const chain = w.rs.tables.get(table)?.chains.get(name);
  if (chain) {
    const terminated = runChain(w, table, name, p, depth + 1);
    if (terminated) return ends('terminal');
    // A goto's chain returns to our caller, not to us.
    return t.kind === 'goto' ? ends('return') : 'continue';
  }
  if (VERDICTS.has(name)) {
    w.verdicts.push(name);
    return ends('terminal');
  }
  switch (name) {
    case 'DNAT':
      return recordDNAT(w, rule) ? ends('terminal') : 'continue';
    case 'REDIRECT':
      recordRedirect(w, rule, p);
      return ends('terminal');
    case 'RETURN':
      return ends('return');
    case 'MARK':
      if (markBitsSet(rule) & w.masqMark) w.masq = true;
      return 'continue';
  }
  if (SILENT_TERMINALS.has(name)) return ends('terminal');
  w.onUnknownTarget?.(table, name);
  if (!/^[A-Z][A-Z0-9_]*$/.test(name) || name.startsWith('KUBE-')) {
    w.notes.add(`rule at line ${rule.line} jumps to ${table}/${name}, which does not exist; treated as no-op`);
  }
  return 'continue';
}

function recordDNAT(w: Walk, rule: Rule): boolean {
  const to = targetOption(rule.target, '--to-destination');
  if (to === undefined) {
    w.notes.add(`DNAT at line ${rule.line} has no --to-destination; ignored`);
    return false;
  }
  w.dnats.push(normaliseHostPort(to));
  return true;
}

function recordRedirect(w: Walk, rule: Rule, p: Pkt): void {
  // REDIRECT sends the packet to the node itself; upstream's tracer never meets it.
  const ports = targetOption(rule.target, '--to-ports');
  const host = p.dst.includes(':') ? '::1' : '127.0.0.1';
  const port = ports ? ports.split('-')[0] : String(p.dport);
  w.dnats.push(joinHostPort(host, Number(port)));
  w.notes.add(`REDIRECT at line ${rule.line} is reported as a DNAT to this node (${host}:${port})`);
}

/** "10.180.0.1:80", "[fd00::1]:80", "fd00::1", "10.0.0.1" → canonical text; ranges stay. */
export function normaliseHostPort(s: string): string {
  const bracket = /^\[([^\]]+)\](?::(\d+))?$/.exec(s);
  if (bracket) {
    const ip = canonicalIP(bracket[1]) ?? bracket[1];
    return bracket[2] ? joinHostPort(ip, Number(bracket[2])) : ip;
  }
  const colons = s.split(':').length - 1;
  if (colons === 1) {
    const [h, port] = s.split(':');
    const ip = canonicalIP(h);
    if (ip && /^\d+$/.test(port)) return joinHostPort(ip, Number(port));
    return s;
  }
  return canonicalIP(s) ?? s;
}

/** The address part of a DNAT output (first of a range). */
function dnatAddress(s: string): string | null {
  const bracket = /^\[([^\]]+)\]/.exec(s);
  const host = bracket ? bracket[1] : s.split(':').length === 2 ? s.split(':')[0] : s;
  return canonicalIP(host.split('-')[0]);
}

// ---------------------------------------------------------------------------------------
// Matching

function ruleMatches(w: Walk, rule: Rule, p: Pkt): boolean {
  // words the parser ignored are reported whether or not the rule matches: they might be
  // what would have decided it
  if (rule.stray.length) w.notes.add(`line ${rule.line}: words ${JSON.stringify(rule.stray.join(' '))} not understood, ignored`);
  let assumed: string | null = null;
  for (const c of rule.conds) {
    const m = condMatches(w, c, p);
    if (m === false) return false;
    if (m === null) assumed ??= describeAssumption(c);
  }
  if (assumed) w.notes.add(`line ${rule.line}: assumed to match (${assumed})`);
  return true;
}

/** true / false, or null when the tracer cannot know and assumes a match. */
function condMatches(w: Walk, c: Cond, p: Pkt): boolean | null {
  switch (c.kind) {
    case 'addr':
      return c.dir === 'src' ? addrCondMatches(c.values, p.src, p.srcV, c.neg) : addrCondMatches(c.values, p.dst, p.dstV, c.neg);
    case 'proto':
      return protoMatches(c.value, p.proto) !== c.neg;
    case 'port': {
      if (c.dir === 'src') return null; // a first packet's source port is anybody's guess
      if (!c.ranges) return null;
      const inRange = c.ranges.some(([lo, hi]) => p.dport >= lo && p.dport <= hi);
      // --ports matches either port; only a destination hit is certain.
      if (c.dir === 'any' && !inRange) return null;
      return inRange !== c.neg;
    }
    case 'addrtype': {
      const ip = c.dir === 'src' ? p.src : p.dst;
      return c.types.includes(addrTypeOf(w, ip)) !== c.neg;
    }
    case 'iprange':
      return inIPRange(c.dir === 'src' ? p.src : p.dst, c.from, c.to) !== c.neg;
    case 'fragment':
      return c.neg; // a first packet is not a fragment
    case 'tcpflags': {
      if (p.proto !== 'tcp') return false;
      // The first packet of a TCP connection carries SYN only.
      const ok = c.mask.every((f) => (f === 'SYN') === c.comp.includes(f));
      return ok !== c.neg;
    }
    case 'history':
      return false;
    case 'always':
      return true;
    case 'iface':
      return null;
    case 'unknown':
      return null;
  }
}

function describeAssumption(c: Cond): string {
  switch (c.kind) {
    case 'iface':
      return `${c.dir === 'in' ? '-i' : '-o'} ${c.name}: interfaces are not traced`;
    case 'port':
      return c.dir === 'src' ? 'source port not traced' : `port "${c.raw}" not understood`;
    case 'unknown':
      return `${c.module ? `-m ${c.module} ` : ''}${c.option}${c.args.length ? ` ${c.args.join(' ')}` : ''} not evaluated`;
    default:
      return c.kind;
  }
}

function protoMatches(ruleProto: string, proto: string): boolean {
  const v = PROTO_NUMBERS[ruleProto] ?? ruleProto;
  return v === 'all' || v === '0' || v === proto;
}

function addrTypeOf(w: Walk, ip: string): string {
  if (w.local.has(ip)) return 'LOCAL';
  if (ip === '255.255.255.255') return 'BROADCAST';
  if (/^(22[4-9]|23\d)\./.test(ip) || /^ff/i.test(ip)) return 'MULTICAST';
  return 'UNICAST';
}

/** An address condition's network: IPv4 as 32-bit numbers (fast), IPv6 as bigints. */
type Net = { v6: false; value: number; mask: number } | { v6: true; value: bigint; prefix: number };

/** Parsed networks per address condition: rules are parsed once, matched many times. */
const netCache = new WeakMap<string[], Array<Net | null>>();

function addrCondMatches(values: string[], ip: string, value: bigint, neg: boolean): boolean | null {
  let nets = netCache.get(values);
  if (!nets) {
    nets = values.map(parseNet);
    netCache.set(values, nets);
  }
  const v6 = ip.includes(':');
  const v4 = v6 ? 0 : Number(value);
  let hit = false;
  for (const n of nets) {
    if (n === null) return null; // a host name: cannot resolve here
    if (n.v6 !== v6) continue;
    if (n.v6 ? value >> BigInt(128 - n.prefix) === n.value >> BigInt(128 - n.prefix) : ((v4 ^ n.value) & n.mask) === 0) {
      hit = true;
      break;
    }
  }
  return hit !== neg;
}

/** "10.0.0.0/8", "172.30.0.41/32", "10.0.0.1", "10.0.0.0/255.0.0.0", IPv6 alike. */
function parseNet(s: string): Net | null {
  const slash = s.indexOf('/');
  // a dotted IPv4 address with a prefix length, what iptables-save prints for every `-d`/`-s`
  // (20,000 of them in the two chains a NodePort's walk reads at 10,000 Services): read in place
  const v4 = IPV4_NET.exec(s);
  if (v4) {
    const octets = [v4[1], v4[2], v4[3], v4[4]].map(Number);
    if (octets.every((o) => o <= 255)) {
      const prefix = v4[5] === undefined ? 32 : parseInt(v4[5], 10);
      if (prefix > 32) return null;
      const mask = prefix === 0 ? 0 : (0xffffffff << (32 - prefix)) | 0;
      return { v6: false, value: ((octets[0] << 24) | (octets[1] << 16) | (octets[2] << 8) | octets[3]) | 0, mask };
    }
  }
  const ip = canonicalIP(slash < 0 ? s : s.slice(0, slash));
  if (!ip) return null;
  const v6 = ip.includes(':');
  const bits = v6 ? 128 : 32;
  let prefix = bits;
  if (slash >= 0) {
    const m = s.slice(slash + 1);
    if (/^\d+$/.test(m)) prefix = parseInt(m, 10);
    else {
      const maskIP = canonicalIP(m);
      if (!maskIP) return null;
      prefix = maskPrefix(ipToBigInt(maskIP), bits);
    }
    if (prefix > bits) return null;
  }
  if (v6) return { v6, value: ipToBigInt(ip), prefix };
  const mask = prefix === 0 ? 0 : (0xffffffff << (32 - prefix)) | 0;
  return { v6, value: Number(ipToBigInt(ip)) | 0, mask };
}

const IPV4_NET = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})(?:\/(\d+))?$/;

function maskPrefix(mask: bigint, bits: number): number {
  let n = 0;
  for (let i = bits - 1; i >= 0 && (mask >> BigInt(i)) & 1n; i--) n++;
  return n;
}

function inIPRange(ip: string, from: string, to: string): boolean {
  const a = canonicalIP(from);
  const b = canonicalIP(to);
  if (!a || !b || a.includes(':') !== ip.includes(':')) return false;
  const v = ipToBigInt(ip);
  return v >= ipToBigInt(a) && v <= ipToBigInt(b);
}
