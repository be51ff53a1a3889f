// Builders for userspace tests: Services and EndpointSlices as the API shapes them, turned
// into planner input through the real conversion (stateOf), so tests exercise validation too.
import { readdirSync } from 'node:fs';
import type net from 'node:net';
import { resolveConfig, type ProxyConfig } from '../../src/config/config.ts';
import { stateOf } from '../../src/conformance/case.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import type { CommandRunner } from '../../src/kernel/runner.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { createTcpForwarder, type AnyTcpForwarder } from '../../src/modes/userspace/dataplane/tcp-raw.ts';
import type { TcpForwarderOptions } from '../../src/modes/userspace/dataplane/tcp.ts';
import { clientIPAffinity, lbStatus, makeService, makeSlice } from '../support/builders.ts';

export const NODE = 'node-a';

export interface SvcOpts {
  clusterIP: string;
  ports: { name?: string; port: number; protocol?: 'TCP' | 'UDP' | 'SCTP'; nodePort?: number }[];
  type?: 'ClusterIP' | 'NodePort' | 'LoadBalancer';
  externalIPs?: string[];
  lbIPs?: string[];
  affinitySeconds?: number;
  externalTrafficPolicy?: 'Local' | 'Cluster';
  internalTrafficPolicy?: 'Local' | 'Cluster';
  sourceRanges?: string[];
}

export function svc(name: string, o: SvcOpts, namespace = 'ns'): K8sService {
  return makeService(namespace, name, {
    type: o.type ?? 'ClusterIP',
    clusterIP: o.clusterIP,
    ports: o.ports.map((p) => ({ name: p.name ?? '', port: p.port, protocol: p.protocol ?? 'TCP', nodePort: p.nodePort })),
    externalIPs: o.externalIPs,
    ...(o.affinitySeconds ? clientIPAffinity(o.affinitySeconds) : { sessionAffinity: 'None' }),
    externalTrafficPolicy: o.externalTrafficPolicy,
    internalTrafficPolicy: o.internalTrafficPolicy,
    loadBalancerSourceRanges: o.sourceRanges,
  }, o.lbIPs ? lbStatus(...o.lbIPs) : undefined);
}

export interface EpOpts {
  ip: string;
  node?: string;
  ready?: boolean;
}

export function slice(
  service: string,
  endpoints: EpOpts[],
  ports: { name?: string; port: number; protocol?: 'TCP' | 'UDP' }[],
  namespace = 'ns',
): K8sEndpointSlice {
  return makeSlice(namespace, service, {
    name: `${service}-abc`,
    endpoints: endpoints.map((e) => ({ ip: e.ip, node: e.node ?? NODE, ready: e.ready ?? true })),
    ports: ports.map((p) => ({ name: p.name ?? '', port: p.port, protocol: p.protocol })),
  });
}

/** A runner for proxiers that must not run any command (no REDIRECT rules: redirect: false). */
export const refusingRunner: CommandRunner = {
  run: async (cmd, args) => {
    throw new Error(`unexpected command: ${cmd} ${args.join(' ')}`);
  },
};

export function testConfig(raw: Record<string, unknown> = {}): ProxyConfig {
  return resolveConfig({ mode: 'userspace', ...raw });
}

export function planInput(objects: Array<K8sService | K8sEndpointSlice>, opts: { nodeIPs?: string[]; config?: ProxyConfig } = {}): PlanInput {
  return {
    state: stateOf({ mode: 'userspace', nodeName: NODE }, objects),
    config: opts.config ?? testConfig(),
    node: { nodeName: NODE, nodeIPs: opts.nodeIPs ?? ['192.168.0.2'], nodeLabels: {}, family: 4 },
  };
}

/** Open fds of a process (this one by default), from /proc. */
export function openFds(pid: number | 'self' = 'self'): number {
  return readdirSync(`/proc/${pid}/fd`).length;
}

/** Resolves with the first line a connection reads (the backend's id) or how it ended without one. */
export function firstLine(sock: net.Socket, timeoutMs = 10_000): Promise<string> {
  return new Promise((resolve) => {
    let got = '';
    const t = setTimeout(() => resolve(`timeout ${got}`), timeoutMs);
    sock.on('data', (d: Buffer) => {
      got += d.toString();
      if (got.includes('\n')) {
        clearTimeout(t);
        resolve(got.split('\n')[0]);
      }
    });
    sock.on('error', (e: NodeJS.ErrnoException) => {
      clearTimeout(t);
      resolve(`error ${e.code}`);
    });
    sock.on('close', () => {
      clearTimeout(t);
      resolve(`closed ${got}`);
    });
  });
}

/**
 * The two userspace TCP paths every forwarder test runs against: raw libuv handles
 * (src/modes/userspace/dataplane/tcp-raw.ts, the default) and net.Socket (src/modes/userspace/dataplane/tcp.ts).
 */
export const TCP_PATHS = ['raw', 'net'] as const;
export type TcpPathName = (typeof TCP_PATHS)[number];

/** A TCP forwarder on the given path (forced: a test of one path never silently gets the other). */
export function tcpForwarder(path: TcpPathName, opts: TcpForwarderOptions): AnyTcpForwarder {
  const f = createTcpForwarder(opts, path);
  if ((f.constructor.name === 'RawTcpForwarder') !== (path === 'raw')) throw new Error(`asked for the ${path} TCP path, got ${f.constructor.name}`);
  return f;
}
