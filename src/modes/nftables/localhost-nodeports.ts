// Localhost NodePorts in the nftables mode (KEP-6032, kubernetes#138427; upstream
// pkg/proxy/localnodeportproxy, gate KubeProxyNFTablesLocalhostNodePorts). nftables cannot DNAT
// a packet to 127.0.0.1 without route_localnet, which the nftables mode never sets, so a
// connection from the node to 127.0.0.1:<nodePort> (or [::1]:<nodePort>) is served by a
// userspace TCP listener on the family's loopback address instead, beside the ruleset. The
// listeners are the userspace mode's data plane (dataplane/tcp.ts, tcp-raw.ts, balancer.ts),
// reconciled on every sync from the node view: only when the view opts in
// (NodeSettings.localhostNodePortProxy), only TCP, only NodePorts whose external traffic has
// endpoints (externalTrafficPolicy Local: the node-local ones; none, no listener).
import type { Logger } from '../../log.ts';
import type { ProxyConfig } from '../../config/config.ts';
import { settingsOf, viewOf, type NodeView, type PlanInput } from '../../core/nodeview.ts';
import type { Proxier, SyncStats } from '../types.ts';
import { RoundRobinBalancer, type BalancedEndpoint } from '../userspace/dataplane/balancer.ts';
import { processBudgets } from '../userspace/dataplane/limits.ts';
import { newCounters, type ForwardCounters } from '../userspace/dataplane/tcp.ts';
import { createTcpForwarder, type AnyTcpForwarder } from '../userspace/dataplane/tcp-raw.ts';

/** One NodePort to serve on loopback (upstream's NodePortSpec). */
export interface LocalhostNodePort {
  /** "TCP/<nodePort>": one listener per NodePort, as upstream's nodePortKey */
  key: string;
  /** the service port it serves ("ns/name:port") */
  servicePortKey: string;
  nodePort: number;
  endpoints: BalancedEndpoint[];
  /** ClientIP affinity in seconds, 0 when none: every loopback client shares one source, so it pins the listener */
  affinitySeconds: number;
}

/**
 * The loopback listeners a view asks for (upstream nftables syncProxyRules building the
 * LocalNodePortProxy's specs): none unless the view opts in; TCP NodePorts only (UDP and SCTP
 * are not proxied); the external endpoints, i.e. the node-local ones with externalTrafficPolicy
 * Local; a NodePort left without endpoints has no listener (upstream SyncNodePorts skips an
 * empty list: no fallback to remote endpoints under eTP Local).
 */
export function localhostNodePorts(view: NodeView): LocalhostNodePort[] {
  if (!view.localhostNodePortProxy) return [];
  const out = new Map<string, LocalhostNodePort>();
  // the view's map as it is (no sort per sync: a partial sync of 50,000 ports stays cheap)
  for (const pv of view.ports.values()) {
    const sp = pv.sp;
    if (sp.nodePort === 0 || sp.protocol !== 'TCP' || pv.externalVerdict !== 'forward') continue;
    const eps = pv.externalPolicy === 'local' ? pv.localEndpoints : pv.clusterEndpoints;
    if (eps.length === 0) continue;
    const key = `TCP/${sp.nodePort}`;
    // the API server gives each NodePort of a protocol to one Service port; should two claim one, the first in key order keeps it
    const held = out.get(key);
    if (held && held.servicePortKey < sp.key) continue;
    out.set(key, {
      key,
      servicePortKey: sp.key,
      nodePort: sp.nodePort,
      endpoints: eps.map((e) => ({ key: e.key, ip: e.ip, port: e.port })),
      affinitySeconds: pv.affinitySeconds,
    });
  }
  return [...out.values()];
}

interface LiveListener {
  spec: LocalhostNodePort;
  fwd: AnyTcpForwarder;
  balancer: RoundRobinBalancer;
  counters: ForwardCounters;
}

export interface LocalhostNodePortOptions {
  config: ProxyConfig;
  log: Logger;
  family: 4 | 6;
  /** dial attempts per connection (tests shorten them); default the data plane's */
  dialTimeoutsMs?: number[];
}

/** What a reconcile changed: listeners opened and closed, NodePorts that could not be bound. */
export interface ListenerChanges {
  opened: string[];
  closed: string[];
  failed: string[];
}

/** The loopback listener set of one family (upstream's LocalNodePortProxy). */
export class LocalhostNodePortListeners {
  private readonly live = new Map<string, LiveListener>();
  /** NodePorts whose bind failed, logged once until they bind or leave */
  private failedLogged = new Set<string>();
  private failures = 0;

  constructor(private readonly opts: LocalhostNodePortOptions) {}

  get host(): string {
    return this.opts.family === 6 ? '::1' : '127.0.0.1';
  }

  /** Opens, updates and closes listeners to match `wanted`. A NodePort that cannot be bound (a host process owns it) is counted, logged and retried next sync; the others carry on. */
  async reconcile(wanted: LocalhostNodePort[]): Promise<ListenerChanges> {
    const byKey = new Map(wanted.map((w) => [w.key, w]));
    const changes: ListenerChanges = { opened: [], closed: [], failed: [] };
    for (const [key, l] of this.live) {
      if (byKey.has(key)) continue;
      // stops accepting; spliced connections finish on their own
      l.fwd.close();
      this.live.delete(key);
      changes.closed.push(key);
    }
    const failedNow = new Set<string>();
    for (const spec of wanted) {
      const l = this.live.get(spec.key);
      if (l) {
        this.update(l, spec);
        continue;
      }
      try {
        this.live.set(spec.key, await this.open(spec));
        changes.opened.push(spec.key);
      } catch (e) {
        this.failures++;
        failedNow.add(spec.key);
        changes.failed.push(spec.key);
        if (!this.failedLogged.has(spec.key)) {
          this.opts.log.warn({ code: 'KPROXY_LOCALHOST_NODEPORT_BIND', servicePort: spec.servicePortKey, address: `${this.host}:${spec.nodePort}`, err: (e as Error).message },
            `KPROXY_LOCALHOST_NODEPORT_BIND: cannot listen on ${this.host} port ${spec.nodePort} for ${spec.servicePortKey} (${(e as Error).message}); localhost connections to this NodePort fail until the port is free (retried every sync)`);
        }
      }
    }
    this.failedLogged = failedNow;
    return changes;
  }

  private async open(spec: LocalhostNodePort): Promise<LiveListener> {
    const us = this.opts.config.userspace;
    const balancer = new RoundRobinBalancer({ stickyMaxAgeSeconds: spec.affinitySeconds });
    balancer.setEndpoints(spec.endpoints);
    const counters = newCounters();
    const fwd = createTcpForwarder({
      host: this.host, port: spec.nodePort, balancer, counters, log: this.opts.log,
      dialTimeoutsMs: this.opts.dialTimeoutsMs, budget: processBudgets(us).tcp, idleTimeoutMs: us.idleTimeoutMs,
    }, us.tcpPath);
    await fwd.listen();
    return { spec, fwd, balancer, counters };
  }

  /** The same NodePort with other endpoints or affinity: removed endpoints get no new connections, open ones carry on. */
  private update(l: LiveListener, spec: LocalhostNodePort): void {
    l.spec = spec;
    l.balancer.setStickyMaxAge(spec.affinitySeconds);
    l.balancer.setEndpoints(spec.endpoints);
  }

  /** open listeners (the gauge kubeproxy_nftables_localhost_nodeport_listeners) */
  get size(): number {
    return this.live.size;
  }

  /** binds that failed since start (kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total) */
  get creationFailures(): number {
    return this.failures;
  }

  /** the open listeners, one line each (for /debug/rules) */
  describe(): string[] {
    return [...this.live.values()]
      .sort((a, b) => a.spec.nodePort - b.spec.nodePort)
      .map((l) => `${this.opts.family === 6 ? `[${this.host}]` : this.host}:${l.spec.nodePort} tcp -> ${l.spec.endpoints.map((e) => e.key).join(', ')}${l.spec.affinitySeconds ? ` (ClientIP affinity ${l.spec.affinitySeconds}s)` : ''}  # ${l.spec.servicePortKey}`);
  }

  /** Closes every listener and its open connections. */
  stop(): void {
    for (const l of this.live.values()) l.fwd.destroy();
    this.live.clear();
  }
}

/**
 * The nftables mode's proxier with localhost NodePorts: the ruleset proxier syncs first (its
 * failure fails the sync, the listeners stay as they were), then the loopback listeners follow
 * the same view.
 */
export class NftWithLocalhostNodePorts implements Proxier {
  readonly listeners: LocalhostNodePortListeners;

  constructor(readonly nft: Proxier, opts: LocalhostNodePortOptions) {
    this.listeners = new LocalhostNodePortListeners(opts);
  }

  async sync(input: PlanInput, changed: Set<string>, full: boolean): Promise<SyncStats> {
    const stats = await this.nft.sync(input, changed, full);
    // settings first: the ports are only looked at when the view opts in
    const wanted = settingsOf(input).localhostNodePortProxy ? localhostNodePorts(viewOf(input)) : [];
    if (wanted.length === 0 && this.listeners.size === 0) return stats;
    const c = await this.listeners.reconcile(wanted);
    const lines = [...c.opened.map((k) => `+ localhost ${k}`), ...c.closed.map((k) => `- localhost ${k}`)];
    if (lines.length === 0) return stats;
    return { ...stats, diff: [stats.diff, ...lines].filter(Boolean).join('\n') };
  }

  /** the ruleset proxier's last transaction (tests of the ruleset proxier reach it through here) */
  lastTransactionText(): string {
    const n = this.nft as Proxier & { lastTransactionText?: () => string };
    return n.lastTransactionText ? n.lastTransactionText() : '';
  }

  /** the gauge and the failure counter of this family, for /metrics */
  localhostNodePorts(): { listeners: number; creationFailures: number } {
    return { listeners: this.listeners.size, creationFailures: this.listeners.creationFailures };
  }

  dump(): string {
    const text = this.nft.dump();
    const lines = this.listeners.describe();
    if (lines.length === 0) return text;
    return `${text}${text.endsWith('\n') || text === '' ? '' : '\n'}# localhost NodePorts (userspace listeners)\n${lines.map((l) => `# ${l}`).join('\n')}\n`;
  }

  async stop(): Promise<void> {
    this.listeners.stop();
    await this.nft.stop();
  }
}
