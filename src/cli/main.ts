// kproxy's command line. Shapes are fixed by DESIGN.md ("The command line").
import { Command, Option } from 'commander';
import { hostname } from 'node:os';
import { resolveConfig, ConfigError, type ConfigFlags, type ProxyConfig, type ModeName } from '../config/config.ts';
import { loadConfigFile } from '../config/load.ts';
import { runCommand } from './run.ts';
import { renderCommand } from './render.ts';
import { traceCommand } from './trace.ts';
import { cleanupCommand } from './cleanup.ts';
import { statusCommand } from './status.ts';
import { conformanceCommand } from './conformance.ts';
import { demoCommand } from './demo.ts';

export interface CommonOptions {
  config?: string;
  mode?: string;
  manifests?: string;
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
  cleanup?: boolean;
  nodeIp?: string;
  logLevel?: string;
}

/** Loads --config, applies flags over it, validates: throws ConfigError before anything touches the host. */
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
  return resolveConfig(raw, flags);
}

/** Node name as upstream: --hostname-override, then NODE_NAME, then the hostname, lower-cased. */
export function resolveNodeName(cfg: ProxyConfig): string {
  return (cfg.hostnameOverride || process.env.NODE_NAME || hostname()).trim().toLowerCase();
}

function addProxyFlags(cmd: Command): Command {
  return cmd
    .option('--config <file>', 'KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1) YAML')
    .addOption(new Option('--mode <mode>', 'proxy mode').choices(['userspace', 'iptables', 'ipvs', 'nftables']).argParser((v) => v))
    .option('--manifests <dir>', 'watch a directory of Service / EndpointSlice YAML instead of a cluster')
    .option('--kubeconfig <file>', 'kubeconfig of the cluster to watch')
    .option('--hostname-override <name>', 'node name to use instead of the hostname')
    .option('--cluster-cidr <cidrs>', 'pod CIDR(s): traffic from outside is masqueraded')
    .option('--healthz-bind-address <ip:port>', 'healthz server address (default 0.0.0.0:10256)')
    .option('--metrics-bind-address <ip:port>', 'metrics and debug server address (default 127.0.0.1:10249)')
    .option('--nodeport-addresses <cidrs>', 'comma-separated CIDRs (or "primary") NodePorts are served on (default: all local addresses; nftables: primary)')
    .option('--detect-local-mode <mode>', 'how local pod traffic is recognised: ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix')
    .option('--pod-bridge-interface <name>', 'bridge interface of the pods (detectLocalMode BridgeInterface)')
    .option('--pod-interface-name-prefix <prefix>', 'name prefix of the pods\' interfaces (detectLocalMode InterfaceNamePrefix)')
    .option('--masquerade-all', 'SNAT all traffic sent to service IPs')
    .option('--ipvs-scheduler <name>', 'IPVS scheduler: rr, wrr, lc, wlc, lblc, lblcr, sh, dh, sed, nq, mh')
    .option('--userspace-workers <n>', 'userspace mode: processes accepting TCP connections (default 1)')
    .option('--userspace-max-connections <n>', 'userspace mode: open client connections at most (default 0: from the fd limit)')
    .option('--userspace-idle-timeout <duration>', 'userspace mode: close a TCP connection idle this long (default 24h, 0 = never)')
    .option('--log-level <level>', 'log level (trace, debug, info, warn, error)');
}

function fail(err: unknown): never {
  const msg = err instanceof Error ? err.message : String(err);
  process.stderr.write(`kproxy: ${msg}\n`);
  if (!(err instanceof ConfigError) && process.env.KPROXY_DEBUG && err instanceof Error) process.stderr.write(`${err.stack}\n`);
  process.exit(err instanceof ConfigError ? 2 : 1);
}

export async function main(argv: string[]): Promise<void> {
  const program = new Command('kproxy')
    .description('A Kubernetes service proxy: userspace, iptables, IPVS and nftables modes')
    .showHelpAfterError();

  addProxyFlags(program.command('run').description('run the proxy').option('--cleanup', 'remove every mode\'s kernel state and exit'))
    .action(async (o: CommonOptions) => runCommand(o).catch(fail));

  addProxyFlags(program.command('render').description('dry run: print what would be applied (no root needed)'))
    .option('--node-ip <ips>', 'node IPs to plan with (default: this host\'s)')
    .action(async (o: CommonOptions) => renderCommand(o).catch(fail));

  addProxyFlags(program.command('trace').description('which endpoints a packet reaches, and through which rules'))
    .option('--live', 'trace through the live kernel state instead of the planned one')
    .requiredOption('--from <ip>', 'source IP of the packet')
    .requiredOption('--to <ip:port>', 'destination of the packet: IP:PORT, or [IPv6]:PORT (the family picks the rules traced)')
    .option('--proto <proto>', 'tcp, udp or sctp', 'tcp')
    .option('--json', 'print {"output", "masq", "rules"} as JSON')
    .option('--node-ip <ips>', 'node IPs to plan with (default: this host\'s)')
    .action(async (o) => traceCommand(o).catch(fail));

  program.command('cleanup').description('remove every mode\'s kernel state (iptables, nftables, IPVS, ipsets, kube-ipvs0, redirects)')
    .action(async () => cleanupCommand().catch(fail));

  program.command('status').description('ask a running kproxy how it is doing')
    .option('--healthz-address <ip:port>', 'its healthz server', '127.0.0.1:10256')
    .option('--metrics-address <ip:port>', 'its metrics server', '127.0.0.1:10249')
    .action(async (o) => statusCommand(o).catch(fail));

  program.command('conformance').description('run upstream-format conformance cases; ends with "N passed, N failed"')
    .argument('<dirs...>', 'case directories or directories of cases')
    .action(async (dirs: string[]) => conformanceCommand(dirs).catch(fail));

  program.command('demo').description('standalone demo: userspace mode on examples/manifests with backends on loopback')
    .option('--manifests <dir>', 'manifests directory (default: the examples/manifests of this checkout)')
    .option('--requests <n>', 'send N requests through the service, print where they went, and exit')
    .action(async (o) => demoCommand(o).catch(fail));

  await program.parseAsync(argv);
}

export type { ModeName };
