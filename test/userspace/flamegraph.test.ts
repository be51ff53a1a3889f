// bench/flamegraph.ts: a V8 .cpuprofile turned into a call tree with sample counts and drawn
// as a flame graph SVG (the profile of the userspace TCP path in docs/ comes from it).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { callTree, flameSvg, frameName, type CpuProfile } from '../../bench/flamegraph.ts';

const frame = (functionName: string, url = '', lineNumber = 0) => ({ functionName, url, lineNumber });

// root → (idle); root → main → { write (twice, from two call sites: merged), tiny }
const PROFILE: CpuProfile = {
  nodes: [
    { id: 1, callFrame: frame('(root)'), children: [2, 3] },
    { id: 2, callFrame: frame('(idle)') },
    { id: 3, callFrame: frame('main', 'file:///work/x/src/modes/userspace/dataplane/tcp.ts', 9), children: [4, 5, 6] },
    { id: 4, callFrame: frame('writeBuffer') },
    { id: 5, callFrame: frame('writeBuffer') },
    { id: 6, callFrame: frame('tiny', 'node:net', 99) },
  ],
  samples: [2, 2, 2, 2, 3, 4, 4, 5, 5, 6],
};

test('call tree: totals include callees, same-named siblings merge, idle can be left out', () => {
  const t = callTree(PROFILE);
  assert.equal(t.name, 'all');
  assert.equal(t.total, 10);
  const main = t.children.find((c) => c.name.startsWith('main'))!;
  assert.equal(main.name, 'main src/modes/userspace/dataplane/tcp.ts:10');
  assert.equal(main.self, 1);
  assert.equal(main.total, 6);
  assert.deepEqual(main.children.map((c) => [c.name, c.total]), [['tiny node:net:100', 1], ['writeBuffer', 4]]);
  const busy = callTree(PROFILE, true);
  assert.equal(busy.total, 6);
  assert.equal(busy.children.find((c) => c.name === '(idle)'), undefined);
});

test('flame graph SVG: a box per frame wide enough, titled with its share; narrow frames left out', () => {
  const svg = flameSvg(callTree(PROFILE, true), { title: 'T <1>', minPct: 20 });
  assert.match(svg, /^<svg /);
  assert.match(svg, /T &lt;1&gt;/);
  assert.match(svg, /<title>writeBuffer \(66\.7 %, self 66\.7 %\)<\/title>/);
  assert.match(svg, /<title>main src\/modes\/userspace\/dataplane\/tcp\.ts:10 \(100\.0 %, self 16\.7 %\)<\/title>/);
  // tiny is 1 of 6 busy samples (16.7 %), under minPct 20.
  assert.doesNotMatch(svg, /tiny/);
  assert.equal(frameName(frame('', 'file:///a/node_modules/pino/lib.js', 0)), '(anonymous) node_modules/pino/lib.js:1');
});
