// What each KubeProxyConfiguration field does in kproxy, one line per field the decoder reads
// (SPEC in config.ts). docs/configuration.md is generated from this table, SPEC, the defaults
// resolveConfig fills in and the flag table (scripts/gen-docs.ts); the generator refuses a
// field of SPEC without a line here, or a line for a field SPEC does not have. Pure data.
import { SPEC, type Kind, type Spec } from './config.ts';

export interface FieldDoc {
  /** what the field does in kproxy (upstream's meaning unless it says otherwise) */
  help: string;
  /** kproxy's addition to upstream's v1alpha1 */
  kproxy?: boolean;
  /** the default as text, where resolveConfig's v1alpha1 output does not show it */
  dflt?: string;
}

export const FIELD_DOCS: Record<string, FieldDoc> = {
  apiVersion: { help: '`kubeproxy.config.k8s.io/v1alpha1`; another value is refused.' },
  kind: { help: '`KubeProxyConfiguration`; another value is refused.' },
  featureGates: { help: 'Feature gates by name. kproxy has none (every feature it has is on): a gate kube-proxy knows is a warning, an unknown one is refused, as upstream (`src/config/feature-gates.ts`).' },
  'clientConnection.kubeconfig': { help: 'The kubeconfig of the Kubernetes source; empty: the in-cluster configuration.' },
  'clientConnection.acceptContentTypes': { help: 'Accepted with a warning: kproxy accepts JSON only.' },
  'clientConnection.contentType': { help: 'A value other than `application/json` is a warning: kproxy talks JSON to the API server.' },
  'clientConnection.qps': { help: 'Accepted, not used: kproxy makes one list and one watch per resource, with back-off.' },
  'clientConnection.burst': { help: 'Accepted (must be ≥ 0), not used.' },
  'logging.format': { help: '`text` (klog-like lines) or `json` (pino lines). kproxy writes JSON when neither this field nor `--logging-format` is set; `--write-config-to` shows upstream\'s `text`.', dflt: 'unset (JSON lines; upstream: `text`)' },
  'logging.flushFrequency': { help: 'Accepted (a duration or nanoseconds); kproxy writes each line at once.' },
  'logging.verbosity': { help: 'klog\'s `-v`: 0–1 info, 2–4 debug, 5 and more trace (`--log-level` wins).' },
  'logging.vmodule': { help: 'Ignored with a warning: kproxy has one log level.', dflt: '`[]`' },
  'logging.options': { help: 'Accepted; kproxy does not buffer or split its log.' },
  hostnameOverride: { help: 'The Node name kproxy runs as; empty: the host name. `--hostname-override` wins over the file.' },
  bindAddress: { help: 'The node\'s primary IP family comes from it (`::` means IPv6); the default family of the health and metrics addresses.' },
  healthzBindAddress: { help: 'IP:port of `/healthz` and `/livez`; a bare IP gets port 10256; empty in the file: the default.' },
  metricsBindAddress: { help: 'IP:port of `/metrics` and `/debug/*`; a bare IP gets port 10249.' },
  bindAddressHardFail: { help: 'Accepted; kproxy treats a health or metrics address it cannot bind as fatal whatever its value.' },
  enableProfiling: { help: 'Ignored with a warning (no Go pprof; use `node --inspect`).' },
  showHiddenMetricsForVersion: { help: 'Empty or the previous minor version (`1.33`), as upstream; kproxy has no hidden metrics.' },
  mode: { help: '`userspace`, `iptables`, `ipvs` or `nftables`; empty means `iptables`. `--mode` wins over the file.', dflt: '`""` (iptables)' },
  'iptables.masqueradeBit': { help: 'The fwmark bit (0–31) that marks packets to masquerade, in every mode but nftables.' },
  'iptables.masqueradeAll': { help: 'Masquerade all traffic sent to Service cluster IPs (every mode but nftables).' },
  'iptables.localhostNodePorts': { help: 'NodePorts answer on 127.0.0.1 (iptables mode, IPv4): sets `route_localnet=1` only while such a NodePort exists, with upstream\'s CVE-2020-8558 rule.' },
  'iptables.snatNodeInternalIP': { help: 'Not supported: a warning; masqueraded traffic takes the egress interface\'s address.', dflt: '`false`' },
  'iptables.syncPeriod': { help: 'The periodic (partial) sync interval of the iptables and userspace modes.' },
  'iptables.minSyncPeriod': { help: 'How long a burst of changes is coalesced before a sync (iptables and userspace modes).' },
  'ipvs.syncPeriod': { help: 'The periodic sync interval of the ipvs mode.' },
  'ipvs.minSyncPeriod': { help: 'How long a burst of changes is coalesced before a sync (ipvs mode).' },
  'ipvs.scheduler': { help: '`rr` (when empty), `wrr`, `lc`, `wlc`, `lblc`, `lblcr`, `sh`, `dh`, `sed`, `nq` or `mh`.' },
  'ipvs.excludeCIDRs': { help: 'Virtual servers in these CIDRs are never removed by the ipvs mode.' },
  'ipvs.strictARP': { help: 'Set `arp_ignore=1` and `arp_announce=2` so the node does not answer ARP for VIPs on `kube-ipvs0`.' },
  'ipvs.tcpTimeout': { help: 'IPVS idle TCP timeout (`ipvsadm --set`); 0 leaves it.' },
  'ipvs.tcpFinTimeout': { help: 'IPVS TCP timeout after a FIN; 0 leaves it.' },
  'ipvs.udpTimeout': { help: 'IPVS UDP timeout; 0 leaves it.' },
  'nftables.masqueradeBit': { help: 'The fwmark bit (0–31) that marks packets to masquerade, in the nftables mode.' },
  'nftables.masqueradeAll': { help: 'Masquerade all traffic sent to Service cluster IPs (nftables mode).' },
  'nftables.syncPeriod': { help: 'The periodic (partial) sync interval of the nftables mode.' },
  'nftables.minSyncPeriod': { help: 'How long a burst of changes is coalesced before a sync (nftables mode).' },
  'nftables.tables': { help: 'kproxy: how many tables the nftables mode spreads the Services over: "auto" (the default: one `kube-proxy` table below 1,000 Services, then about one per 600, at most 16) or a fixed number from 1 to 64; 1 keeps upstream\'s one-table shape (docs/modes.md).' },
  'winkernel.networkName': { help: 'Windows only: a warning when set.' },
  'winkernel.sourceVip': { help: 'Windows only: a warning when set.' },
  'winkernel.enableDSR': { help: 'Windows only: a warning when set.' },
  'winkernel.rootHnsEndpointName': { help: 'Windows only: a warning when set.' },
  'winkernel.forwardHealthCheckVip': { help: 'Windows only: a warning when set.' },
  detectLocalMode: { help: 'How traffic from a pod on this node is recognised: `ClusterCIDR` (empty), `NodeCIDR` (the Node\'s `spec.podCIDRs`), `BridgeInterface`, `InterfaceNamePrefix`.' },
  'detectLocal.bridgeInterface': { help: 'The pod bridge for `BridgeInterface` (required there; at most 15 characters).' },
  'detectLocal.interfaceNamePrefix': { help: 'The pod interface prefix for `InterfaceNamePrefix` (required there).' },
  clusterCIDR: { help: 'The pod network: one CIDR or a dual-stack pair, comma-separated; used by `detectLocalMode: ClusterCIDR`, and a CIDR of a family makes that family run.' },
  nodePortAddresses: { help: 'Where NodePorts answer: CIDRs and the keywords `primary` (the Node\'s first InternalIP of each family), `localhost` (127.0.0.1, ::1) and `all` (every address), in any combination (kubernetes#138427); unset: every local address, `primary` in the nftables mode.' },
  oomScoreAdj: { help: 'Written to `/proc/self/oom_score_adj` at start (−1000 to 1000); null leaves it.' },
  'conntrack.maxPerCore': { help: '`nf_conntrack_max` = maxPerCore × cores (at least `min`), set at start in the kernel modes; 0 leaves it.' },
  'conntrack.min': { help: 'The floor of `nf_conntrack_max`.' },
  'conntrack.tcpEstablishedTimeout': { help: '`nf_conntrack_tcp_timeout_established`; 0 leaves it.' },
  'conntrack.tcpCloseWaitTimeout': { help: '`nf_conntrack_tcp_timeout_close_wait`; 0 leaves it.' },
  'conntrack.tcpBeLiberal': { help: 'Set `nf_conntrack_tcp_be_liberal=1`.' },
  'conntrack.udpTimeout': { help: '`nf_conntrack_udp_timeout`; 0 leaves it.' },
  'conntrack.udpStreamTimeout': { help: '`nf_conntrack_udp_timeout_stream`; 0 leaves it.' },
  configSyncPeriod: { help: 'Accepted and validated (> 0); kproxy\'s watches need no periodic relist.' },
  portRange: { help: 'Accepted with a warning, unused as upstream (it configured the old userspace proxy).' },
  windowsRunAsService: { help: 'Windows only: a warning when set.', dflt: '`false`' },
  udpIdleTimeout: { help: 'The userspace mode\'s UDP session idle timeout (v1alpha1 up to kube-proxy v1.28); ignored with a warning in the other modes.' },
  syncPeriod: { help: 'The periodic sync interval, whatever the mode; wins over the mode\'s section.', kproxy: true, dflt: 'unset (the mode section\'s)' },
  minSyncPeriod: { help: 'The coalescing period, whatever the mode; wins over the mode\'s section.', kproxy: true, dflt: 'unset (the mode section\'s)' },
  'userspace.workers': { help: 'Processes accepting TCP connections (1–64): N−1 workers forked beside kproxy\'s own (`--userspace-workers`).', kproxy: true },
  'userspace.maxConnections': { help: 'Open client connections at most, node-wide; 0: half the fd limit less 512, per process (`--userspace-max-connections`).', kproxy: true },
  'userspace.idleTimeout': { help: 'Close a TCP connection silent both ways this long; 0: never (`--userspace-idle-timeout`).', kproxy: true },
  'userspace.udpMaxSessions': { help: 'UDP sessions over all listeners; when all are taken, a newcomer takes the oldest session of the biggest holder.', kproxy: true },
  'userspace.udpMaxSessionsPerClient': { help: 'UDP sessions of one client IP (at most `udpMaxSessions`).', kproxy: true },
  'userspace.tcpPath': { help: '`raw` (libuv handles), `net` (`net.Socket`) or `auto` (raw where this Node has the internals); `KPROXY_USERSPACE_TCP` wins.', kproxy: true },
};

export interface ConfigField {
  path: string;
  /** the decoder's type: string, bool, int32, float, duration, strings, boolMap, flushFrequency, any */
  type: Exclude<Kind, Spec>;
}

/** Every leaf field of SPEC, in its order, with its dotted path. */
export function configFields(spec: Spec = SPEC, prefix = ''): ConfigField[] {
  return Object.entries(spec).flatMap(([name, kind]): ConfigField[] =>
    typeof kind === 'object' ? configFields(kind, `${prefix}${name}.`) : [{ path: `${prefix}${name}`, type: kind }],
  );
}
