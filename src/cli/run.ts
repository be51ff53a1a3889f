import { type CommonOptions, allocationConfig, effectiveConfig, resolveNodeName } from './options.ts';
import { defaultStatePath } from '../sources/allocation-state.ts';
import { createLogger, type Logger } from '../log.ts';
import { hostRunner } from '../kernel/runner.ts';
import { modes } from '../modes/registry.ts';
import { ProxyController } from '../sync/controller.ts';
import { ManifestsSource } from '../sources/manifests.ts';
import { startServers } from '../server/servers.ts';
import { ServiceHealthServer, healthCheckServicesOf } from '../server/service-health.ts';
import { cleanupAll } from './cleanup.ts';
import { installProcessGuards } from './guards.ts';
import type { Source } from '../sources/types.ts';
import { detectLocalNotice, type ProxyConfig } from '../config/config.ts';
import { kproxyError } from '../errors.ts';
import { availableParallelism } from 'node:os';
import { procSysctl } from '../kernel/sysctl.ts';
import { applyStartSettings, conntrackCleaner } from '../kernel/conntrack.ts';
import { watchConfigFile, CONFIG_CHANGED_MESSAGE } from './config-watch.ts';
import { announceModeNotices } from './mode-announce.ts';
import type { NodeEventRecorder } from '../sources/k8s-events.ts';
import { boundHeapGrowth } from '../sync/memory.ts';

export async function createSource(o: CommonOptions, cfg: ProxyConfig, nodeName: string, log: Logger): Promise<Source> {
  if (o.manifests) {
    const statePath = o.manifestsState ?? defaultStatePath(o.manifests);
    return new ManifestsSource({ dir: o.manifests, nodeName, log: log.child({ source: 'manifests' }), allocation: allocationConfig(o), statePath });
  }
  const master = o.invocation?.master;
  if (cfg.kubeconfig || master || process.env.KUBERNETES_SERVICE_HOST) {
    // Loaded only when needed: @kubernetes/client-node is ~1000 modules, seconds of start-up
    // on a small node (minutes in the software-emulated IPVS test VM) that --manifests never uses.
    const { createKubernetesSource } = await import('../sources/kubernetes.ts');
    return createKubernetesSource({ kubeconfig: cfg.kubeconfig || undefined, master, nodeName, log: log.child({ source: 'kubernetes' }) });
  }
  throw kproxyError('KPROXY_NO_SOURCE', 'nothing to watch; give --manifests DIR (no cluster), --kubeconfig FILE or --master URL, or run in a cluster');
}

/** The Kubernetes source's event recorder (loaded only with it, as the source is). */
async function nodeEventRecorder(o: CommonOptions, cfg: ProxyConfig, nodeName: string, log: Logger): Promise<NodeEventRecorder | undefined> {
  const { loadKubeConfig } = await import('../sources/kubernetes.ts');
  const { createNodeEventRecorder } = await import('../sources/k8s-events.ts');
  try {
    return createNodeEventRecorder(loadKubeConfig({ kubeconfig: cfg.kubeconfig || undefined, master: o.invocation?.master }), nodeName, log.child({ component: 'events' }));
  } catch (err) {
    // the source loaded the same configuration a moment ago; events are advice, the log has the warning
    log.warn({ err: (err as Error).message }, 'no event recorder; notices go to the log only');
    return undefined;
  }
}

export async function runCommand(o: CommonOptions): Promise<void> {
  const cfg = o.invocation?.cfg ?? effectiveConfig(o);
  const log = createLogger({ level: o.logLevel, format: o.invocation?.logFormat });
  for (const w of o.invocation?.warnings ?? []) log.warn(w);
  if (o.cleanup) {
    await cleanupAll(hostRunner, log);
    return;
  }
  if (o.invocation?.initOnly) {
    // upstream --init-only: the steps that need full root privileges, then exit
    await applyStartSettings({ conntrack: cfg.mode === 'userspace' ? null : cfg.conntrack, oomScoreAdj: cfg.oomScoreAdj, cpus: availableParallelism(), sysctl: procSysctl(), proc: procSysctl('/proc'), log });
    log.info('init-only: initialization done; exiting');
    return;
  }
  // upstream: a change of the --config file ends the process (exit 1) so the pod restarts with it
  if (o.invocation?.configFile) {
    watchConfigFile(o.invocation.configFile, () => {
      log.error({ err: CONFIG_CHANGED_MESSAGE, file: o.invocation?.configFile }, 'Error running ProxyServer');
      process.exit(1);
    });
  }
  // A long-running kproxy logs an error that escapes every handler and keeps going (node's
  // default would exit 1 and leave the node unserviced until a restart).
  installProcessGuards(log);
  // Before the load: its garbage would otherwise grow the heap to the process's peak
  // (src/sync/memory.ts). The cap costs more collections; in the userspace mode the CPU is the
  // data plane's, so that mode keeps V8's own sizing.
  if (cfg.mode !== 'userspace') boundHeapGrowth();
  const nodeName = resolveNodeName(cfg);
  const source = await createSource(o, cfg, nodeName, log);
  const mode = modes[cfg.mode];
  log.info({ mode: cfg.mode, nodeName, source: o.manifests ? `manifests:${o.manifests}` : 'kubernetes' }, 'starting kproxy');
  // KEP-5495 / KEP-5343: the mode's deprecation and default-change warnings; not awaited, so
  // that a slow API server never delays the first sync
  void announceModeNotices(cfg, log, o.manifests ? undefined : await nodeEventRecorder(o, cfg, nodeName, log));
  // upstream server_linux.go: conntrack sysctls and oom_score_adj before anything else. The
  // userspace mode does no NAT through conntrack, so it leaves the host's conntrack settings
  // alone (the standalone demo must not retune a workstation's conntrack table).
  await applyStartSettings({ conntrack: cfg.mode === 'userspace' ? null : cfg.conntrack, oomScoreAdj: cfg.oomScoreAdj, cpus: availableParallelism(), sysctl: procSysctl(), proc: procSysctl('/proc'), log });
  const conntrack = cfg.mode === 'userspace' ? undefined : conntrackCleaner(hostRunner, log);
  const ctrl = new ProxyController({ config: cfg, nodeName, mode, allModes: modes, source, sourceName: o.manifests ? 'manifests' : 'kubernetes', runner: hostRunner, log, conntrack });
  const localNotice = detectLocalNotice(cfg, ctrl.families[0]?.family);
  if (localNotice) log.info(localNotice.fields, localNotice.msg);
  // Health first: while the source waits for its first list, /healthz must answer (503).
  const servers = await startServers(
    { ctrl, source, mode: cfg.mode, log },
    cfg.healthzBindAddress,
    cfg.metricsBindAddress,
  );
  // Per-service health checks (eTP Local LoadBalancers): after each family's successful sync,
  // from its node view, as upstream's proxiers call SyncServices/SyncEndpoints.
  const serviceHealth = new ServiceHealthServer({ log: log.child({ component: 'service-health' }), proxyHealthy: () => ctrl.health.verdict().live });
  ctrl.onSync((rec) => {
    for (const r of rec.families ?? []) {
      const view = r.ok ? ctrl.families.find((f) => f.family === r.family)?.lastView : undefined;
      if (view) void serviceHealth.sync(r.family, view.nodePorts, healthCheckServicesOf(view));
    }
  });
  await ctrl.start();
  let stopping = false;
  const shutdown = async (sig: string) => {
    if (stopping) return;
    stopping = true;
    log.info({ signal: sig }, 'stopping; kernel rules stay in place for the next start');
    const force = setTimeout(() => process.exit(0), 5000);
    force.unref();
    await ctrl.stop().catch(() => {});
    await servers.close().catch(() => {});
    await serviceHealth.close().catch(() => {});
    process.exit(0);
  };
  process.on('SIGINT', () => void shutdown('SIGINT'));
  process.on('SIGTERM', () => void shutdown('SIGTERM'));
}
