// bench/userspace.ts's parsers and report (the bench itself needs nginx, haproxy, iperf3 and
// wrk, installed for the bench only): wrk and iperf3 output as those tools print it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { goals, markdown, medianFigures, parseIperfMBs, parseWrk, svg, wrkTimeUs, type BenchReport } from '../../bench/userspace.ts';

const WRK = `Running 3s test @ http://127.0.0.6:80/
  1 threads and 1 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    88.21us  120.50us   5.12ms   98.90%
    Req/Sec    11.32k   410.22    11.90k    70.00%
  Latency Distribution
     50%   79.00us
     75%   88.00us
     90%  101.00us
     99%    1.20ms
  33801 requests in 3.00s, 4.35MB read
  Socket errors: connect 0, read 12, write 0, timeout 2
Requests/sec:  11266.80
Transfer/sec:      1.45MB
`;

test('wrk: requests/s, p50/p99 in µs, errors (reads at close are not errors)', () => {
  assert.deepEqual(parseWrk(WRK), { rps: 11266.8, p50us: 79, p99us: 1200, errors: 2 });
  assert.equal(wrkTimeUs('2.00s'), 2e6);
  assert.ok(Number.isNaN(parseWrk('garbage').rps));
});

test('iperf3 -J: received MB/s; an error is thrown', () => {
  assert.equal(parseIperfMBs(JSON.stringify({ end: { sum_received: { bytes: 3e9, seconds: 3 } } })), 1000);
  assert.throws(() => parseIperfMBs(JSON.stringify({ error: 'unable to connect' })), /unable to connect/);
});

test('report: medians, a row per proxy, goals against the naive pipe and nginx, an SVG', () => {
  const f = (t: number, c: number, p99: number, ka: number) => ({ throughputMBs: t, connPerSec: c, p50us: 50, p99us: p99, keepAliveRps: ka });
  const peer = (key: string, name: string, runs: ReturnType<typeof f>[]) => ({ key, name, runs, median: medianFigures(runs) });
  const r: BenchReport = {
    date: '2026-12-03T10:00:00Z', host: { cpus: 2, node: 'v20', kernel: '6' }, durationS: 3, repeat: 3, workers: 2,
    peers: [
      peer('naive', 'naive Node pipe', [f(100, 10, 900, 50), f(300, 30, 1100, 70), f(200, 20, 1000, 60)]),
      peer('nginx', 'nginx stream', [f(400, 40, 500, 100)]),
      { ...peer('kproxy', 'kproxy userspace (1 worker)', [f(250, 25, 800, 70)]), idle: { connections: 5000, rssBytesPerConn: 6000, fdsPerConn: 2 } },
    ],
    loadAverages: [9.5, 12.25, 8],
  };
  assert.deepEqual(r.peers[0].median, f(200, 20, 1000, 60));
  const md = markdown(r);
  assert.match(md, /\| kproxy userspace \(1 worker\) \| 250 \| 25 \| 50 \| 800 \| 70 \| 6,000 B \/ 2\.00 \|/);
  assert.match(md, /Load average \(1 min\) during the run: 8\.0–12\.3, median 9\.5 \(2 cores\)/);
  const g = goals(r);
  assert.match(g, /throughput ≥ naive pipe \| 250 \| ≥ 200 \| yes/);
  assert.match(g, /conn\/s ≥ 0\.6× nginx \| 25 \| ≥ 24 \| yes/);
  assert.match(g, /keep-alive ≥ naive pipe \| 70 \| ≥ 60 \| yes/);
  assert.match(g, /p99 at c=1 ≤ 1 ms \(µs\) \| 800 \| ≤ 1,000 \| yes/);
  assert.match(g, /memory per idle connection ≤ 8 KB \(bytes\) \| 6,000 \| ≤ 8,192 \| yes/);
  const s = svg(r);
  assert.match(s, /^<svg /);
  assert.match(s, /load average 9\.5/);
  assert.equal((s.match(/<rect x=/g) ?? []).length, 4 * 3, 'a bar per proxy in each of the four panels');
});
