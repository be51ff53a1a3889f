// Shared by the nftables kernel tests: a runner into a test's namespace, and the NodePort
// Service / EndpointSlice pairs they fill tables with.
import { spawn, type ChildProcess } from 'node:child_process';
import { hostRunner, type CommandRunner } from '../../src/kernel/runner.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';

/** Runs every command inside the network namespace `ns`. */
export function nsRunner(ns: string): CommandRunner {
  return { run: (cmd, args, opts) => hostRunner.run('ip', ['netns', 'exec', ns, cmd, ...args], opts) };
}

/** ns/svc<i>: NodePort 30000+i, ClusterIP 172.30.0.<i+1>, port 80 → 8080; ClientIP affinity when `affinitySeconds` is given. */
export function nodePortService(i: number, affinitySeconds?: number): K8sService {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { namespace: 'ns', name: `svc${i}` },
    spec: {
      type: 'NodePort',
      clusterIP: `172.30.0.${i + 1}`,
      ports: [{ name: 'http', protocol: 'TCP', port: 80, nodePort: 30000 + i }],
      ...(affinitySeconds ? { sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: affinitySeconds } } } : {}),
    },
  };
}

/** svc<i>'s slice: n ready endpoints 10.180.<i>.1…n on `nodeName`, port 8080. */
export function endpointSlice(i: number, n: number, nodeName: string): K8sEndpointSlice {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { namespace: 'ns', name: `svc${i}-x`, labels: { 'kubernetes.io/service-name': `svc${i}` } },
    addressType: 'IPv4',
    endpoints: Array.from({ length: n }, (_, k) => ({ addresses: [`10.180.${i}.${k + 1}`], conditions: { ready: true }, nodeName })),
    ports: [{ name: 'http', port: 8080, protocol: 'TCP' }],
  };
}

/** Starts `ip netns exec NS node SCRIPT ARGS...` (kept in `children` for the test's cleanup) and waits for it to print "ready" (10 s). */
export async function startReadyServer(children: ChildProcess[], ns: string, script: string, args: string[], what: string): Promise<void> {
  const child = spawn('ip', ['netns', 'exec', ns, 'node', script, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what} did not start`)), 10_000);
    child.stdout!.on('data', (d: Buffer) => {
      if (d.toString().includes('ready')) {
        clearTimeout(timer);
        resolve();
      }
    });
    child.on('exit', (code) => reject(new Error(`${what} exited ${code}`)));
  });
}
