// Normalising iptables-restore text the way upstream's tests do (sortIPTablesRules in
// pkg/proxy/iptables/proxier_test.go), so emission order does not matter when comparing:
// tables by name; chains KUBE-NODEPORTS, KUBE-SERVICES, other KUBE-* alphabetically, then
// the rest; each chain's rules in their relative order; KUBE-NODEPORTS and KUBE-SERVICES
// rules stably sorted by the service name in their comment (nat KUBE-SERVICES' "must be
// the last rule" stays last); then -X lines. Pure.
import { forEachSaveLine } from '../../kernel/iptables/save.ts';

interface Chain {
  name: string;
  declared: boolean;
  rules: string[];
  deleted: boolean;
}

interface Table {
  name: string;
  chains: Map<string, Chain>;
}

function chainOf(t: Table, name: string): Chain {
  let c = t.chains.get(name);
  if (!c) t.chains.set(name, (c = { name, declared: false, rules: [], deleted: false }));
  return c;
}

export function parseRestoreText(text: string): Table[] {
  const tables: Table[] = [];
  let cur: Table | null = null;
  forEachSaveLine(text, (l) => {
    if (l.kind === 'table') {
      cur = { name: l.name, chains: new Map() };
      tables.push(cur);
    } else if (l.kind === 'commit') {
      cur = null;
    } else if (cur && l.kind === 'chain') {
      chainOf(cur, l.name).declared = true;
    } else if (cur && l.kind === 'command' && (l.line.startsWith('-A ') || l.line.startsWith('-I '))) {
      chainOf(cur, l.line.split(/\s+/)[1]).rules.push(l.line);
    } else if (cur && l.kind === 'command' && l.line.startsWith('-X ')) {
      chainOf(cur, l.line.split(/\s+/)[1]).deleted = true;
    } else {
      throw new Error(`unexpected iptables-restore line: ${l.line}`);
    }
  });
  return tables;
}

/** The comment of a rule (quoted or a single word), or null. */
export function ruleComment(rule: string): string | null {
  const m = /--comment (?:"((?:[^"\\]|\\.)*)"|(\S+))/.exec(rule);
  if (!m) return null;
  return m[1] ?? m[2];
}

function serviceNameOf(comment: string): string {
  const i = comment.search(/[ :]/);
  return i === -1 ? comment : comment.slice(0, i);
}

function byCommentServiceName(a: string, b: string): number {
  const ca = ruleComment(a);
  const cb = ruleComment(b);
  if (ca === null || cb === null) return 0;
  const na = serviceNameOf(ca);
  const nb = serviceNameOf(cb);
  return na < nb ? -1 : na > nb ? 1 : 0;
}

function chainRank(name: string): [number, string] {
  if (name === 'KUBE-NODEPORTS') return [0, ''];
  if (name === 'KUBE-SERVICES') return [1, ''];
  return [name.startsWith('KUBE-') ? 2 : 3, name];
}

export function normalizeRestoreText(text: string): string {
  const tables = parseRestoreText(text).sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const out: string[] = [];
  for (const t of tables) {
    const chains = [...t.chains.values()].sort((a, b) => {
      const [ra, na] = chainRank(a.name);
      const [rb, nb] = chainRank(b.name);
      return ra - rb || (na < nb ? -1 : na > nb ? 1 : 0);
    });
    for (const c of chains) {
      if (c.name === 'KUBE-NODEPORTS' || (c.name === 'KUBE-SERVICES' && t.name !== 'nat')) c.rules.sort(byCommentServiceName);
      if (c.name === 'KUBE-SERVICES' && t.name === 'nat') {
        const isLast = (r: string) => (ruleComment(r) ?? '').includes('must be the last rule');
        c.rules.sort((a, b) => {
          const la = isLast(a);
          const lb = isLast(b);
          if (la !== lb) return la ? 1 : -1;
          return byCommentServiceName(a, b);
        });
      }
    }
    out.push(`*${t.name}`);
    for (const c of chains) if (c.declared) out.push(`:${c.name} - [0:0]`);
    for (const c of chains) out.push(...c.rules);
    for (const c of chains) if (c.deleted) out.push(`-X ${c.name}`);
    out.push('COMMIT');
  }
  return out.join('\n') + '\n';
}

const BUILTIN_TARGETS = new Set([
  'ACCEPT', 'DROP', 'REJECT', 'RETURN', 'DNAT', 'SNAT', 'MASQUERADE', 'MARK', 'REDIRECT', 'LOG', 'CONNMARK', 'NOTRACK', 'CT',
]);

/** Jumps to chains the payload does not declare (upstream's checkIPTablesRuleJumps), as messages. */
export function undeclaredJumps(text: string): string[] {
  const problems: string[] = [];
  for (const t of parseRestoreText(text)) {
    for (const c of t.chains.values()) {
      if (!c.declared && c.rules.length) problems.push(`${t.name}: rules appended to undeclared chain ${c.name}`);
      for (const r of c.rules) {
        const m = / -j (\S+)/.exec(r);
        if (!m || BUILTIN_TARGETS.has(m[1])) continue;
        const target = t.chains.get(m[1]);
        if (!target?.declared) problems.push(`${t.name}: jump to undeclared chain ${m[1]}: ${r}`);
      }
    }
  }
  return problems;
}

/** A short, readable difference between two normalised texts (empty when equal). */
export function diffLines(expected: string, actual: string, max = 40): string {
  if (expected === actual) return '';
  const e = expected.split('\n');
  const a = actual.split('\n');
  const count = (lines: string[]) => {
    const m = new Map<string, number>();
    for (const l of lines) m.set(l, (m.get(l) ?? 0) + 1);
    return m;
  };
  const ce = count(e);
  const ca = count(a);
  const out: string[] = [];
  for (const l of e) {
    const n = ca.get(l) ?? 0;
    if (n > 0) ca.set(l, n - 1);
    else out.push(`- ${l}`);
  }
  for (const l of a) {
    const n = ce.get(l) ?? 0;
    if (n > 0) ce.set(l, n - 1);
    else out.push(`+ ${l}`);
  }
  if (out.length === 0) {
    const i = e.findIndex((l, k) => l !== a[k]);
    out.push(`same lines, different order; first difference at line ${i + 1}:`, `- ${e[i]}`, `+ ${a[i]}`);
  }
  return out.slice(0, max).join('\n') + (out.length > max ? `\n... ${out.length - max} more` : '');
}
