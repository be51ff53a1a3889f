// Per-service health-check servers, as upstream's ServiceHealthServer
// (pkg/proxy/healthcheck/service_health.go): every Service with externalTrafficPolicy Local
// and a healthCheckNodePort gets an HTTP server on that port, on the NodePort addresses,
// which load balancers probe to learn whether this node has local endpoints. 200 when it has
// some and the proxy is healthy, 503 otherwise; the body is upstream's.
import { createServer, type Server } from 'node:http';
import type { HealthCheckService, NodeView } from '../core/nodeview.ts';
import { coded } from '../errors.ts';
import type { Logger } from '../log.ts';

/** One Service's health check as one family's sync sees it (the node view decides it). */
export type { HealthCheckService } from '../core/nodeview.ts';

/** Where one family listens: every address of the family, or the resolved NodePort addresses. */
export interface HealthCheckAddresses {
  matchAll: boolean;
  ips: string[];
}

/**
 * The health-checked Services of a node view (view.healthChecks, kept by the view per changed
 * Service), in Service key order.
 */
export function healthCheckServicesOf(view: NodeView): HealthCheckService[] {
  return [...view.healthChecks].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([, s]) => s);
}

/** upstream's response body (dedented, no trailing newline) */
export function serviceHealthBody(namespace: string, name: string, localEndpoints: number, proxyHealthy: boolean): string {
  return [
    '{',
    '\t"service": {',
    `\t\t"namespace": ${JSON.stringify(namespace)},`,
    `\t\t"name": ${JSON.stringify(name)}`,
    '\t},',
    `\t"localEndpoints": ${localEndpoints},`,
    `\t"serviceProxyHealthy": ${proxyHealthy}`,
    '}',
  ].join('\n');
}

export interface ServiceHealthOptions {
  log: Logger;
  /** is the proxy healthy (upstream's healthzServer.IsHealthy: no update waited too long) */
  proxyHealthy: () => boolean;
}

interface Instance {
  namespace: string;
  name: string;
  localEndpoints: number;
}

interface Listener {
  port: number;
  host: string;
  server: Server;
}

/**
 * The servers of every family, merged per port: a port's listeners are the union of the
 * families' addresses, and its answer the Service's entry (a dual-stack Service's local
 * endpoint count is the larger of its families': one pod has an endpoint in each).
 */
export class ServiceHealthServer {
  private readonly families = new Map<4 | 6, { addresses: HealthCheckAddresses; services: HealthCheckService[] }>();
  /** by port: what the port answers */
  private instances = new Map<number, Instance>();
  /** by "host|port" */
  private readonly listeners = new Map<string, Listener>();
  /** "host|port" whose bind failed and was logged; logged again only after it succeeded or left */
  private readonly bindFailed = new Set<string>();
  private chain: Promise<void> = Promise.resolve();
  private closed = false;

  constructor(private readonly opts: ServiceHealthOptions) {}

  /** After a successful sync of a family: its addresses and its health-checked Services. */
  sync(family: 4 | 6, addresses: HealthCheckAddresses, services: HealthCheckService[]): Promise<void> {
    this.families.set(family, { addresses, services });
    return this.enqueue(() => this.reconcile());
  }

  /** The ports being served (tests, /debug). */
  ports(): number[] {
    return [...new Set([...this.listeners.values()].map((l) => l.port))].sort((a, b) => a - b);
  }

  close(): Promise<void> {
    this.closed = true;
    this.families.clear();
    return this.enqueue(() => this.reconcile());
  }

  private enqueue(fn: () => Promise<void>): Promise<void> {
    this.chain = this.chain.then(fn, fn);
    return this.chain;
  }

  private desired(): { instances: Map<number, Instance>; binds: Map<string, { port: number; host: string }> } {
    const instances = new Map<number, Instance>();
    const binds = new Map<string, { port: number; host: string }>();
    for (const [family, f] of [...this.families].sort((a, b) => a[0] - b[0])) {
      const hosts = f.addresses.matchAll ? [family === 6 ? '::' : '0.0.0.0'] : f.addresses.ips;
      for (const s of f.services) {
        const cur = instances.get(s.port);
        if (cur && (cur.namespace !== s.namespace || cur.name !== s.name)) continue; // the API forbids a shared port: the first keeps it
        if (cur) cur.localEndpoints = Math.max(cur.localEndpoints, s.localEndpoints);
        else instances.set(s.port, { namespace: s.namespace, name: s.name, localEndpoints: s.localEndpoints });
        for (const host of hosts) binds.set(`${host}|${s.port}`, { port: s.port, host });
      }
    }
    return { instances, binds };
  }

  private async reconcile(): Promise<void> {
    const { instances, binds } = this.closed ? { instances: new Map<number, Instance>(), binds: new Map<string, { port: number; host: string }>() } : this.desired();
    this.instances = instances;
    for (const [key, l] of this.listeners) {
      if (binds.has(key)) continue;
      this.listeners.delete(key);
      await closeServer(l.server);
      this.opts.log.info({ port: l.port, address: l.host }, 'closed a service health check server');
    }
    for (const key of [...this.bindFailed]) if (!binds.has(key)) this.bindFailed.delete(key);
    for (const [key, b] of binds) {
      if (this.listeners.has(key)) continue;
      const server = createServer((req, res) => {
        const inst = this.instances.get(b.port);
        if (!inst) {
          // a request raced the close of its server (upstream logs and answers nothing)
          res.destroy();
          return;
        }
        const healthy = this.opts.proxyHealthy();
        res.setHeader('Content-Type', 'application/json');
        res.setHeader('X-Content-Type-Options', 'nosniff');
        res.setHeader('X-Load-Balancing-Endpoint-Weight', String(inst.localEndpoints));
        res.writeHead(inst.localEndpoints !== 0 && healthy ? 200 : 503);
        res.end(serviceHealthBody(inst.namespace, inst.name, inst.localEndpoints, healthy));
      });
      try {
        await listenOn(server, b.port, b.host);
        this.listeners.set(key, { ...b, server });
        this.bindFailed.delete(key);
        const inst = instances.get(b.port)!;
        this.opts.log.info({ port: b.port, address: b.host, service: `${inst.namespace}/${inst.name}` }, 'serving a service health check');
      } catch (e) {
        if (this.bindFailed.has(key)) continue;
        this.bindFailed.add(key);
        const inst = instances.get(b.port)!;
        this.opts.log.error(
          { port: b.port, address: b.host, service: `${inst.namespace}/${inst.name}`, err: (e as Error).message },
          coded('KPROXY_HEALTHCHECK_BIND', `cannot serve the health check node port ${b.port} on ${b.host}; load balancers will see this node as unhealthy for the Service; free the port (retried on every sync)`),
        );
      }
    }
  }
}

function listenOn(server: Server, port: number, host: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const onError = (e: Error) => reject(e);
    server.once('error', onError);
    server.listen({ port, host, ipv6Only: host === '::', exclusive: true }, () => {
      server.off('error', onError);
      resolve();
    });
  });
}

function closeServer(server: Server): Promise<void> {
  return new Promise((resolve) => {
    server.close(() => resolve());
    server.closeAllConnections();
  });
}
