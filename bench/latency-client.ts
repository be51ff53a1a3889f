// A c=1 keep-alive HTTP client that times EVERY request (bench/userspace-latency.ts).
// wrk 4.1 (Debian's) does not: it records one latency sample per 10–20 ms (sample_rate in
// its source), ~70 a second, so its "p99" over a few seconds is about the third-largest of a
// few hundred samples, and one scheduler stall decides it. This sends `GET /` on one
// connection, waits for the whole response (Content-Length), and records each round trip
// with process.hrtime; one line of JSON at the end: requests, p50/p90/p99/p99.9/max in µs.
// Its own overhead (a Node event-loop turn per request, ~10–20 µs) is in every figure alike,
// so differences between targets are the targets'.
//   node --import tsx bench/latency-client.ts HOST PORT SECONDS [START_DELAY_MS]
// START_DELAY_MS: wait before the first request (the bench sets this process's scheduling
// from outside meanwhile).
import net from 'node:net';

const [host, portText, secondsText, delayText = '0'] = process.argv.slice(2);
await new Promise((r) => setTimeout(r, Number(delayText)));
const deadline = process.hrtime.bigint() + BigInt(Math.round(Number(secondsText) * 1e9));
const MAX = 2_000_000;
const lat = new Float64Array(MAX);
let n = 0;
let start = 0n;
let buf: Buffer = Buffer.alloc(0);
const req = Buffer.from(`GET / HTTP/1.1\r\nHost: ${host}\r\n\r\n`);
const sock = net.connect({ host, port: Number(portText), noDelay: true });

function send(): void {
  start = process.hrtime.bigint();
  sock.write(req);
}

function finish(): void {
  sock.destroy();
  const xs = lat.subarray(0, n).sort();
  const q = (p: number) => (n ? xs[Math.min(n - 1, Math.floor((p / 100) * n))] : NaN);
  process.stdout.write(JSON.stringify({ requests: n, p50us: q(50), p90us: q(90), p99us: q(99), p999us: q(99.9), maxus: n ? xs[n - 1] : NaN }) + '\n');
  process.exit(0);
}

sock.on('connect', send);
sock.on('error', (e) => {
  process.stderr.write(`${e.message}\n`);
  process.exit(1);
});
sock.on('data', (d: Buffer) => {
  buf = buf.length ? Buffer.concat([buf, d]) : d;
  const head = buf.indexOf('\r\n\r\n');
  if (head < 0) return;
  const m = /content-length:\s*(\d+)/i.exec(buf.subarray(0, head).toString('latin1'));
  const total = head + 4 + Number(m?.[1] ?? 0);
  if (buf.length < total) return;
  const now = process.hrtime.bigint();
  lat[n++] = Number(now - start) / 1000;
  buf = buf.subarray(total);
  if (now >= deadline || n >= MAX) return finish();
  send();
});
