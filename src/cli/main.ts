// kproxy's command line. Shapes are fixed by DESIGN.md ("The command line"): `kproxy [flags]`
// and `kproxy run [flags]` take kube-proxy's command line (src/cli/flags.ts, parsed as Go's
// pflag does); the other commands are commander's.
import { Command, Option } from 'commander';
import { writeFileSync } from 'node:fs';
import { stringify as toYAML } from 'yaml';
import { ConfigError, KUBE_PROXY_COMPAT, type ModeName } from '../config/config.ts';
import { loadConfigFile } from '../config/load.ts';
import { KproxyError, kproxyError } from '../errors.ts';
import { helpText, parseFlags, proxyInvocation, type ProxyInvocation } from './flags.ts';
import pkg from '../../package.json' with { type: 'json' };
import type { CommonOptions } from './options.ts';
// Each command's module is imported when the command runs: a one-shot command (`kproxy trace
// --live`) does not load the proxy's sync loop, servers and metrics, nor the other commands.

function addProxyFlags(cmd: Command): Command {
  return cmd
    .option('--config <file>', 'KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1) YAML')
    .addOption(new Option('--mode <mode>', 'proxy mode').choices(['userspace', 'iptables', 'ipvs', 'nftables']).argParser((v) => v))
    .option('--manifests <dir>', 'a directory of Kubernetes manifests (Services, EndpointSlices; other kinds are ignored) instead of a cluster')
    .option('--service-cluster-ip-range <cidrs>', 'with --manifests: the CIDR(s) Services without spec.clusterIP get cluster IPs from (kube-apiserver\'s flag; default 10.0.0.0/24)')
    .option('--service-node-port-range <range>', 'with --manifests: the range node ports are allocated from (kube-apiserver\'s flag; default 30000-32767)')
    .option('--manifests-state <file>', 'with --manifests: the state file of the allocations, read and never written here (default: where kproxy run keeps it)')
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

/** A command line or configuration kproxy refuses: exit 2 (as a usage error), else 1. */
function isUsageError(err: unknown): boolean {
  return err instanceof ConfigError || (err instanceof KproxyError && err.code === 'KPROXY_FLAG_UNKNOWN');
}

function fail(err: unknown): never {
  const msg = err instanceof Error ? err.message : String(err);
  process.stderr.write(`kproxy: ${msg}\n`);
  if (!isUsageError(err) && process.env.KPROXY_DEBUG && err instanceof Error) process.stderr.write(`${err.stack}\n`);
  process.exit(isUsageError(err) ? 2 : 1);
}

export const VERSION = `v${pkg.version}`;

/** `--version`: one line, as upstream's verflag ("Kubernetes v1.34.0"); `--version=raw` as JSON. */
export function versionText(raw: boolean): string {
  if (raw) return JSON.stringify({ gitVersion: VERSION, kubeProxyCompatible: KUBE_PROXY_COMPAT, platform: `${process.platform}/${process.arch}`, nodeVersion: process.version }, null, 2) + '\n';
  return `kproxy version ${VERSION} (kube-proxy compatible ${KUBE_PROXY_COMPAT})\n`;
}

/** Parses and resolves kube-proxy's command line; throws before anything touches the host. */
export function invocationOf(args: string[]): ProxyInvocation | { help: true } | { version: 'raw' | true } {
  const p = parseFlags(args);
  if (p.values.get('help') === true) return { help: true };
  const v = p.values.get('version');
  if (v === true || v === 'raw') return { version: v };
  const file = p.values.get('config') as string | undefined;
  return proxyInvocation(p, file ? loadConfigFile(file) : undefined);
}

/** `kproxy [flags]` and `kproxy run [flags]`: kube-proxy's command line. */
async function proxyMain(args: string[]): Promise<void> {
  const inv = invocationOf(args);
  if ('help' in inv) {
    process.stdout.write(helpText());
    return;
  }
  if ('version' in inv) {
    process.stdout.write(versionText(inv.version === 'raw'));
    return;
  }
  if (inv.writeConfigTo) {
    // upstream writeConfigFile: the effective configuration as v1alpha1 YAML, then exit 0
    for (const w of inv.warnings) process.stderr.write(`kproxy: warning: ${w}\n`);
    try {
      writeFileSync(inv.writeConfigTo, toYAML(inv.cfg.v1alpha1, { sortMapEntries: true }));
    } catch (e) {
      throw new ConfigError('--write-config-to', `cannot write ${inv.writeConfigTo}: ${(e as Error).message}`);
    }
    process.stderr.write(`kproxy: Wrote configuration file=${JSON.stringify(inv.writeConfigTo)}\n`);
    return;
  }
  const { runCommand } = await import('./run.ts');
  await runCommand({
    config: inv.configFile,
    manifests: inv.manifests,
    serviceClusterIpRange: inv.serviceClusterIPRange,
    serviceNodePortRange: inv.serviceNodePortRange,
    manifestsState: inv.manifestsState,
    logLevel: inv.logLevel,
    cleanup: inv.cleanup,
    invocation: inv,
  });
}

const COMMANDS = ['run', 'render', 'trace', 'cleanup', 'status', 'conformance', 'demo', 'help'];

export async function main(argv: string[]): Promise<void> {
  const args = argv.slice(2);
  // Bare `kproxy [flags]` runs the proxy as upstream's kube-proxy does; so does `kproxy run`.
  if (args.length === 0 || args[0].startsWith('-') || args[0] === 'run') {
    return proxyMain(args[0] === 'run' ? args.slice(1) : args).catch(fail);
  }
  if (!COMMANDS.includes(args[0])) {
    fail(kproxyError('KPROXY_FLAG_UNKNOWN', `unknown command ${JSON.stringify(args[0])}; kproxy takes kube-proxy's flags, or one of the commands ${COMMANDS.join(', ')} (kproxy --help)`));
  }
  const program = new Command('kproxy')
    .description('A Kubernetes service proxy: userspace, iptables, IPVS and nftables modes')
    .showHelpAfterError();

  addProxyFlags(program.command('render').description('dry run: print what would be applied (no root needed)'))
    .option('--node-ip <ips>', 'node IPs to plan with (default: this host\'s)')
    .action(async (o: CommonOptions) => (await import('./render.ts')).renderCommand(o).catch(fail));

  addProxyFlags(program.command('trace').description('which endpoints a packet reaches, and through which rules'))
    .option('--live', 'trace through the live kernel state instead of the planned one')
    .option('--rules <file>', 'trace through a node\'s saved rules instead: iptables-save, nft list ruleset, ipvsadm -Ln/-Sn or ipset save output (repeat for several files; docs/trace-rules.md)', (v: string, acc: string[]) => [...acc, v], [] as string[])
    .option('--rules-format <formats>', 'the format of the --rules files (iptables-save, nft, ipvsadm, ipset): one for all, or a comma-separated list in --rules order; detected from the content when absent')
    .option('--family <4|6>', 'the IP family of the --rules (detected from the files and the packet when absent)')
    .requiredOption('--from <ip>', 'source IP of the packet')
    .requiredOption('--to <ip:port>', 'destination of the packet: IP:PORT, or [IPv6]:PORT (the family picks the rules traced)')
    .option('--proto <proto>', 'tcp, udp or sctp', 'tcp')
    .option('--json', 'print {"output", "masq", "rules"} as JSON')
    .option('--node-ip <ips>', 'node IPs to plan with (default: this host\'s); with --rules, the traced node\'s IPs (addrtype LOCAL, fib type local)')
    .action(async (o) => (await import('./trace.ts')).traceCommand(o).catch(fail));

  program.command('cleanup').description('remove every mode\'s kernel state (iptables, nftables, IPVS, ipsets, kube-ipvs0, redirects)')
    .action(async () => (await import('./cleanup.ts')).cleanupCommand().catch(fail));

  program.command('status').description('ask a running kproxy how it is doing')
    .option('--healthz-address <ip:port>', 'its healthz server', '127.0.0.1:10256')
    .option('--metrics-address <ip:port>', 'its metrics server', '127.0.0.1:10249')
    .action(async (o) => (await import('./status.ts')).statusCommand(o).catch(fail));

  program.command('conformance').description('run upstream-format conformance cases; ends with "N passed, N failed"')
    .argument('[dirs...]', 'case directories or directories of cases (default: the conformance/ cases of this checkout)')
    .option('--nft-shards <list>', 'also run every flows case and every nftables case through the sharded nftables mode with these table counts, e.g. 2,3')
    .action(async (dirs: string[], o: { nftShards?: string }) => (await import('./conformance.ts')).conformanceCommand(dirs, o).catch(fail));

  program.command('demo').description('standalone demo: userspace mode on examples/manifests with backends on loopback')
    .option('--manifests <dir>', 'manifests directory (default: the examples/manifests of this checkout)')
    .option('--requests <n>', 'send N requests through the service, print where they went, and exit')
    .action(async (o) => (await import('./demo.ts')).demoCommand(o).catch(fail));

  await program.parseAsync(argv);
}

export type { ModeName };
