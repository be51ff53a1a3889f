// Packet-based detection of "the change is in the kernel" for bench/kproxy-run.ts: a change
// counts as programmed when a connection to the Service's VIP is answered by the endpoint the
// change added. Runs inside a benchmark namespace, in one of two roles:
//
//   serve PORT       the pods: accepts on 0.0.0.0:PORT (the namespace routes `local 10.0.0.0/8`
//                    to its loopback, so every endpoint address is here) and answers each
//                    connection with the address it was made to (the endpoint kproxy's DNAT
//                    chose), one line, then closes.
//   watch TICK_MS MAX_PER_TICK PER_WATCH
//                    the node's client: reads `ID HOST PORT WANT_IP TIMEOUT_MS` lines on stdin;
//                    every TICK_MS it connects to each watched HOST:PORT (up to PER_WATCH
//                    times; at most MAX_PER_TICK connects per tick in all, shared round-robin,
//                    so a stream of changes does not turn into a connection flood that
//                    competes with kproxy for the CPU) until one is answered by WANT_IP; then prints
//                    `seen ID CONNECTS`, or `timeout ID CONNECTS` after TIMEOUT_MS. Each
//                    connection is reset after the answer (no TIME_WAIT pile-up).
// The endpoint is chosen at random per connection (1/n each), so a detection overshoots the
// moment the rule landed by about n / (connects per tick) ticks: the bench reports the connects
// a detection took, so the resolution is known.
import { createServer, Socket } from 'node:net';
import { createInterface } from 'node:readline';

/** One connection: the address the server says it was made to, or null (refused, timed out, reset). */
function ask(host: string, port: number, timeoutMs: number): Promise<string | null> {
  return new Promise((resolve) => {
    const s = new Socket();
    let buf = '';
    let done = false;
    const finish = (v: string | null) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      if (typeof s.resetAndDestroy === 'function' && !s.destroyed && s.readyState === 'open') s.resetAndDestroy();
      else s.destroy();
      resolve(v);
    };
    const timer = setTimeout(() => finish(null), timeoutMs);
    s.setEncoding('utf8');
    s.on('data', (d: string) => {
      buf += d;
      const nl = buf.indexOf('\n');
      if (nl >= 0) finish(buf.slice(0, nl));
    });
    s.once('error', () => finish(null));
    s.once('close', () => finish(buf.includes('\n') ? buf.slice(0, buf.indexOf('\n')) : null));
    s.connect(port, host);
  });
}

interface Watch {
  id: string;
  host: string;
  port: number;
  want: string;
  deadline: number;
  connects: number;
  inFlight: number;
  done: boolean;
}

function watch(tickMs: number, maxPerTick: number, perWatch: number): void {
  const watches = new Map<string, Watch>();
  let rr = 0;
  const say = (line: string) => process.stdout.write(`${line}\n`);
  const rl = createInterface({ input: process.stdin });
  rl.on('line', (l) => {
    const [id, host, port, want, timeoutMs] = l.trim().split(/\s+/);
    if (!id || !want) return;
    watches.set(id, { id, host, port: Number(port), want, deadline: Date.now() + Number(timeoutMs), connects: 0, inFlight: 0, done: false });
  });
  rl.on('close', () => process.exit(0));
  const tick = () => {
    const active = [...watches.values()].filter((w) => !w.done);
    const per = active.length ? Math.min(perWatch, Math.max(1, Math.floor(maxPerTick / active.length))) : 0;
    let budget = maxPerTick;
    // round-robin: when the budget does not reach every watch, the next tick starts where this one stopped
    const start = active.length ? rr++ % active.length : 0;
    for (let j = 0; j < active.length; j++) {
      const w = active[(start + j) % active.length];
      if (Date.now() > w.deadline) {
        w.done = true;
        watches.delete(w.id);
        say(`timeout ${w.id} ${w.connects}`);
        continue;
      }
      // a watch never has more than `per` connects in flight: a slow answer does not pile up
      for (let k = w.inFlight; k < per && budget > 0; k++, budget--) {
        w.inFlight++;
        w.connects++;
        void ask(w.host, w.port, 1000).then((got) => {
          w.inFlight--;
          if (w.done || got !== w.want) return;
          w.done = true;
          watches.delete(w.id);
          say(`seen ${w.id} ${w.connects}`);
        });
      }
    }
  };
  setInterval(tick, tickMs);
  say('READY');
}

function serve(port: number): void {
  const srv = createServer((c) => {
    c.on('error', () => {});
    c.end(`${c.localAddress ?? ''}\n`);
  });
  srv.listen(port, '0.0.0.0', () => process.stdout.write('READY\n'));
}

const [role, a, b, c] = process.argv.slice(2);
if (role === 'serve') serve(Number(a));
else if (role === 'watch') watch(Number(a), Number(b), Number(c));
else {
  process.stderr.write('usage: change-probe.ts serve PORT | watch TICK_MS MAX_PER_TICK PER_WATCH\n');
  process.exit(2);
}
