// Tracing a packet through a node's SAVED rules, offline: the `iptables-save`, `nft list
// ruleset`, `ipvsadm -Ln` / `-Sn` and `ipset save` text attached to a bug report, written by
// any kube-proxy (upstream's chain layouts of any recent version, kproxy's own, its sharded
// nftables tables) or by another tool. Each file's format is known from its content
// (detectRulesFormat) unless forced; the files pick the mode's tracer: ipvsadm text means
// IPVS (with the ipsets and, if given, the iptables rules for masquerade), nft text means
// nftables, iptables-save text alone means iptables. The packet's family picks the family's
// rules. Every line a reader cannot use is named in `warnings` ("FILE line N: why: text"),
// never skipped silently; a match a tracer cannot evaluate makes its rule "may match": taken
// as matching and named in the notes. Pure: the caller reads the files.
import { canonicalIP, ipFamily } from '../core/ip.ts';
import { kproxyError } from '../errors.ts';
import { parseIptablesSave, type Ruleset as IptablesRuleset } from '../kernel/iptables/parse.ts';
import { parseListing, parseRules, splitHostPort, type IpvsTable } from '../kernel/ipvs/model.ts';
import { parseSave, type IPSetTable } from '../kernel/ipset/model.ts';
import { traceIptables } from './iptables/trace.ts';
import { masqConfigFromIptables, traceIpvs, type MasqConfig } from './ipvs/trace.ts';
import { isKubeProxyTable } from './nftables/names.ts';
import { readNftDump } from './nftables/parse.ts';
import type { Ruleset as NftRuleset } from './nftables/ruleset.ts';
import { traceTables } from './nftables/trace.ts';
import type { TraceResult } from './trace-types.ts';

export const RULES_FORMATS = ['iptables-save', 'nft', 'ipvsadm', 'ipset'] as const;
export type RulesFormat = (typeof RULES_FORMATS)[number];

export interface RulesFile {
  /** the name the warnings use (the file's path) */
  name: string;
  text: string;
  /** forced with --rules-format; detected from the text when absent */
  format?: RulesFormat;
}

export interface SavedTraceRequest {
  files: RulesFile[];
  from: string;
  to: string;
  port: number;
  protocol: 'TCP' | 'UDP' | 'SCTP';
  /** the family of the rules, when given (--family): must be the packet's */
  family?: 4 | 6;
  /** the node's own addresses (`addrtype LOCAL`, `fib daddr type local`); loopback always is */
  nodeIPs: string[];
}

export interface SavedTraceResult extends TraceResult {
  mode: 'iptables' | 'nftables' | 'ipvs';
  /** how each file was read: "FILE: iptables-save (line 3: a "*TABLE" line)" */
  read: string[];
  warnings: string[];
  notes: string[];
}

/**
 * The first line of a text that only one tool writes, per format, in the order they are
 * tried. ipvsadm's rule form (`-A -t ADDR:PORT`) comes before iptables-save (whose rules
 * also start with `-A`, but whose text has `*TABLE` lines and never a chain named `-t`).
 */
const SIGNS: Array<{ format: RulesFormat; re: RegExp; what: string }> = [
  { format: 'ipvsadm', re: /^IP Virtual Server version /m, what: 'the "IP Virtual Server version" header of ipvsadm -L' },
  { format: 'ipvsadm', re: /^-[AE]\s+(?:-t|-u|-f|--tcp-service|--udp-service|--sctp-service|--fwmark-service)\s/m, what: 'an "-A -t|-u ADDR:PORT" virtual server of ipvsadm -S' },
  { format: 'ipset', re: /^create\s+\S+\s+(?:hash|bitmap|list):\S+/m, what: 'a "create NAME TYPE" line of ipset save' },
  { format: 'iptables-save', re: /^\s*\*(?:nat|filter|mangle|raw|security)\s*$/m, what: 'a "*TABLE" line of iptables-save' },
  { format: 'nft', re: /^\s*table\s+(?:ip|ip6|inet|arp|bridge|netdev)\s+\S+\s*\{/m, what: 'a "table FAMILY NAME {" block of nft list ruleset' },
  { format: 'nft', re: /^\s*(?:add|create|insert)\s+(?:table|chain|rule|set|map|element)\s+(?:ip6?|inet)\s+\S+/m, what: 'an "add table|chain|rule ..." command of nft -f' },
  { format: 'ipvsadm', re: /^(?:TCP|UDP|SCTP)\s+\S+:\d+\s+[a-z]+\b/m, what: 'a "PROT ADDR:PORT SCHEDULER" virtual server of ipvsadm -Ln' },
];

/** Which tool wrote the text, and the line that says so; null when none of them. */
export function detectRulesFormat(text: string): { format: RulesFormat; why: string } | null {
  for (const s of SIGNS) {
    const m = s.re.exec(text);
    if (m) {
      const lineNo = text.slice(0, m.index).split('\n').length + (m[0].startsWith('\n') ? 1 : 0);
      return { format: s.format, why: `line ${lineNo}: ${s.what}` };
    }
  }
  return null;
}

export function parseRulesFormat(s: string): RulesFormat {
  const f = s.trim().toLowerCase();
  const alias: Record<string, RulesFormat> = {
    'iptables-save': 'iptables-save', iptables: 'iptables-save', 'ip6tables-save': 'iptables-save', ip6tables: 'iptables-save',
    nft: 'nft', nftables: 'nft',
    ipvsadm: 'ipvsadm', ipvs: 'ipvsadm',
    ipset: 'ipset',
  };
  const v = alias[f];
  if (!v) throw kproxyError('KPROXY_TRACE_INPUT', `--rules-format ${JSON.stringify(s)}: one of ${RULES_FORMATS.join(', ')}`);
  return v;
}

interface ReadFile extends RulesFile {
  format: RulesFormat;
  why: string;
}

/** One mode's answer, and the files it read. */
type Part = Omit<SavedTraceResult, 'read'> & { used: Set<ReadFile> };

export function traceSavedRules(req: SavedTraceRequest): SavedTraceResult {
  const family = ipFamily(req.to) === 6 ? 6 : 4;
  if (req.family !== undefined && req.family !== family) {
    throw kproxyError('KPROXY_TRACE_INPUT', `--family ${req.family} but the packet's addresses are IPv${family}; trace an IPv${req.family} packet through IPv${req.family} rules`);
  }
  if (!req.files.length) throw kproxyError('KPROXY_TRACE_INPUT', 'give at least one --rules FILE');
  const files: ReadFile[] = req.files.map((f) => {
    if (f.format) return { ...f, format: f.format, why: 'given with --rules-format' };
    const d = detectRulesFormat(f.text);
    if (!d) {
      throw kproxyError(
        'KPROXY_TRACE_INPUT',
        `${f.name}: not the output of iptables-save, nft list ruleset, ipvsadm -Ln/-Sn or ipset save (no line only one of them writes); name its format with --rules-format`,
      );
    }
    return { ...f, ...d };
  });
  const read = files.map((f) => `${f.name}: ${f.format} (${f.why})`);
  const of = (fmt: RulesFormat) => files.filter((f) => f.format === fmt);
  let r: Part;
  if (of('ipvsadm').length) r = traceSavedIpvs(req, family, of('ipvsadm'), of('ipset'), of('iptables-save'));
  else if (of('nft').length) r = traceSavedNft(req, family, of('nft'));
  else if (of('iptables-save').length) r = traceSavedIptables(req, family, of('iptables-save'));
  else throw kproxyError('KPROXY_TRACE_INPUT', 'ipset save alone says nothing about where a packet goes: give the ipvsadm -Ln (or -Sn) output with it');
  const unused = files.filter((f) => !r.used.has(f));
  for (const f of unused) r.notes.unshift(`${f.name} (${f.format}) is not used by the ${r.mode} trace`);
  const { used: _used, ...rest } = r;
  return { ...rest, read };
}

function localIPs(req: SavedTraceRequest): string[] {
  return req.nodeIPs.map((ip) => canonicalIP(ip) ?? ip);
}

function noNodeIPNote(req: SavedTraceRequest): string[] {
  return req.nodeIPs.length ? [] : ['no --node-ip: only loopback addresses count as the node\'s own (addrtype LOCAL, fib type local); give the node\'s IPs to trace NodePorts'];
}

// ---------------------------------------------------------------------------------------
// iptables

/** The family an iptables-save text is of: its header, else the addresses its rules name. */
export function iptablesSaveFamily(text: string): 4 | 6 | null {
  const head = /^# Generated by (ip6?)tables(?:-legacy|-nft)?-save/m.exec(text);
  if (head) return head[1] === 'ip6' ? 6 : 4;
  const v6 = (text.match(/\s(?:-[sd]|--to-destination)\s+\[?[0-9a-fA-F]*:[0-9a-fA-F:.]*[\]/\s]/g) ?? []).length;
  const v4 = (text.match(/\s(?:-[sd]|--to-destination)\s+\d+\.\d+\.\d+\.\d+/g) ?? []).length;
  if (v6 === v4) return null;
  return v6 > v4 ? 6 : 4;
}

/**
 * The text with every non-blank, non-comment line outside a `*TABLE` ... `COMMIT` block (a
 * shell prompt, a banner) blanked, so that the parser, which refuses a rule outside a table,
 * reads the rest; each blanked line is named.
 */
function outsideTablesBlanked(text: string, warnings: string[]): string {
  const lines = text.split('\n');
  let inTable = false;
  for (let i = 0; i < lines.length; i++) {
    const t = lines[i].trim();
    if (t === '' || t.startsWith('#')) continue;
    if (/^\*\S+$/.test(t)) inTable = true;
    else if (t === 'COMMIT') inTable = false;
    else if (!inTable) {
      warnings.push(`line ${i + 1}: outside a *TABLE ... COMMIT block, left out: ${clip(t)}`);
      lines[i] = '';
    }
  }
  return lines.join('\n');
}

function traceSavedIptables(req: SavedTraceRequest, family: 4 | 6, files: ReadFile[]): Part {
  const notes: string[] = [];
  const warnings: string[] = [];
  const used = new Set<ReadFile>();
  const merged: IptablesRuleset = { tables: new Map(), warnings: [] };
  const others: string[] = [];
  for (const f of files) {
    const fam = iptablesSaveFamily(f.text);
    if (req.family === undefined && fam !== null && fam !== family) {
      others.push(`${f.name} holds IPv${fam} rules`);
      continue;
    }
    const own: string[] = [];
    const rs = parseIptablesSave(outsideTablesBlanked(f.text, own));
    // iptables-nft-save says so when the legacy backend holds rules too: kube-proxy's may be there
    const legacy = /^# Warning: iptables-legacy tables present.*$/m.exec(f.text);
    if (legacy) notes.push(`${f.name}: "${legacy[0].slice(2)}": the rules traced may not be all the node has; ask for iptables-legacy-save too`);
    warnings.push(...[...own, ...rs.warnings].map((w) => `${f.name} ${w}`));
    for (const [name, t] of rs.tables) {
      if (merged.tables.has(name)) notes.push(`table ${name} of ${f.name} replaces the one read before`);
      merged.tables.set(name, t);
    }
    used.add(f);
  }
  if (!used.size) {
    throw kproxyError('KPROXY_TRACE_INPUT', `no IPv${family} iptables rules to trace the IPv${family} packet through (${others.join('; ')}); give the ${family === 6 ? 'ip6tables-save' : 'iptables-save'} output, or --family if the family was read wrong`);
  }
  const r = traceIptables(merged, { sourceIP: req.from, destIP: req.to, destPort: req.port, protocol: req.protocol }, { localIPs: localIPs(req) });
  if ([...used].some((f) => /--match-set KUBE-(6-)?CLUSTER-IP\s/.test(f.text))) {
    notes.push('these rules match the IPVS mode\'s ipsets (KUBE-CLUSTER-IP): the node runs the IPVS mode; give its ipvsadm -Ln and ipset save output with them to trace the virtual servers');
  }
  const usesLocal = [...merged.tables.values()].some((t) => [...t.chains.values()].some((c) => c.rules.some((x) => /--(src|dst)-type\s/.test(x.text))));
  return {
    mode: 'iptables',
    output: r.output,
    masq: r.masq,
    rules: r.rules,
    warnings,
    notes: [...(usesLocal ? noNodeIPNote(req) : []), ...notes, ...r.notes],
    used,
  };
}

// ---------------------------------------------------------------------------------------
// nftables

function traceSavedNft(req: SavedTraceRequest, family: 4 | 6, files: ReadFile[]): Part {
  const fam = family === 6 ? 'ip6' : 'ip';
  const warnings: string[] = [];
  const notes: string[] = [];
  const used = new Set<ReadFile>();
  const tables: NftRuleset[] = [];
  const skipped: string[] = [];
  let iptablesNft = false;
  for (const f of files) {
    const d = readNftDump(f.text);
    warnings.push(...d.warnings.map((w) => `${f.name} ${w}`));
    for (const rs of d.tables.values()) {
      if (rs.family === fam && isKubeProxyTable(rs.table)) {
        tables.push(rs);
        used.add(f);
      } else {
        skipped.push(`${rs.family} ${rs.table}`);
        if ([...rs.chains.keys()].some((c) => c.startsWith('KUBE-'))) iptablesNft = true;
      }
    }
  }
  if (!tables.length) {
    const hint = iptablesNft ? '; its KUBE-* chains are iptables rules listed by nft (iptables-nft): trace the iptables-save output instead' : '';
    throw kproxyError('KPROXY_TRACE_INPUT', `no ${fam} kube-proxy table (kube-proxy or kube-proxy-<n>) in ${files.map((f) => f.name).join(', ')} (tables: ${skipped.join(', ') || 'none'})${hint}`);
  }
  if (skipped.length) notes.push(`not traced (not kube-proxy's, or of the other family): table ${skipped.join(', table ')}`);
  let local = localIPs(req);
  if (!local.length) {
    // The mode's own list of the addresses NodePorts answer on: the best guess of the node's IPs.
    local = [...new Set(tables.flatMap((rs) => [...(rs.sets.get('nodeport-ips')?.elements.values() ?? [])].map((e) => canonicalIP(e.key[0]) ?? e.key[0])))];
    if (local.length) notes.push(`no --node-ip: the node's addresses are taken from the nodeport-ips set: ${local.join(', ')}`);
    else notes.push(...noNodeIPNote(req));
  }
  if (tables.length > 1) notes.push(`tables traced together, in the order listed: ${tables.map((t) => t.table).join(', ')}`);
  const r = traceTables(tables, { sourceIP: req.from, destIP: req.to, destPort: req.port, protocol: req.protocol }, { localIPs: local });
  return { mode: 'nftables', output: r.output, masq: r.masq, rules: r.rules, warnings, notes: [...notes, ...r.notes], used };
}

// ---------------------------------------------------------------------------------------
// IPVS

const LISTING_HEADERS = [/^IP Virtual Server version /, /^Prot\s+LocalAddress:Port/, /^->\s+RemoteAddress:Port/];

/** Names every line of ipvsadm text that the table parsers would pass over. */
function checkIpvsadmLines(text: string, listing: boolean, warn: (line: number, why: string) => void): void {
  text.split('\n').forEach((raw, i) => {
    const t = raw.trim();
    if (t === '' || t.startsWith('#') || LISTING_HEADERS.some((re) => re.test(t))) return;
    const w = t.split(/\s+/);
    if (/^FWM$/.test(w[0]) || w.includes('-f') || w.includes('--fwmark-service')) return warn(i + 1, `a firewall-mark virtual server (kube-proxy makes none), not traced: ${clip(t)}`);
    if (listing) {
      if (/^(TCP|UDP|SCTP)$/.test(w[0]) && w.length >= 3) {
        if (!splitHostPort(w[1])) warn(i + 1, `virtual server address ${w[1]} is not numeric IP:PORT (ipvsadm -L without -n?), left out: ${clip(t)}`);
        return;
      }
      if (w[0] === '->' && w.length >= 6 && /^\d+$/.test(w[3])) {
        if (!splitHostPort(w[1])) warn(i + 1, `real server address ${w[1]} is not numeric IP:PORT (ipvsadm -L without -n?), left out: ${clip(t)}`);
        return;
      }
    } else if (/^-[AaEe]$/.test(w[0])) {
      const at = w.findIndex((x) => /^(-t|-u|--tcp-service|--udp-service|--sctp-service)$/.test(x));
      if (at < 0 || !splitHostPort(w[at + 1] ?? '')) return warn(i + 1, `no numeric -t|-u|--sctp-service ADDR:PORT, left out: ${clip(t)}`);
      if (/^-[ae]$/.test(w[0]) && !splitHostPort(w[w.indexOf('-r') + 1] ?? '')) return warn(i + 1, `no numeric -r ADDR:PORT, left out: ${clip(t)}`);
      return;
    }
    warn(i + 1, `not understood, left out: ${clip(t)}`);
  });
}

function checkIpsetLines(text: string, warn: (line: number, why: string) => void): void {
  const created = new Set<string>();
  text.split('\n').forEach((raw, i) => {
    const t = raw.trim();
    if (t === '' || t.startsWith('#')) return;
    const w = t.split(/\s+/);
    if (w[0] === 'create' && w.length >= 3) created.add(w[1]);
    else if (w[0] === 'add' && w.length >= 3) {
      if (!created.has(w[1])) warn(i + 1, `entry of set ${w[1]}, which no "create" line before it makes, left out: ${clip(t)}`);
    } else warn(i + 1, `not understood, left out: ${clip(t)}`);
  });
}

function traceSavedIpvs(req: SavedTraceRequest, family: 4 | 6, ipvsFiles: ReadFile[], ipsetFiles: ReadFile[], iptablesFiles: ReadFile[]): Part {
  const warnings: string[] = [];
  const notes: string[] = [];
  const used = new Set<ReadFile>();
  const table: IpvsTable = new Map();
  for (const f of ipvsFiles) {
    const listing = /^IP Virtual Server version |^\s*->\s/m.test(f.text) || !/^-A\s/m.test(f.text);
    checkIpvsadmLines(f.text, listing, (n, why) => warnings.push(`${f.name} line ${n}: ${why}`));
    for (const [k, v] of listing ? parseListing(f.text) : parseRules(f.text)) table.set(k, v);
    used.add(f);
  }
  const sets: IPSetTable = new Map();
  for (const f of ipsetFiles) {
    checkIpsetLines(f.text, (n, why) => warnings.push(`${f.name} line ${n}: ${why}`));
    for (const [k, v] of parseSave(f.text)) sets.set(k, v);
    used.add(f);
  }
  if (!ipsetFiles.length) notes.push('no ipset save given: the source ranges, masquerade and NodePort rules that use the ipsets are not judged');
  let masq: MasqConfig = { all: false, clusterCIDR: null };
  const natFile = iptablesFiles.find((f) => (iptablesSaveFamily(f.text) ?? family) === family && /^\s*\*nat\s*$/m.test(f.text));
  if (natFile) {
    masq = masqConfigFromIptables(natFile.text, family);
    used.add(natFile);
  } else notes.push('no iptables-save (nat table) given: masquerade of cluster IP traffic is judged from the ipsets alone');
  const r = traceIpvs(
    { family, table, sets, masq, nodeIPs: localIPs(req) },
    { from: canonicalIP(req.from) ?? req.from, to: canonicalIP(req.to) ?? req.to, port: req.port, protocol: req.protocol },
  );
  return { mode: 'ipvs', output: r.output, masq: r.masq, rules: r.rules, warnings, notes: [...notes, ...noNodeIPNote(req), ...(r.notes ?? [])], used };
}

function clip(s: string): string {
  return s.length > 120 ? `${s.slice(0, 117)}...` : s;
}
