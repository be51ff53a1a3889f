// bench/userspace-flame-svg.ts: `perf script` text as perf 6.x prints it (header line, frames
// leaf first, a blank line) folded into stacks, the shares per kind of code, and the flame
// graph's frame widths.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { flameSvg, foldPerfScript, foldedText, inclusiveShare, kindOf, parseFolded, perfMapResolver, selfShares } from '../../bench/userspace-flame-svg.ts';

const SCRIPT = `node 4242 52127.593756:    1001001 cpu-clock:ppp: 
\tffffffff8160a9f3 tcp_sendmsg+0xd3 ([kernel.kallsyms])
\tffffffff81000c82 entry_SYSCALL_64_after_hwframe+0x22 ([kernel.kallsyms])
\t           1b7ad __GI___libc_write+0x3d (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t    7f50e49888a8 JS:*forward file:///x/tcp-raw.ts:1:8731 (/tmp/perf-4242.map)
\t          5a1b2c uv__io_poll+0x1c (/usr/bin/node)

node 4242 52127.594754:    1001001 cpu-clock:ppp: 
\t    7f50e49888a8 JS:*forward file:///x/tcp-raw.ts:1:8731 (/tmp/perf-4242.map)
\t          5a1b2c uv__io_poll+0x1c (/usr/bin/node)

node 4242 52127.595889:    1001001 cpu-clock:ppp: 
\t          9abcde v8::internal::Heap::Scavenge+0x10 (/usr/bin/node)
\t    7f50e49888a8 [unknown] ([unknown])

node 4242 52127.596882:    1001001 cpu-clock:ppp: 
\t    7f50e49888a8 JS:*forward file:///x/tcp-raw.ts:1:8731 (/tmp/perf-4242.map)
\t          5a1b2c uv__io_poll+0x1c (/usr/bin/node)
`;

test('perf script → folded stacks: root first, offsets dropped, kernel frames marked, unknown frames named by their DSO, equal stacks counted', () => {
  const f = foldPerfScript(SCRIPT, 'kproxy');
  assert.deepEqual([...f].sort(), [
    ['kproxy;[unknown];v8::internal::Heap::Scavenge', 1],
    ['kproxy;uv__io_poll;JS:*forward file:///x/tcp-raw.ts:1:8731', 2],
    ['kproxy;uv__io_poll;JS:*forward file:///x/tcp-raw.ts:1:8731;__GI___libc_write;entry_SYSCALL_64_after_hwframe_[k];tcp_sendmsg_[k]', 1],
  ]);
  // The text form reads back as it was.
  assert.deepEqual(parseFolded(foldedText(f)), f);
});

test('shares: self time by the kind of the leaf (anything under the collector is GC); inclusive time under a frame', () => {
  const f = foldPerfScript(SCRIPT, 'kproxy');
  const s = selfShares(f);
  assert.equal(s.js, 0.5);
  assert.equal(s.kernel, 0.25);
  assert.equal(s.gc, 0.25);
  assert.equal(inclusiveShare(f, /^uv__io_poll$/), 0.75);
  assert.equal(inclusiveShare(f, /^tcp_sendmsg_\[k\]$/), 0.25);
  assert.equal(kindOf('uv__read'), 'libuv');
  assert.equal(kindOf('node::StreamBase::Write'), 'node/v8');
  assert.equal(kindOf('epoll_ctl'), 'libc');
});

test('flame graph: one rect per frame, width proportional to its samples, a title per frame', () => {
  const f = parseFolded('a;b 3\na;c 1\n');
  const svg = flameSvg(f, 'T', 'sub');
  const rects = [...svg.matchAll(/<title>([^<]*)<\/title><rect x="([\d.]+)" y="[\d.]+" width="([\d.]+)"/g)].map((m) => [m[1], Number(m[2]), Number(m[3])] as const);
  const byName = new Map(rects.map(([t, x, w]) => [t.split(' (')[0], { x, w }]));
  const all = byName.get('all')!;
  assert.equal(byName.get('a')!.w, all.w);
  assert.ok(Math.abs(byName.get('b')!.w - (all.w * 3) / 4) < 0.02);
  assert.ok(Math.abs(byName.get('c')!.w - all.w / 4) < 0.02);
  assert.ok(Math.abs(byName.get('c')!.x - (byName.get('b')!.x + byName.get('b')!.w)) < 0.02, 'siblings side by side');
  assert.match(svg, /<title>b \(3 samples, 75\.00%\)<\/title>/);
});

test('perf map: overlapping JIT code ranges resolve to the entry written last; addresses outside every entry are unknown', () => {
  const r = perfMapResolver(['1000 100 Eval:~ startup.js:1:1', '2000 10 JS:*tiny a.js:1:1', '1040 20 JS:*onRead tcp-raw.ts:1:8240', 'garbage', ''].join('\n'));
  assert.equal(r(0x1000), 'Eval:~ startup.js:1:1');
  assert.equal(r(0x1045), 'JS:*onRead tcp-raw.ts:1:8240');
  assert.equal(r(0x1060), 'Eval:~ startup.js:1:1', 'past the later entry, the earlier one is still there');
  assert.equal(r(0x200f), 'JS:*tiny a.js:1:1', 'sizes are hex too');
  assert.equal(r(0x2010), undefined);
  assert.equal(r(0xfff), undefined);
  // perf script's own (wrong) pick is replaced for the process whose map it is.
  const text = 'node 4242 1.0:    1001001 cpu-clock:ppp: \n\t    1045 Eval:~ startup.js:1:1+0x45 (/tmp/perf-4242.map)\n\t  5a1b2c uv__io_poll+0x1c (/usr/bin/node)\n';
  assert.deepEqual([...foldPerfScript(text, 'k', new Map([[4242, r]]))], [['k;uv__io_poll;JS:*onRead tcp-raw.ts:1:8240', 1]]);
  assert.deepEqual([...foldPerfScript(text, 'k', new Map([[7, r]]))], [['k;uv__io_poll;Eval:~ startup.js:1:1', 1]]);
});
