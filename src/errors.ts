// The catalogue of KPROXY_* codes: every code a user can meet (in an error, a log line or
// /healthz) is defined here once, with what it means and what to do. Code elsewhere names a
// code only through this catalogue (the type ErrorCode), and test/errors.test.ts checks that
// every code written anywhere in src/ is here, that every entry is used and tested, and that
// README.md's "Error codes" section lists exactly these. Pure: importable from src/core and
// src/modes.

export const ERROR_CODES = {
  KPROXY_CLEANUP_FAILED: 'kproxy cleanup could not remove the state of one or more modes; the log names each mode and why, fix that (often: run as root) and run cleanup again',
  KPROXY_CLEANUP_KEPT: 'cleanup left one of kproxy\'s (or kube-proxy\'s) iptables chains in place because another program\'s chain still jumps to it; the warning names both: remove that rule, then run kproxy cleanup again',
  KPROXY_CONFIG_INVALID: 'the configuration (file or flags) is invalid; the message names the field and the value to fix. Nothing on the host was touched',
  KPROXY_CONNTRACK_FAILED: 'conntrack could not list or delete the stale entries of a sync (UDP/SCTP flows, never-DNATed TCP attempts; the tool is missing or refused the filter); the sync itself succeeded, but clients may stay on a gone endpoint, or a TCP client reusing a source port may time out, until the entry times out. Install conntrack (conntrack-tools) and run as root',
  KPROXY_DEMO_MANIFESTS: 'kproxy demo found no examples/manifests next to it; give --manifests DIR',
  KPROXY_ERROR_STORM: 'too many errors escaped within a short window: the process state cannot be trusted, so kproxy exits for its supervisor to restart it; the log holds the errors',
  KPROXY_EXEC_FAILED: 'a host command exited non-zero; the message holds its stderr. The next sync retries',
  KPROXY_EXEC_MISSING: 'a tool the mode needs (iptables-restore, nft, ipset, ipvsadm, ...) is not installed; install its package or choose another --mode',
  KPROXY_EXEC_SPAWN_FAILED: 'a host command could not be started (file descriptors, processes, memory or permissions); the message names the errno and what to check',
  KPROXY_EXEC_TIMEOUT: 'a host command did not finish in time and its process group was killed (often a held xtables lock); the next sync retries',
  KPROXY_FAMILY_UNAVAILABLE: 'one IP family cannot be served on this node (its tools are missing, or IPv6 is disabled in the kernel); the other family keeps working. Install the tool or enable the family, then restart',
  KPROXY_FLAG_UNKNOWN: 'the command line has a flag kproxy does not know (or one without its value, or a stray argument); the message names it. kproxy takes kube-proxy\'s flags (kproxy --help lists them) plus its own',
  KPROXY_HEALTHCHECK_BIND: 'a Service\'s health check node port cannot be bound on a NodePort address (another process holds it); load balancers see the node as unhealthy for that Service. Logged once; retried on every sync',
  KPROXY_IPTABLES_FAILED: 'an iptables command (create a chain, insert a jump) was refused; the message holds its stderr. Run as root with the iptables kernel modules available',
  KPROXY_IPTABLES_PARSE: 'text given as iptables-save output (or an iptables-restore payload) cannot be read; the message names the line',
  KPROXY_IPTABLES_RESTORE_FAILED: 'iptables-restore refused the rules of a sync; the message holds the refused line. The next sync is a full one',
  KPROXY_IPTABLES_RESTORE_TIMEOUT: 'iptables-restore did not finish in time (often a held xtables lock) and was killed; the next sync retries',
  KPROXY_IPTABLES_SAVE_FAILED: 'iptables-save failed, so the live rules could not be read; run as root with iptables installed',
  KPROXY_IPTABLES_TRACE: 'the iptables tracer cannot follow the ruleset it was given (a jump to a missing chain, a loop); the message says where',
  KPROXY_IPVS_APPLY_FAILED: 'ipvsadm -R refused the virtual servers of a sync and the refused lines could not be isolated; the next sync retries',
  KPROXY_IPVS_CLEANUP_INCOMPLETE: 'IPVS cleanup left state behind (virtual servers, kube-ipvs0, ipsets or rules); the message lists what, remove it by hand or run cleanup again',
  KPROXY_IPVS_IPSET_FAILED: 'ipset refused a restore or a destroy; the message holds its stderr. Install ipset and load the ip_set modules',
  KPROXY_IPVS_IPTABLES_FAILED: 'the IPVS mode\'s iptables rules (masquerade, filtering) were refused by iptables-restore; the message holds its stderr',
  KPROXY_IPVS_LINK_FAILED: 'the kube-ipvs0 dummy device or an address on it could not be set up; run as root with the dummy module available',
  KPROXY_IPVS_MODULE_MISSING: 'a kernel module IPVS mode needs (ip_vs, a scheduler, nf_conntrack) cannot be loaded; load it or choose another --mode',
  KPROXY_IPVS_REFUSED: 'one IPVS entry was left out because the kernel refused it; every other service is applied. Fix the Service the message names',
  KPROXY_LOCALHOST_NODEPORT_BIND: 'the nftables mode cannot listen on 127.0.0.1 / ::1 for a localhost NodePort (another process holds the port); logged once, counted (kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total) and retried every sync; free the port',
  KPROXY_MANIFEST_DIR: 'the --manifests directory cannot be read; check the path and its permissions',
  KPROXY_MANIFEST_INVALID: 'a manifest file (or one object in it) is invalid; the message names file:line. A broken file\'s last good content stays in force; an object skipped alone (a misspelt kind such as `apiVersion: v1` with `kind: Servce`, a document without kind) leaves the rest of its file in use',
  KPROXY_MANIFEST_STATE: 'the manifests source\'s state file (what each Service was allocated) cannot be read or written; allocations go on (the same directory allocates the same way) but may move at a restart. Give --manifests-state FILE in a writable place, or fix the file\'s permissions',
  KPROXY_NFT_APPLY: 'nft -f refused the transaction of a sync; the message holds the refused line. The next sync is a full one',
  KPROXY_NFT_INTERNAL: 'the nftables planner built an inconsistent ruleset (an element for an undeclared set): a kproxy bug, please report it',
  KPROXY_NFT_PARSE: 'text given as nft list output cannot be read; the message names the line',
  KPROXY_NFT_STALE_CHAINS: 'chains or map elements of removed services could not be deleted yet; they are retried at the next sync',
  KPROXY_NFT_TIMEOUT: 'nft -f did not finish in time and was killed; the next sync retries',
  KPROXY_NO_SOURCE: 'kproxy run has nothing to watch; give --manifests DIR or --kubeconfig FILE, or run it in a cluster',
  KPROXY_RENDER_INPUT: 'kproxy render needs --manifests DIR',
  KPROXY_SERVICE_ALLOCATION: 'a Service from the manifests directory was refused as the API server refuses it: the cluster IP or node port it asks for is held by another Service, a range is full, or its IP family has no --service-cluster-ip-range; the message names the field. It is counted as invalid, and tried again whenever an address or port is freed',
  KPROXY_SERVICE_IP_SKIPPED: 'a Service VIP (cluster, external or load balancer IP) that is loopback, unspecified, link-local, multicast or broadcast was left out by the planner (the userspace mode keeps loopback); the Service\'s other addresses are served. Fix the Service',
  KPROXY_SOURCE_API_ERROR: 'the API server answered a list or watch with an error (forbidden, not found, ...); check the RBAC of kproxy\'s service account',
  KPROXY_SOURCE_HANDLER_FAILED: 'handling one event from the API threw; that event was skipped and the others go on',
  KPROXY_SOURCE_KUBECONFIG: 'the kubeconfig cannot be used (missing, unreadable, no current context, plain HTTP); the message says what to fix',
  KPROXY_SOURCE_NODE_NAME: 'the node name is empty; pass --hostname-override NAME',
  KPROXY_SOURCE_NO_CLUSTER: 'neither a kubeconfig nor the in-cluster configuration is available; pass --kubeconfig FILE or --manifests DIR',
  KPROXY_SOURCE_UNREACHABLE: 'the API server cannot be reached (refused, cut, timed out); the last state stays in force and kproxy keeps retrying',
  KPROXY_STATUS_UNREACHABLE: 'kproxy status found no running kproxy on the metrics or healthz address; give --metrics-address and --healthz-address',
  KPROXY_SYNC_SERVICE_EXCLUDED: 'the kernel refused the rules of one Service, so that Service was left out of the sync and every other one applied; fix the Service the message names',
  KPROXY_SYSCTL_FAILED: 'a sysctl the mode needs could not be set (run as root with /proc/sys writable); at start, a warning naming the conntrack settings or oom_score_adj the host did not allow, which keep their host values',
  KPROXY_TRACE_BAD_PROTOCOL: 'a traced flow has a protocol other than tcp, udp or sctp',
  KPROXY_TRACE_INPUT: 'kproxy trace was given a bad --from, --to, --proto, --family, --node-ip, --rules FILE or --rules-format, none of --manifests DIR, --live and --rules FILE, or --rules with --manifests or --live',
  KPROXY_TRACE_NO_INPUT: 'a planned trace needs --manifests DIR (or use --live, or --rules FILE for saved rules)',
  KPROXY_TRACE_UNSUPPORTED: 'the chosen mode has no tracer',
  KPROXY_UNCAUGHT_EXCEPTION: 'an exception escaped every handler; it is logged and kproxy goes on unless they come in a storm (KPROXY_ERROR_STORM)',
  KPROXY_UNHANDLED_REJECTION: 'a promise rejection escaped every handler; it is logged and kproxy goes on unless they come in a storm (KPROXY_ERROR_STORM)',
  KPROXY_USERSPACE_BIND: 'the userspace proxy cannot listen on a Service address; free the address or change the Service',
  KPROXY_USERSPACE_NO_REDIRECT: 'iptables-restore is not usable, so the userspace mode serves only the Service addresses it can bind itself; install iptables',
  KPROXY_USERSPACE_SCTP: 'an SCTP Service port cannot be served by the userspace mode (Node has no SCTP sockets); it is refused at plan time, logged once and counted, every other port is served. Use the iptables, ipvs or nftables mode for SCTP Services',
  KPROXY_USERSPACE_UNSERVED: 'a Service port the userspace mode cannot serve (its address cannot be bound nor redirected); the message says which and why',
  KPROXY_VIEW_INTERNAL: 'the node view was built from a view an incremental build had already superseded: a kproxy bug, please report it',
} as const satisfies Record<string, string>;

export type ErrorCode = keyof typeof ERROR_CODES;

/**
 * KPROXY_* names that are environment variables, not error codes: they are read, never
 * reported, and stay out of the catalogue.
 */
export const ENV_VARS = {
  KPROXY_DEBUG: 'set to print the stack of a fatal error',
  KPROXY_LOG_LEVEL: 'the log level when no flag sets it (debug, info, warn, error)',
  KPROXY_USERSPACE_REDIRECT: 'set to 0 to keep the userspace mode from installing iptables redirects',
  KPROXY_USERSPACE_SHARED_READ: "set to 0 to make userspace TCP sockets read through Node's default path (a buffer per read) instead of the shared read buffer (benchmarks)",
  KPROXY_USERSPACE_TCP: 'net, raw or auto: the userspace TCP path (net.Socket, raw libuv handles, or raw when this Node has them); wins over userspace.tcpPath',
} as const;

/** An error a user can meet: `CODE: detail`, with the code kept for callers to test. */
export class KproxyError extends Error {
  constructor(
    readonly code: ErrorCode,
    detail: string,
  ) {
    super(`${code}: ${detail}`);
  }
}

export function kproxyError(code: ErrorCode, detail: string): KproxyError {
  return new KproxyError(code, detail);
}

/** The text of a coded log line or message: `CODE: detail`. */
export function coded(code: ErrorCode, detail: string): string {
  return `${code}: ${detail}`;
}

/** The code of an error, when it carries one of the catalogue's. */
export function errorCode(e: unknown): ErrorCode | undefined {
  const code = (e as { code?: unknown } | null | undefined)?.code;
  return typeof code === 'string' && Object.hasOwn(ERROR_CODES, code) ? (code as ErrorCode) : undefined;
}
