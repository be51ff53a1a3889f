// KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1): load, default, validate.
// Defaults are upstream's (pkg/proxy/apis/config/v1alpha1/defaults.go). Validation errors
// name the field and the bad value, and nothing touches the host before they are checked.
import { parse as parseYAML } from 'yaml';
import { z } from 'zod';
import { parseCIDR, canonicalIP } from '../core/ip.ts';
import { KproxyError } from '../errors.ts';

export const MODES = ['userspace', 'iptables', 'ipvs', 'nftables'] as const;
export type ModeName = (typeof MODES)[number];
export const IPVS_SCHEDULERS = ['rr', 'wrr', 'lc', 'wlc', 'lblc', 'lblcr', 'sh', 'dh', 'sed', 'nq', 'mh'] as const;

export class ConfigError extends KproxyError {
  declare readonly code: 'KPROXY_CONFIG_INVALID';
  constructor(readonly field: string, message: string) {
    super('KPROXY_CONFIG_INVALID', `${field}: ${message}`);
  }
}

/** Go duration text ("1m30s", "250ms", "0s") → milliseconds. */
export function parseDuration(text: string | number): number | null {
  if (typeof text === 'number') return Number.isFinite(text) ? text : null;
  const s = String(text).trim();
  if (s === '0') return 0;
  const re = /(-?\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)/gy;
  let total = 0;
  let m: RegExpExecArray | null;
  let consumed = 0;
  const unit: Record<string, number> = { h: 3600e3, m: 60e3, s: 1e3, ms: 1, us: 1e-3, 'µs': 1e-3, ns: 1e-6 };
  while ((m = re.exec(s))) {
    total += parseFloat(m[1]) * unit[m[2]];
    consumed = re.lastIndex;
  }
  if (consumed !== s.length || s.length === 0) return null;
  return total;
}

const duration = z.union([z.string(), z.number()]);

const schema = z
  .object({
    apiVersion: z.string().optional(),
    kind: z.string().optional(),
    bindAddress: z.string().optional(),
    healthzBindAddress: z.string().optional(),
    metricsBindAddress: z.string().optional(),
    bindAddressHardFail: z.boolean().optional(),
    enableProfiling: z.boolean().optional(),
    clusterCIDR: z.string().optional(),
    hostnameOverride: z.string().optional(),
    clientConnection: z
      .object({
        kubeconfig: z.string().optional(),
        acceptContentTypes: z.string().optional(),
        contentType: z.string().optional(),
        qps: z.number().optional(),
        burst: z.number().optional(),
      })
      .strict()
      .optional(),
    iptables: z
      .object({
        masqueradeBit: z.number().int().nullable().optional(),
        masqueradeAll: z.boolean().optional(),
        localhostNodePorts: z.boolean().nullable().optional(),
        syncPeriod: duration.optional(),
        minSyncPeriod: duration.optional(),
      })
      .strict()
      .optional(),
    ipvs: z
      .object({
        syncPeriod: duration.optional(),
        minSyncPeriod: duration.optional(),
        scheduler: z.string().optional(),
        excludeCIDRs: z.array(z.string()).nullable().optional(),
        strictARP: z.boolean().optional(),
        tcpTimeout: duration.optional(),
        tcpFinTimeout: duration.optional(),
        udpTimeout: duration.optional(),
      })
      .strict()
      .optional(),
    nftables: z
      .object({
        masqueradeBit: z.number().int().nullable().optional(),
        masqueradeAll: z.boolean().optional(),
        syncPeriod: duration.optional(),
        minSyncPeriod: duration.optional(),
      })
      .strict()
      .optional(),
    // kproxy only, not upstream's: the userspace data plane's workers and bounds (see userspaceField).
    userspace: z
      .object({
        workers: z.number().int().optional(),
        maxConnections: z.number().int().optional(),
        idleTimeout: duration.optional(),
        udpMaxSessions: z.number().int().optional(),
        udpMaxSessionsPerClient: z.number().int().optional(),
      })
      .strict()
      .optional(),
    winkernel: z.record(z.unknown()).optional(),
    logging: z.record(z.unknown()).optional(),
    featureGates: z.record(z.boolean()).optional(),
    mode: z.string().optional(),
    portRange: z.string().optional(),
    udpIdleTimeout: duration.optional(),
    conntrack: z.record(z.unknown()).optional(),
    configSyncPeriod: duration.optional(),
    nodePortAddresses: z.array(z.string()).nullable().optional(),
    detectLocalMode: z.string().optional(),
    detectLocal: z.record(z.unknown()).optional(),
    oomScoreAdj: z.number().int().nullable().optional(),
    showHiddenMetricsForVersion: z.string().optional(),
    syncPeriod: duration.optional(),
    minSyncPeriod: duration.optional(),
  })
  .strict();

export type RawConfig = z.infer<typeof schema>;

/** The effective configuration kproxy runs with, every default filled in. */
export interface ProxyConfig {
  mode: ModeName;
  hostnameOverride: string;
  kubeconfig: string;
  clusterCIDRs: string[];
  bindAddress: string;
  healthzBindAddress: string;
  metricsBindAddress: string;
  masqueradeAll: boolean;
  masqueradeBit: number;
  localhostNodePorts: boolean;
  /** canonical CIDRs; empty = all local addresses (upstream's default) */
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
  featureGates: Record<string, boolean>;
  /** upstream KubeProxyConntrackConfiguration, applied at start (timeouts in seconds, 0 = leave as is) */
  conntrack: ConntrackSettings;
  /** written to /proc/self/oom_score_adj at start; null leaves it */
  oomScoreAdj: number | null;
  /** kproxy only: the userspace data plane's workers and bounds */
  userspace: UserspaceSettings;
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

/** Flags from the command line; any that is set overrides the file. */
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
  const idleTimeoutMs = durationField('userspace.idleTimeout', flags.userspaceIdleTimeout ?? u.idleTimeout, 24 * 3600_000);
  const udpMaxSessions = int('udpMaxSessions', undefined, u.udpMaxSessions, 8192, 1, 1_000_000);
  const udpMaxSessionsPerClient = int('udpMaxSessionsPerClient', undefined, u.udpMaxSessionsPerClient, Math.min(1024, udpMaxSessions), 1, udpMaxSessions);
  return { workers, maxConnections, idleTimeoutMs, udpMaxSessions, udpMaxSessionsPerClient };
}

export const DETECT_LOCAL_MODES = ['ClusterCIDR', 'NodeCIDR', 'BridgeInterface', 'InterfaceNamePrefix'] as const;
export type DetectLocalMode = (typeof DETECT_LOCAL_MODES)[number];

/**
 * upstream validateProxyConfiguration (pkg/proxy/apis/config/validation): the mode is one of
 * four (empty = ClusterCIDR); BridgeInterface needs detectLocal.bridgeInterface and
 * InterfaceNamePrefix needs detectLocal.interfaceNamePrefix ("must not be empty"); an
 * interface name is at most 15 bytes (IFNAMSIZ) with no '/' or whitespace. ClusterCIDR
 * without clusterCIDR is allowed (upstream warns and detects nothing); NodeCIDR takes the
 * Node's spec.podCIDRs at run time.
 */
function detectLocalField(raw: RawConfig, flags: ConfigFlags): { mode: DetectLocalMode; bridgeInterface: string; interfaceNamePrefix: string } {
  const modeText = flags.detectLocalMode ?? raw.detectLocalMode ?? '';
  const mode = (modeText === '' ? 'ClusterCIDR' : modeText) as DetectLocalMode;
  if (!(DETECT_LOCAL_MODES as readonly string[]).includes(mode)) {
    throw new ConfigError('detectLocalMode', `unsupported value ${JSON.stringify(modeText)} (want one of ${DETECT_LOCAL_MODES.join(', ')})`);
  }
  const dl = raw.detectLocal ?? {};
  const str = (field: string, v: unknown): string => {
    if (v === undefined || v === null) return '';
    if (typeof v !== 'string') throw new ConfigError(field, `want a string, got ${JSON.stringify(v)}`);
    return v;
  };
  const bridgeInterface = flags.podBridgeInterface ?? str('detectLocal.bridgeInterface', dl.bridgeInterface);
  const interfaceNamePrefix = flags.podInterfaceNamePrefix ?? str('detectLocal.interfaceNamePrefix', dl.interfaceNamePrefix);
  for (const [field, v] of [['detectLocal.bridgeInterface', bridgeInterface], ['detectLocal.interfaceNamePrefix', interfaceNamePrefix]] as const) {
    if (v !== '' && (v.length > 15 || /[\s/]/.test(v))) throw new ConfigError(field, `invalid interface name ${JSON.stringify(v)} (at most 15 characters, no '/' or spaces)`);
  }
  if (mode === 'BridgeInterface' && bridgeInterface === '') {
    throw new ConfigError('detectLocal.bridgeInterface', 'must not be empty when detectLocalMode is BridgeInterface (set --pod-bridge-interface)');
  }
  if (mode === 'InterfaceNamePrefix' && interfaceNamePrefix === '') {
    throw new ConfigError('detectLocal.interfaceNamePrefix', 'must not be empty when detectLocalMode is InterfaceNamePrefix (set --pod-interface-name-prefix)');
  }
  for (const k of Object.keys(dl)) {
    if (k !== 'bridgeInterface' && k !== 'interfaceNamePrefix') throw new ConfigError(`detectLocal.${k}`, 'unknown field');
  }
  return { mode, bridgeInterface, interfaceNamePrefix };
}

/**
 * A duration field. Upstream treats 0 as "unset" for most periods (kubeadm writes
 * `syncPeriod: 0s`), so zeroMeansDefault keeps such configs working.
 */
function durationField(field: string, v: string | number | undefined, dflt: number, zeroMeansDefault = false): number {
  if (v === undefined) return dflt;
  const ms = parseDuration(v);
  if (ms === null) throw new ConfigError(field, `invalid duration ${JSON.stringify(v)} (want e.g. "30s", "1m", "250ms")`);
  if (ms < 0) throw new ConfigError(field, `must not be negative, got ${JSON.stringify(v)}`);
  if (ms === 0 && zeroMeansDefault) return dflt;
  return ms;
}

/**
 * upstream KubeProxyConntrackConfiguration with its v1alpha1 defaults: maxPerCore 32768,
 * min 131072, tcpEstablishedTimeout 24h, tcpCloseWaitTimeout 1h; the UDP timeouts and
 * tcpBeLiberal are left to the host unless given.
 */
function conntrackField(raw: Record<string, unknown> | undefined): ConntrackSettings {
  const r = raw ?? {};
  const known = ['maxPerCore', 'min', 'tcpEstablishedTimeout', 'tcpCloseWaitTimeout', 'tcpBeLiberal', 'udpTimeout', 'udpStreamTimeout'];
  for (const k of Object.keys(r)) if (!known.includes(k)) throw new ConfigError(`conntrack.${k}`, 'unknown field');
  const int = (k: string, dflt: number): number => {
    const v = r[k];
    if (v === undefined || v === null) return dflt;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) throw new ConfigError(`conntrack.${k}`, `must be a non-negative integer, got ${JSON.stringify(v)}`);
    return v;
  };
  const secs = (k: string, dflt: number): number => {
    const v = r[k];
    if (v === null) return 0;
    if (v !== undefined && typeof v !== 'string' && typeof v !== 'number') throw new ConfigError(`conntrack.${k}`, `invalid duration ${JSON.stringify(v)}`);
    return Math.floor(durationField(`conntrack.${k}`, v, dflt * 1000) / 1000);
  };
  const liberal = r.tcpBeLiberal;
  if (liberal !== undefined && typeof liberal !== 'boolean') throw new ConfigError('conntrack.tcpBeLiberal', 'must be true or false');
  return {
    maxPerCore: int('maxPerCore', 32768),
    min: int('min', 131072),
    tcpEstablishedTimeoutSec: secs('tcpEstablishedTimeout', 24 * 3600),
    tcpCloseWaitTimeoutSec: secs('tcpCloseWaitTimeout', 3600),
    tcpBeLiberal: liberal ?? false,
    udpTimeoutSec: secs('udpTimeout', 0),
    udpStreamTimeoutSec: secs('udpStreamTimeout', 0),
  };
}

function hostPortField(field: string, v: string): string {
  if (v === '') return v;
  const m = /^(\[[0-9a-fA-F:.]+\]|[0-9.]+)?:(\d+)$/.exec(v) ?? /^([0-9.]+)$/.exec(v);
  if (!m) throw new ConfigError(field, `invalid address ${JSON.stringify(v)} (want IP:port)`);
  const host = (m[1] ?? '').replace(/^\[|\]$/g, '');
  if (host && !canonicalIP(host)) throw new ConfigError(field, `invalid IP in ${JSON.stringify(v)}`);
  if (m[2] !== undefined && (Number(m[2]) < 0 || Number(m[2]) > 65535)) {
    throw new ConfigError(field, `port out of range in ${JSON.stringify(v)}`);
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

export function parseConfigText(text: string, source = 'config'): RawConfig {
  let doc: unknown;
  try {
    doc = parseYAML(text) ?? {};
  } catch (e) {
    throw new ConfigError(source, `not valid YAML: ${(e as Error).message}`);
  }
  const res = schema.safeParse(doc);
  if (!res.success) {
    const issue = res.error.issues[0];
    const path = issue.path.join('.') || '(root)';
    if (issue.code === 'unrecognized_keys') {
      const where = issue.path.length ? `${path}.` : '';
      throw new ConfigError(`${where}${issue.keys[0]}`, 'unknown field');
    }
    throw new ConfigError(path, issue.message);
  }
  const raw = res.data;
  if (raw.kind !== undefined && raw.kind !== 'KubeProxyConfiguration') {
    throw new ConfigError('kind', `want KubeProxyConfiguration, got ${JSON.stringify(raw.kind)}`);
  }
  if (raw.apiVersion !== undefined && raw.apiVersion !== 'kubeproxy.config.k8s.io/v1alpha1') {
    throw new ConfigError('apiVersion', `want kubeproxy.config.k8s.io/v1alpha1, got ${JSON.stringify(raw.apiVersion)}`);
  }
  return raw;
}


/** Applies upstream's defaults and the flags, validates, and returns the effective config. */
export function resolveConfig(raw: RawConfig = {}, flags: ConfigFlags = {}): ProxyConfig {
  const modeText = flags.mode ?? raw.mode ?? '';
  const mode = (modeText === '' ? 'iptables' : modeText) as ModeName;
  if (!MODES.includes(mode)) {
    throw new ConfigError('mode', `unknown mode ${JSON.stringify(modeText)} (want one of ${MODES.join(', ')})`);
  }
  const modeSection = mode === 'nftables' ? raw.nftables : raw.iptables;
  const masqueradeBit = modeSection?.masqueradeBit ?? 14;
  if (masqueradeBit < 0 || masqueradeBit > 31) {
    throw new ConfigError(`${mode === 'nftables' ? 'nftables' : 'iptables'}.masqueradeBit`, `must be in [0, 31], got ${masqueradeBit}`);
  }
  const schedText = flags.ipvsScheduler ?? raw.ipvs?.scheduler ?? '';
  const scheduler = schedText === '' ? 'rr' : schedText;
  if (!(IPVS_SCHEDULERS as readonly string[]).includes(scheduler)) {
    throw new ConfigError('ipvs.scheduler', `unknown scheduler ${JSON.stringify(schedText)} (want one of ${IPVS_SCHEDULERS.join(', ')})`);
  }
  const clusterCIDRText = flags.clusterCidr ?? raw.clusterCIDR ?? '';
  const clusterCIDRs = clusterCIDRText === '' ? [] : cidrList('clusterCIDR', clusterCIDRText.split(',').map((s) => s.trim()));
  const npaList = flags.nodeportAddresses !== undefined
    ? flags.nodeportAddresses.split(',').map((s) => s.trim()).filter(Boolean)
    : raw.nodePortAddresses ?? [];
  // upstream: "primary" may be mixed with CIDRs; both are kept.
  const nodePortAddresses = npaList.map((c, i) => {
    if (c === 'primary') return c;
    const p = parseCIDR(c);
    if (!p) throw new ConfigError(`nodePortAddresses[${i}]`, `invalid CIDR ${JSON.stringify(c)} (want a CIDR or "primary")`);
    return p.text;
  });
  const detectLocal = detectLocalField(raw, flags);

  const syncSection = mode === 'ipvs' ? raw.ipvs : modeSection;
  const sectionName = mode === 'ipvs' ? 'ipvs' : mode === 'nftables' ? 'nftables' : 'iptables';
  // Errors name the field the value came from: a top-level period wins over the mode's section.
  const syncField = raw.syncPeriod !== undefined ? 'syncPeriod' : `${sectionName}.syncPeriod`;
  const minSyncField = raw.minSyncPeriod !== undefined ? 'minSyncPeriod' : `${sectionName}.minSyncPeriod`;
  const syncPeriodMs = durationField(syncField, raw.syncPeriod ?? syncSection?.syncPeriod, 30_000, true);
  const minSyncPeriodMs = durationField(minSyncField, raw.minSyncPeriod ?? syncSection?.minSyncPeriod, mode === 'ipvs' ? 0 : 1_000, mode !== 'ipvs');
  if (syncPeriodMs === 0) throw new ConfigError(syncField, 'must be greater than 0');
  if (minSyncPeriodMs > syncPeriodMs) {
    throw new ConfigError(minSyncField, `must not exceed syncPeriod (${minSyncPeriodMs}ms > ${syncPeriodMs}ms)`);
  }

  return {
    mode,
    hostnameOverride: flags.hostnameOverride ?? raw.hostnameOverride ?? '',
    kubeconfig: flags.kubeconfig ?? raw.clientConnection?.kubeconfig ?? '',
    clusterCIDRs,
    bindAddress: raw.bindAddress ?? '0.0.0.0',
    healthzBindAddress: hostPortField('healthzBindAddress', flags.healthzBindAddress || raw.healthzBindAddress || '0.0.0.0:10256'),
    metricsBindAddress: hostPortField('metricsBindAddress', flags.metricsBindAddress || raw.metricsBindAddress || '127.0.0.1:10249'),
    masqueradeAll: flags.masqueradeAll ?? modeSection?.masqueradeAll ?? false,
    masqueradeBit,
    localhostNodePorts: raw.iptables?.localhostNodePorts ?? true,
    nodePortAddresses,
    detectLocalMode: detectLocal.mode,
    detectLocal: { bridgeInterface: detectLocal.bridgeInterface, interfaceNamePrefix: detectLocal.interfaceNamePrefix },
    syncPeriodMs,
    minSyncPeriodMs,
    udpIdleTimeoutMs: durationField('udpIdleTimeout', raw.udpIdleTimeout, 250, true),
    configSyncPeriodMs: durationField('configSyncPeriod', raw.configSyncPeriod, 15 * 60_000, true),
    ipvs: {
      scheduler,
      excludeCIDRs: cidrList('ipvs.excludeCIDRs', raw.ipvs?.excludeCIDRs ?? []),
      strictARP: raw.ipvs?.strictARP ?? false,
      tcpTimeoutMs: durationField('ipvs.tcpTimeout', raw.ipvs?.tcpTimeout, 0),
      tcpFinTimeoutMs: durationField('ipvs.tcpFinTimeout', raw.ipvs?.tcpFinTimeout, 0),
      udpTimeoutMs: durationField('ipvs.udpTimeout', raw.ipvs?.udpTimeout, 0),
      syncPeriodMs: durationField('ipvs.syncPeriod', raw.ipvs?.syncPeriod, 30_000, true),
      minSyncPeriodMs: durationField('ipvs.minSyncPeriod', raw.ipvs?.minSyncPeriod, 0),
    },
    featureGates: raw.featureGates ?? {},
    conntrack: conntrackField(raw.conntrack),
    oomScoreAdj: raw.oomScoreAdj === undefined ? -999 : raw.oomScoreAdj,
    userspace: userspaceField(raw, flags),
  };
}

/** Upstream prints the mark as %#08x of 1<<bit: "0x00004000" for bit 14. */
export function masqueradeMark(bit: number): string {
  return '0x' + (1 << bit >>> 0).toString(16).padStart(8, '0');
}
