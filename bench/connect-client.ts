// Runs inside a benchmark namespace. Two roles:
//   serve PORT                  accept TCP connections and close them (the pods)
//   connect COUNT TIMEOUT_MS label=ip:port...
//                               COUNT sequential TCP connects per target, round-robin over
//                               the targets; prints {"label": [ms, ...]} (time from connect()
//                               to the SYN-ACK, i.e. the first packet's way through the rules)
//   probe TIMEOUT_MS label=ip:port...
//                               one TCP connect per target; prints {"label": "connected" |
//                               "timeout" | the error code, e.g. "ECONNREFUSED"}
import { createServer, Socket } from 'node:net';

function connectOnce(host: string, port: number, timeoutMs: number): Promise<number> {
  return new Promise((resolve) => {
    const s = new Socket();
    const t0 = process.hrtime.bigint();
    const timer = setTimeout(() => {
      s.destroy();
      resolve(Number.NaN);
    }, timeoutMs);
    s.once('connect', () => {
      const ms = Number(process.hrtime.bigint() - t0) / 1e6;
      clearTimeout(timer);
      s.destroy();
      resolve(ms);
    });
    s.once('error', () => {
      clearTimeout(timer);
      resolve(Number.NaN);
    });
    s.connect(port, host);
  });
}

function probeOnce(host: string, port: number, timeoutMs: number): Promise<string> {
  return new Promise((resolve) => {
    const s = new Socket();
    const timer = setTimeout(() => {
      s.destroy();
      resolve('timeout');
    }, timeoutMs);
    s.once('connect', () => {
      clearTimeout(timer);
      s.destroy();
      resolve('connected');
    });
    s.once('error', (e: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      resolve(e.code ?? 'error');
    });
    s.connect(port, host);
  });
}

function parseTargets(args: string[]): Array<{ label: string; host: string; port: number }> {
  return args.map((t) => {
    const [label, addr] = t.split('=');
    const i = addr.lastIndexOf(':');
    return { label, host: addr.slice(0, i), port: Number(addr.slice(i + 1)) };
  });
}

async function main(): Promise<void> {
  const [role, ...rest] = process.argv.slice(2);
  if (role === 'probe') {
    const out: Record<string, string> = {};
    for (const t of parseTargets(rest.slice(1))) out[t.label] = await probeOnce(t.host, t.port, Number(rest[0]));
    process.stdout.write(JSON.stringify(out) + '\n');
    return;
  }
  if (role === 'serve') {
    const srv = createServer((c) => c.destroy());
    srv.listen(Number(rest[0]), '0.0.0.0', () => process.stdout.write('READY\n'));
    return;
  }
  const count = Number(rest[0]);
  const timeoutMs = Number(rest[1]);
  const targets = parseTargets(rest.slice(2));
  const out: Record<string, number[]> = Object.fromEntries(targets.map((t) => [t.label, []]));
  // warm-up: one connect each (ARP, route cache, JIT), not counted
  for (const t of targets) await connectOnce(t.host, t.port, timeoutMs);
  for (let k = 0; k < count; k++) {
    for (const t of targets) out[t.label].push(await connectOnce(t.host, t.port, timeoutMs));
  }
  process.stdout.write(JSON.stringify(out) + '\n');
}

void main();
