// ipset objects of the ipvs mode in `ipset save`/`ipset restore` text, and the difference
// between two states as a restore script (create -exist, add/del only what differs, never a
// flush). Pure: no I/O.
import { canonicalIP, ipFamily, parseCIDR } from '../../core/ip.ts';

/** The set types kube-proxy's ipvs mode uses. */
export type IPSetType = 'hash:ip' | 'hash:ip,port' | 'hash:ip,port,ip' | 'hash:ip,port,net' | 'bitmap:port';

export interface IPSetState {
  name: string;
  type: IPSetType;
  family: 4 | 6;
  comment: string;
  /** normalised entry texts */
  entries: Set<string>;
}

/** by kernel set name */
export type IPSetTable = Map<string, IPSetState>;

/**
 * One canonical text per entry so that desired and listed entries compare equal: canonical
 * IPs, lower-case protocol, and no "/32" or "/128" on a host net (ipset prints hosts bare).
 */
export function normalizeEntry(text: string): string {
  return text
    .trim()
    .split(',')
    .map((part) => {
      const pp = /^([a-zA-Z]+):(\d+)$/.exec(part);
      if (pp) return `${pp[1].toLowerCase()}:${Number(pp[2])}`;
      if (part.includes('/')) {
        const c = parseCIDR(part);
        if (!c) return part;
        return (c.family === 4 && c.prefix === 32) || (c.family === 6 && c.prefix === 128) ? c.ip : c.text;
      }
      return canonicalIP(part) ?? part;
    })
    .join(',');
}

const UNSPECIFIED = new Set(['0.0.0.0', '::']);
const PORT_PART = /^(tcp|udp|sctp):(\d+)$/;

function portOK(text: string): boolean {
  const n = Number(text);
  return /^\d+$/.test(text) && n >= 0 && n <= 65535;
}

/**
 * Why the kernel would refuse `entry` in a set of `type` and `family`, or null when it takes
 * it. Each reason was checked against the real `ipset` (v7.17, kernel 6.x): hash:ip and
 * hash:ip,port refuse the unspecified address (0.0.0.0 / ::) as their first part,
 * hash:ip,port,net refuses a /0 net ("The value of the CIDR parameter of the IP address is
 * invalid"), every IP must be of the set's family, ports must be 0-65535. `ipset restore`
 * stops at the first refused line, so a planner leaves such entries out and reports them.
 */
export function entryRefusal(type: IPSetType, family: 4 | 6, entry: string): string | null {
  const parts = entry.split(',');
  const ipOK = (text: string | undefined): string | null => {
    const ip = text === undefined ? null : canonicalIP(text);
    if (!ip) return `${JSON.stringify(text ?? '')} is not an IP address`;
    if (ipFamily(ip) !== family) return `${ip} is not an IPv${family} address (set family inet${family === 6 ? '6' : ''})`;
    return null;
  };
  const firstIP = (): string | null => {
    const bad = ipOK(parts[0]);
    if (bad) return bad;
    return UNSPECIFIED.has(canonicalIP(parts[0])!) ? `the unspecified address ${parts[0]} cannot be stored in ${type}` : null;
  };
  const proto = (text: string | undefined): string | null => {
    const m = PORT_PART.exec(text ?? '');
    return m && portOK(m[2]) ? null : `${JSON.stringify(text ?? '')} is not proto:port with a port 0-65535`;
  };
  switch (type) {
    case 'bitmap:port':
      return parts.length === 1 && portOK(parts[0]) ? null : `${JSON.stringify(entry)} is not a port 0-65535`;
    case 'hash:ip':
      return parts.length === 1 ? firstIP() : `${JSON.stringify(entry)} is not one IP`;
    case 'hash:ip,port':
      if (parts.length !== 2) return `${JSON.stringify(entry)} is not ip,proto:port`;
      return firstIP() ?? proto(parts[1]);
    case 'hash:ip,port,ip':
      if (parts.length !== 3) return `${JSON.stringify(entry)} is not ip,proto:port,ip`;
      return ipOK(parts[0]) ?? proto(parts[1]) ?? ipOK(parts[2]);
    case 'hash:ip,port,net': {
      if (parts.length !== 3) return `${JSON.stringify(entry)} is not ip,proto:port,net`;
      const head = ipOK(parts[0]) ?? proto(parts[1]);
      if (head) return head;
      if (!parts[2].includes('/')) return ipOK(parts[2]);
      const c = parseCIDR(parts[2]);
      if (!c) return `${JSON.stringify(parts[2])} is not a CIDR`;
      if (c.family !== family) return `${c.text} is not an IPv${family} network`;
      return c.prefix === 0 ? `a /0 net (${c.text}) cannot be stored in ${type}` : null;
    }
  }
  return null;
}

/** `create` line as upstream's CreateSet, idempotent with -exist */
export function createLine(s: Pick<IPSetState, 'name' | 'type' | 'family'>): string {
  if (s.type === 'bitmap:port') return `create ${s.name} bitmap:port range 0-65535 comment -exist`;
  return `create ${s.name} ${s.type} family ${s.family === 6 ? 'inet6' : 'inet'} hashsize 1024 maxelem 65536 comment -exist`;
}

/** Parses `ipset save` output (all sets, or one). Unknown set types are kept as listed. */
export function parseSave(text: string): IPSetTable {
  const table: IPSetTable = new Map();
  for (const raw of text.split('\n')) {
    const w = raw.trim().split(/\s+/);
    if (w[0] === 'create' && w.length >= 3) {
      const fi = w.indexOf('family');
      table.set(w[1], {
        name: w[1],
        type: w[2] as IPSetType,
        family: fi >= 0 && w[fi + 1] === 'inet6' ? 6 : 4,
        comment: '',
        entries: new Set(),
      });
    } else if (w[0] === 'add' && w.length >= 3) {
      table.get(w[1])?.entries.add(normalizeEntry(w[2]));
    }
  }
  return table;
}

export interface IPSetDiff {
  /** `ipset restore` script; empty when nothing differs */
  script: string;
  added: number;
  deleted: number;
  created: number;
}

/**
 * The restore script from `current` to `desired`: creates missing sets, adds missing
 * entries, deletes surplus entries. Sets not in `desired` are left alone (cleanup destroys
 * them once no iptables rule references them).
 */
export function diffIPSets(desired: IPSetTable, current: IPSetTable): IPSetDiff {
  const lines: string[] = [];
  let added = 0;
  let deleted = 0;
  let created = 0;
  for (const set of desired.values()) {
    const have = current.get(set.name);
    if (!have) {
      lines.push(createLine(set));
      created++;
    }
    const haveEntries = have?.entries ?? new Set<string>();
    for (const e of [...haveEntries].sort()) {
      if (!set.entries.has(e)) {
        lines.push(`del ${set.name} ${e} -exist`);
        deleted++;
      }
    }
    for (const e of [...set.entries].sort()) {
      if (!haveEntries.has(e)) {
        lines.push(`add ${set.name} ${e} -exist`);
        added++;
      }
    }
  }
  return { script: lines.length ? lines.join('\n') + '\n' : '', added, deleted, created };
}

/** the whole desired state as a restore script (render / dry run) */
export function formatIPSets(desired: IPSetTable): string {
  return diffIPSets(desired, new Map()).script;
}

/**
 * The answers of `ipset -` (interactive mode) to one `test SET ENTRY` line each, in order: on
 * stderr, "Warning: ENTRY is in set SET." for a member, "ENTRY is NOT in set SET." for a
 * non-member, one "ipset vX: <error>" line for a set that does not exist (no member). Null
 * when the text does not hold one answer per question (the caller cannot trust any of them).
 */
export function parseTestAnswers(stderr: string, questions: Array<{ set: string }>): boolean[] | null {
  const lines = stderr.split('\n').map((l) => l.trim()).filter(Boolean);
  if (lines.length !== questions.length) return null;
  const out: boolean[] = [];
  for (const [i, line] of lines.entries()) {
    const set = questions[i].set;
    if (line.startsWith('Warning: ') && line.endsWith(` is in set ${set}.`)) out.push(true);
    else if (line.endsWith(` is NOT in set ${set}.`)) out.push(false);
    else if (/The set with the given name does not exist/.test(line)) out.push(false);
    else return null;
  }
  return out;
}
