// The dispatch edits of the restart form in bounded restores (kproxy, not upstream: a first
// sync must not hold the xtables lock or the nf_tables commit for tens of seconds).
// restart.ts edits the dispatch chains (nat KUBE-SERVICES / KUBE-NODEPORTS and
// the filter chains) in place: `-D` of the installed rules no longer wanted, `-I` of the
// missing ones. After many Services changed, or over rules an older version wrote with other
// text (comments, large-cluster mode), that is most of KUBE-SERVICES: 40,000 edit lines at
// 10,000 Services, which one iptables-nft transaction takes seconds to commit (it is
// quadratic in its size). Here the edits are split into restores of about `maxLines` lines:
// - each Service's edits (its deletions and insertions, in every dispatch chain of both
//   tables) are in ONE restore, so no Service is unreachable or half switched between two;
//   the static rules (the NodePort catch-all, KUBE-FORWARD, KUBE-FIREWALL) are one group too;
// - an installed rule is the Service's whose chains (KUBE-SVC/SVL/EXT/FW-<hash>) it jumps
//   to, or else the Service its comment names (kproxy's comments start with "ns/name:port"; a
//   removed Service's rules are one group too, linked by its comment to its chains), or else
//   the static rules' when its comment or its target is theirs; a rule that tells none of
//   these (no kproxy comment, no service chain target) is deleted on its own, first;
// - every `-D` and `-I` is by position (an insertion after every rule the chain holds then is
//   an `-A`: no position to find), computed against a model of each chain as the
//   restores before it (and the lines before it in its own) leave it: the kept installed
//   rules, the inserted planned ones and the deleted ones in one order (a Fenwick tree of
//   which are present). By position, not by spec: iptables-nft finds a `-D` by spec by
//   converting every rule before it, which in a 20,000-rule chain costs tens of seconds
//   for a few thousand deletions (docs/benchmarks.md).
// Which installed rules are kept, deleted and inserted is chainEdits' choice (restart.ts: the
// longest run of installed rules already in planned order is kept). A chain not installed is
// declared in the first restore and filled by the groups' insertions. Pure.
import { canonicalRule, type InstalledChain } from './canonical.ts';

/** One dispatch chain to turn into its planned rules. */
export interface DispatchChain {
  table: 'filter' | 'nat';
  name: string;
  /** the planned rules (`-A` lines) */
  rules: readonly string[];
  /** each planned rule's group: its Service ("ns/name"), or STATIC_GROUP */
  owners: readonly string[];
  /** the chain as installed (canonical.ts; with `lines` and `canon`), undefined: not installed */
  installed: InstalledChain | undefined;
}

/** The group of planned rules that belong to no Service (the catch-all, KUBE-FORWARD, ...). */
export const STATIC_GROUP = '';

/** One restore of edits: lines per table (declarations first). */
export interface DispatchChunk {
  filter: string[];
  nat: string[];
}

export interface DispatchEdits {
  chunks: DispatchChunk[];
  /** `-I` and `-A` lines, per table */
  written: { filter: number; nat: number };
  /** chains installed as planned (no edit) */
  adopted: number;
}

/** Prefix sums over present slots (a Fenwick tree): a rule's position is how many present slots are at or before it. */
class Positions {
  private readonly t: Int32Array;
  constructor(n: number) {
    this.t = new Int32Array(n + 1);
  }
  add(slot: number, d: number): void {
    for (let i = slot + 1; i < this.t.length; i += i & -i) this.t[i] += d;
  }
  /** present slots in [0, slot] */
  upTo(slot: number): number {
    let s = 0;
    for (let i = slot + 1; i > 0; i -= i & -i) s += this.t[i];
    return s;
  }
}

interface Edit {
  chain: number;
  /** true: insert planned rule `index`; false: delete installed rule `index` */
  insert: boolean;
  index: number;
  slot: number;
}

/**
 * Which installed rules (by index) are kept, matched to which planned rules: the longest run
 * of installed rules already in planned order (patience sorting over the first unused
 * installed rule of each planned rule's canonical form). Also chainEdits' choice.
 */
export function keptRules(have: readonly string[], want: readonly string[]): { keptPlanned: boolean[]; keptInstalled: boolean[]; match: number[] } {
  const at = new Map<string, number[]>();
  for (let i = have.length - 1; i >= 0; i--) {
    const q = at.get(have[i]);
    if (q) q.push(i);
    else at.set(have[i], [i]);
  }
  const match: number[] = want.map((c) => at.get(c)?.pop() ?? -1);
  const tails: number[] = [];
  const prev = new Array<number>(want.length).fill(-1);
  for (let j = 0; j < want.length; j++) {
    const k = match[j];
    if (k < 0) continue;
    let lo = 0;
    let hi = tails.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (match[tails[mid]] < k) lo = mid + 1;
      else hi = mid;
    }
    prev[j] = lo > 0 ? tails[lo - 1] : -1;
    tails[lo] = j;
  }
  const keptPlanned = new Array<boolean>(want.length).fill(false);
  const keptInstalled = new Array<boolean>(have.length).fill(false);
  for (let j = tails.length ? tails[tails.length - 1] : -1; j >= 0; j = prev[j]) {
    keptPlanned[j] = true;
    keptInstalled[match[j]] = true;
  }
  return { keptPlanned, keptInstalled, match };
}

const TARGET = / -[jg] (KUBE-\S+)/;
const COMMENT = /-m comment --comment (\S+)/;

const SERVICE_CHAIN = /^KUBE-(?:SVC|SVL|EXT|FW)-(.+)$/;

/**
 * The KUBE-* chain a rule (canonical form) jumps to, unless it is one many groups use
 * (KUBE-MARK-*); a service port's own chains (KUBE-SVC/SVL/EXT/FW-<hash>) as one: `#<hash>`.
 */
function targetOf(canon: string): string | undefined {
  const m = TARGET.exec(` ${canon}`);
  if (!m || m[1].startsWith('KUBE-MARK-')) return undefined;
  return serviceChainKey(m[1]) ?? m[1];
}

/** A service port's chains' common key (`#` + the hash all four names end with), for KUBE-SVC/SVL/EXT/FW-*. */
export function serviceChainKey(chain: string): string | undefined {
  const m = SERVICE_CHAIN.exec(chain);
  return m ? `#${m[1]}` : undefined;
}

/** The first word of a rule's comment (canonical form): kproxy's comments start with the Service port's name. */
function commentOf(canon: string): string | undefined {
  return COMMENT.exec(canon)?.[1];
}

/** The Service ("ns/name") a comment's first word names ("ns/name:port" or "ns/name"), if it names one. */
function serviceOfComment(word: string | undefined): string | undefined {
  return word?.includes('/') ? word.replace(/:[^:/]*$/, '') : undefined;
}

/** Every chain's edits in one order, and the model the restores' positions are computed against. */
interface EditModel {
  edits: Edit[];
  /** per chain: which of its slots are present (see Edit.slot) */
  positions: Positions[];
  /** chains declared (not installed) in the first restore */
  declared: number[];
  /** per chain: each planned rule's canonical form, each installed rule's */
  wants: string[][];
  haves: string[][];
  /** per chain: how many rules it holds as the restores so far leave it */
  counts: number[];
  /** chains installed as planned */
  adopted: number;
}

/**
 * One chain's edits: one order over the installed and the planned rules, where before each
 * kept pair come the installed rules deleted since the previous one, then the planned rules
 * inserted. Returns the slots present before any edit.
 */
function chainEditOrder(ci: number, have: readonly string[], want: readonly string[], edits: Edit[]): { present: number[]; slots: number } {
  const { keptPlanned, match } = keptRules(have, want);
  let slot = 0;
  let i = 0;
  let from = 0;
  const present: number[] = [];
  for (let j = 0; j <= want.length; j++) {
    if (j < want.length && !keptPlanned[j]) continue;
    const upTo = j < want.length ? match[j] : have.length;
    for (; i < upTo; i++) {
      present.push(slot);
      edits.push({ chain: ci, insert: false, index: i, slot: slot++ });
    }
    for (let k = from; k < j; k++) edits.push({ chain: ci, insert: true, index: k, slot: slot++ });
    if (j < want.length) {
      present.push(slot++);
      i = upTo + 1;
    }
    from = j + 1;
  }
  return { present, slots: slot };
}

function editModel(chains: readonly DispatchChain[]): EditModel {
  const m: EditModel = { edits: [], positions: [], declared: [], wants: [], haves: [], counts: chains.map(() => 0), adopted: 0 };
  chains.forEach((c, ci) => {
    const want = c.rules.map(canonicalRule);
    const installed = c.installed?.canon && c.installed.lines ? c.installed.canon : undefined;
    const have = installed ?? [];
    m.wants.push(want);
    m.haves.push(have);
    if (installed && want.length === have.length && want.every((x, i) => x === have[i])) {
      m.adopted++;
      m.positions.push(new Positions(0));
      return;
    }
    if (!installed) m.declared.push(ci);
    const { present, slots } = chainEditOrder(ci, have, want, m.edits);
    const p = new Positions(slots);
    for (const s of present) p.add(s, 1);
    m.positions.push(p);
    m.counts[ci] = present.length;
  });
  return m;
}

/** What tells an installed rule's group: the groups of the planned rules by target and by comment, and a removed Service's chains. */
interface OwnerIndex {
  byTarget: Map<string, string | null>;
  byComment: Map<string, string | null>;
  /** "table chain" → the Service whose installed rules (by their comment) jump to it */
  installedTarget: Map<string, string | null>;
}

function ownerIndex(chains: readonly DispatchChain[], m: EditModel): OwnerIndex {
  const ix: OwnerIndex = { byTarget: new Map(), byComment: new Map(), installedTarget: new Map() };
  const note = (map: Map<string, string | null>, k: string | undefined, owner: string) => {
    if (k === undefined) return;
    const o = map.get(k);
    if (o === undefined) map.set(k, owner);
    else if (o !== owner) map.set(k, null); // two groups: tells nothing
  };
  chains.forEach((c, ci) => {
    m.wants[ci].forEach((w, j) => {
      const target = targetOf(w);
      if (target) note(ix.byTarget, `${c.table} ${target}`, c.owners[j]);
      const comment = commentOf(w);
      if (comment) note(ix.byComment, `${c.table} ${comment}`, c.owners[j]);
    });
    // A removed Service's rules: its chains named by the installed rules that carry its comment.
    for (const h of m.haves[ci]) {
      const t = targetOf(h);
      const svc = serviceOfComment(commentOf(h));
      if (t && svc) note(ix.installedTarget, `${c.table} ${t}`, svc);
    }
  });
  return ix;
}

/**
 * An installed rule's group: the planned rules' Service that jumps to the same chain; the
 * Service the comment names ("ns/name:port", planned or removed); the removed Service that
 * jumped to the same chain; a static rule's comment; else its target's own group. Undefined:
 * a rule that tells none of these.
 */
function installedOwner(canon: string, table: string, ix: OwnerIndex, chainOwners: ReadonlyMap<string, string>): string | undefined {
  const t = targetOf(canon);
  const c = commentOf(canon);
  let owner = t === undefined ? undefined : (chainOwners.get(t) ?? ix.byTarget.get(`${table} ${t}`) ?? undefined);
  owner ??= serviceOfComment(c);
  if (owner === undefined && t) owner = ix.installedTarget.get(`${table} ${t}`) ?? undefined;
  if (owner === undefined && c) owner = ix.byComment.get(`${table} ${c}`) ?? undefined;
  if (owner === undefined && t) owner = `~${t}`;
  return owner;
}

/** The edits in groups, in restore order: free deletions, Services by key, static. */
function orderedGroups(chains: readonly DispatchChain[], m: EditModel, chainOwners: ReadonlyMap<string, string>): Edit[][] {
  const ix = ownerIndex(chains, m);
  const groups = new Map<string, Edit[]>();
  const free: Edit[][] = [];
  for (const e of m.edits) {
    const c = chains[e.chain];
    const owner = e.insert ? c.owners[e.index] : installedOwner(m.haves[e.chain][e.index], c.table, ix, chainOwners);
    if (owner === undefined) {
      free.push([e]);
      continue;
    }
    let g = groups.get(owner);
    if (!g) groups.set(owner, (g = []));
    g.push(e);
  }
  const services = [...groups].filter(([k]) => k !== STATIC_GROUP).sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  return [...free, ...services.map(([, g]) => g), ...[...groups].filter(([k]) => k === STATIC_GROUP).map(([, g]) => g)];
}

/** Groups packed into restores of about `maxLines` lines (a group larger than that alone in one). */
function packGroups(groups: Edit[][], declared: number, maxLines: number): Edit[][] {
  const packed: Edit[][] = [];
  let cur: Edit[] = [];
  let size = declared;
  for (const g of groups) {
    if (maxLines > 0 && cur.length > 0 && size + g.length > maxLines) {
      packed.push(cur);
      cur = [];
      size = 0;
    }
    for (const e of g) cur.push(e);
    size += g.length;
  }
  if (cur.length || declared) packed.push(cur);
  return packed;
}

/** One restore's lines, against the model as the restores before it leave each chain. */
function writeRestore(chains: readonly DispatchChain[], m: EditModel, edits: Edit[], first: boolean, written: DispatchEdits['written']): DispatchChunk {
  const chunk: DispatchChunk = { filter: [], nat: [] };
  if (first) for (const ci of m.declared) chunk[chains[ci].table].push(`:${chains[ci].name} - [0:0]`);
  // per chain (in the given order): deletions from the end, then insertions from the start
  const perChain = new Map<number, Edit[]>();
  for (const e of edits) {
    let l = perChain.get(e.chain);
    if (!l) perChain.set(e.chain, (l = []));
    l.push(e);
  }
  for (const ci of [...perChain.keys()].sort((a, b) => a - b)) {
    const c = chains[ci];
    const pos = m.positions[ci];
    const lines = chunk[c.table];
    const es = perChain.get(ci)!;
    for (const e of es.filter((x) => !x.insert).sort((a, b) => b.slot - a.slot)) {
      lines.push(`-D ${c.name} ${pos.upTo(e.slot)}`);
      pos.add(e.slot, -1);
      m.counts[ci]--;
    }
    for (const e of es.filter((x) => x.insert).sort((a, b) => a.slot - b.slot)) {
      pos.add(e.slot, 1);
      const at = pos.upTo(e.slot);
      const r = c.rules[e.index];
      // After every rule the chain holds: an append (the planned `-A` line), which
      // iptables-nft sends without a position; `-I chain <count+1>` walks the chain's rules
      // twice in iptables-nft and once more in the kernel (nf_tables finds the rule it is
      // placed after by handle, from the chain's start).
      lines.push(++m.counts[ci] === at ? r : `-I ${c.name} ${at}${r.slice(r.indexOf(' ', 3))}`);
      written[c.table]++;
    }
  }
  return chunk;
}

/**
 * The edits that turn every chain of `chains` from its installed rules into its planned ones,
 * as restores of about `maxLines` lines each (a group larger than that alone in one), each
 * group's edits in one restore, groups in order: free deletions, Services by key, static.
 * An insertion after the chain's last rule is the planned `-A` line.
 * `chainOwners`: serviceChainKey of each planned service port's chains → its Service (a
 * Service's old rule that jumps to its chains is its, also when no planned rule does).
 */
export function chunkedDispatchEdits(chains: readonly DispatchChain[], maxLines: number, chainOwners: ReadonlyMap<string, string> = new Map()): DispatchEdits {
  const m = editModel(chains);
  const out: DispatchEdits = { chunks: [], written: { filter: 0, nat: 0 }, adopted: m.adopted };
  const packed = packGroups(orderedGroups(chains, m, chainOwners), m.declared.length, maxLines);
  packed.forEach((edits, n) => out.chunks.push(writeRestore(chains, m, edits, n === 0, out.written)));
  return out;
}
