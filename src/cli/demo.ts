// The standalone demo: backends on loopback, kproxy in userspace mode on examples/manifests,
// all in this one process, no cluster and no root needed.
import { createServer as createHttp, type Server } from 'node:http';
import { createSocket, type Socket } from 'node:dgram';
import { request } from 'node:http';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { createLogger } from '../log.ts';
import { hostRunner } from '../kernel/runner.ts';
import { modes } from '../modes/registry.ts';
import { ProxyController } from '../sync/controller.ts';
import { ManifestsSource } from '../sources/manifests.ts';
import { startServers } from '../server/servers.ts';
import { resolveConfig } from '../config/config.ts';
import { kproxyError } from '../errors.ts';

const BACKENDS = ['127.0.1.1', '127.0.1.2', '127.0.1.3'];

async function startBackends(): Promise<{ close(): Promise<void> }> {
  const http: Server[] = [];
  const udp: Socket[] = [];
  for (const [i, ip] of BACKENDS.entries()) {
    const name = `backend-${i + 1} (${ip})`;
    const s = createHttp((req, res) => {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end(`hello from ${name}\n`);
    });
    await new Promise<void>((r, j) => s.once('error', j).listen(8080, ip, () => r()));
    http.push(s);
    const u = createSocket('udp4');
    u.on('message', (msg, rinfo) => u.send(`${name}: ${msg}`, rinfo.port, rinfo.address));
    await new Promise<void>((r, j) => u.once('error', j).bind(5353, ip, () => r()));
    udp.push(u);
  }
  return {
    close: async () => {
      for (const s of http) { s.closeAllConnections(); s.close(); }
      for (const u of udp) u.close();
    },
  };
}

function get(url: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = request(url, { agent: false, timeout: 3000 }, (res) => {
      let body = '';
      res.on('data', (d) => (body += d));
      res.on('end', () => resolve(body.trim()));
    });
    req.on('error', reject);
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.end();
  });
}

/** examples/manifests of this checkout, from the sources (src/cli/) or the bundle (dist/). */
export function defaultManifests(candidates = ['../../examples/manifests', '../examples/manifests']): string {
  for (const rel of candidates) {
    const p = fileURLToPath(new URL(rel, import.meta.url));
    if (existsSync(p)) return p;
  }
  throw kproxyError('KPROXY_DEMO_MANIFESTS', 'examples/manifests not found; give --manifests DIR');
}

export async function demoCommand(opts: { manifests?: string; requests?: string }): Promise<void> {
  const o = { ...opts, manifests: opts.manifests ?? defaultManifests() };
  const log = createLogger({ level: process.env.KPROXY_LOG_LEVEL ?? 'warn' });
  const cfg = resolveConfig({ mode: 'userspace' }, { healthzBindAddress: '127.0.0.1:10256', metricsBindAddress: '127.0.0.1:10249' });
  const backends = await startBackends();
  const source = new ManifestsSource({ dir: o.manifests, nodeName: 'demo-node', log });
  const ctrl = new ProxyController({ config: cfg, nodeName: 'demo-node', mode: modes.userspace, allModes: modes, source, sourceName: 'manifests', runner: hostRunner, log, skipCleanup: true });
  await ctrl.start();
  await ctrl.loop.idle();
  const servers = await startServers({ ctrl, source, mode: 'userspace', log }, cfg.healthzBindAddress, cfg.metricsBindAddress);
  const stop = async () => {
    await ctrl.stop();
    await servers.close();
    await backends.close();
  };
  if (o.requests) {
    const n = Number(o.requests);
    const counts = new Map<string, number>();
    for (let i = 0; i < n; i++) {
      const body = await get('http://127.0.100.1:8000/');
      counts.set(body, (counts.get(body) ?? 0) + 1);
    }
    for (const [b, c] of [...counts].sort()) process.stdout.write(`${String(c).padStart(4)}  ${b}\n`);
    await stop();
    return;
  }
  process.stdout.write(`kproxy demo: userspace mode on ${o.manifests}
  backends:  ${BACKENDS.map((b) => `${b}:8080`).join(', ')} (HTTP), ${BACKENDS.map((b) => `${b}:5353`).join(', ')} (UDP)
  service:   demo/web  http://127.0.100.1:8000  ->  the three backends, round robin
             demo/echo udp 127.0.100.2:5353     ->  backends 1 and 2

Try, in another terminal:
  for i in $(seq 6); do curl -s http://127.0.100.1:8000/; done      # requests spread over the backends
  echo hi | socat - UDP:127.0.100.2:5353                             # a UDP round trip
  curl -s 127.0.0.1:10256/healthz ; curl -s 127.0.0.1:10249/debug/rules
  node bin/kproxy.js status
Edit ${o.manifests}/web.yaml (remove an endpoint) and the next curls skip it, no restart.
Ctrl-C stops.
`);
  const done = async () => { await stop(); process.exit(0); };
  process.on('SIGINT', () => void done());
  process.on('SIGTERM', () => void done());
}
