// What the commands share: their options, and how render and trace resolve the configuration
// and the node name from them. Every command module imports this; none imports main.ts.
import { hostname } from 'node:os';
import { resolveConfig, type ConfigFlags, type ProxyConfig } from '../config/config.ts';
import { loadConfigFile } from '../config/load.ts';
import { checkAllocationFlags, type ProxyInvocation } from './flags.ts';
import { allocatorConfig, type AllocatorConfig } from '../sources/service-alloc.ts';

/** The options every command takes: the configuration flags (ConfigFlags) and the command line's own. */
export interface CommonOptions extends ConfigFlags {
  config?: string;
  manifests?: string;
  cleanup?: boolean;
  /** the manifests source's allocations: kube-apiserver's --service-cluster-ip-range and --service-node-port-range, and the state file */
  serviceClusterIpRange?: string;
  serviceNodePortRange?: string;
  manifestsState?: string;
  nodeIp?: string;
  logLevel?: string;
  /** `kproxy [flags]` / `kproxy run [flags]`: the configuration resolved with upstream's precedence */
  invocation?: ProxyInvocation;
}

/** render and trace: loads --config, applies flags over it, validates: throws ConfigError before anything touches the host. */
export function effectiveConfig(o: CommonOptions): ProxyConfig {
  const raw = o.config ? loadConfigFile(o.config) : {};
  const flags: ConfigFlags = {
    mode: o.mode,
    kubeconfig: o.kubeconfig,
    hostnameOverride: o.hostnameOverride,
    clusterCidr: o.clusterCidr,
    healthzBindAddress: o.healthzBindAddress,
    metricsBindAddress: o.metricsBindAddress,
    nodeportAddresses: o.nodeportAddresses,
    masqueradeAll: o.masqueradeAll,
    ipvsScheduler: o.ipvsScheduler,
    detectLocalMode: o.detectLocalMode,
    podBridgeInterface: o.podBridgeInterface,
    podInterfaceNamePrefix: o.podInterfaceNamePrefix,
    userspaceWorkers: o.userspaceWorkers,
    userspaceMaxConnections: o.userspaceMaxConnections,
    userspaceIdleTimeout: o.userspaceIdleTimeout,
  };
  // render/trace: warnings (an unknown field, a field that does not apply) go to stderr; stdout stays the payload
  return resolveConfig(raw, flags, (w) => process.stderr.write(`kproxy: warning: ${w}\n`));
}

/** The ranges the manifests source allocates from (the flags, else kube-apiserver's defaults); throws ConfigError. */
export function allocationConfig(o: CommonOptions): AllocatorConfig {
  checkAllocationFlags(o.serviceClusterIpRange, o.serviceNodePortRange);
  return allocatorConfig(o.serviceClusterIpRange, o.serviceNodePortRange);
}

/** Node name as upstream: --hostname-override, then NODE_NAME, then the hostname, lower-cased. */
export function resolveNodeName(cfg: ProxyConfig): string {
  return (cfg.hostnameOverride || process.env.NODE_NAME || hostname()).trim().toLowerCase();
}
