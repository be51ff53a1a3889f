// What the iptables sync tests share (chunked.test.ts, skip-unchanged.test.ts): a seeded
// PRNG for their random change sequences, and a fake kernel's tables in a form two kernels
// can be compared by.
import type { FakeIptables } from '../../src/kernel/iptables/fake.ts';

export { rng } from './rng.ts';

/** nat and filter of a fake kernel, order-free across chains, rule order kept within. */
export function kernelState(k: FakeIptables): string {
  const out: string[] = [];
  for (const table of ['filter', 'nat']) {
    for (const c of k.chains(table).sort()) out.push(`${table} :${c}`, ...k.rules(table, c).map((r) => `${table} -A ${c} ${r}`));
  }
  return out.join('\n');
}
