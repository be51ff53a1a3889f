// KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1): decode, default, validate.
//
// As upstream kube-proxy (cmd/kube-proxy/app/options.go loadConfig, pkg/proxy/apis/config/
// v1alpha1/defaults.go, server_linux.go platformApplyDefaults, pkg/proxy/apis/config/
// validation/validation.go):
// - decoding is lenient: an unknown field (at any depth) is a warning naming its path, not an
//   error (upstream falls back to its lenient decoder and logs "Using lenient decoding");
// - a value of the wrong type (a string where a number goes) is an error, as Go's decoder's;
// - defaults are upstream's, applied to zero values (kubeadm writes "0s" and null everywhere);
// - validation errors name the field and the value, and nothing touches the host before.
// A field that exists upstream but does nothing here (winkernel, a protobuf content type,
// profiling, ...) gets a one-line warning. Pure: planners import the types and defaults.
import { KNOWN_FEATURE_GATES, KUBE_PROXY_GATES } from './feature-gates.ts';
import { parse as parseYAML } from 'yaml';
import { parseCIDR, canonicalIP, isIPv4 } from '../core/ip.ts';
import { KproxyError } from '../errors.ts';

export const MODES = ['userspace', 'iptables', 'ipvs', 'nftables'] as const;
export type ModeName = (typeof MODES)[number];
export const IPVS_SCHEDULERS = ['rr', 'wrr', 'lc', 'wlc', 'lblc', 'lblcr', 'sh', 'dh', 'sed', 'nq', 'mh'] as const;
export const API_VERSION = 'kubeproxy.config.k8s.io/v1alpha1';
export const KIND = 'KubeProxyConfiguration';
/** The kube-proxy release whose command line and configuration kproxy follows. */
export const KUBE_PROXY_COMPAT = 'v1.34';
/** upstream's ValidateShowHiddenMetricsVersion: only the previous minor version is allowed */
const PREVIOUS_MINOR = '1.33';

export class ConfigError extends KproxyError {
  declare readonly code: 'KPROXY_CONFIG_INVALID';
  constructor(readonly field: string, message: string) {
    super('KPROXY_CONFIG_INVALID', `${field}: ${message}`);
  }
}

/** Receives one line per warning (an unknown field, a field that does not apply here). */
export type ConfigWarn = (warning: string) => void;

/**
 * Go duration text ("1m30s", "250ms", "-1.5h", "0") → milliseconds, as time.ParseDuration.
 * A number is taken as milliseconds (kproxy's own callers); null when invalid.
 */
export function parseDuration(text: string | number): number | null {
  if (typeof text === 'number') return Number.isFinite(text) ? text : null;
  let s = String(text).trim();
  let sign = 1;
  if (s.startsWith('-') || s.startsWith('+')) {
    if (s[0] === '-') sign = -1;
    s = s.slice(1);
  }
  if (s === '0') return 0;
  if (s.length === 0) return null;
  const re = /(\d+(?:\.\d*)?|\.\d+)(h|ms|m|s|us|µs|μs|ns)/gy;
  const unit: Record<string, number> = { h: 3600e3, m: 60e3, s: 1e3, ms: 1, us: 1e-3, 'µs': 1e-3, 'μs': 1e-3, ns: 1e-6 };
  let total = 0;
  let consumed = 0;
  let m: RegExpExecArray | null;
  while ((m = re.exec(s))) {
    total += parseFloat(m[1]) * unit[m[2]];
    consumed = re.lastIndex;
  }
  if (consumed !== s.length) return null;
  return sign * total + 0; // + 0: no -0
}

/** milliseconds → Go's time.Duration.String() ("30s", "1m30s", "24h0m0s", "250ms", "0s"). */
export function formatDuration(ms: number): string {
  if (ms === 0) return '0s';
  const neg = ms < 0;
  let ns = Math.round(Math.abs(ms) * 1e6);
  let out: string;
  if (ns < 1e9) {
    const trim = (v: number) => String(Number(v.toFixed(6)));
    out = ns < 1e3 ? `${ns}ns` : ns < 1e6 ? `${trim(ns / 1e3)}µs` : `${trim(ns / 1e6)}ms`;
  } else {
    const h = Math.floor(ns / 3600e9);
    ns -= h * 3600e9;
    const m = Math.floor(ns / 60e9);
    ns -= m * 60e9;
    const s = String(Number((ns / 1e9).toFixed(9)));
    out = h > 0 ? `${h}h${m}m${s}s` : m > 0 ? `${m}m${s}s` : `${s}s`;
  }
  return neg ? `-${out}` : out;
}

// ---- decoding: the v1alpha1 fields and their Go types ----

export type Kind = 'string' | 'bool' | 'int32' | 'float' | 'duration' | 'strings' | 'boolMap' | 'flushFrequency' | 'any' | Spec;
export interface Spec {
  [field: string]: Kind;
}

/** Every field the decoder reads, with its Go type (docs/configuration.md lists them: src/config/fields.ts). */
export const SPEC: Spec = {
  apiVersion: 'string',
  kind: 'string',
  featureGates: 'boolMap',
  clientConnection: { kubeconfig: 'string', acceptContentTypes: 'string', contentType: 'string', qps: 'float', burst: 'int32' },
  logging: { format: 'string', flushFrequency: 'flushFrequency', verbosity: 'int32', vmodule: 'any', options: 'any' },
  hostnameOverride: 'string',
  bindAddress: 'string',
  healthzBindAddress: 'string',
  metricsBindAddress: 'string',
  bindAddressHardFail: 'bool',
  enableProfiling: 'bool',
  showHiddenMetricsForVersion: 'string',
  mode: 'string',
  iptables: { masqueradeBit: 'int32', masqueradeAll: 'bool', localhostNodePorts: 'bool', snatNodeInternalIP: 'bool', syncPeriod: 'duration', minSyncPeriod: 'duration' },
  ipvs: {
    syncPeriod: 'duration',
    minSyncPeriod: 'duration',
    scheduler: 'string',
    excludeCIDRs: 'strings',
    strictARP: 'bool',
    tcpTimeout: 'duration',
    tcpFinTimeout: 'duration',
    udpTimeout: 'duration',
  },
  // tables (kproxy): "auto" or a number, checked by nftablesTables
  nftables: { masqueradeBit: 'int32', masqueradeAll: 'bool', syncPeriod: 'duration', minSyncPeriod: 'duration', tables: 'any' },
  winkernel: { networkName: 'string', sourceVip: 'string', enableDSR: 'bool', rootHnsEndpointName: 'string', forwardHealthCheckVip: 'bool' },
  detectLocalMode: 'string',
  detectLocal: { bridgeInterface: 'string', interfaceNamePrefix: 'string' },
  clusterCIDR: 'string',
  nodePortAddresses: 'strings',
  oomScoreAdj: 'int32',
  conntrack: {
    maxPerCore: 'int32',
    min: 'int32',
    tcpEstablishedTimeout: 'duration',
    tcpCloseWaitTimeout: 'duration',
    tcpBeLiberal: 'bool',
    udpTimeout: 'duration',
    udpStreamTimeout: 'duration',
  },
  configSyncPeriod: 'duration',
  portRange: 'string',
  windowsRunAsService: 'bool',
  // v1alpha1 up to kube-proxy v1.28 (the userspace mode's UDP idle timeout); kproxy's userspace mode honours it
  udpIdleTimeout: 'duration',
  // kproxy: top-level periods (v1alpha2's shape) win over the mode's section
  syncPeriod: 'duration',
  minSyncPeriod: 'duration',
  // kproxy: the userspace mode's own settings
  userspace: { workers: 'int32', maxConnections: 'int32', idleTimeout: 'duration', udpMaxSessions: 'int32', udpMaxSessionsPerClient: 'int32', tcpPath: 'string' },
};

type Duration = string;
/** The v1alpha1 document as decoded (only known fields, nulls dropped). */
export interface RawConfig {
  apiVersion?: string;
  kind?: string;
  featureGates?: Record<string, boolean>;
  clientConnection?: { kubeconfig?: string; acceptContentTypes?: string; contentType?: string; qps?: number; burst?: number };
  logging?: { format?: string; flushFrequency?: string | number; verbosity?: number; vmodule?: unknown; options?: unknown };
  hostnameOverride?: string;
  bindAddress?: string;
  healthzBindAddress?: string;
  metricsBindAddress?: string;
  bindAddressHardFail?: boolean;
  enableProfiling?: boolean;
  showHiddenMetricsForVersion?: string;
  mode?: string;
  iptables?: { masqueradeBit?: number | null; masqueradeAll?: boolean; localhostNodePorts?: boolean | null; snatNodeInternalIP?: boolean | null; syncPeriod?: Duration; minSyncPeriod?: Duration };
  ipvs?: {
    syncPeriod?: Duration;
    minSyncPeriod?: Duration;
    scheduler?: string;
    excludeCIDRs?: string[] | null;
    strictARP?: boolean;
    tcpTimeout?: Duration;
    tcpFinTimeout?: Duration;
    udpTimeout?: Duration;
  };
  nftables?: { masqueradeBit?: number | null; masqueradeAll?: boolean; syncPeriod?: Duration; minSyncPeriod?: Duration; tables?: unknown };
  winkernel?: { networkName?: string; sourceVip?: string; enableDSR?: boolean; rootHnsEndpointName?: string; forwardHealthCheckVip?: boolean };
  detectLocalMode?: string;
  detectLocal?: { bridgeInterface?: string; interfaceNamePrefix?: string };
  clusterCIDR?: string;
  nodePortAddresses?: string[] | null;
  oomScoreAdj?: number | null;
  conntrack?: {
    maxPerCore?: number | null;
    min?: number | null;
    tcpEstablishedTimeout?: Duration | null;
    tcpCloseWaitTimeout?: Duration | null;
    tcpBeLiberal?: boolean;
    udpTimeout?: Duration;
    udpStreamTimeout?: Duration;
  };
  configSyncPeriod?: Duration;
  portRange?: string;
  windowsRunAsService?: boolean;
  udpIdleTimeout?: Duration;
  syncPeriod?: Duration;
  minSyncPeriod?: Duration;
  userspace?: { workers?: number; maxConnections?: number; idleTimeout?: Duration; udpMaxSessions?: number; udpMaxSessionsPerClient?: number; tcpPath?: string };
}

const typeName = (v: unknown) => (Array.isArray(v) ? 'a list' : v === null ? 'null' : typeof v === 'object' ? 'a mapping' : `${typeof v} ${JSON.stringify(v)}`);

function decodeValue(path: string, kind: Kind, v: unknown, warn: ConfigWarn): unknown {
  const want = (what: string): never => {
    throw new ConfigError(path, `want ${what}, got ${typeName(v)}`);
  };
  if (typeof kind === 'object') {
    if (typeof v !== 'object' || v === null || Array.isArray(v)) want('a mapping');
    return decodeObject(path, kind, v as Record<string, unknown>, warn);
  }
  switch (kind) {
    case 'string':
      return typeof v === 'string' ? v : want('a string');
    case 'bool':
      return typeof v === 'boolean' ? v : want('true or false');
    case 'int32':
      if (typeof v !== 'number' || !Number.isInteger(v)) want('an integer');
      if ((v as number) < -(2 ** 31) || (v as number) >= 2 ** 31) want('a 32-bit integer');
      return v;
    case 'float':
      return typeof v === 'number' && Number.isFinite(v) ? v : want('a number');
    case 'duration':
      // metav1.Duration is a JSON string; Go refuses a bare number
      if (typeof v !== 'string') want('a duration such as "30s" or "1m"');
      if (parseDuration(v as string) === null) throw new ConfigError(path, `invalid duration ${JSON.stringify(v)} (want e.g. "30s", "1m", "250ms")`);
      return v;
    case 'flushFrequency':
      // logsapi.TimeOrMetaDuration: nanoseconds or a duration string
      if (typeof v === 'number' && Number.isFinite(v)) return v;
      if (typeof v === 'string' && parseDuration(v) !== null) return v;
      return want('a duration such as "5s" or a number of nanoseconds');
    case 'strings':
      if (!Array.isArray(v)) want('a list of strings');
      (v as unknown[]).forEach((e, i) => {
        if (typeof e !== 'string') throw new ConfigError(`${path}[${i}]`, `want a string, got ${typeName(e)}`);
      });
      return v;
    case 'boolMap':
      if (typeof v !== 'object' || v === null || Array.isArray(v)) want('a mapping of names to true or false');
      for (const [k, b] of Object.entries(v as object)) {
        if (typeof b !== 'boolean') throw new ConfigError(`${path}.${k}`, `want true or false, got ${typeName(b)}`);
      }
      return v;
    case 'any':
      return v;
  }
}

function decodeObject(path: string, spec: Spec, obj: Record<string, unknown>, warn: ConfigWarn): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  const byLower = new Map(Object.keys(spec).map((k) => [k.toLowerCase(), k]));
  const prefix = path ? `${path}.` : '';
  for (const [key, value] of Object.entries(obj)) {
    let field = key;
    if (!(key in spec)) {
      // Go's lenient JSON decoding matches field names case-insensitively
      const folded = byLower.get(key.toLowerCase());
      if (!folded) {
        warn(`${prefix}${key}: unknown field, ignored (kube-proxy's lenient decoding ignores it too)`);
        continue;
      }
      warn(`${prefix}${key}: read as ${prefix}${folded} (field names are case-sensitive in kube-proxy's strict decoding)`);
      field = folded;
    }
    if (value === null || value === undefined) continue; // Go: null leaves the zero value
    out[field] = decodeValue(`${prefix}${field}`, spec[field], value, warn);
  }
  return out;
}

/**
 * Parses a config file's text (YAML or JSON): the document must be a mapping, and apiVersion
 * and kind must be upstream's when given. Structure and types are checked by resolveConfig.
 */
export function parseConfigText(text: string, source = 'config'): RawConfig {
  let doc: unknown;
  try {
    doc = parseYAML(text) ?? {};
  } catch (e) {
    throw new ConfigError(source, `not valid YAML: ${(e as Error).message}`);
  }
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc)) {
    throw new ConfigError(source, `want a ${KIND} mapping, got ${typeName(doc)}`);
  }
  const raw = doc as Record<string, unknown>;
  if (raw.kind !== undefined && raw.kind !== KIND) {
    throw new ConfigError('kind', `want ${KIND}, got ${JSON.stringify(raw.kind)}`);
  }
  if (raw.apiVersion !== undefined && raw.apiVersion !== API_VERSION) {
    throw new ConfigError('apiVersion', `want ${API_VERSION}, got ${JSON.stringify(raw.apiVersion)}`);
  }
  return raw as RawConfig;
}

// ---- the effective configuration ----

/** The effective configuration kproxy runs with, every default filled in. */
export interface ProxyConfig {
  mode: ModeName;
  /**
   * true when neither the flags nor the file set the mode and it fell back to iptables
   * (upstream platformApplyDefaults); what the KEP-5343 warning reports
   */
  modeDefaulted?: boolean;
  hostnameOverride: string;
  kubeconfig: string;
  clusterCIDRs: string[];
  bindAddress: string;
  /** "" disables the server (--healthz-port=0, or --healthz-bind-address="" without --config) */
  healthzBindAddress: string;
  metricsBindAddress: string;
  bindAddressHardFail: boolean;
  masqueradeAll: boolean;
  masqueradeBit: number;
  localhostNodePorts: boolean;
  /** canonical CIDRs and the keywords (NODE_PORT_KEYWORDS); empty = upstream's per-mode default */
  nodePortAddresses: string[];
  /** upstream detectLocalMode: how traffic from local pods is recognised */
  detectLocalMode: DetectLocalMode;
  detectLocal: { bridgeInterface: string; interfaceNamePrefix: string };
  syncPeriodMs: number;
  minSyncPeriodMs: number;
  udpIdleTimeoutMs: number;
  configSyncPeriodMs: number;
  ipvs: {
    scheduler: string;
    excludeCIDRs: string[];
    strictARP: boolean;
    tcpTimeoutMs: number;
    tcpFinTimeoutMs: number;
    udpTimeoutMs: number;
    syncPeriodMs: number;
    minSyncPeriodMs: number;
  };
  /**
   * kproxy: how many tables the nftables mode spreads the Services over: "auto" (one below
   * 1,000 Services, more above: src/modes/nftables/shards.ts) or always n (1: upstream's one
   * `kube-proxy` table)
   */
  nftables: { tables: NftablesTables };
  featureGates: Record<string, boolean>;
  clientConnection: { kubeconfig: string; contentType: string; acceptContentTypes: string; qps: number; burst: number };
  /** logging.verbosity (klog's -v) and logging.format */
  logging: { format: 'text' | 'json'; verbosity: number };
  /** upstream KubeProxyConntrackConfiguration, applied at start (timeouts in seconds, 0 = leave as is) */
  conntrack: ConntrackSettings;
  /** written to /proc/self/oom_score_adj at start; null leaves it */
  oomScoreAdj: number | null;
  /** kproxy only: the userspace data plane's workers and bounds */
  userspace: UserspaceSettings;
  /** the effective configuration in upstream's v1alpha1 shape (what --write-config-to writes) */
  v1alpha1: Record<string, unknown>;
}

/** kproxy's `userspace:` block, resolved (see userspaceField for the defaults and why). */
export interface UserspaceSettings {
  /** processes accepting TCP connections; 1 = kproxy's own process */
  workers: number;
  /** open client connections over all TCP listeners; 0 = automatic, from the fd limit */
  maxConnections: number;
  /** a spliced TCP connection silent both ways this long is closed; 0 = never */
  idleTimeoutMs: number;
  /** UDP sessions over all listeners (each holds a socket) */
  udpMaxSessions: number;
  /** UDP sessions of one client IP: one client cannot take them all */
  udpMaxSessionsPerClient: number;
  /**
   * the TCP data path: raw libuv handles (src/modes/userspace/dataplane/tcp-raw.ts), net.Socket (tcp.ts), or
   * auto (raw when this Node has the internals); KPROXY_USERSPACE_TCP=net|raw|auto wins
   */
  tcpPath: 'auto' | 'net' | 'raw';
}

/** upstream KubeProxyConntrackConfiguration, in kproxy's units */
export interface ConntrackSettings {
  /** per CPU; 0 leaves nf_conntrack_max as it is */
  maxPerCore: number;
  /** floor of maxPerCore × cores */
  min: number;
  /** seconds; 0 leaves the setting as it is */
  tcpEstablishedTimeoutSec: number;
  tcpCloseWaitTimeoutSec: number;
  tcpBeLiberal: boolean;
  udpTimeoutSec: number;
  udpStreamTimeoutSec: number;
}

/** Flags from the command line; any that is set overrides the file (render, trace, demo). */
export interface ConfigFlags {
  mode?: string;
  kubeconfig?: string;
  hostnameOverride?: string;
  clusterCidr?: string;
  healthzBindAddress?: string;
  metricsBindAddress?: string;
  nodeportAddresses?: string;
  masqueradeAll?: boolean;
  ipvsScheduler?: string;
  detectLocalMode?: string;
  podBridgeInterface?: string;
  podInterfaceNamePrefix?: string;
  userspaceWorkers?: string;
  userspaceMaxConnections?: string;
  userspaceIdleTimeout?: string;
}

/**
 * kproxy's `userspace:` block (flags --userspace-workers, --userspace-max-connections,
 * --userspace-idle-timeout win). Defaults: 1 worker (kproxy's own process); maxConnections
 * 0 = automatic, half the fd limit less a reserve (each connection holds two fds); an idle
 * timeout of 24h, upstream's conntrack tcpEstablishedTimeout, so an idle connection lives as
 * long as it would in the kernel modes; 8192 UDP sessions, at most 1024 per client IP.
 */
function userspaceField(raw: RawConfig, flags: ConfigFlags): UserspaceSettings {
  const u = raw.userspace ?? {};
  const int = (field: string, flag: string | undefined, v: number | undefined, dflt: number, min: number, max: number): number => {
    const n = flag !== undefined ? Number(flag) : v ?? dflt;
    if (!Number.isInteger(n) || n < min || n > max) {
      throw new ConfigError(`userspace.${field}`, `want an integer from ${min} to ${max}, got ${JSON.stringify(flag ?? v)}`);
    }
    return n;
  };
  const workers = int('workers', flags.userspaceWorkers, u.workers, 1, 1, 64);
  const maxConnections = int('maxConnections', flags.userspaceMaxConnections, u.maxConnections, 0, 0, 10_000_000);
  const idleText = flags.userspaceIdleTimeout ?? u.idleTimeout;
  const idleParsed = idleText === undefined ? 24 * 3600_000 : parseDuration(idleText);
  if (idleParsed === null || idleParsed < 0) throw new ConfigError('userspace.idleTimeout', `want a duration such as "10m" (0 = never), got ${JSON.stringify(idleText)}`);
  const idleTimeoutMs = idleParsed;
  const udpMaxSessions = int('udpMaxSessions', undefined, u.udpMaxSessions, 8192, 1, 1_000_000);
  const udpMaxSessionsPerClient = int('udpMaxSessionsPerClient', undefined, u.udpMaxSessionsPerClient, Math.min(1024, udpMaxSessions), 1, udpMaxSessions);
  const tcpPath = u.tcpPath ?? 'auto';
  if (tcpPath !== 'auto' && tcpPath !== 'net' && tcpPath !== 'raw') throw new ConfigError('userspace.tcpPath', `want auto, net or raw, got ${JSON.stringify(tcpPath)}`);
  return { workers, maxConnections, idleTimeoutMs, udpMaxSessions, udpMaxSessionsPerClient, tcpPath };
}

export const DETECT_LOCAL_MODES = ['ClusterCIDR', 'NodeCIDR', 'BridgeInterface', 'InterfaceNamePrefix'] as const;
export type DetectLocalMode = (typeof DETECT_LOCAL_MODES)[number];

const ms = (d: string | undefined): number => (d === undefined ? 0 : (parseDuration(d) as number));

/** A period: 0 (or unset) means the default, as upstream's defaulting; negative is refused. */
function period(field: string, v: string | undefined, dflt: number, zeroMeansDefault: boolean): number {
  const n = ms(v);
  if (n < 0) throw new ConfigError(field, `must be greater than or equal to 0, got ${JSON.stringify(v)}`);
  return n === 0 && zeroMeansDefault ? dflt : n;
}

/** A timeout that keeps its value (0 = leave the host's setting). */
function nonNegative(field: string, v: string | undefined | null): number {
  const n = ms(v ?? undefined);
  if (n < 0) throw new ConfigError(field, `must be greater than or equal to 0, got ${JSON.stringify(v)}`);
  return n;
}

/**
 * upstream validateDetectLocalMode / validateDetectLocalConfiguration: the mode is one of
 * four (empty = ClusterCIDR); BridgeInterface needs detectLocal.bridgeInterface and
 * InterfaceNamePrefix needs detectLocal.interfaceNamePrefix ("must not be empty"); an
 * interface name is at most 15 bytes (IFNAMSIZ) with no '/' or whitespace (kproxy: the
 * kernel would refuse the rule). ClusterCIDR without clusterCIDR is allowed (upstream
 * warns and detects nothing); NodeCIDR takes the Node's spec.podCIDRs at run time.
 */
function detectLocalField(raw: RawConfig, flags: ConfigFlags): { mode: DetectLocalMode; bridgeInterface: string; interfaceNamePrefix: string } {
  const modeText = flags.detectLocalMode ?? raw.detectLocalMode ?? '';
  const mode = (modeText === '' ? 'ClusterCIDR' : modeText) as DetectLocalMode;
  if (!(DETECT_LOCAL_MODES as readonly string[]).includes(mode)) {
    throw new ConfigError('detectLocalMode', `unsupported value ${JSON.stringify(modeText)} (want one of ${DETECT_LOCAL_MODES.join(', ')})`);
  }
  const bridgeInterface = flags.podBridgeInterface ?? raw.detectLocal?.bridgeInterface ?? '';
  const interfaceNamePrefix = flags.podInterfaceNamePrefix ?? raw.detectLocal?.interfaceNamePrefix ?? '';
  for (const [field, v] of [['detectLocal.bridgeInterface', bridgeInterface], ['detectLocal.interfaceNamePrefix', interfaceNamePrefix]] as const) {
    if (v !== '' && (v.length > 15 || /[\s/]/.test(v))) throw new ConfigError(field, `invalid interface name ${JSON.stringify(v)} (at most 15 characters, no '/' or spaces)`);
  }
  if (mode === 'BridgeInterface' && bridgeInterface === '') {
    throw new ConfigError('detectLocal.bridgeInterface', 'must not be empty when detectLocalMode is BridgeInterface (set --pod-bridge-interface)');
  }
  if (mode === 'InterfaceNamePrefix' && interfaceNamePrefix === '') {
    throw new ConfigError('detectLocal.interfaceNamePrefix', 'must not be empty when detectLocalMode is InterfaceNamePrefix (set --pod-interface-name-prefix)');
  }
  return { mode, bridgeInterface, interfaceNamePrefix };
}

/**
 * upstream validateDualStackCIDRStrings on clusterCIDR (comma-separated): one CIDR, or a
 * dual-stack pair. Validated when detectLocalMode is ClusterCIDR, the only mode that uses it.
 */
function clusterCIDRField(text: string, used: boolean): string[] {
  if (text === '') return [];
  const parts = text.split(',').map((s) => s.trim());
  const parsed = parts.map((c) => parseCIDR(c));
  if (!used) return parsed.every(Boolean) ? parsed.map((p) => p!.text) : [];
  parsed.forEach((p, i) => {
    if (!p) throw new ConfigError(`clusterCIDR[${i}]`, `invalid CIDR ${JSON.stringify(parts[i])} (must be a valid CIDR block, e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)`);
  });
  if (parts.length > 2 || (parts.length === 2 && parsed[0]!.family === parsed[1]!.family)) {
    throw new ConfigError('clusterCIDR', `${JSON.stringify(text)}: must be either a single CIDR or a dual-stack pair of CIDRs (e.g. 10.100.0.0/16,fde4:8dba:82e1::/48)`);
  }
  return parsed.map((p) => p!.text);
}

/** upstream conntrack validation (every value ≥ 0) with the v1alpha1 defaults. */
function conntrackField(r: NonNullable<RawConfig['conntrack']>): ConntrackSettings {
  const int = (k: 'maxPerCore' | 'min', dflt: number): number => {
    const v = r[k] ?? dflt;
    if (v < 0) throw new ConfigError(`conntrack.${k}`, `must be greater than or equal to 0, got ${v}`);
    return v;
  };
  const secs = (k: 'tcpEstablishedTimeout' | 'tcpCloseWaitTimeout' | 'udpTimeout' | 'udpStreamTimeout', dflt: number | null): number => {
    const v = r[k];
    if (v === undefined || v === null) return dflt === null ? 0 : dflt;
    return Math.floor(nonNegative(`conntrack.${k}`, v) / 1000);
  };
  return {
    maxPerCore: int('maxPerCore', 32768),
    min: int('min', 131072),
    tcpEstablishedTimeoutSec: secs('tcpEstablishedTimeout', 24 * 3600),
    tcpCloseWaitTimeoutSec: secs('tcpCloseWaitTimeout', 3600),
    tcpBeLiberal: r.tcpBeLiberal ?? false,
    udpTimeoutSec: secs('udpTimeout', null),
    udpStreamTimeoutSec: secs('udpStreamTimeout', null),
  };
}

/** upstream AppendPortIfNeeded: a bare IP gets the default port ("[ip]:port" for IPv6). */
function appendPortIfNeeded(addr: string, port: number): string {
  const ip = canonicalIP(addr);
  if (!ip) return addr;
  return addr.includes(':') ? `[${addr}]:${port}` : `${addr}:${port}`;
}

/** upstream validateHostPort: IP:port with a valid IP and a port in 1..65535. "" is allowed (disabled). */
function hostPortField(field: string, v: string): string {
  if (v === '') return v;
  const m = /^(?:\[([^\]]*)\]|([^:[\]]*)):([^:]*)$/.exec(v);
  if (!m) throw new ConfigError(field, `invalid address ${JSON.stringify(v)} (must be IP:port)`);
  const host = m[1] ?? m[2] ?? '';
  if (!canonicalIP(host)) throw new ConfigError(field, `invalid IP in ${JSON.stringify(v)} (must be a valid IP)`);
  if (!/^\d+$/.test(m[3]) || Number(m[3]) < 1 || Number(m[3]) > 65535) {
    throw new ConfigError(field, `invalid port in ${JSON.stringify(v)} (must be a valid port, 1-65535)`);
  }
  return v;
}

function cidrList(field: string, list: string[]): string[] {
  return list.map((c, i) => {
    const p = parseCIDR(c);
    if (!p) throw new ConfigError(`${field}[${i}]`, `invalid CIDR ${JSON.stringify(c)}`);
    return p.text;
  });
}

/** upstream utilnet.ParsePortRange: "", "N", "A-B" or "A+N" within 0..65535. */
function portRangeField(v: string): string {
  if (v === '') return v;
  const m = /^(\d+)(?:([-+])(\d+))?$/.exec(v.trim());
  const ok = m && (() => {
    const a = Number(m[1]);
    const b = m[2] === '-' ? Number(m[3]) : m[2] === '+' ? a + Number(m[3]) : a;
    return a <= 65535 && b <= 65535 && b >= a;
  })();
  if (!ok) throw new ConfigError('portRange', `invalid value ${JSON.stringify(v)} (must be a valid port range, e.g. 300-2000)`);
  return v;
}

/** Warnings for fields that exist upstream but change nothing in kproxy. */
function notApplicableWarnings(raw: RawConfig, mode: ModeName, warn: ConfigWarn): void {
  const w = raw.winkernel ?? {};
  const setWin = Object.entries(w).filter(([, v]) => v !== '' && v !== false).map(([k]) => `winkernel.${k}`);
  if (raw.windowsRunAsService) setWin.push('windowsRunAsService');
  if (setWin.length) warn(`${setWin.join(', ')}: Windows only (winkernel proxy); ignored on Linux`);
  const cc = raw.clientConnection ?? {};
  if (cc.contentType && cc.contentType !== 'application/json') {
    warn(`clientConnection.contentType: ${JSON.stringify(cc.contentType)} ignored; kproxy talks JSON to the API server`);
  }
  if (cc.acceptContentTypes) warn(`clientConnection.acceptContentTypes: ${JSON.stringify(cc.acceptContentTypes)} ignored; kproxy accepts JSON only`);
  if ((cc.qps && cc.qps !== 5) || (cc.burst && cc.burst !== 10)) warn('clientConnection.qps/burst: accepted, not used (kproxy makes one list and one watch per resource, with back-off)');
  if (raw.enableProfiling) warn('enableProfiling: ignored; Go\'s pprof does not exist in kproxy (use node --inspect, and /debug/* on the metrics address)');
  if (raw.showHiddenMetricsForVersion) warn('showHiddenMetricsForVersion: accepted; kproxy has no hidden metrics');
  if (raw.portRange) warn('portRange: unused, as upstream (it configured the old userspace proxy; kproxy\'s userspace mode picks its ports itself)');
  if (raw.iptables?.snatNodeInternalIP) warn('iptables.snatNodeInternalIP: not supported by kproxy; masqueraded traffic takes the egress interface\'s address');
  if (raw.logging?.vmodule !== undefined && !(Array.isArray(raw.logging.vmodule) && raw.logging.vmodule.length === 0)) {
    warn('logging.vmodule: ignored; kproxy has one log level (logging.verbosity, -v)');
  }
  const gates = Object.keys(raw.featureGates ?? {});
  // upstream featuregate.SetFromMap: an unknown name fails the start
  const unknown = gates.filter((g) => !KNOWN_FEATURE_GATES.has(g));
  if (unknown.length) {
    throw new ConfigError('featureGates', `unrecognized feature gate: ${unknown.join(', ')}; remove it or fix its spelling (gates that affect kube-proxy: ${KUBE_PROXY_GATES.join(', ')})`);
  }
  const ignored = gates.filter((g) => g !== 'KubeProxyNFTablesLocalhostNodePorts');
  if (ignored.length) warn(`featureGates: ${ignored.join(', ')} ignored; kproxy has no feature gates (every feature it has is on)`);
  // the one gate kproxy reads: on unless false (src/core/nodeview.ts localhostNodePortProxyWanted)
  if (gates.length > ignored.length) {
    warn(raw.featureGates!.KubeProxyNFTablesLocalhostNodePorts === false
      ? 'featureGates: KubeProxyNFTablesLocalhostNodePorts=false turns off the nftables mode\'s localhost NodePort proxy; every other feature of kproxy is on'
      : 'featureGates: KubeProxyNFTablesLocalhostNodePorts=true is kproxy\'s default; the nftables mode serves localhost NodePorts when nodePortAddresses names the loopback address (e.g. primary,localhost), and only =false turns it off');
  }
  if (raw.udpIdleTimeout !== undefined && ms(raw.udpIdleTimeout) !== 0 && mode !== 'userspace') warn('udpIdleTimeout: used by the userspace mode only; ignored in ' + mode + ' mode');
}

export type NftablesTables = 'auto' | number;

/** The most tables `nftables.tables` may ask for: the shard table names kproxy owns and cleans up (src/modes/nftables/names.ts SHARD_TABLE_NAMES). */
export const NFTABLES_TABLES_MAX = 64;

/** `nftables.tables`: "auto" (the default) or a whole number of tables from 1 to NFTABLES_TABLES_MAX. */
function nftablesTables(v: unknown): NftablesTables {
  if (v === undefined || v === null || v === 'auto') return 'auto';
  if (typeof v === 'number' && Number.isInteger(v) && v >= 1 && v <= NFTABLES_TABLES_MAX) return v;
  throw new ConfigError('nftables.tables', `want "auto" or a whole number of tables from 1 to ${NFTABLES_TABLES_MAX}, got ${typeName(v)}`);
}

function modeField(raw: RawConfig, flags: ConfigFlags): ModeName {
  const modeText = flags.mode ?? raw.mode ?? '';
  const mode = (modeText === '' ? 'iptables' : modeText) as ModeName;
  if (!MODES.includes(mode)) {
    throw new ConfigError('mode', `unknown mode ${JSON.stringify(modeText)} (want one of ${MODES.join(', ')}, or blank for iptables)`);
  }
  return mode;
}

/** upstream validates iptables.masqueradeBit always and nftables.masqueradeBit in nftables mode */
function masqueradeBits(raw: RawConfig, mode: ModeName): { iptBit: number; nftBit: number; masqueradeBit: number } {
  const iptBit = raw.iptables?.masqueradeBit ?? 14;
  if (iptBit < 0 || iptBit > 31) throw new ConfigError('iptables.masqueradeBit', `must be within the range [0, 31], got ${iptBit}`);
  const nftBit = raw.nftables?.masqueradeBit ?? 14;
  if (mode === 'nftables' && (nftBit < 0 || nftBit > 31)) throw new ConfigError('nftables.masqueradeBit', `must be within the range [0, 31], got ${nftBit}`);
  return { iptBit, nftBit, masqueradeBit: mode === 'nftables' ? nftBit : iptBit };
}

/** The IPVS scheduler as given (`text`, what v1alpha1 echoes) and as used. */
function schedulerField(raw: RawConfig, flags: ConfigFlags): { text: string; scheduler: string } {
  const text = flags.ipvsScheduler ?? raw.ipvs?.scheduler ?? '';
  const scheduler = text === '' ? 'rr' : text;
  if (!(IPVS_SCHEDULERS as readonly string[]).includes(scheduler)) {
    throw new ConfigError('ipvs.scheduler', `unknown scheduler ${JSON.stringify(text)} (want one of ${IPVS_SCHEDULERS.join(', ')}; blank means rr)`);
  }
  return { text, scheduler };
}

/**
 * `--nodeport-addresses` keywords (kubernetes#138427): "primary" the Node's primary IP of each
 * family, "localhost" the loopback address of each family, "all" every address.
 */
export const NODE_PORT_KEYWORDS = ['primary', 'localhost', 'all'] as const;

/**
 * upstream validateKubeProxyNodePortAddress: CIDRs and the keywords "primary", "localhost" and
 * "all", in any combination (kubernetes#138427, KEP-6032; before it, "primary" alone)
 */
function nodePortAddressesField(raw: RawConfig, flags: ConfigFlags): string[] {
  const list = flags.nodeportAddresses !== undefined
    ? flags.nodeportAddresses.split(',').map((s) => s.trim()).filter(Boolean)
    : raw.nodePortAddresses ?? [];
  return list.map((c, i) => {
    if ((NODE_PORT_KEYWORDS as readonly string[]).includes(c)) return c;
    const p = parseCIDR(c);
    if (!p) throw new ConfigError(`nodePortAddresses[${i}]`, `invalid CIDR ${JSON.stringify(c)} (want a CIDR or one of ${NODE_PORT_KEYWORDS.map((k) => `"${k}"`).join(', ')})`);
    return p.text;
  }).filter((c, i, all) => all.indexOf(c) === i);
}

/**
 * Periods: upstream converts the mode's section into the effective period (iptables for
 * iptables and userspace, ipvs, nftables); kproxy's top-level periods win when given.
 */
function syncPeriods(raw: RawConfig, mode: ModeName): { sectionName: string; syncPeriodMs: number; minSyncPeriodMs: number } {
  const sectionName = mode === 'ipvs' ? 'ipvs' : mode === 'nftables' ? 'nftables' : 'iptables';
  const syncSection = mode === 'ipvs' ? raw.ipvs : mode === 'nftables' ? raw.nftables : raw.iptables;
  const syncField = raw.syncPeriod !== undefined ? 'syncPeriod' : `${sectionName}.syncPeriod`;
  const minSyncField = raw.minSyncPeriod !== undefined ? 'minSyncPeriod' : `${sectionName}.minSyncPeriod`;
  const syncText = raw.syncPeriod ?? syncSection?.syncPeriod;
  const minSyncText = raw.minSyncPeriod ?? syncSection?.minSyncPeriod;
  if (ms(syncText) < 0) throw new ConfigError(syncField, `must be greater than 0, got ${JSON.stringify(syncText)}`);
  const syncPeriodMs = period(syncField, syncText, 30_000, true);
  const minSyncPeriodMs = period(minSyncField, minSyncText, mode === 'ipvs' ? 0 : 1_000, mode !== 'ipvs');
  if (minSyncPeriodMs > syncPeriodMs) {
    throw new ConfigError(minSyncField, `must not exceed ${syncField} (${formatDuration(minSyncPeriodMs)} > ${formatDuration(syncPeriodMs)})`);
  }
  return { sectionName, syncPeriodMs, minSyncPeriodMs };
}

/** bindAddress, and the healthz and metrics servers' addresses. */
function serverAddresses(raw: RawConfig, flags: ConfigFlags): { bindAddress: string; healthzBindAddress: string; metricsBindAddress: string } {
  const bindText = raw.bindAddress || '0.0.0.0';
  const bindIP = canonicalIP(bindText);
  if (!bindIP) throw new ConfigError('bindAddress', `${JSON.stringify(bindText)} is not a valid textual representation of an IP address`);
  const v4 = isIPv4(bindIP);
  // upstream defaulting: "" in the file gets the default address (of bindAddress's family), a
  // bare IP the default port; an empty flag value disables the server, as upstream's flags.
  const serverAddress = (field: string, flag: string | undefined, file: string | undefined, dflt: string, port: number): string => {
    if (flag === '') return '';
    const text = flag ?? file ?? '';
    return hostPortField(field, text === '' ? dflt : appendPortIfNeeded(text, port));
  };
  return {
    bindAddress: bindText,
    healthzBindAddress: serverAddress('healthzBindAddress', flags.healthzBindAddress, raw.healthzBindAddress, v4 ? '0.0.0.0:10256' : '[::]:10256', 10256),
    metricsBindAddress: serverAddress('metricsBindAddress', flags.metricsBindAddress, raw.metricsBindAddress, v4 ? '127.0.0.1:10249' : '[::1]:10249', 10249),
  };
}

/** The process's own settings: OOM score, client connection, config sync period, metrics version, logging. */
function processFields(raw: RawConfig): { oomScoreAdj: number | null; configSyncPeriodMs: number; showHiddenMetricsForVersion: string; logging: ProxyConfig['logging'] } {
  const oomScoreAdj = raw.oomScoreAdj === undefined ? -999 : raw.oomScoreAdj;
  if (oomScoreAdj !== null && (oomScoreAdj < -1000 || oomScoreAdj > 1000)) {
    throw new ConfigError('oomScoreAdj', `must be within the range [-1000, 1000], got ${oomScoreAdj}`);
  }
  const cc = raw.clientConnection ?? {};
  if ((cc.burst ?? 0) < 0) throw new ConfigError('clientConnection.burst', `must be greater than or equal to 0, got ${cc.burst}`);
  const configSyncPeriodMs = period('configSyncPeriod', raw.configSyncPeriod, 15 * 60_000, true);
  portRangeField(raw.portRange ?? '');
  const shm = raw.showHiddenMetricsForVersion ?? '';
  if (shm !== '' && shm !== PREVIOUS_MINOR) {
    throw new ConfigError('showHiddenMetricsForVersion', `${JSON.stringify(shm)}: must be omitted or have the value '${PREVIOUS_MINOR}'; only the previous minor version is allowed`);
  }
  const format = raw.logging?.format || 'text';
  if (format !== 'text' && format !== 'json') throw new ConfigError('logging.format', `unsupported value ${JSON.stringify(format)} (want "text" or "json")`);
  const verbosity = raw.logging?.verbosity ?? 0;
  if (verbosity < 0) throw new ConfigError('logging.verbosity', `must be greater than or equal to 0, got ${verbosity}`);
  return { oomScoreAdj, configSyncPeriodMs, showHiddenMetricsForVersion: shm, logging: { format, verbosity } };
}

function ipvsField(raw: RawConfig, mode: ModeName, scheduler: string): ProxyConfig['ipvs'] {
  const ipvsRaw = raw.ipvs ?? {};
  // validated in ipvs mode only, as upstream; elsewhere unused
  const validated = mode === 'ipvs';
  const timeout = (field: string, v: string | undefined) => (validated ? nonNegative(field, v) : Math.max(0, ms(v)));
  return {
    scheduler,
    excludeCIDRs: validated ? cidrList('ipvs.excludeCIDRs', ipvsRaw.excludeCIDRs ?? []) : (ipvsRaw.excludeCIDRs ?? []).flatMap((c) => parseCIDR(c)?.text ?? []),
    strictARP: ipvsRaw.strictARP ?? false,
    tcpTimeoutMs: timeout('ipvs.tcpTimeout', ipvsRaw.tcpTimeout),
    tcpFinTimeoutMs: timeout('ipvs.tcpFinTimeout', ipvsRaw.tcpFinTimeout),
    udpTimeoutMs: timeout('ipvs.udpTimeout', ipvsRaw.udpTimeout),
    syncPeriodMs: period('ipvs.syncPeriod', ipvsRaw.syncPeriod, 30_000, true),
    minSyncPeriodMs: period('ipvs.minSyncPeriod', ipvsRaw.minSyncPeriod, 0, false),
  };
}

function clientConnectionField(raw: RawConfig, flags: ConfigFlags): ProxyConfig['clientConnection'] {
  const cc = raw.clientConnection ?? {};
  return {
    kubeconfig: flags.kubeconfig ?? cc.kubeconfig ?? '',
    contentType: cc.contentType || 'application/vnd.kubernetes.protobuf',
    acceptContentTypes: cc.acceptContentTypes ?? '',
    qps: cc.qps || 5,
    burst: cc.burst || 10,
  };
}

/** What the v1alpha1 form echoes as given rather than as resolved. */
interface AsGiven {
  iptBit: number;
  nftBit: number;
  schedulerText: string;
  sectionName: string;
  showHiddenMetricsForVersion: string;
}

/**
 * The same configuration in upstream's v1alpha1 shape, defaults filled as upstream's
 * SetDefaults + platformApplyDefaults would (what kube-proxy --write-config-to writes).
 */
function v1alpha1Of(raw: RawConfig, cfg: Omit<ProxyConfig, 'v1alpha1'>, given: AsGiven): Record<string, unknown> {
  const d = formatDuration;
  const { mode, conntrack, ipvs, clientConnection: cc } = cfg;
  const section = (name: string) => (given.sectionName === name ? { syncPeriod: d(cfg.syncPeriodMs), minSyncPeriod: d(cfg.minSyncPeriodMs) } : null);
  const iptSync = section('iptables') ?? { syncPeriod: d(period('iptables.syncPeriod', raw.iptables?.syncPeriod, 30_000, true)), minSyncPeriod: d(period('iptables.minSyncPeriod', raw.iptables?.minSyncPeriod, 1_000, true)) };
  const nftSync = section('nftables') ?? { syncPeriod: d(period('nftables.syncPeriod', raw.nftables?.syncPeriod, 30_000, true)), minSyncPeriod: d(period('nftables.minSyncPeriod', raw.nftables?.minSyncPeriod, 1_000, true)) };
  const ipvsSync = section('ipvs') ?? { syncPeriod: d(ipvs.syncPeriodMs), minSyncPeriod: d(ipvs.minSyncPeriodMs) };
  const v1alpha1: Record<string, unknown> = {
    apiVersion: API_VERSION,
    kind: KIND,
    bindAddress: cfg.bindAddress,
    bindAddressHardFail: cfg.bindAddressHardFail,
    clientConnection: { acceptContentTypes: cc.acceptContentTypes, burst: cc.burst, contentType: cc.contentType, kubeconfig: cc.kubeconfig, qps: cc.qps },
    clusterCIDR: cfg.clusterCIDRs.join(','),
    configSyncPeriod: d(cfg.configSyncPeriodMs),
    conntrack: {
      maxPerCore: conntrack.maxPerCore,
      min: conntrack.min,
      tcpBeLiberal: conntrack.tcpBeLiberal,
      tcpCloseWaitTimeout: d(conntrack.tcpCloseWaitTimeoutSec * 1000),
      tcpEstablishedTimeout: d(conntrack.tcpEstablishedTimeoutSec * 1000),
      udpStreamTimeout: d(conntrack.udpStreamTimeoutSec * 1000),
      udpTimeout: d(conntrack.udpTimeoutSec * 1000),
    },
    detectLocal: { ...cfg.detectLocal },
    detectLocalMode: cfg.detectLocalMode,
    enableProfiling: raw.enableProfiling ?? false,
    featureGates: cfg.featureGates,
    healthzBindAddress: cfg.healthzBindAddress,
    hostnameOverride: cfg.hostnameOverride,
    iptables: { localhostNodePorts: cfg.localhostNodePorts, masqueradeAll: mode === 'nftables' ? raw.iptables?.masqueradeAll ?? false : cfg.masqueradeAll, masqueradeBit: given.iptBit, ...iptSync },
    ipvs: {
      excludeCIDRs: ipvs.excludeCIDRs.length ? ipvs.excludeCIDRs : null,
      ...ipvsSync,
      scheduler: given.schedulerText,
      strictARP: ipvs.strictARP,
      tcpFinTimeout: d(ipvs.tcpFinTimeoutMs),
      tcpTimeout: d(ipvs.tcpTimeoutMs),
      udpTimeout: d(ipvs.udpTimeoutMs),
    },
    logging: { flushFrequency: raw.logging?.flushFrequency || '5s', format: cfg.logging.format, options: { json: { infoBufferSize: '0' }, text: { infoBufferSize: '0' } }, verbosity: cfg.logging.verbosity },
    metricsBindAddress: cfg.metricsBindAddress,
    mode,
    // tables only when given: upstream's strict decoding refuses a field it does not know
    nftables: { masqueradeAll: mode === 'nftables' ? cfg.masqueradeAll : raw.nftables?.masqueradeAll ?? false, masqueradeBit: given.nftBit, ...nftSync, ...(raw.nftables?.tables !== undefined ? { tables: cfg.nftables.tables } : {}) },
    nodePortAddresses: cfg.nodePortAddresses.length ? cfg.nodePortAddresses : mode === 'nftables' ? ['primary'] : null,
    oomScoreAdj: cfg.oomScoreAdj,
    portRange: raw.portRange ?? '',
    showHiddenMetricsForVersion: given.showHiddenMetricsForVersion,
    winkernel: { enableDSR: raw.winkernel?.enableDSR ?? false, forwardHealthCheckVip: raw.winkernel?.forwardHealthCheckVip ?? false, networkName: raw.winkernel?.networkName ?? '', rootHnsEndpointName: raw.winkernel?.rootHnsEndpointName ?? '', sourceVip: raw.winkernel?.sourceVip ?? '' },
  };
  if (mode === 'userspace') v1alpha1.udpIdleTimeout = d(cfg.udpIdleTimeoutMs);
  if (raw.userspace !== undefined) v1alpha1.userspace = raw.userspace;
  return v1alpha1;
}

/**
 * Applies upstream's defaults and the flags, validates, and returns the effective config.
 * `warn` receives a line per unknown field and per field that does not apply here. The
 * fields are checked in a fixed order: the first invalid one is the error reported.
 */
export function resolveConfig(input: RawConfig = {}, flags: ConfigFlags = {}, warn: ConfigWarn = () => {}): ProxyConfig {
  const raw = decodeObject('', SPEC, input as Record<string, unknown>, warn) as RawConfig;
  const mode = modeField(raw, flags);
  notApplicableWarnings(raw, mode, warn);
  const bits = masqueradeBits(raw, mode);
  const sched = schedulerField(raw, flags);
  const detectLocal = detectLocalField(raw, flags);
  const clusterCIDRs = clusterCIDRField(flags.clusterCidr ?? raw.clusterCIDR ?? '', detectLocal.mode === 'ClusterCIDR' || flags.clusterCidr !== undefined);
  const nodePortAddresses = nodePortAddressesField(raw, flags);
  const periods = syncPeriods(raw, mode);
  const servers = serverAddresses(raw, flags);
  const proc = processFields(raw);
  const ipvs = ipvsField(raw, mode, sched.scheduler);
  const conntrack = conntrackField(raw.conntrack ?? {});
  const udpIdleTimeoutMs = period('udpIdleTimeout', raw.udpIdleTimeout, 250, true);
  const modeSection = mode === 'nftables' ? raw.nftables : raw.iptables;
  const clientConnection = clientConnectionField(raw, flags);
  const cfg: Omit<ProxyConfig, 'v1alpha1'> = {
    mode,
    modeDefaulted: (flags.mode ?? raw.mode ?? '') === '',
    hostnameOverride: flags.hostnameOverride ?? raw.hostnameOverride ?? '',
    kubeconfig: clientConnection.kubeconfig,
    clusterCIDRs,
    ...servers,
    bindAddressHardFail: raw.bindAddressHardFail ?? false,
    masqueradeAll: flags.masqueradeAll ?? modeSection?.masqueradeAll ?? false,
    masqueradeBit: bits.masqueradeBit,
    localhostNodePorts: raw.iptables?.localhostNodePorts ?? true,
    nodePortAddresses,
    detectLocalMode: detectLocal.mode,
    detectLocal: { bridgeInterface: detectLocal.bridgeInterface, interfaceNamePrefix: detectLocal.interfaceNamePrefix },
    syncPeriodMs: periods.syncPeriodMs,
    minSyncPeriodMs: periods.minSyncPeriodMs,
    udpIdleTimeoutMs,
    configSyncPeriodMs: proc.configSyncPeriodMs,
    ipvs,
    nftables: { tables: nftablesTables(raw.nftables?.tables) },
    featureGates: raw.featureGates ?? {},
    clientConnection,
    logging: proc.logging,
    conntrack,
    oomScoreAdj: proc.oomScoreAdj,
    userspace: userspaceField(raw, flags),
  };
  const given = { iptBit: bits.iptBit, nftBit: bits.nftBit, schedulerText: sched.text, sectionName: periods.sectionName, showHiddenMetricsForVersion: proc.showHiddenMetricsForVersion };
  return { ...cfg, v1alpha1: v1alpha1Of(raw, cfg, given) };
}

/** Upstream prints the mark as %#08x of 1<<bit: "0x00004000" for bit 14. */
export function masqueradeMark(bit: number): string {
  return '0x' + (1 << bit >>> 0).toString(16).padStart(8, '0');
}

/**
 * upstream server_linux.go getLocalDetectors: with detectLocalMode ClusterCIDR and no cluster
 * CIDR of the primary IP family, traffic from local pods cannot be recognised in that family
 * (a no-op detector: nothing is "local"); upstream logs it at info level, once at start, with
 * this text. null when the mode is another or a CIDR of the family is set. The userspace mode
 * detects no local traffic, so it gets no notice.
 */
export function detectLocalNotice(cfg: Pick<ProxyConfig, 'mode' | 'detectLocalMode' | 'clusterCIDRs'>, primaryFamily: 4 | 6 | undefined): { msg: string; fields: { ipFamily: string; clusterCIDRs: string[] } } | null {
  if (cfg.mode === 'userspace' || cfg.detectLocalMode !== 'ClusterCIDR' || primaryFamily === undefined) return null;
  if (cfg.clusterCIDRs.some((c) => (c.includes(':') ? 6 : 4) === primaryFamily)) return null;
  return {
    msg: 'Detect-local-mode set to ClusterCIDR, but no cluster CIDR specified for primary IP family',
    fields: { ipFamily: `IPv${primaryFamily}`, clusterCIDRs: cfg.clusterCIDRs },
  };
}
