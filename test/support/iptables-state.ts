// What the iptables sync tests share (chunked.test.ts, skip-unchanged.test.ts): a seeded
// PRNG for their random change sequences, and a fake kernel's tables in a form two kernels
// can be compared by.
import type { FakeIptables } from '../../src/iptables/fake.ts';

/** mulberry32: a small seeded PRNG, so a failure replays. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** nat and filter of a fake kernel, order-free across chains, rule order kept within. */
export function kernelState(k: FakeIptables): string {
  const out: string[] = [];
  for (const table of ['filter', 'nat']) {
    for (const c of k.chains(table).sort()) out.push(`${table} :${c}`, ...k.rules(table, c).map((r) => `${table} -A ${c} ${r}`));
  }
  return out.join('\n');
}
