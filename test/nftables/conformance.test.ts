// Every nftables case in ../shared/conformance must pass through the nftables adapter.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { findCases, loadCase } from '../../src/conformance/load.ts';
import { conformance } from '../../src/proxy/nftables/index.ts';
import { sortNftTransaction } from '../../src/modes/nftables/conformance.ts';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const casesRoot = resolve(repoRoot, '../shared/conformance');

const nftCases = findCases([casesRoot]).filter((d) => loadCase(d).config.mode === 'nftables');

test('there are nftables conformance cases', () => {
  assert.ok(nftCases.length >= 3, `found ${nftCases.length} nftables cases under ${casesRoot}`);
});

for (const dir of nftCases) {
  test(`conformance ${dir.slice(casesRoot.length + 1)}`, async () => {
    assert.ok(conformance, 'nftables conformance adapter exported');
    const outcome = await conformance.run(loadCase(dir));
    assert.equal(outcome.ok, true, outcome.detail);
  });
}

test('sortNftTransaction reproduces upstream normalisation (expected.sorted.txt)', () => {
  const dir = join(casesRoot, 'golden/nftables-overall');
  const sorted = sortNftTransaction(readFileSync(join(dir, 'expected.txt'), 'utf8'));
  assert.equal(sorted + '\n', readFileSync(join(dir, 'expected.sorted.txt'), 'utf8'));
});

test('a golden mismatch fails with a diff naming the line', async () => {
  const c = loadCase(join(casesRoot, 'golden/nftables-overall'));
  c.expected = c.expected!.replace('dnat to 10.180.0.1:80', 'dnat to 10.180.0.9:80');
  const outcome = await conformance!.run(c);
  assert.equal(outcome.ok, false);
  assert.match(outcome.detail ?? '', /- add rule .*dnat to 10\.180\.0\.9:80/);
  assert.match(outcome.detail ?? '', /\+ add rule .*dnat to 10\.180\.0\.1:80/);
});
