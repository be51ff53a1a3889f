// The IPVS objects the planner wants and the parsers of what the kernel has, in ipvsadm's
// own text forms: rule lines (`ipvsadm -Sn`, fed back with `ipvsadm -R`) and the listing
// (`ipvsadm -Ln`, which adds the per-real-server connection counters graceful termination
// needs). Pure: no I/O.
import { canonicalIP, joinHostPort } from '../../core/ip.ts';
import type { Protocol } from '../../core/model.ts';

export interface VirtualServer {
  protocol: Protocol;
  /** canonical IP */
  address: string;
  port: number;
  scheduler: string;
  /** persistence timeout in seconds (sessionAffinity ClientIP); 0 = not persistent */
  persistence: number;
  /** scheduler flags (`-b`), sorted, e.g. ["mh-port"] */
  schedFlags: string[];
}

export type Forward = 'masq' | 'route' | 'tunnel' | 'local';

export interface RealServer {
  address: string;
  port: number;
  weight: number;
  forward: Forward;
  /** live counters (from `ipvsadm -Ln`), absent in plans and in `-Sn` text */
  activeConn?: number;
  inactConn?: number;
}

export interface VirtualServerState {
  vs: VirtualServer;
  /** by realServerKey */
  reals: Map<string, RealServer>;
}

/** by virtualServerKey */
export type IpvsTable = Map<string, VirtualServerState>;

/** upstream's VirtualServer.String(): "10.96.0.1:80/TCP" */
export function virtualServerKey(v: { address: string; port: number; protocol: Protocol }): string {
  return `${joinHostPort(v.address, v.port)}/${v.protocol}`;
}

export function realServerKey(r: { address: string; port: number }): string {
  return joinHostPort(r.address, r.port);
}

const PROTO_FLAG: Record<Protocol, string> = { TCP: '-t', UDP: '-u', SCTP: '--sctp-service' };
const FLAG_PROTO: Record<string, Protocol> = {
  '-t': 'TCP',
  '--tcp-service': 'TCP',
  '-u': 'UDP',
  '--udp-service': 'UDP',
  '--sctp-service': 'SCTP',
};
const FORWARD_FLAG: Record<Forward, string> = { masq: '-m', route: '-g', tunnel: '-i', local: '-m' };

export function serviceFlag(p: Protocol): string {
  return PROTO_FLAG[p];
}

function serviceArgs(v: { protocol: Protocol; address: string; port: number }): string {
  return `${PROTO_FLAG[v.protocol]} ${joinHostPort(v.address, v.port)}`;
}

/** the options of a virtual server after its address: "-s rr -b mh-port -p 10800" */
function vsOptions(vs: VirtualServer): string {
  let s = `-s ${vs.scheduler}`;
  if (vs.schedFlags.length) s += ` -b ${vs.schedFlags.join(',')}`;
  if (vs.persistence > 0) s += ` -p ${vs.persistence}`;
  return s;
}

/** `-A`/`-E` line for ipvsadm -R */
export function vsLine(op: '-A' | '-E', vs: VirtualServer): string {
  return `${op} ${serviceArgs(vs)} ${vsOptions(vs)}`;
}

export function vsDeleteLine(vs: VirtualServer): string {
  return `-D ${serviceArgs(vs)}`;
}

/** `-a`/`-e` line for ipvsadm -R */
export function rsLine(op: '-a' | '-e', vs: VirtualServer, rs: RealServer): string {
  return `${op} ${serviceArgs(vs)} -r ${realServerKey(rs)} ${FORWARD_FLAG[rs.forward]} -w ${rs.weight}`;
}

export function rsDeleteLine(vs: VirtualServer, rs: { address: string; port: number }): string {
  return `-d ${serviceArgs(vs)} -r ${realServerKey(rs)}`;
}

/** whether two virtual servers are configured alike (what `-E` would change) */
export function sameVirtualServer(a: VirtualServer, b: VirtualServer): boolean {
  return a.scheduler === b.scheduler && a.persistence === b.persistence && a.schedFlags.join(',') === b.schedFlags.join(',');
}

/** "10.0.0.1:80" or "[fd00::1]:80" → {address, port}; null when malformed */
export function splitHostPort(text: string): { address: string; port: number } | null {
  const m = /^\[([0-9a-fA-F:.]+)\]:(\d+)$/.exec(text) ?? /^([0-9.]+):(\d+)$/.exec(text);
  if (!m) return null;
  const address = canonicalIP(m[1]);
  const port = Number(m[2]);
  if (!address || port > 65535) return null;
  return { address, port };
}

/** every "[vs, rs-lines]" in the order of the table, as `ipvsadm -Sn` prints it */
export function formatTable(table: IpvsTable): string {
  const lines: string[] = [];
  for (const { vs, reals } of table.values()) {
    lines.push(vsLine('-A', vs));
    for (const rs of reals.values()) lines.push(rsLine('-a', vs, rs));
  }
  return lines.length ? lines.join('\n') + '\n' : '';
}

/**
 * Parses `ipvsadm -Sn` (rule format). Unknown options are skipped so a newer ipvsadm does
 * not break parsing; a line that names no service is ignored.
 */
export function parseRules(text: string): IpvsTable {
  const table: IpvsTable = new Map();
  for (const raw of text.split('\n')) {
    const words = raw.trim().split(/\s+/).filter(Boolean);
    if (words.length < 3) continue;
    const op = words[0];
    let protocol: Protocol | undefined;
    let hostPort: { address: string; port: number } | null = null;
    let scheduler = '';
    let persistence = 0;
    let schedFlags: string[] = [];
    let real: { address: string; port: number } | null = null;
    let weight = 1;
    let forward: Forward = 'route';
    for (let i = 1; i < words.length; i++) {
      const w = words[i];
      if (FLAG_PROTO[w]) {
        protocol = FLAG_PROTO[w];
        hostPort = splitHostPort(words[++i] ?? '');
      } else if (w === '-s') scheduler = words[++i] ?? '';
      else if (w === '-p') persistence = Number(words[++i] ?? 0);
      else if (w === '-b') schedFlags = (words[++i] ?? '').split(',').filter(Boolean).sort();
      else if (w === '-r') real = splitHostPort(words[++i] ?? '');
      else if (w === '-w') weight = Number(words[++i] ?? 1);
      else if (w === '-m') forward = 'masq';
      else if (w === '-g') forward = 'route';
      else if (w === '-i') forward = 'tunnel';
      else if (w === '-M' || w === '--pe' || w === '-x' || w === '-y' || w === '--tun-type' || w === '--tun-port') i++;
    }
    if (!protocol || !hostPort) continue;
    const key = virtualServerKey({ ...hostPort, protocol });
    if (op === '-A') {
      table.set(key, { vs: { protocol, ...hostPort, scheduler, persistence, schedFlags }, reals: new Map() });
    } else if (op === '-a' && real) {
      const entry = table.get(key);
      if (entry) entry.reals.set(realServerKey(real), { ...real, weight, forward });
    }
  }
  return table;
}

const LIST_FORWARD: Record<string, Forward> = { Masq: 'masq', Route: 'route', Tunnel: 'tunnel', Local: 'local' };
const LIST_PROTO: Record<string, Protocol> = { TCP: 'TCP', UDP: 'UDP', SCTP: 'SCTP' };

/**
 * Parses `ipvsadm -Ln`: the same table plus ActiveConn/InActConn per real server, which are
 * live counters (unlike `--stats`, which the kernel refreshes every 2 s).
 */
export function parseListing(text: string): IpvsTable {
  const table: IpvsTable = new Map();
  let current: VirtualServerState | undefined;
  for (const raw of text.split('\n')) {
    const words = raw.trim().split(/\s+/).filter(Boolean);
    if (words.length === 0) continue;
    const proto = LIST_PROTO[words[0]];
    if (proto && words.length >= 3) {
      const hp = splitHostPort(words[1]);
      current = undefined;
      if (!hp) continue;
      const pIdx = words.indexOf('persistent');
      const flagWord = words.find((w) => w.startsWith('(') && w.endsWith(')'));
      const vs: VirtualServer = {
        protocol: proto,
        ...hp,
        scheduler: words[2],
        persistence: pIdx >= 0 ? Number(words[pIdx + 1] ?? 0) : 0,
        schedFlags: flagWord ? flagWord.slice(1, -1).split(',').filter(Boolean).sort() : [],
      };
      current = { vs, reals: new Map() };
      table.set(virtualServerKey(vs), current);
    } else if (words[0] === '->' && current && words.length >= 6) {
      const hp = splitHostPort(words[1]);
      if (!hp) continue;
      current.reals.set(realServerKey(hp), {
        ...hp,
        forward: LIST_FORWARD[words[2]] ?? 'masq',
        weight: Number(words[3]),
        activeConn: Number(words[4]),
        inactConn: Number(words[5]),
      });
    }
  }
  return table;
}

/**
 * The table after `ipvsadm -R` applied `lines` to it (a line that could not apply is left
 * out, as the kernel refuses it). Copy-on-write: states of `table` are never changed, a
 * changed virtual server gets a new state, so plan states can be shared.
 */
export function applyLines(table: IpvsTable, lines: string[]): void {
  for (const line of lines) {
    const w = line.trim().split(/\s+/);
    const op = w[0];
    const parsed = parseRules(`-A ${w.slice(1).join(' ')}`);
    const [key, st] = [...parsed][0] ?? [];
    if (!key || !st) continue;
    const cur = table.get(key);
    if (op === '-A' || op === '-E') {
      if ((op === '-A') === (cur !== undefined)) continue;
      table.set(key, { vs: st.vs, reals: cur?.reals ?? new Map() });
    } else if (op === '-D') {
      table.delete(key);
    } else if (cur && (op === '-a' || op === '-e' || op === '-d')) {
      const ri = w.indexOf('-r');
      const rhp = splitHostPort(w[ri + 1] ?? '');
      if (ri < 0 || !rhp) continue;
      const rk = realServerKey(rhp);
      const reals = new Map(cur.reals);
      if (op === '-d') reals.delete(rk);
      else {
        const rs = parseRules(`-A ${w[1]} ${w[2]} -s rr\n-a ${w.slice(1).join(' ')}`).get(key)?.reals.get(rk);
        if (!rs || (op === '-a') === reals.has(rk)) continue;
        reals.set(rk, rs);
      }
      table.set(key, { vs: cur.vs, reals });
    }
  }
}
