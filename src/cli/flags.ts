// kube-proxy's command line (cmd/kube-proxy/app/options.go, and the logging flags of
// k8s.io/component-base/logs/api/v1), parsed as Go's pflag parses it, so that a DaemonSet
// written for kube-proxy starts kproxy unchanged:
//   --flag=value, --flag value, -v=4, -v 4, -v4, -h; booleans --flag, --flag=true|false|1|0|t|f;
//   "_" in a flag name reads as "-" (component-base's WordSepNormalizeFunc); "--" ends flags;
//   a repeated list flag appends and a repeated map flag merges (pflag's StringSlice,
//   MapStringBool); any other repeated flag: the last one wins.
// Precedence, as upstream's Options.Complete:
//   without --config, every flag sets its configuration field (over upstream's defaults);
//   with --config, the file replaces them all except --hostname-override and the logging
//   flags (-v, --logging-format, ...), which still apply; --master, --cleanup, --init-only,
//   --write-config-to and --version apply either way. kproxy warns once per flag that
//   --config makes it ignore (upstream ignores them silently).
// kproxy's own flags (--mode, --manifests, --log-level) apply either way.
import { ConfigError, parseDuration, resolveConfig, type ConfigFlags, type ConfigWarn, type ProxyConfig, type RawConfig } from '../config/config.ts';
import { canonicalIP } from '../core/ip.ts';
import { kproxyError } from '../errors.ts';
import { DEFAULT_SERVICE_CLUSTER_IP_RANGE, DEFAULT_SERVICE_NODE_PORT_RANGE, parseServiceClusterIPRange, parseServiceNodePortRange } from '../sources/service-alloc.ts';

type FlagType = 'string' | 'bool' | 'int32' | 'float32' | 'duration' | 'strings' | 'ip' | 'ipport' | 'mapStringBool' | 'version' | 'level';

/**
 * Where a flag applies: `config` flags set a configuration field and are ignored with
 * --config; `always` flags apply with or without it; `logging` flags apply either way and
 * override the file's logging section.
 */
type Scope = 'config' | 'always' | 'logging';

interface FlagSpec {
  name: string;
  short?: string;
  type: FlagType;
  scope: Scope;
  /** the default shown in --help, as upstream prints it */
  dflt?: string;
  help: string;
  /** kproxy's own flag (not kube-proxy's) */
  kproxy?: boolean;
  /** a one-line warning when the flag is used: what kproxy does not do with it */
  note?: string;
  /** upstream marked it deprecated or removed it; a warning says so */
  deprecated?: string;
}

const S = (name: string, type: FlagType, scope: Scope, help: string, extra: Partial<FlagSpec> = {}): FlagSpec => ({ name, type, scope, help, ...extra });

/** Every flag of kube-proxy v1.34's options.go and logsapi.AddFlags, then kproxy's own. */
export const FLAGS: FlagSpec[] = [
  S('config', 'string', 'always', 'The path to the configuration file.'),
  S('write-config-to', 'string', 'always', 'If set, write the default configuration values to this file and exit.'),
  S('cleanup', 'bool', 'always', 'If true cleanup iptables and ipvs rules and exit.'),
  S('init-only', 'bool', 'always', 'If true, perform any initialization steps that must be done with full root privileges (conntrack sysctls, oom_score_adj), and then exit.'),
  S('version', 'version', 'always', 'Print version information and quit; --version=raw prints it as JSON.'),
  S('help', 'bool', 'always', 'help for kproxy', { short: 'h' }),
  S('feature-gates', 'mapStringBool', 'config', 'A set of key=value pairs that describe feature gates for alpha/experimental features. This parameter is ignored if a config file is specified by --config.'),
  S('kubeconfig', 'string', 'config', 'Path to kubeconfig file with authorization information (the master location can be overridden by the master flag).'),
  S('master', 'string', 'always', 'The address of the Kubernetes API server (overrides any value in kubeconfig)'),
  S('kube-api-content-type', 'string', 'config', 'Content type of requests sent to apiserver.', { dflt: 'application/vnd.kubernetes.protobuf' }),
  S('kube-api-burst', 'int32', 'config', 'Burst to use while talking with kubernetes apiserver', { dflt: '10' }),
  S('kube-api-qps', 'float32', 'config', 'QPS to use while talking with kubernetes apiserver', { dflt: '5' }),
  S('hostname-override', 'string', 'always', 'If non-empty, will be used as the name of the Node that kube-proxy is running on. If unset, the node name is assumed to be the same as the node\'s hostname.'),
  S('bind-address', 'ip', 'config', 'Overrides kube-proxy\'s idea of what its node\'s primary IP is. This parameter is ignored if a config file is specified by --config.', { dflt: '0.0.0.0' }),
  S('healthz-bind-address', 'ipport', 'config', 'The IP address and port for the health check server to serve on. This parameter is ignored if a config file is specified by --config.', { dflt: '0.0.0.0:10256' }),
  S('metrics-bind-address', 'ipport', 'config', 'The IP address and port for the metrics server to serve on. Set empty to disable. This parameter is ignored if a config file is specified by --config.', { dflt: '127.0.0.1:10249' }),
  S('bind-address-hard-fail', 'bool', 'config', 'If true kube-proxy will treat failure to bind to a port as fatal and exit'),
  S('profiling', 'bool', 'config', 'If true enables profiling via web interface on /debug/pprof handler. This parameter is ignored if a config file is specified by --config.'),
  S('show-hidden-metrics-for-version', 'string', 'config', 'The previous version for which you want to show hidden metrics. Only the previous minor version is meaningful. This parameter is ignored if a config file is specified by --config.'),
  S('proxy-mode', 'string', 'config', 'Which proxy mode to use: \'iptables\' (default), \'ipvs\', \'nftables\' or (kproxy) \'userspace\'. This parameter is ignored if a config file is specified by --config.'),
  S('iptables-masquerade-bit', 'int32', 'config', 'If using the iptables or ipvs proxy mode, the bit of the fwmark space to mark packets requiring SNAT with. Must be within the range [0, 31].', { dflt: '14' }),
  S('masquerade-all', 'bool', 'config', 'SNAT all traffic sent via Service cluster IPs.'),
  S('iptables-localhost-nodeports', 'bool', 'config', 'If false, kube-proxy will disable the legacy behavior of allowing NodePort services to be accessed via localhost. (iptables mode and IPv4 only.)', { dflt: 'true' }),
  S('iptables-sync-period', 'duration', 'config', 'An interval (e.g. \'5s\', \'1m\', \'2h22m\') indicating how frequently various re-synchronizing and cleanup operations are performed. Must be greater than 0.', { dflt: '30s' }),
  S('iptables-min-sync-period', 'duration', 'config', 'The minimum period between iptables rule resyncs (e.g. \'5s\', \'1m\', \'2h22m\'). A value of 0 means every Service or EndpointSlice change will result in an immediate iptables resync.', { dflt: '1s' }),
  S('ipvs-sync-period', 'duration', 'config', 'An interval (e.g. \'5s\', \'1m\', \'2h22m\') indicating how frequently various re-synchronizing and cleanup operations are performed. Must be greater than 0.', { dflt: '30s' }),
  S('ipvs-min-sync-period', 'duration', 'config', 'The minimum period between IPVS rule resyncs (e.g. \'5s\', \'1m\', \'2h22m\').'),
  S('ipvs-scheduler', 'string', 'config', 'The ipvs scheduler type when proxy mode is ipvs'),
  S('ipvs-exclude-cidrs', 'strings', 'config', 'A comma-separated list of CIDRs which the ipvs proxier should not touch when cleaning up IPVS rules.'),
  S('ipvs-strict-arp', 'bool', 'config', 'Enable strict ARP by setting arp_ignore to 1 and arp_announce to 2'),
  S('ipvs-tcp-timeout', 'duration', 'config', 'The timeout for idle IPVS TCP connections, 0 to leave as-is. (e.g. \'5s\', \'1m\', \'2h22m\').'),
  S('ipvs-tcpfin-timeout', 'duration', 'config', 'The timeout for IPVS TCP connections after receiving a FIN packet, 0 to leave as-is.'),
  S('ipvs-udp-timeout', 'duration', 'config', 'The timeout for IPVS UDP packets, 0 to leave as-is.'),
  S('detect-local-mode', 'string', 'config', 'Mode to use to detect local traffic (ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix). This parameter is ignored if a config file is specified by --config.'),
  S('pod-bridge-interface', 'string', 'config', 'A bridge interface name. When --detect-local-mode is set to BridgeInterface, kube-proxy will consider traffic to be local if it originates from this bridge.'),
  S('pod-interface-name-prefix', 'string', 'config', 'An interface name prefix. When --detect-local-mode is set to InterfaceNamePrefix, kube-proxy will consider traffic to be local if it originates from any interface whose name begins with this prefix.'),
  S('cluster-cidr', 'string', 'config', 'The CIDR range of the pods in the cluster (a comma-separated dual-stack pair for dual-stack clusters). This parameter is ignored if a config file is specified by --config.'),
  S('nodeport-addresses', 'strings', 'config', 'A list of CIDR ranges that contain valid node IPs. The list may also hold the keywords \'primary\', \'localhost\' and \'all\', in any combination with each other and with CIDRs: \'primary\' is the node\'s primary IP(s) according to the Node object, \'localhost\' its loopback addresses, \'all\' every address. If set, connections to NodePort services are accepted only on node IPs in one of the indicated ranges. If unset, NodePort connections are accepted on all local IPs (in nftables mode, on the primary IP(s)). This parameter is ignored if a config file is specified by --config.'),
  S('oom-score-adj', 'int32', 'config', 'The oom-score-adj value for kube-proxy process. Values must be within the range [-1000, 1000]. This parameter is ignored if a config file is specified by --config.', { dflt: '-999' }),
  S('conntrack-max-per-core', 'int32', 'config', 'Maximum number of NAT connections to track per CPU core (0 to leave the limit as-is and ignore conntrack-min).', { dflt: '32768' }),
  S('conntrack-min', 'int32', 'config', 'Minimum number of conntrack entries to allocate, regardless of conntrack-max-per-core.', { dflt: '131072' }),
  S('conntrack-tcp-timeout-established', 'duration', 'config', 'Idle timeout for established TCP connections (0 to leave as-is)', { dflt: '24h0m0s' }),
  S('conntrack-tcp-timeout-close-wait', 'duration', 'config', 'NAT timeout for TCP connections in the CLOSE_WAIT state', { dflt: '1h0m0s' }),
  S('conntrack-tcp-be-liberal', 'bool', 'config', 'Enable liberal mode for tracking TCP packets by setting nf_conntrack_tcp_be_liberal to 1'),
  S('conntrack-udp-timeout', 'duration', 'config', 'Idle timeout for UNREPLIED UDP connections (0 to leave as-is)'),
  S('conntrack-udp-timeout-stream', 'duration', 'config', 'Idle timeout for ASSURED UDP connections (0 to leave as-is)'),
  S('config-sync-period', 'duration', 'config', 'How often configuration from the apiserver is refreshed. Must be greater than 0.', { dflt: '15m0s' }),
  S('healthz-port', 'int32', 'config', 'The port to bind the health check server. Use 0 to disable.', { dflt: '10256', deprecated: 'use --healthz-bind-address instead' }),
  S('metrics-port', 'int32', 'config', 'The port to bind the metrics server. Use 0 to disable.', { dflt: '10249', deprecated: 'use --metrics-bind-address instead' }),
  // flags older kube-proxy releases had (v1.28 and before), still found in DaemonSets
  S('proxy-port-range', 'string', 'config', 'Range of host ports (beginPort-endPort) for the old userspace proxy.', { deprecated: 'removed from kube-proxy with its userspace mode; ignored' }),
  S('udp-timeout', 'duration', 'config', 'How long an idle UDP connection is kept open (userspace mode).', { dflt: '250ms', deprecated: 'removed from kube-proxy with its userspace mode; kproxy\'s userspace mode honours it' }),
  S('windows-service', 'bool', 'always', 'Enable Windows Service Control Manager API integration.', { note: 'Windows only; ignored on Linux' }),
  // logging (k8s.io/component-base/logs/api/v1 AddFlags)
  S('v', 'level', 'logging', 'number for the log level verbosity (0: info; 2-4: debug; 5 and more: trace)', { short: 'v', dflt: '0' }),
  S('vmodule', 'string', 'logging', 'comma-separated list of pattern=N settings for file-filtered logging (only works for text log format)', { note: 'ignored; kproxy has one log level (-v)' }),
  S('logging-format', 'string', 'logging', 'Sets the log format. Permitted formats: "json", "text". (kproxy: "json" when neither this flag nor logging.format is set; upstream\'s default is "text")', { dflt: 'json' }),
  S('log-flush-frequency', 'duration', 'logging', 'Maximum number of seconds between log flushes', { dflt: '5s' }),
  S('log-json-info-buffer-size', 'string', 'logging', '[Alpha] In JSON format with split output streams, the info messages can be buffered for a while to increase performance.', { note: 'ignored; kproxy does not buffer its log' }),
  S('log-json-split-stream', 'bool', 'logging', '[Alpha] In JSON format, write error messages to stderr and info messages to stdout.', { note: 'ignored; kproxy writes every log line to stdout' }),
  S('log-text-info-buffer-size', 'string', 'logging', '[Alpha] In text format with split output streams, the info messages can be buffered for a while to increase performance.', { note: 'ignored; kproxy does not buffer its log' }),
  S('log-text-split-stream', 'bool', 'logging', '[Alpha] In text format, write error messages to stderr and info messages to stdout.', { note: 'ignored; kproxy writes every log line to stdout' }),
  // kproxy's own
  S('mode', 'string', 'always', 'kproxy: the proxy mode (userspace, iptables, ipvs, nftables); unlike --proxy-mode it also overrides --config', { kproxy: true }),
  S('manifests', 'string', 'always', 'kproxy: watch a directory of Kubernetes manifests (Services, EndpointSlices; other kinds are ignored) instead of a cluster', { kproxy: true }),
  S('service-cluster-ip-range', 'string', 'always', 'kproxy: with --manifests, the CIDR (or two of different families, comma-separated, for dual-stack) that Services without spec.clusterIP get their cluster IPs from, as kube-apiserver\'s flag', { kproxy: true, dflt: DEFAULT_SERVICE_CLUSTER_IP_RANGE }),
  S('service-node-port-range', 'string', 'always', 'kproxy: with --manifests, the port range (min-max, min+size or one port) NodePort and LoadBalancer Services get node ports and health check node ports from, as kube-apiserver\'s flag', { kproxy: true, dflt: DEFAULT_SERVICE_NODE_PORT_RANGE }),
  S('manifests-state', 'string', 'always', 'kproxy: with --manifests, the JSON file that keeps the allocated cluster IPs and node ports across restarts (default: manifests-<dir>-<hash>.json in /var/lib/kproxy, else $XDG_STATE_HOME/kproxy or ~/.local/state/kproxy)', { kproxy: true }),
  S('userspace-workers', 'string', 'config', 'kproxy: userspace mode: processes accepting TCP connections (userspace.workers, default 1)', { kproxy: true }),
  S('userspace-max-connections', 'string', 'config', 'kproxy: userspace mode: open client connections at most (userspace.maxConnections, default 0: from the fd limit)', { kproxy: true }),
  S('userspace-idle-timeout', 'string', 'config', 'kproxy: userspace mode: close a TCP connection idle this long (userspace.idleTimeout, default 24h, 0 = never)', { kproxy: true }),
  S('log-level', 'string', 'always', 'kproxy: log level (trace, debug, info, warn, error); overrides -v', { kproxy: true }),
];

const BY_NAME = new Map(FLAGS.map((f) => [f.name, f]));
const BY_SHORT = new Map(FLAGS.filter((f) => f.short).map((f) => [f.short!, f]));

export type FlagValue = string | boolean | number | string[] | Record<string, boolean>;

/** The command line as parsed: the flags given (by name, typed) and their order. */
export interface ParsedFlags {
  values: Map<string, FlagValue>;
  /** the raw text each flag was last given as (durations keep their Go text) */
  text: Map<string, string>;
  args: string[];
}

/** Go's strconv.ParseBool. */
function parseGoBool(v: string): boolean | null {
  if (['1', 't', 'T', 'TRUE', 'true', 'True'].includes(v)) return true;
  if (['0', 'f', 'F', 'FALSE', 'false', 'False'].includes(v)) return false;
  return null;
}

function invalid(flag: string, value: string, why: string): never {
  throw new ConfigError(`--${flag}`, `invalid argument ${JSON.stringify(value)}: ${why}`);
}

/** One flag value, checked as its pflag type's Set would. */
function convert(spec: FlagSpec, v: string, prev: FlagValue | undefined): FlagValue {
  const n = spec.name;
  switch (spec.type) {
    case 'string':
      return v;
    case 'bool': {
      const b = parseGoBool(v);
      return b === null ? invalid(n, v, 'want true or false') : b;
    }
    case 'version':
      if (v === 'raw') return 'raw';
      return parseGoBool(v) ?? invalid(n, v, 'want true, false or raw');
    case 'int32':
    case 'level': {
      if (!/^[+-]?(0[xX][0-9a-fA-F]+|0[oO]?[0-7]+|0[bB][01]+|[0-9]+)$/.test(v)) invalid(n, v, 'want an integer');
      const neg = v.startsWith('-');
      const body = v.replace(/^[+-]/, '');
      const num = /^0[0-7]+$/.test(body) ? parseInt(body, 8) : /^0[oO]/.test(body) ? parseInt(body.slice(2), 8) : Number(body);
      const val = neg ? -num : num;
      if (val < -(2 ** 31) || val >= 2 ** 31) invalid(n, v, 'out of the 32-bit range');
      if (spec.type === 'level' && val < 0) invalid(n, v, 'want a level of 0 or more');
      return val;
    }
    case 'float32': {
      const f = Number(v);
      return v.trim() === '' || !Number.isFinite(f) ? invalid(n, v, 'want a number') : f;
    }
    case 'duration':
      return parseDuration(v) === null ? invalid(n, v, 'want a duration such as "30s", "1m" or "2h22m"') : v;
    case 'strings': {
      // pflag's StringSlice: CSV; the first use replaces the default, later uses append
      const items = v === '' ? [] : v.split(',').map((s) => s.trim());
      return [...((prev as string[] | undefined) ?? []), ...items];
    }
    case 'ip':
      return canonicalIP(v) ? v : invalid(n, v, 'not a valid IP address');
    case 'ipport': {
      if (v === '' || canonicalIP(v)) return v;
      const m = /^(?:\[([^\]]*)\]|([^:[\]]*)):(\d+)$/.exec(v);
      if (!m || !canonicalIP(m[1] ?? m[2] ?? '') || Number(m[3]) > 65535) invalid(n, v, 'not in a valid format (ip or ip:port)');
      return v;
    }
    case 'mapStringBool': {
      const out: Record<string, boolean> = { ...((prev as Record<string, boolean> | undefined) ?? {}) };
      for (const pair of v.split(',')) {
        if (pair.trim() === '') continue;
        const [k, b, ...rest] = pair.split('=');
        const val = b === undefined || rest.length ? null : parseGoBool(b.trim());
        if (val === null) invalid(n, v, `${JSON.stringify(pair)}: want key=true or key=false`);
        out[k.trim()] = val;
      }
      return out;
    }
  }
}

function lookup(name: string, given: string): FlagSpec {
  const spec = BY_NAME.get(name.replace(/_/g, '-'));
  if (!spec) throw kproxyError('KPROXY_FLAG_UNKNOWN', `unknown flag: ${given}; see kproxy --help for kube-proxy's flags and kproxy's`);
  return spec;
}

/** Parses kube-proxy's command line (argv without node and the script, and without `run`). */
export function parseFlags(argv: string[]): ParsedFlags {
  const values = new Map<string, FlagValue>();
  const text = new Map<string, string>();
  const args: string[] = [];
  const set = (spec: FlagSpec, v: string) => {
    values.set(spec.name, convert(spec, v, values.get(spec.name)));
    text.set(spec.name, v);
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--') {
      args.push(...argv.slice(i + 1));
      break;
    }
    if (a.startsWith('--') && a.length > 2) {
      const eq = a.indexOf('=');
      const name = eq < 0 ? a.slice(2) : a.slice(2, eq);
      const spec = lookup(name, eq < 0 ? a : a.slice(0, eq));
      if (eq >= 0) set(spec, a.slice(eq + 1));
      else if (spec.type === 'bool' || spec.type === 'version') set(spec, 'true');
      else if (i + 1 < argv.length) set(spec, argv[++i]);
      else throw kproxyError('KPROXY_FLAG_UNKNOWN', `flag needs an argument: ${a}`);
      continue;
    }
    if (a.startsWith('-') && a.length > 1) {
      // shorthands: -h, -v=4, -v 4, -v4 (pflag)
      const spec = BY_SHORT.get(a[1]);
      if (!spec) throw kproxyError('KPROXY_FLAG_UNKNOWN', `unknown shorthand flag: ${JSON.stringify(a[1])} in ${a}; kube-proxy's flags take two dashes (--${a.slice(1).split('=')[0]}); see kproxy --help`);
      const rest = a.slice(2);
      if (spec.type === 'bool') {
        if (rest.startsWith('=')) set(spec, rest.slice(1));
        else if (rest === '') set(spec, 'true');
        else throw kproxyError('KPROXY_FLAG_UNKNOWN', `unknown shorthand flag in ${a}; see kproxy --help`);
      } else if (rest.startsWith('=')) set(spec, rest.slice(1));
      else if (rest !== '') set(spec, rest);
      else if (i + 1 < argv.length) set(spec, argv[++i]);
      else throw kproxyError('KPROXY_FLAG_UNKNOWN', `flag needs an argument: ${a}`);
      continue;
    }
    args.push(a);
  }
  return { values, text, args };
}

/** What the proxy runs with, from a parsed command line. */
export interface ProxyInvocation {
  cfg: ProxyConfig;
  /** one line each: an ignored or unsupported flag, an unknown or inapplicable config field */
  warnings: string[];
  configFile?: string;
  writeConfigTo?: string;
  cleanup: boolean;
  initOnly: boolean;
  manifests?: string;
  /** --service-cluster-ip-range, --service-node-port-range, --manifests-state (the manifests source's allocations) */
  serviceClusterIPRange?: string;
  serviceNodePortRange?: string;
  manifestsState?: string;
  /** --master: the API server URL, over the kubeconfig's (applies with or without --config) */
  master?: string;
  /** pino level: --log-level, else from -v / logging.verbosity */
  logLevel: string;
  /**
   * log line format: `text` (klog-like) or `json` when --logging-format or the file's
   * logging.format says so; JSON when neither does (kproxy's default; upstream's is text)
   */
  logFormat: 'json' | 'text';
}

/** klog verbosity → pino level: V(0..1) info, V(2..4) debug, V(5+) trace. */
export function levelForVerbosity(v: number): string {
  return v >= 5 ? 'trace' : v >= 2 ? 'debug' : 'info';
}

const get = <T extends FlagValue>(p: ParsedFlags, name: string): T | undefined => p.values.get(name) as T | undefined;

/** Copies the logging flags given over a logging section (upstream's copyLogsFromFlags). */
function loggingFromFlags(p: ParsedFlags, logging: RawConfig['logging']): RawConfig['logging'] {
  if (!['v', 'logging-format', 'log-flush-frequency'].some((n) => p.values.has(n))) return logging;
  const out = { ...(typeof logging === 'object' && logging !== null ? logging : {}) };
  if (p.values.has('v')) out.verbosity = get<number>(p, 'v');
  if (p.values.has('logging-format')) out.format = get<string>(p, 'logging-format');
  if (p.values.has('log-flush-frequency')) out.flushFrequency = get<string>(p, 'log-flush-frequency');
  return out;
}

/** The v1alpha1 document the flags describe, without --config (upstream: flags bound to the config). */
function rawFromFlags(p: ParsedFlags, mode: string): { raw: RawConfig; flags: ConfigFlags } {
  const raw: RawConfig = {};
  const flags: ConfigFlags = {};
  const has = (n: string) => p.values.has(n);
  const str = (n: string) => get<string>(p, n);
  const cc: NonNullable<RawConfig['clientConnection']> = {};
  if (has('kubeconfig')) cc.kubeconfig = str('kubeconfig');
  if (has('kube-api-content-type')) cc.contentType = str('kube-api-content-type');
  if (has('kube-api-burst')) cc.burst = get<number>(p, 'kube-api-burst');
  if (has('kube-api-qps')) cc.qps = get<number>(p, 'kube-api-qps');
  if (Object.keys(cc).length) raw.clientConnection = cc;
  if (has('feature-gates')) raw.featureGates = get<Record<string, boolean>>(p, 'feature-gates');
  if (has('bind-address')) raw.bindAddress = str('bind-address');
  if (has('bind-address-hard-fail')) raw.bindAddressHardFail = get<boolean>(p, 'bind-address-hard-fail');
  if (has('profiling')) raw.enableProfiling = get<boolean>(p, 'profiling');
  if (has('show-hidden-metrics-for-version')) raw.showHiddenMetricsForVersion = str('show-hidden-metrics-for-version');
  if (has('proxy-mode')) raw.mode = str('proxy-mode');
  const ipt: NonNullable<RawConfig['iptables']> = {};
  if (has('iptables-masquerade-bit')) ipt.masqueradeBit = get<number>(p, 'iptables-masquerade-bit');
  if (has('iptables-localhost-nodeports')) ipt.localhostNodePorts = get<boolean>(p, 'iptables-localhost-nodeports');
  if (Object.keys(ipt).length) raw.iptables = ipt;
  if (has('masquerade-all')) flags.masqueradeAll = get<boolean>(p, 'masquerade-all');
  // upstream processV1Alpha1Flags: the iptables periods set the sync periods in every mode but
  // ipvs, the ipvs periods in ipvs mode only
  const ipvsMode = mode === 'ipvs';
  const period = ipvsMode ? 'ipvs' : 'iptables';
  if (has(`${period}-sync-period`)) raw.syncPeriod = str(`${period}-sync-period`);
  if (has(`${period}-min-sync-period`)) raw.minSyncPeriod = str(`${period}-min-sync-period`);
  const ipvs: NonNullable<RawConfig['ipvs']> = {};
  if (has('ipvs-scheduler')) ipvs.scheduler = str('ipvs-scheduler');
  if (has('ipvs-exclude-cidrs')) ipvs.excludeCIDRs = get<string[]>(p, 'ipvs-exclude-cidrs');
  if (has('ipvs-strict-arp')) ipvs.strictARP = get<boolean>(p, 'ipvs-strict-arp');
  if (has('ipvs-tcp-timeout')) ipvs.tcpTimeout = str('ipvs-tcp-timeout');
  if (has('ipvs-tcpfin-timeout')) ipvs.tcpFinTimeout = str('ipvs-tcpfin-timeout');
  if (has('ipvs-udp-timeout')) ipvs.udpTimeout = str('ipvs-udp-timeout');
  if (Object.keys(ipvs).length) raw.ipvs = ipvs;
  if (has('userspace-workers')) flags.userspaceWorkers = str('userspace-workers');
  if (has('userspace-max-connections')) flags.userspaceMaxConnections = str('userspace-max-connections');
  if (has('userspace-idle-timeout')) flags.userspaceIdleTimeout = str('userspace-idle-timeout');
  if (has('detect-local-mode')) raw.detectLocalMode = str('detect-local-mode');
  const dl: NonNullable<RawConfig['detectLocal']> = {};
  if (has('pod-bridge-interface')) dl.bridgeInterface = str('pod-bridge-interface');
  if (has('pod-interface-name-prefix')) dl.interfaceNamePrefix = str('pod-interface-name-prefix');
  if (Object.keys(dl).length) raw.detectLocal = dl;
  if (has('cluster-cidr')) raw.clusterCIDR = str('cluster-cidr');
  if (has('nodeport-addresses')) raw.nodePortAddresses = get<string[]>(p, 'nodeport-addresses');
  if (has('oom-score-adj')) raw.oomScoreAdj = get<number>(p, 'oom-score-adj');
  const ct: NonNullable<RawConfig['conntrack']> = {};
  if (has('conntrack-max-per-core')) ct.maxPerCore = get<number>(p, 'conntrack-max-per-core');
  if (has('conntrack-min')) ct.min = get<number>(p, 'conntrack-min');
  if (has('conntrack-tcp-timeout-established')) ct.tcpEstablishedTimeout = str('conntrack-tcp-timeout-established');
  if (has('conntrack-tcp-timeout-close-wait')) ct.tcpCloseWaitTimeout = str('conntrack-tcp-timeout-close-wait');
  if (has('conntrack-tcp-be-liberal')) ct.tcpBeLiberal = get<boolean>(p, 'conntrack-tcp-be-liberal');
  if (has('conntrack-udp-timeout')) ct.udpTimeout = str('conntrack-udp-timeout');
  if (has('conntrack-udp-timeout-stream')) ct.udpStreamTimeout = str('conntrack-udp-timeout-stream');
  if (Object.keys(ct).length) raw.conntrack = ct;
  if (has('config-sync-period')) raw.configSyncPeriod = str('config-sync-period');
  if (has('proxy-port-range')) raw.portRange = str('proxy-port-range');
  if (has('udp-timeout')) raw.udpIdleTimeout = str('udp-timeout');
  // upstream addressFromDeprecatedFlags: --healthz-port/--metrics-port 0 disables the server,
  // another port completes a bind address given as a bare IP
  const address = (flag: string, portFlag: string, dfltHost: string, dfltPort: number): string | undefined => {
    if (!has(flag) && !has(portFlag)) return undefined;
    const port = get<number>(p, portFlag) ?? dfltPort;
    if (port === 0) return '';
    const addr = has(flag) ? str(flag)! : dfltHost;
    if (addr === '') return '';
    if (!canonicalIP(addr)) return addr;
    return addr.includes(':') ? `[${addr}]:${port}` : `${addr}:${port}`;
  };
  flags.healthzBindAddress = address('healthz-bind-address', 'healthz-port', '0.0.0.0', 10256);
  flags.metricsBindAddress = address('metrics-bind-address', 'metrics-port', '127.0.0.1', 10249);
  return { raw, flags };
}

/**
 * The effective configuration of `kproxy [flags]` / `kproxy run [flags]`, with upstream's
 * precedence. `fileRaw` is the --config document, already read (undefined without --config).
 */
export function proxyInvocation(p: ParsedFlags, fileRaw: RawConfig | undefined): ProxyInvocation {
  const warnings: string[] = [];
  const warn: ConfigWarn = (w) => warnings.push(w);
  if (p.args.length) {
    throw kproxyError('KPROXY_FLAG_UNKNOWN', `"kproxy" does not take any arguments, got ${JSON.stringify(p.args)} (commands: run, render, trace, cleanup, status, conformance, demo; a boolean flag takes --flag=false, not --flag false)`);
  }
  const given = [...p.values.keys()];
  for (const name of given) {
    const spec = BY_NAME.get(name)!;
    if (spec.deprecated) warn(`--${name}: deprecated (${spec.deprecated})`);
    if (spec.note && !(spec.type === 'bool' && p.values.get(name) === false)) warn(`--${name}: ${spec.note}`);
  }
  const mode = get<string>(p, 'mode');
  let raw: RawConfig;
  let flags: ConfigFlags;
  if (fileRaw) {
    // upstream: the file replaces every flag bound to the configuration
    const ignored = given.filter((n) => BY_NAME.get(n)!.scope === 'config');
    for (const n of ignored) warn(`--${n}: ignored because --config is given (as kube-proxy does); set it in the config file`);
    raw = { ...fileRaw };
    flags = {};
  } else {
    ({ raw, flags } = rawFromFlags(p, mode ?? get<string>(p, 'proxy-mode') ?? ''));
  }
  const logging = loggingFromFlags(p, raw.logging);
  if (logging !== undefined) raw.logging = logging;
  if (mode !== undefined) flags.mode = mode;
  // upstream processHostnameOverrideFlag: the flag wins over the file, trimmed and lower-cased
  const host = get<string>(p, 'hostname-override');
  if (host !== undefined && host.length > 0) {
    if (host.trim() === '') throw new ConfigError('--hostname-override', 'empty hostname-override is invalid');
    flags.hostnameOverride = host.trim().toLowerCase();
  }
  const cfg = resolveConfig(raw, flags, warn);
  checkAllocationFlags(get<string>(p, 'service-cluster-ip-range'), get<string>(p, 'service-node-port-range'));
  if (!get<string>(p, 'manifests')) {
    for (const n of ['service-cluster-ip-range', 'service-node-port-range', 'manifests-state']) {
      if (p.values.has(n)) warn(`--${n}: applies to --manifests only (a cluster's API server allocates for its Services); ignored`);
    }
  }
  const logLevel = get<string>(p, 'log-level') ?? levelForVerbosity(cfg.logging.verbosity);
  const formatGiven = typeof raw.logging === 'object' && raw.logging !== null && !!raw.logging.format;
  return {
    cfg,
    warnings,
    configFile: get<string>(p, 'config') || undefined,
    writeConfigTo: get<string>(p, 'write-config-to') || undefined,
    cleanup: get<boolean>(p, 'cleanup') ?? false,
    initOnly: get<boolean>(p, 'init-only') ?? false,
    manifests: get<string>(p, 'manifests'),
    serviceClusterIPRange: get<string>(p, 'service-cluster-ip-range'),
    serviceNodePortRange: get<string>(p, 'service-node-port-range'),
    manifestsState: get<string>(p, 'manifests-state') || undefined,
    master: get<string>(p, 'master') || undefined,
    logLevel,
    logFormat: formatGiven ? cfg.logging.format : 'json',
  };
}

/** The manifests source's ranges, checked as kube-apiserver checks its flags: throws ConfigError (exit 2) before anything touches the host. */
export function checkAllocationFlags(ipRange: string | undefined, nodePortRange: string | undefined): void {
  try {
    if (ipRange !== undefined) parseServiceClusterIPRange(ipRange);
  } catch (e) {
    throw new ConfigError('--service-cluster-ip-range', `invalid argument ${JSON.stringify(ipRange)}: ${(e as Error).message}`);
  }
  try {
    if (nodePortRange !== undefined) parseServiceNodePortRange(nodePortRange);
  } catch (e) {
    throw new ConfigError('--service-node-port-range', `invalid argument ${JSON.stringify(nodePortRange)}: ${(e as Error).message}`);
  }
}

/** `kproxy --help`: the commands, then every flag with upstream's help text. */
export function helpText(): string {
  const lines = [
    'kproxy: a Kubernetes service proxy (kube-proxy compatible): userspace, iptables, IPVS and nftables modes.',
    '',
    'Usage:',
    '  kproxy [flags]              run the proxy, started as kube-proxy is (same flags, same --config file)',
    '  kproxy run [flags]          the same',
    '  kproxy render|trace|cleanup|status|conformance|demo ...   see kproxy <command> --help',
    '',
    'Flags:',
  ];
  for (const f of FLAGS) {
    const name = f.short ? `-${f.short}, --${f.name}` : `    --${f.name}`;
    const type = f.type === 'bool' ? '' : f.type === 'version' ? ' version[=true]' : ` ${f.type === 'level' ? 'int' : f.type}`;
    const extra = [f.dflt !== undefined ? `(default ${f.dflt})` : '', f.deprecated ? `(DEPRECATED: ${f.deprecated})` : '', f.note ? `(kproxy: ${f.note})` : ''].filter(Boolean).join(' ');
    lines.push(`  ${(name + type).padEnd(48)} ${f.help}${extra ? ' ' + extra : ''}`);
  }
  return lines.join('\n') + '\n';
}

export const FLAG_NAMES = FLAGS.map((f) => f.name);
