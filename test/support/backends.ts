// Small TCP/UDP backends that answer with their own identity, for mode tests.
//
// TCP: on connect it writes "<id>\n", echoes every byte it receives, and when the client
// shuts its write side it writes "bye <id> <bytesReceived>\n" and closes: a client that
// half-closes sees whether the reply after its FIN arrived.
// UDP: answers every datagram with "<id>:<payload>".
//
// In-process: startTcpBackend / startUdpBackend. Inside a network namespace:
// startBackendsInNetns(ns, specs) runs this file as a child process there
// (`ip netns exec NS node --import tsx test/support/backends.ts '<json specs>'`).
// Clients: tcpExchange / udpExchange (in-process, e.g. over 127.0.0.0/8).
import { spawn, type ChildProcess } from 'node:child_process';
import dgram from 'node:dgram';
import net from 'node:net';
import { createInterface } from 'node:readline';
import { fileURLToPath, pathToFileURL } from 'node:url';

export interface Backend {
  id: string;
  host: string;
  port: number;
  /** TCP: connections accepted; UDP: distinct client addresses (ip:port) seen */
  readonly connections: number;
  close(): Promise<void>;
}

export async function startTcpBackend(host: string, port: number, id: string): Promise<Backend> {
  const sockets = new Set<net.Socket>();
  let connections = 0;
  const server = net.createServer({ allowHalfOpen: true }, (s) => {
    connections++;
    sockets.add(s);
    let received = 0;
    s.on('close', () => sockets.delete(s));
    s.on('error', () => s.destroy());
    s.write(`${id}\n`);
    s.on('data', (d: Buffer) => {
      received += d.length;
      // Echo with back-pressure: stop reading while the client is not reading.
      if (!s.write(d)) {
        s.pause();
        s.once('drain', () => s.resume());
      }
    });
    s.on('end', () => s.end(`bye ${id} ${received}\n`));
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ host, port, ipv6Only: host === '::' }, () => resolve());
  });
  const bound = (server.address() as net.AddressInfo).port;
  return {
    id,
    host,
    port: bound,
    get connections() {
      return connections;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

export async function startUdpBackend(host: string, port: number, id: string): Promise<Backend> {
  const peers = new Set<string>();
  const sock = dgram.createSocket(net.isIPv6(host) ? 'udp6' : 'udp4');
  sock.on('message', (msg, rinfo) => {
    peers.add(`${rinfo.address}:${rinfo.port}`);
    sock.send(Buffer.concat([Buffer.from(`${id}:`), msg]), rinfo.port, rinfo.address);
  });
  await new Promise<void>((resolve, reject) => {
    sock.once('error', reject);
    sock.bind(port, host, () => resolve());
  });
  return {
    id,
    host,
    port: sock.address().port,
    get connections() {
      return peers.size;
    },
    close: () => new Promise<void>((resolve) => sock.close(() => resolve())),
  };
}

export interface TcpReply {
  /** the backend's id (first line) */
  id: string;
  /** everything after the first line */
  rest: Buffer;
  /** the backend's "bye <id> <n>" line, when it arrived */
  bye: string | null;
}

/**
 * Connects, sends `payload`, half-closes, and collects the whole reply until the server
 * closes. Rejects on error or after timeoutMs.
 */
export function tcpExchange(
  host: string,
  port: number,
  payload: Buffer | string,
  opts: { localAddress?: string; timeoutMs?: number } = {},
): Promise<TcpReply> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    const s = net.connect({ host, port, localAddress: opts.localAddress, allowHalfOpen: true });
    const timer = setTimeout(() => {
      s.destroy();
      reject(new Error(`tcpExchange ${host}:${port} timed out`));
    }, opts.timeoutMs ?? 10_000);
    s.on('connect', () => s.end(payload));
    s.on('data', (d: Buffer) => chunks.push(d));
    s.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    s.on('end', () => {
      clearTimeout(timer);
      s.destroy();
      resolve(parseTcpReply(Buffer.concat(chunks)));
    });
  });
}

export function parseTcpReply(all: Buffer): TcpReply {
  const nl = all.indexOf(10);
  const id = nl < 0 ? all.toString() : all.subarray(0, nl).toString();
  let rest = nl < 0 ? Buffer.alloc(0) : all.subarray(nl + 1);
  let bye: string | null = null;
  const tail = rest.subarray(Math.max(0, rest.length - 200)).toString('latin1');
  const m = /bye \S+ \d+\n$/.exec(tail);
  if (m) {
    bye = m[0].trimEnd();
    rest = rest.subarray(0, rest.length - Buffer.byteLength(m[0], 'latin1'));
  }
  return { id, rest, bye };
}

/** Sends one datagram and resolves with the first reply's text (or rejects after timeoutMs). */
export function udpExchange(
  host: string,
  port: number,
  payload: string,
  opts: { localAddress?: string; localPort?: number; timeoutMs?: number } = {},
): Promise<{ reply: string; from: string }> {
  return new Promise((resolve, reject) => {
    const sock = dgram.createSocket(net.isIPv6(host) ? 'udp6' : 'udp4');
    const timer = setTimeout(() => {
      sock.close();
      reject(new Error(`udpExchange ${host}:${port} got no reply`));
    }, opts.timeoutMs ?? 3000);
    sock.on('message', (msg, rinfo) => {
      clearTimeout(timer);
      sock.close();
      resolve({ reply: msg.toString(), from: `${rinfo.address}:${rinfo.port}` });
    });
    sock.on('error', (e) => {
      clearTimeout(timer);
      sock.close();
      reject(e);
    });
    sock.bind({ address: opts.localAddress, port: opts.localPort ?? 0 }, () => sock.send(payload, port, host));
  });
}

// ---- backends inside a network namespace, as a child process ----

export interface BackendSpec {
  proto: 'tcp' | 'udp';
  host: string;
  port: number;
  id: string;
}

export interface NetnsBackends {
  /** connection counts by backend id, asked of the child */
  connections(): Promise<Record<string, number>>;
  /** closes one backend (e.g. to make its port refuse) */
  stop(id: string): Promise<void>;
  close(): Promise<void>;
}

const SELF = fileURLToPath(import.meta.url);
/** the repository root: `--import tsx` resolves from the child's working directory */
const REPO = fileURLToPath(new URL('../../', import.meta.url));

/** Runs backends inside `ns` in one child process; resolves once they all listen (or rejects after 20s). */
export async function startBackendsInNetns(ns: string, specs: BackendSpec[]): Promise<NetnsBackends> {
  const child = spawn('ip', ['netns', 'exec', ns, process.execPath, '--import', 'tsx', SELF, JSON.stringify(specs)], {
    stdio: ['pipe', 'pipe', 'pipe'],
    cwd: REPO,
  });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()).length > 10_000 && (stderr = stderr.slice(-5000)));
  const lines = createInterface({ input: child.stdout! });
  const waiting: ((line: string) => void)[] = [];
  lines.on('line', (l) => waiting.shift()?.(l));
  const nextLine = (what: string, timeoutMs: number) =>
    new Promise<string>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`backends in ${ns}: no ${what} after ${timeoutMs}ms: ${stderr}`)), timeoutMs);
      const onExit = () => reject(new Error(`backends in ${ns} exited: ${stderr}`));
      child.once('exit', onExit);
      waiting.push((l) => {
        clearTimeout(t);
        child.off('exit', onExit);
        resolve(l);
      });
    });
  try {
    const ready = await nextLine('READY', 20_000);
    if (ready !== 'READY') throw new Error(`backends in ${ns}: ${ready} ${stderr}`);
  } catch (e) {
    await killChild(child);
    throw e;
  }
  const ask = async (cmd: string): Promise<string> => {
    const p = nextLine(`answer to ${cmd}`, 5000);
    child.stdin!.write(cmd + '\n');
    return p;
  };
  return {
    connections: async () => JSON.parse(await ask('counts')) as Record<string, number>,
    stop: async (id) => {
      await ask(`stop ${id}`);
    },
    close: () => killChild(child),
  };
}

export function killChild(child: ChildProcess, timeoutMs = 3000): Promise<void> {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve();
    const t = setTimeout(() => {
      child.kill('SIGKILL');
      resolve();
    }, timeoutMs);
    child.once('exit', () => {
      clearTimeout(t);
      resolve();
    });
    child.kill('SIGTERM');
  });
}

async function childMain(specs: BackendSpec[]): Promise<void> {
  const running = new Map<string, Backend>();
  for (const s of specs) {
    running.set(s.id, s.proto === 'tcp' ? await startTcpBackend(s.host, s.port, s.id) : await startUdpBackend(s.host, s.port, s.id));
  }
  process.stdout.write('READY\n');
  const rl = createInterface({ input: process.stdin });
  rl.on('line', async (line) => {
    const [cmd, arg] = line.trim().split(/\s+/);
    if (cmd === 'counts') {
      process.stdout.write(JSON.stringify(Object.fromEntries([...running].map(([id, b]) => [id, b.connections]))) + '\n');
    } else if (cmd === 'stop') {
      await running.get(arg)?.close();
      process.stdout.write('OK\n');
    } else process.stdout.write(`ERR unknown command ${cmd}\n`);
  });
  // The parent going away (stdin closed) ends the backends too.
  rl.on('close', () => process.exit(0));
  process.on('SIGTERM', () => process.exit(0));
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  childMain(JSON.parse(process.argv[2] ?? '[]') as BackendSpec[]).catch((e) => {
    process.stdout.write(`ERR ${(e as Error).message}\n`);
    process.exit(1);
  });
}
