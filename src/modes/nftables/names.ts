// Object names in the kube-proxy nftables table, exactly as upstream builds them
// (pkg/proxy/nftables/proxier.go): "HASH-ns/name/proto/port" for service chains and
// "HASH-ns/name/proto/port__ip/port" for endpoint chains, where HASH is the first 8
// characters of base32(sha256(name)). The hash keeps truncated names unique and makes
// near-identical names easy to tell apart. Pure.
import { hash } from 'node:crypto';
import { sha256Base32Prefix } from '../../core/chain-hash.ts';
import type { ServicePort } from '../../core/model.ts';

/** nftables' limit on object names (knftables.NameLengthMax). */
export const NAME_LENGTH_MAX = 256;
const CHAIN_NAME_PREFIX_LENGTH_MAX = 16;
export const CHAIN_NAME_BASE_LENGTH_MAX = NAME_LENGTH_MAX - CHAIN_NAME_PREFIX_LENGTH_MAX;

export const TABLE = 'kube-proxy';

/** The table of shard n when the Services are spread over several tables: `kube-proxy-<n>`. */
export function shardTable(n: number): string {
  return `${TABLE}-${n}`;
}

/**
 * The shard (0..k-1) of a Service, `namespace/name`: the first 4 bytes of its sha256 mod k.
 * Stable: a Service never moves when others come and go (only when k changes).
 */
export function shardOf(serviceKey: string, k: number): number {
  if (k <= 1) return 0;
  return hash('sha256', serviceKey, 'buffer').readUInt32BE(0) % k;
}

/**
 * How many shard table names kproxy owns: `kube-proxy-0` .. `kube-proxy-63` (it writes at most
 * shards.ts maxTables ≤ this, 16 by default). Cleanup and the sharded proxier's scan for unused
 * tables probe exactly these names (nft.ts existingTables), because `nft list tables` reads
 * every table's whole content first (nft 1.0.6: 55 s at 10,000 Services in 16 tables).
 */
export const SHARD_TABLE_NAMES = 64;

/**
 * Whether a table (of family ip or ip6) is kube-proxy's: upstream's `kube-proxy`, or a shard's
 * `kube-proxy-<n>` (0 ≤ n < SHARD_TABLE_NAMES, decimal without leading zeros, as shardTable
 * writes it). Cleanup removes exactly these; any other name (`kube-proxy-x`, `kube-proxy-01`,
 * `kube-proxy-64`) is not ours.
 */
export function isKubeProxyTable(name: string): boolean {
  if (name === TABLE) return true;
  const m = /^kube-proxy-(0|[1-9][0-9]?)$/.exec(name);
  return m !== null && Number(m[1]) < SHARD_TABLE_NAMES;
}

/** Every table name isKubeProxyTable accepts: `kube-proxy`, then `kube-proxy-0` .. `kube-proxy-63`. */
export function kubeProxyTableNames(): string[] {
  return [TABLE, ...Array.from({ length: SHARD_TABLE_NAMES }, (_, i) => shardTable(i))];
}

/**
 * nft's limit on comments (NFTNL_UDATA_COMMENT_MAXLEN, knftables.CommentLengthMax): a longer
 * one makes nft refuse the whole transaction ("comment too long, 128 characters maximum
 * allowed"). A Service with a 63-character namespace and name and a 15-character port name
 * has a 143-character "ns/name:port" (kubernetes#139515).
 */
export const COMMENT_LENGTH_MAX = 128;

/**
 * A comment nft accepts: at most COMMENT_LENGTH_MAX bytes (cut deterministically, at a
 * character boundary, ending in "..." so a reader sees it was cut), and without the
 * characters that would end the quoted string or the line.
 */
export function nftComment(text: string): string {
  // eslint-disable-next-line no-control-regex
  let s = /["\\\x00-\x1f\x7f]/.test(text) ? text.replace(/["\\\x00-\x1f\x7f]/g, '_') : text;
  if (s.length <= COMMENT_LENGTH_MAX / 4 || Buffer.byteLength(s, 'utf8') <= COMMENT_LENGTH_MAX) return s;
  const room = COMMENT_LENGTH_MAX - 3;
  let bytes = 0;
  let cut = 0;
  for (const ch of s) {
    const n = Buffer.byteLength(ch, 'utf8');
    if (bytes + n > room) break;
    bytes += n;
    cut += ch.length;
  }
  s = s.slice(0, cut) + '...';
  return s;
}

export function hashAndTruncate(name: string): string {
  let out = `${sha256Base32Prefix(name, 8)}-${name}`;
  if (out.length > CHAIN_NAME_BASE_LENGTH_MAX) out = out.slice(0, CHAIN_NAME_BASE_LENGTH_MAX - 3) + '...';
  return out;
}

interface PortNameLike {
  namespace: string;
  name: string;
  port: string;
}

/** "HASH-ns/name/proto/port"; protocol lower case. */
export function servicePortChainNameBase(n: PortNameLike, protocol: string): string {
  return hashAndTruncate(`${n.namespace}/${n.name}/${protocol}/${n.port}`);
}

/** Splits "ip:port" / "[ip]:port" as Go's net.SplitHostPort. */
export function splitHostPort(endpoint: string): [string, string] {
  if (endpoint.startsWith('[')) {
    const end = endpoint.indexOf(']');
    return [endpoint.slice(1, end), endpoint.slice(end + 2)];
  }
  const i = endpoint.lastIndexOf(':');
  return [endpoint.slice(0, i), endpoint.slice(i + 1)];
}

/** "HASH-ns/name/proto/port__ip/port"; IPv6 colons become dots (not allowed in names). */
export function servicePortEndpointChainNameBase(n: PortNameLike, protocol: string, endpoint: string): string {
  const [ip, port] = splitHostPort(endpoint);
  const safeIP = ip.replaceAll(':', '.');
  return hashAndTruncate(`${n.namespace}/${n.name}/${protocol}/${n.port}__${safeIP}/${port}`);
}

export interface ServiceChainNames {
  readonly cluster: string;
  readonly local: string;
  readonly external: string;
  readonly firewall: string;
}

/**
 * A flat copy of a string built by concatenation. V8 keeps a template literal's result as a
 * tree of its pieces (32 bytes a node, 3 to 6 nodes a rule); hashing it as a Map key then adds
 * a flat copy beside the tree. Names kept between syncs, and the rules of a table a full sync
 * is writing, are flat: same text, about half the memory.
 */
export function flatString(s: string): string {
  // A JSON round trip always yields a fresh sequential string; in-place flattening (hashing,
  // charCodeAt) keeps the tree and adds the copy.
  return JSON.parse(JSON.stringify(s)) as string;
}

/** A port's chain names, each made on first use (most ports use two of the four). */
class LazyChainNames implements ServiceChainNames {
  private c?: string;
  private l?: string;
  private e?: string;
  private f?: string;
  constructor(private readonly base: string) {}
  get cluster(): string {
    return (this.c ??= flatString(`service-${this.base}`));
  }
  get local(): string {
    return (this.l ??= flatString(`local-${this.base}`));
  }
  get external(): string {
    return (this.e ??= flatString(`external-${this.base}`));
  }
  get firewall(): string {
    return (this.f ??= flatString(`firewall-${this.base}`));
  }
}

// Hashing (sha256 per name) dominated planning at scale, so names are cached per ServicePort
// object. The trackers replace a ServicePort whenever the Service changes, so an entry is
// never stale, and a WeakMap drops it with the object.
interface NameCacheEntry {
  names: ServiceChainNames;
  /** endpoint key → endpoint-... chain name */
  endpoints: Map<string, string>;
  /** endpoint key → affinity-... set name (created on first use: most ports have no affinity) */
  affinity?: Map<string, string>;
}
// Endpoint churn under a long-lived ServicePort must not grow its entry without bound.
const ENDPOINT_NAMES_MAX = 4096;
const nameCache = new WeakMap<ServicePort, NameCacheEntry>();

function cacheEntry(sp: ServicePort): NameCacheEntry {
  let e = nameCache.get(sp);
  if (!e) {
    e = { names: new LazyChainNames(flatString(servicePortChainNameBase(sp.portName, sp.protocol.toLowerCase()))), endpoints: new Map() };
    nameCache.set(sp, e);
  }
  return e;
}

export function serviceChainNames(sp: ServicePort): ServiceChainNames {
  return cacheEntry(sp).names;
}

function endpointBase(sp: ServicePort, endpointKey: string): string {
  return servicePortEndpointChainNameBase(sp.portName, sp.protocol.toLowerCase(), endpointKey);
}

export function endpointChainName(sp: ServicePort, endpointKey: string): string {
  const e = cacheEntry(sp);
  let n = e.endpoints.get(endpointKey);
  if (n === undefined) {
    if (e.endpoints.size >= ENDPOINT_NAMES_MAX) e.endpoints.clear();
    n = flatString(`endpoint-${endpointBase(sp, endpointKey)}`);
    e.endpoints.set(endpointKey, n);
  }
  return n;
}

export function affinitySetName(sp: ServicePort, endpointKey: string): string {
  const e = cacheEntry(sp);
  const affinity = (e.affinity ??= new Map());
  let n = affinity.get(endpointKey);
  if (n === undefined) {
    if (affinity.size >= ENDPOINT_NAMES_MAX) affinity.clear();
    n = flatString(`affinity-${endpointBase(sp, endpointKey)}`);
    affinity.set(endpointKey, n);
  }
  return n;
}

/** Service and endpoint chain names always contain "/", none of the fixed chains do. */
export function isServiceChainName(name: string): boolean {
  return name.includes('/');
}

export function isAffinitySetName(name: string): boolean {
  return name.startsWith('affinity-');
}
