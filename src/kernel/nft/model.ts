// nftables objects (knftables' model) and the typed transaction: a list of operations, each
// one object (table, chain, rule, set or map, elements) added, created, flushed or deleted,
// with the Service port that owns it. renderOps is the one place that writes `nft -f` text;
// every operation is one line, so nft's "line N" names operation N-1 (opAtLine). Pure.

export type NftFamily = 'ip' | 'ip6';

export interface NftRule {
  /** rule text without the trailing comment */
  rule: string;
  comment?: string;
}

export interface NftChain {
  name: string;
  /** base chains only */
  type?: 'filter' | 'nat';
  hook?: 'prerouting' | 'input' | 'forward' | 'output' | 'postrouting';
  priority?: number;
  comment?: string;
  rules: NftRule[];
}

export interface NftElement {
  key: string[];
  /** verdict (maps only), e.g. ["goto", "service-..."] rendered joined by " " */
  value?: string;
  comment?: string;
}

export interface NftSet {
  kind: 'set' | 'map';
  name: string;
  /** "ipv4_addr" or "ipv4_addr . inet_proto . inet_service : verdict" */
  type: string;
  flags?: string[];
  timeoutSeconds?: number;
  comment?: string;
  /** by elementKey(key) */
  elements: Map<string, NftElement>;
}

/** A table an operation acts in (one object per table, shared by its operations). */
export interface NftTableRef {
  family: NftFamily;
  table: string;
}

export type NftVerb = 'add' | 'create' | 'flush' | 'delete';

/**
 * The object of one operation. `spec` is the object's declaration, written with an `add`:
 * a chain's type, hook, priority and comment (with `rules`, its rules too, as a body), a
 * set's type, flags, timeout and comment. Elements with a `spec` are written as a
 * re-declaration of their set with an `elements` body (see renderOp).
 */
export type NftTarget =
  | { kind: 'table'; comment?: string }
  | { kind: 'chain'; name: string; spec?: NftChain; rules?: boolean }
  | { kind: 'rule'; chain: string; rule: NftRule }
  | { kind: 'set'; setKind: 'set' | 'map'; name: string; spec?: NftSet }
  | { kind: 'element'; set: string; elements: NftElement[]; spec?: NftSet };

export type NftOp = NftTarget & {
  verb: NftVerb;
  in: NftTableRef;
  /** the service port key whose plan wrote the object; absent for the table's fixed part */
  owner?: string;
};

export function elementKey(key: string[]): string {
  return key.join(' . ');
}

function quote(s: string): string {
  return `"${s}"`;
}

export function ruleText(r: NftRule): string {
  return r.comment === undefined ? r.rule : `${r.rule} comment ${quote(r.comment)}`;
}

/** The declaration parts of a chain body: `type ... hook ... priority N ;` and `comment "..." ;`. */
function chainSpecParts(ch: NftChain): string[] {
  const parts: string[] = [];
  if (ch.type && ch.hook !== undefined) parts.push(`type ${ch.type} hook ${ch.hook} priority ${ch.priority ?? 0} ;`);
  if (ch.comment !== undefined) parts.push(`comment ${quote(ch.comment)} ;`);
  return parts;
}

function setSpecParts(s: NftSet): string[] {
  const parts = [`type ${s.type} ;`];
  if (s.flags?.length) parts.push(`flags ${s.flags.join(',')} ;`);
  if (s.timeoutSeconds !== undefined) parts.push(`timeout ${s.timeoutSeconds}s ;`);
  if (s.comment !== undefined) parts.push(`comment ${quote(s.comment)} ;`);
  return parts;
}

/** One element as a set body lists it: `KEY [comment "..."] [: VERDICT]`. */
export function elementBodyText(el: NftElement): string {
  let t = el.key.join(' . ');
  if (el.comment !== undefined) t += ` comment ${quote(el.comment)}`;
  if (el.value !== undefined) t += ` : ${el.value}`;
  return t;
}

function body(parts: string[]): string {
  return parts.length ? ` { ${parts.join(' ')} }` : '';
}

/**
 * One operation as one `nft -f` line. The forms nft 1.0.6 runs without listing every chain
 * of every table first (src/cache.c: an `add rule` or `add element` needs NFT_CACHE_CHAIN,
 * 60,000 chains at 10,000 Services; an `add chain`/`add set`/`add map` only the table list):
 * a chain's rules as `add chain T NAME { RULE ; ... }` (on an existing chain the rules are
 * appended, as `add rule` would), elements as `add map T NAME { type ... ; elements = { E1 ,
 * E2 } ; }` (the kernel accepts a re-declaration whose type and flags match the live set, and
 * adds the elements).
 */
export function renderOp(op: NftOp): string {
  const head = `${op.verb} ${op.kind === 'set' ? op.setKind : op.kind} ${op.in.family} ${op.in.table}`;
  const declare = op.verb === 'add' || op.verb === 'create';
  switch (op.kind) {
    case 'table':
      return declare && op.comment !== undefined ? `${head} { comment ${quote(op.comment)} ; }` : head;
    case 'chain': {
      if (!declare || !op.spec) return `${head} ${op.name}`;
      const parts = chainSpecParts(op.spec);
      if (op.rules) for (const r of op.spec.rules) parts.push(`${ruleText(r)} ;`);
      return `${head} ${op.name}${body(parts)}`;
    }
    case 'rule':
      return `${head} ${op.chain} ${ruleText(op.rule)}`;
    case 'set':
      return declare && op.spec ? `${head} ${op.name}${body(setSpecParts(op.spec))}` : `${head} ${op.name}`;
    case 'element':
      return elementLine(op);
  }
}

function elementLine(op: NftOp & { kind: 'element' }): string {
  const t = `${op.in.family} ${op.in.table}`;
  if (op.verb === 'delete') return `delete element ${t} ${op.set} { ${op.elements.map((e) => elementKey(e.key)).join(' , ')} }`;
  const els = op.elements.map(elementBodyText).join(' , ');
  if (!op.spec) return `${op.verb} element ${t} ${op.set} { ${els} }`;
  const parts = setSpecParts(op.spec);
  return `add ${op.spec.kind} ${t} ${op.set} { ${parts.join(' ')} elements = { ${els} } ; }`;
}

/** A transaction's `nft -f` text: one line per operation, in order. */
export function renderOps(ops: readonly NftOp[]): string {
  // One join writes one sequential string: `text +=` would build a tree of 2 nodes a line,
  // which the writer to nft then flattens.
  const lines = new Array<string>(ops.length + 1);
  for (let i = 0; i < ops.length; i++) lines[i] = renderOp(ops[i]);
  lines[ops.length] = '';
  return ops.length ? lines.join('\n') : '';
}

/** The operation nft's error names by line number (1-based) in renderOps(ops)'s text. */
export function opAtLine(ops: readonly NftOp[], line: number): NftOp | undefined {
  return line >= 1 ? ops[line - 1] : undefined;
}
