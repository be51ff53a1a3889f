// The test API server (apiserver.ts) as a child process, so it can run inside a network
// namespace next to kproxy (`ip netns exec NS node --import tsx apiserver-main.ts ...`).
//
// Usage: apiserver-main.ts [--port N] [--tls] [--token T] [--kubeconfig FILE]
// It listens on 127.0.0.1 (of its namespace), writes a kubeconfig for itself when asked, and
// prints one line when ready:  {"event":"ready","url":...,"port":...}
// Then it reads one JSON command per line on stdin and answers one JSON line per command:
//   {"id": 1, "op": "create"|"update"|"apply", "resource": "services", "object": {...}}
//   {"id": 2, "op": "remove", "resource": "endpointslices", "namespace": "t", "name": "web-1"}
//   {"id": 3, "op": "dropWatches", "graceful"?: bool}   → result: number of streams cut
//   {"id": 4, "op": "compact"}                           (watches from older versions get 410)
//   {"id": 5, "op": "stop"} / {"op": "start"}           (same port, state and history kept)
//   {"id": 6, "op": "status"}                            → {running, resourceVersion, watches, lists, watchRequests, lastRequestAt}
//   {"id": 7, "op": "batch", "ops": [...]}               ops run back to back, with no I/O in
//                                                         between (no client can reconnect mid-batch)
//   answer: {"id": 1, "ok": true, "result": ...} or {"id": 1, "ok": false, "error": "..."}
// It exits when stdin closes (the test went away) or after 15 minutes at most.
import { createInterface } from 'node:readline';
import { TestApiServer, type KObject, type ResourceName } from './apiserver.ts';

interface Command {
  id?: number;
  op: string;
  resource?: ResourceName;
  object?: KObject;
  namespace?: string;
  name?: string;
  graceful?: boolean;
  ops?: Command[];
}

function argValue(args: string[], flag: string): string | undefined {
  const i = args.indexOf(flag);
  return i >= 0 ? args[i + 1] : undefined;
}

const args = process.argv.slice(2);
const port = Number(argValue(args, '--port') ?? 0);
const token = argValue(args, '--token');
const kubeconfig = argValue(args, '--kubeconfig');

const server = await TestApiServer.start({ tls: args.includes('--tls'), token, port });
if (kubeconfig) server.writeKubeconfig(kubeconfig);

const RESOURCES: ResourceName[] = ['services', 'endpointslices', 'nodes'];

function statusOf(): Record<string, unknown> {
  const last = server.requests.at(-1);
  return {
    running: server.running,
    resourceVersion: server.resourceVersion,
    watches: server.watchCount(),
    lists: Object.fromEntries(RESOURCES.map((r) => [r, server.count(r, 'list')])),
    watchRequests: Object.fromEntries(RESOURCES.map((r) => [r, server.count(r, 'watch')])),
    requests: server.requests.length,
    lastRequest: last ? { path: last.path, watch: last.watch, status: last.status } : null,
    firstRequestAfterStartMs: firstRequestAfterStartMs(),
  };
}

// When the server last came back, and when the first request of each resource arrived
// after that: how long the client's back-off kept it away.
let startedAt = Date.now();
let requestsAtStart = 0;
function firstRequestAfterStartMs(): Record<string, number | null> {
  const out: Record<string, number | null> = {};
  for (const r of RESOURCES) {
    const first = server.requests.slice(requestsAtStart).find((q) => q.path.endsWith(`/${r}`));
    out[r] = first ? first.at - startedAt : null;
  }
  return out;
}

function need<T>(v: T | undefined, what: string): T {
  if (v === undefined) throw new Error(`${what} is required`);
  return v;
}

/** Synchronous ops (everything but stop/start) so a batch runs without yielding. */
function runSync(c: Command): unknown {
  switch (c.op) {
    case 'create':
      return server.create(need(c.resource, 'resource'), need(c.object, 'object')).metadata?.resourceVersion;
    case 'update':
      return server.update(need(c.resource, 'resource'), need(c.object, 'object')).metadata?.resourceVersion;
    case 'apply':
      return server.apply(need(c.resource, 'resource'), need(c.object, 'object')).metadata?.resourceVersion;
    case 'remove':
      server.remove(need(c.resource, 'resource'), c.namespace, need(c.name, 'name'));
      return server.resourceVersion;
    case 'dropWatches':
      return server.dropWatches({ graceful: c.graceful });
    case 'compact':
      server.compact();
      return server.resourceVersion;
    case 'status':
      return statusOf();
    case 'batch':
      return need(c.ops, 'ops').map(runSync);
    default:
      throw new Error(`unknown op ${JSON.stringify(c.op)}`);
  }
}

async function run(c: Command): Promise<unknown> {
  if (c.op === 'stop') {
    await server.stop();
    return null;
  }
  if (c.op === 'start') {
    await server.start();
    startedAt = Date.now();
    requestsAtStart = server.requests.length;
    return null;
  }
  return runSync(c);
}

function reply(o: Record<string, unknown>): void {
  process.stdout.write(JSON.stringify(o) + '\n');
}

async function shutdown(code: number): Promise<never> {
  await server.close().catch(() => {});
  process.exit(code);
}

// Commands run strictly in order: a "start" must finish before the mutation after it.
let chain: Promise<void> = Promise.resolve();
const rl = createInterface({ input: process.stdin });
rl.on('line', (line) => {
  if (!line.trim()) return;
  chain = chain.then(async () => {
    let c: Command;
    try {
      c = JSON.parse(line) as Command;
    } catch (e) {
      reply({ ok: false, error: `bad JSON: ${(e as Error).message}` });
      return;
    }
    try {
      reply({ id: c.id, ok: true, result: (await run(c)) ?? null });
    } catch (e) {
      reply({ id: c.id, ok: false, error: (e as Error).message });
    }
  });
});
rl.on('close', () => void chain.then(() => shutdown(0)));
process.on('SIGTERM', () => void shutdown(0));
setTimeout(() => void shutdown(0), 15 * 60_000).unref();

reply({ event: 'ready', url: server.url, port: server.port });
