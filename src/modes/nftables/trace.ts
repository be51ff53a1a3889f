// The nftables tracer: walks the first packet of a new connection through a kube-proxy
// table (rendered, or read back from `nft list`), as upstream's test tracer does
// (pkg/proxy/nftables/helpers_test.go): filter prerouting, nat prerouting, apply the first
// DNAT, then filter forward and filter input. Several tables (the shards `kube-proxy-<n>`)
// are walked together: at each hook every table's base chains in priority order,
// ties as the kernel runs them: the chain registered last first (nf_hook_entries_grow inserts
// a hook before those of equal priority; a table's base chains are registered when it is
// created, so the tables are given in creation order: `nft list` order, and for the mode's
// own tables shard order, kube-proxy-<K-1> created last), a drop or reject ends the walk, the first DNAT binds (the kernel
// skips the later nat chains once a binding is set), an accept or return goes on with the
// next base chain; a jump stays in its table. Random choices (numgen: upstream's anonymous
// map, or kproxy's run of picks, selection.ts) follow every branch,
// so the result lists all candidate endpoints. Pure.
import { canonicalIP, cidrContains, isLoopback, joinHostPort } from '../../core/ip.ts';
import { parseKubeProxyTable, parseNftText } from './parse.ts';
import { isKubeProxyTable, splitHostPort } from './names.ts';
import type { NftChain, NftElement, NftSet, Ruleset } from './ruleset.ts';

export interface NftPacket {
  sourceIP: string;
  /** TCP | UDP | SCTP (any case); "" = TCP */
  protocol: string;
  destIP: string;
  destPort: number;
}

export interface NftTraceResult {
  /** "ip:port, ip:port" | "REJECT" | "DROP" | "" */
  output: string;
  masq: boolean;
  /** every rule matched, in order */
  rules: string[];
  /** rules the tracer could not interpret */
  notes: string[];
}

interface Pkt {
  src: string;
  proto: string;
  dst: string;
  dport: string;
}

const MAX_DEPTH = 64;

/**
 * Per set without intervals, its elements by canonical key (null for a set with CIDR keys),
 * built on a walk's first lookup in the set. A caller that walks the same sets again, unchanged
 * (a live trace walks once per read), passes one map to every walk so that each is built once.
 */
export type ExactIndexes = Map<NftSet, Map<string, NftElement> | null>;

/**
 * Told of each chain, set or map the walk looks for in a table and does not find; true when
 * the caller will read it and trace again (a live trace reads the kernel's objects on demand):
 * the walk then goes on past a missing chain instead of ending there. False, or no callback:
 * the object does not exist, and the walk treats it as such.
 */
export type MissingObject = (table: Ruleset, kind: 'chain' | 'set' | 'map', name: string) => boolean;

class Tracer {
  readonly matches: string[] = [];
  readonly outputs: string[] = [];
  readonly notes: string[] = [];
  masq = false;
  /** an object the walk needs is still to be read (MissingObject said so) */
  pending = false;
  /** the table being walked (a jump stays in it) */
  private rs: Ruleset;
  /** shown before a chain's name when several tables are walked */
  private prefix = '';

  constructor(
    private readonly tables: Ruleset[],
    private readonly local: Set<string>,
    private readonly missing?: MissingObject,
    /** per set without intervals, its elements by canonical key (built on first lookup) */
    private readonly exact: ExactIndexes = new Map(),
  ) {
    this.rs = tables[0];
  }

  /** Runs a base chain of one of the tables. */
  runBase(b: BaseRef, p: Pkt): boolean {
    this.rs = b.rs;
    this.prefix = this.tables.length > 1 ? `${b.rs.table} ` : '';
    return this.runChain(b.name, p);
  }

  private isLocal(ip: string): boolean {
    return this.local.has(canonicalIP(ip) ?? ip);
  }

  private set(name: string, kind: 'set' | 'map'): NftSet | undefined {
    const s = this.rs.sets.get(name);
    if (!s && this.missing?.(this.rs, kind, name)) this.pending = true;
    return s;
  }

  /** key parts against packet fields; IP parts may be CIDRs (interval sets) */
  private elementFor(set: NftSet | undefined, want: string[]): { value?: string } | undefined {
    if (!set) return undefined;
    // A set of exact keys: one lookup (keyPartMatches on such keys is equality of canonical forms),
    // where a scan per lookup costs a canonicalIP per element (16 maps of 625 at 10,000 Services).
    let index = this.exact.get(set);
    if (index === undefined) {
      index = exactIndex(set);
      this.exact.set(set, index);
    }
    if (index) return index.get(canonicalKey(want));
    for (const el of set.elements.values()) {
      if (el.key.length !== want.length) continue;
      if (el.key.every((k, i) => keyPartMatches(k, want[i]))) return el;
    }
    return undefined;
  }

  /** Runs a chain; true when the packet hit a terminal verdict (DNAT, drop, reject). */
  runChain(name: string, p: Pkt, depth = 0): boolean {
    const ch: NftChain | undefined = this.rs.chains.get(name);
    if (!ch) {
      // a chain still to be read: the walk goes on past it, to find what else it needs
      if (this.missing?.(this.rs, 'chain', name)) {
        this.pending = true;
        return false;
      }
      this.notes.push(`unknown chain ${name}`);
      return true;
    }
    if (depth > MAX_DEPTH) {
      this.notes.push(`jump depth exceeded at ${name}`);
      return true;
    }
    for (const r of ch.rules) {
      const res = this.runRule(r.rule, ruleDisplay(this.prefix + name, r.rule, r.comment), p, depth);
      if (res === 'terminal') return true;
      if (res === 'return') return false;
    }
    return false;
  }

  /**
   * Evaluates one rule piece by piece; 'next' when it does not match or falls through. One
   * loop over the rule's words with a branch per expression form kproxy and upstream write
   * (longer than most functions here): the forms read in the order a rule holds them, and
   * each branch consumes its words, which separate functions would have to pass back.
   */
  private runRule(text: string, shown: string, p: Pkt, depth: number): 'next' | 'terminal' | 'return' {
    let rule = text.replace(/^ct state new\s*/, '').replace(/\s*comment "[^"]*"$/, '').trim();
    let m: RegExpExecArray | null;
    while (rule !== '') {
      rule = rule.trimStart();
      if ((m = /^ip6? daddr @(\S+)/.exec(rule))) {
        if (!this.elementFor(this.set(m[1], 'set'), [p.dst])) return 'next';
      } else if ((m = /^ip6? saddr @(\S+)/.exec(rule))) {
        // Affinity sets record history; a first packet never matches them.
        if (m[1].startsWith('affinity-') || !this.elementFor(this.set(m[1], 'set'), [p.src])) return 'next';
      } else if ((m = /^ip6? daddr \. meta l4proto \. th dport vmap @(\S+)$/.exec(rule))) {
        const el = this.elementFor(this.set(m[1], 'map'), [p.dst, p.proto, p.dport]);
        if (!el?.value) return 'next';
        this.matches.push(shown);
        rule = el.value;
        continue;
      } else if ((m = /^meta l4proto \. th dport vmap @(\S+)$/.exec(rule))) {
        const el = this.elementFor(this.set(m[1], 'map'), [p.proto, p.dport]);
        if (!el?.value) return 'next';
        this.matches.push(shown);
        rule = el.value;
        continue;
      } else if ((m = /^ip6? daddr \. meta l4proto \. th dport @(\S+)/.exec(rule))) {
        if (!this.elementFor(this.set(m[1], 'set'), [p.dst, p.proto, p.dport])) return 'next';
      } else if ((m = /^meta l4proto \. th dport @(\S+)/.exec(rule))) {
        if (!this.elementFor(this.set(m[1], 'set'), [p.proto, p.dport])) return 'next';
      } else if ((m = /^ip6? (daddr|saddr) (!= )?\{([^}]*)\}/.exec(rule))) {
        const ip = m[1] === 'daddr' ? p.dst : p.src;
        const inSet = m[3].split(',').map((s) => s.trim()).filter(Boolean).some((a) => addressMatches(ip, a));
        if (inSet === (m[2] === '!= ')) return 'next';
      } else if ((m = /^ip6? (daddr|saddr) (!= )?((?=[0-9a-fA-F:])[0-9a-fA-F:.]+(?:\/\d+)?)(?=\s|$)/.exec(rule))) {
        const ip = m[1] === 'daddr' ? p.dst : p.src;
        if (addressMatches(ip, m[3]) === (m[2] === '!= ')) return 'next';
      } else if ((m = /^fib (daddr|saddr) type local/.exec(rule))) {
        if (!this.isLocal(m[1] === 'daddr' ? p.dst : p.src)) return 'next';
      } else if ((m = /^(tcp|udp|sctp) dport (\d+)/.exec(rule))) {
        if (m[1] !== p.proto || m[2] !== p.dport) return 'next';
      } else if ((m = /^meta l4proto (tcp|udp|sctp)(?= )(?! dnat)/.exec(rule))) {
        if (m[1] !== p.proto) return 'next';
      } else if ((m = /^iifname (!= )?\S+/.exec(rule))) {
        // Interface-based local detection: the tracer's packets arrive from outside pods.
        if (!m[1]) return 'next';
      } else if ((m = /^update @\S+ \{[^}]*\}/.exec(rule))) {
        // Recording affinity has no effect on the first packet.
      } else if ((m = /^counter(?: packets \d+ bytes \d+)?/.exec(rule))) {
        // counters never change the verdict
      } else if ((m = /^jump mark-for-masquerade$/.exec(rule))) {
        this.matches.push(shown);
        this.masq = true;
      } else if ((m = /^(jump|goto) (\S+)$/.exec(rule))) {
        this.matches.push(shown);
        if (this.runChain(m[2], p, depth + 1)) return 'terminal';
        return m[1] === 'goto' ? 'return' : 'next';
      } else if ((m = /^(drop|reject)(?: with .*)?$/.exec(rule))) {
        this.matches.push(shown);
        this.outputs.push(m[1].toUpperCase());
        return 'terminal';
      } else if (/^return$/.test(rule)) {
        this.matches.push(shown);
        return 'return';
      } else if (/^accept$/.test(rule)) {
        this.matches.push(shown);
        return 'return';
      } else if ((m = /^(?:meta l4proto (?:tcp|udp|sctp) )?dnat (?:ip6? )?to (\S+)$/.exec(rule))) {
        this.matches.push(shown);
        this.outputs.push(normaliseEndpoint(m[1]));
        return 'terminal';
      } else if ((m = /^numgen random mod \d+ vmap \{(.*)\}$/.exec(rule))) {
        // Follow every branch: the result lists every endpoint the packet may reach.
        for (const entry of m[1].matchAll(/\d+\s*:\s*(?:goto|jump)\s+([^\s,}]+)/g)) {
          this.matches.push(shown);
          this.runChain(entry[1], p, depth + 1);
        }
        return 'terminal';
      } else if ((m = /^numgen random mod \d+ (?:== )?0 goto (\S+)$/.exec(rule))) {
        // One pick of a selection run (selection.ts): it may be taken or not; follow it and
        // go on, so the result lists every endpoint the packet may reach.
        this.matches.push(shown);
        this.runChain(m[1], p, depth + 1);
        return 'next';
      } else if ((m = /^mark (set|and) .*$/.exec(rule)) || (m = /^meta mark .*$/.exec(rule))) {
        return 'next';
      } else if (/^masquerade/.test(rule)) {
        return 'next';
      } else if ((m = /^ct (?:state|status) (\S+)/.exec(rule))) {
        // Connection history: a first packet is in state new and has no status yet.
        if (!m[0].startsWith('ct state') || !m[1].split(',').includes('new')) return 'next';
      } else {
        // A match the tracer cannot evaluate: the rule may match. It is taken as matching
        // (its action is followed), as the iptables tracer assumes of an unknown match, and
        // the note names it, since the answer depends on it.
        const v = trailingAction(rule);
        if (v === null) {
          this.notes.push(`unmatched rule: ${shown}`);
          return 'next';
        }
        this.notes.push(`may match: ${shown}: "${rule.slice(0, v).trim()}" not evaluated, the rule is taken as matching`);
        rule = rule.slice(v);
        continue;
      }
      rule = rule.slice(m[0].length);
    }
    return 'next';
  }
}

/**
 * Where a rule's action starts (a verdict, a jump, a dnat) after pieces the tracer does not
 * know, or null when the rule ends in none it knows.
 */
function trailingAction(rule: string): number | null {
  const m = /(?:^|\s)((?:jump|goto) \S+|drop|reject(?: with .*)?|accept|return|(?:meta l4proto (?:tcp|udp|sctp) )?dnat (?:ip6? )?to \S+)$/.exec(rule);
  if (!m) return null;
  const at = m.index + m[0].length - m[1].length;
  return at > 0 ? at : null;
}

function ruleDisplay(chain: string, rule: string, comment?: string): string {
  return `${chain}: ${rule}${comment !== undefined ? ` comment "${comment}"` : ''}`;
}

function canonicalKey(parts: string[]): string {
  return parts.map((x) => canonicalIP(x) ?? x).join('\u0000');
}

/** The elements by canonical key, the first of equal keys kept (as a scan finds it); null when a key part is a CIDR. */
function exactIndex(set: NftSet): Map<string, NftElement> | null {
  const index = new Map<string, NftElement>();
  for (const el of set.elements.values()) {
    if (el.key.some((k) => k.includes('/'))) return null;
    const k = canonicalKey(el.key);
    if (!index.has(k)) index.set(k, el);
  }
  return index;
}

function keyPartMatches(key: string, want: string): boolean {
  if (key === want) return true;
  const ip = canonicalIP(want);
  if (!ip) return false;
  if (key.includes('/')) return cidrContains(key, ip);
  const k = canonicalIP(key);
  return k !== null && k === ip;
}

function addressMatches(ip: string, ruleAddr: string): boolean {
  if (ruleAddr.includes('/')) return cidrContains(ruleAddr, ip);
  const a = canonicalIP(ruleAddr);
  return a !== null && a === canonicalIP(ip);
}

/** "10.0.0.1:80" / "[fd00::1]:80" in canonical form. */
function normaliseEndpoint(ep: string): string {
  const [host, port] = splitHostPort(ep);
  return joinHostPort(canonicalIP(host) ?? host, Number(port));
}

interface BaseRef {
  rs: Ruleset;
  name: string;
  priority: number;
}

/**
 * Base chains of a type and hook in the order the kernel runs them: by priority; at equal
 * priority the one registered last first (the tables in creation order, a table's chains in
 * its order). By name in a table whose text has no hooks.
 */
function baseChains(tables: Ruleset[], type: 'filter' | 'nat', hook: string, fallback: string[]): BaseRef[] {
  const out: BaseRef[] = [];
  for (const rs of tables) {
    const hooked = [...rs.chains.values()].filter((c) => c.type === type && c.hook === hook);
    if (hooked.length) for (const c of hooked) out.push({ rs, name: c.name, priority: c.priority ?? 0 });
    else for (const n of fallback) if (rs.chains.has(n)) out.push({ rs, name: n, priority: 0 });
  }
  // Array.prototype.sort is stable: reversed first, equal priorities run last-registered first.
  return out.reverse().sort((a, b) => a.priority - b.priority);
}

function endpointOrder(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function finish(t: Tracer): NftTraceResult {
  let outs = t.outputs;
  if (outs.length && outs.every((o) => o !== 'DROP' && o !== 'REJECT')) outs = [...new Set(outs)].sort(endpointOrder);
  return { output: outs.join(', '), masq: t.masq, rules: t.matches, notes: t.notes };
}

/** Traces a packet through a parsed table. `localIPs` are this node's addresses (fib ... type local). */
export function traceRuleset(rs: Ruleset, pkt: NftPacket, opts: { localIPs: string[] }): NftTraceResult {
  return traceTables([rs], pkt, opts);
}

/** Traces a packet through several tables of one family at once (the shards), in hook order. */
export function traceTables(tables: Ruleset[], pkt: NftPacket, opts: { localIPs: string[]; missing?: MissingObject; indexes?: ExactIndexes }): NftTraceResult {
  const local = new Set(opts.localIPs.map((a) => canonicalIP(a) ?? a));
  const t = new Tracer(tables, local, opts.missing, opts.indexes);
  const p: Pkt = {
    src: canonicalIP(pkt.sourceIP) ?? pkt.sourceIP,
    proto: (pkt.protocol || 'TCP').toLowerCase(),
    dst: canonicalIP(pkt.destIP) ?? pkt.destIP,
    dport: String(pkt.destPort),
  };
  for (const c of baseChains(tables, 'filter', 'prerouting', ['filter-prerouting-pre-dnat', 'filter-prerouting'])) {
    if (t.runBase(c, p)) return finish(t);
  }
  for (const c of baseChains(tables, 'nat', 'prerouting', ['nat-prerouting'])) {
    if (t.runBase(c, p)) break;
  }
  // what follows depends on the DNAT: it waits for the objects still to be read
  if (t.pending) return finish(t);
  // The first DNAT changes the destination address and port the later filter chains see,
  // and routing then picks the path: a packet DNATed to a pod on another address is
  // forwarded (filter forward), one for a local address is delivered (filter input). Only
  // an un-DNATed packet to a node address walks input (where the no-endpoint NodePort checks
  // live); one to any other address is forwarded.
  const dnat = t.outputs.find((o) => o !== 'DROP' && o !== 'REJECT');
  let after: Pkt = p;
  if (dnat) {
    const [host, port] = splitHostPort(dnat);
    after = { ...p, dst: canonicalIP(host) ?? host, dport: String(port) };
  }
  const delivered = local.has(after.dst) || isLoopback(after.dst);
  if (!delivered) {
    for (const c of baseChains(tables, 'filter', 'forward', ['filter-forward'])) {
      if (t.runBase(c, after)) return finish(t);
    }
    return finish(t);
  }
  for (const c of baseChains(tables, 'filter', 'input', ['filter-input'])) {
    if (t.runBase(c, after)) break;
  }
  return finish(t);
}

/**
 * The kube-proxy tables of a family in the text (`kube-proxy`, the shards `kube-proxy-<n>`), in
 * the text's order: for `nft list` output the kernel's, which is creation order (what the
 * tracer needs for equal priorities); the mode's rendered text is in shard order, the order it
 * creates them. When the text has none, the one table parseKubeProxyTable picks.
 */
export function kubeProxyTables(text: string, family: 'ip' | 'ip6'): Ruleset[] {
  const ours = [...parseNftText(text).values()].filter((rs) => rs.family === family && isKubeProxyTable(rs.table));
  if (!ours.length) return [parseKubeProxyTable(text, family)];
  return ours;
}

/** Traces through nftables text: a rendered transaction/dump or `nft list table`/`nft -s list ruleset` output; every kube-proxy table of the family in it. */
export function traceNft(text: string, pkt: NftPacket, opts: { localIPs: string[] }): NftTraceResult {
  const fam = pkt.destIP.includes(':') ? 'ip6' : 'ip';
  return traceTables(kubeProxyTables(text, fam), pkt, opts);
}
