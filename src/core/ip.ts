// IP and CIDR helpers. Pure: no I/O.
import { flat } from './flat.ts';
//
// Kubernetes accepts "sloppy" IPv4 forms in old objects (leading zeros such as
// "010.001.002.003", which Go's ParseIPSloppy reads as decimal). Everything that reaches a
// rule goes through canonicalIP first, so the same address always renders the same way.

// The address grammar of node:net's isIPv4/isIPv6 (lib/internal/net.js), here so that this
// module, and everything pure that imports it, stays free of node:net (test/layering.test.ts).
const V4_SEG = '(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])';
const V4_STR = `(?:${V4_SEG}\\.){3}${V4_SEG}`;
const V6_SEG = '(?:[0-9a-fA-F]{1,4})';
const IPV4_RE = new RegExp(`^${V4_STR}$`);
const IPV6_RE = new RegExp(
  '^(?:' +
    `(?:${V6_SEG}:){7}(?:${V6_SEG}|:)|` +
    `(?:${V6_SEG}:){6}(?:${V4_STR}|:${V6_SEG}|:)|` +
    `(?:${V6_SEG}:){5}(?::${V4_STR}|(?::${V6_SEG}){1,2}|:)|` +
    `(?:${V6_SEG}:){4}(?:(?::${V6_SEG}){0,1}:${V4_STR}|(?::${V6_SEG}){1,3}|:)|` +
    `(?:${V6_SEG}:){3}(?:(?::${V6_SEG}){0,2}:${V4_STR}|(?::${V6_SEG}){1,4}|:)|` +
    `(?:${V6_SEG}:){2}(?:(?::${V6_SEG}){0,3}:${V4_STR}|(?::${V6_SEG}){1,5}|:)|` +
    `(?:${V6_SEG}:){1}(?:(?::${V6_SEG}){0,4}:${V4_STR}|(?::${V6_SEG}){1,6}|:)|` +
    `(?::(?:(?::${V6_SEG}){0,5}:${V4_STR}|(?::${V6_SEG}){1,7}|:))` +
    ')(?:%[0-9a-zA-Z-.:]{1,})?$',
);

/** Whether text is a dotted-quad IPv4 address (node:net's isIPv4). */
export function isIPv4(s: string): boolean {
  return IPV4_RE.test(s);
}

/** Whether text is an IPv6 address, zone index allowed (node:net's isIPv6). */
export function isIPv6(s: string): boolean {
  return IPV6_RE.test(s);
}

export type IPFamily = 4 | 6;

/** Canonical text of an IP address, or null when it is not one. IPv4 leading zeros are decimal. */
export function canonicalIP(raw: string): string | null {
  if (typeof raw !== 'string') return null;
  const s = raw.trim();
  if (s === '') return null;
  if (/^[0-9.]+$/.test(s)) return canonicalIPv4(s);
  if (s.includes(':')) return canonicalIPv6(s);
  return null;
}

function canonicalIPv4(s: string): string | null {
  // node:net's grammar has no leading zeros: a match is already canonical.
  if (IPV4_RE.test(s)) return s;
  const parts = s.split('.');
  if (parts.length !== 4) return null;
  const out: number[] = [];
  for (const p of parts) {
    if (!/^[0-9]{1,3}$/.test(p)) return null;
    const n = parseInt(p, 10);
    if (n > 255) return null;
    out.push(n);
  }
  return out.join('.');
}

function canonicalIPv6(s: string): string | null {
  // node:net accepts a zone index ("fe80::1%eth0"); Go's ParseIP does not, and a zone must
  // never reach a rule.
  if (s.includes('%') || !isIPv6(s)) return null;
  const words = ipv6Words(s);
  if (!words) return null;
  // An IPv4-mapped address stays in dotted form, as Go prints it as plain IPv4.
  if (words.slice(0, 5).every((w) => w === 0) && words[5] === 0xffff) {
    return `${words[6] >> 8}.${words[6] & 255}.${words[7] >> 8}.${words[7] & 255}`;
  }
  return formatIPv6(words);
}

function ipv6Words(s: string): number[] | null {
  let text = s;
  const tail: number[] = [];
  const lastColon = text.lastIndexOf(':');
  const last = text.slice(lastColon + 1);
  if (last.includes('.')) {
    const v4 = canonicalIPv4(last);
    if (!v4) return null;
    const b = v4.split('.').map(Number);
    tail.push((b[0] << 8) | b[1], (b[2] << 8) | b[3]);
    text = text.slice(0, lastColon + 1) + '0';
    // '0' placeholder replaced below by dropping one word.
  }
  const halves = text.split('::');
  if (halves.length > 2) return null;
  const parse = (h: string) => (h === '' ? [] : h.split(':').map((w) => parseInt(w, 16)));
  const head = parse(halves[0]);
  let rest = halves.length === 2 ? parse(halves[1]) : [];
  if (tail.length) {
    if (halves.length === 2) rest = rest.slice(0, -1);
    else head.pop();
  }
  const total = 8 - tail.length;
  let words: number[];
  if (halves.length === 2) {
    const fill = total - head.length - rest.length;
    if (fill < 0) return null;
    words = [...head, ...new Array(fill).fill(0), ...rest];
  } else {
    words = head;
  }
  words = [...words, ...tail];
  if (words.length !== 8 || words.some((w) => !Number.isInteger(w) || w < 0 || w > 0xffff)) return null;
  return words;
}

function formatIPv6(words: number[]): string {
  // RFC 5952: compress the longest run (length >= 2) of zero words, first one on ties.
  let bestStart = -1;
  let bestLen = 0;
  for (let i = 0; i < 8; ) {
    if (words[i] !== 0) { i++; continue; }
    let j = i;
    while (j < 8 && words[j] === 0) j++;
    if (j - i > bestLen) { bestStart = i; bestLen = j - i; }
    i = j;
  }
  const hex = words.map((w) => w.toString(16));
  if (bestLen < 2) return hex.join(':');
  const left = hex.slice(0, bestStart).join(':');
  const right = hex.slice(bestStart + bestLen).join(':');
  return `${left}::${right}`;
}

export function ipFamily(ip: string): IPFamily | null {
  if (isIPv4(ip)) return 4;
  // No isIPv6 shortcut: an IPv4-mapped address ("::ffff:1.2.3.4") is IPv4, as canonicalIP
  // prints it and as upstream's utilnet.IsIPv6 says.
  const c = canonicalIP(ip);
  if (!c) return null;
  return isIPv4(c) ? 4 : 6;
}

export function ipToBigInt(ip: string): bigint {
  const c = canonicalIP(ip);
  if (!c) throw new Error(`not an IP address: ${ip}`);
  if (isIPv4(c)) return c.split('.').reduce((acc, o) => (acc << 8n) | BigInt(Number(o)), 0n);
  const words = ipv6Words(c)!;
  return words.reduce((acc, w) => (acc << 16n) | BigInt(w), 0n);
}

export function bigIntToIP(n: bigint, family: IPFamily): string {
  if (family === 4) {
    return [24n, 16n, 8n, 0n].map((s) => Number((n >> s) & 255n)).join('.');
  }
  const words: number[] = [];
  for (let i = 7; i >= 0; i--) words.push(Number((n >> BigInt(i * 16)) & 0xffffn));
  return formatIPv6(words);
}

export interface CIDR {
  /** network address, canonical */
  ip: string;
  prefix: number;
  family: IPFamily;
  /** canonical "ip/prefix" text of the network */
  text: string;
}

/** Parses "a.b.c.d/n" (or IPv6); the host bits are masked off. Null when invalid. */
export function parseCIDR(raw: string): CIDR | null {
  if (typeof raw !== 'string') return null;
  const s = raw.trim();
  const slash = s.indexOf('/');
  if (slash < 0) return null;
  const ip = canonicalIP(s.slice(0, slash));
  const prefixText = s.slice(slash + 1);
  if (!ip || !/^[0-9]{1,3}$/.test(prefixText)) return null;
  const family: IPFamily = isIPv4(ip) ? 4 : 6;
  const bits = family === 4 ? 32 : 128;
  const prefix = parseInt(prefixText, 10);
  if (prefix > bits) return null;
  const mask = prefix === 0 ? 0n : ((1n << BigInt(prefix)) - 1n) << BigInt(bits - prefix);
  const net = bigIntToIP(ipToBigInt(ip) & mask, family);
  return { ip: net, prefix, family, text: `${net}/${prefix}` };
}

export function cidrContains(cidr: CIDR | string, ip: string): boolean {
  const c = typeof cidr === 'string' ? parseCIDR(cidr) : cidr;
  const addr = canonicalIP(ip);
  if (!c || !addr) return false;
  const fam: IPFamily = isIPv4(addr) ? 4 : 6;
  if (fam !== c.family) return false;
  const bits = fam === 4 ? 32 : 128;
  const shift = BigInt(bits - c.prefix);
  return ipToBigInt(addr) >> shift === ipToBigInt(c.ip) >> shift;
}

/** "ip:port" for IPv4, "[ip]:port" for IPv6, as Go's net.JoinHostPort. */
export function joinHostPort(ip: string, port: number): string {
  return ip.includes(':') ? flat`[${ip}]:${port}` : flat`${ip}:${port}`;
}

export function isLoopback(ip: string): boolean {
  return cidrContains('127.0.0.0/8', ip) || canonicalIP(ip) === '::1';
}
