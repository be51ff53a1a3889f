import type { CaseOutcome, ConformanceAdapter, ConformanceCase } from '../conformance/case.ts';
import { runConformance } from '../conformance/runner.ts';
import { conformanceAdapters } from '../modes/registry.ts';
import { runShardedCase } from '../modes/nftables/index.ts';
import { kproxyError } from '../errors.ts';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export interface ConformanceOptions {
  /** "2,3": also run every flows case and every nftables case through the sharded nftables shape with these K */
  nftShards?: string;
}

/** The K of --nft-shards: integers from 2 to 16. */
export function parseShardList(text: string): number[] {
  const ks = text.split(',').map((s) => s.trim()).filter(Boolean).map(Number);
  if (!ks.length || ks.some((k) => !Number.isInteger(k) || k < 2 || k > 16)) {
    throw kproxyError('KPROXY_CONFIG_INVALID', `--nft-shards ${JSON.stringify(text)}: a comma-separated list of table counts from 2 to 16, e.g. 2,3`);
  }
  return [...new Set(ks)];
}

/**
 * Each adapter, and then, for a flows case (any mode) or an nftables case, the same case through
 * K tables (src/modes/nftables/conformance-sharded.ts); a case passes when both pass.
 */
function withShards(adapters: Record<string, ConformanceAdapter | undefined>, ks: number[]): Record<string, ConformanceAdapter | undefined> {
  const out: Record<string, ConformanceAdapter | undefined> = {};
  for (const [mode, a] of Object.entries(adapters)) {
    out[mode] = a && {
      async run(c: ConformanceCase): Promise<CaseOutcome> {
        const r = await a.run(c);
        // A static ruleset is traced as it is: there are no objects to spread over tables.
        if ((c.kind !== 'flows' && mode !== 'nftables') || c.rules) return r;
        const s = runShardedCase(c, ks);
        const by = `through nftables over K=${ks.join(',')} tables (${s.spreads} spreads, ${s.packets} packets)`;
        return {
          ok: r.ok && s.ok,
          detail: [r.detail, s.detail].filter(Boolean).join('\n') || undefined,
          judgedBy: `${r.judgedBy ?? c.kind}, and ${by}`,
        };
      },
    };
  }
  return out;
}

/**
 * The cases kproxy keeps itself (conformance/ at the top of the checkout): what `kproxy
 * conformance` runs when given no directory. Found from this file, whether it runs from
 * src/cli or from the bundle in dist/.
 */
export function ownCasesDir(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 4; i++) {
    if (existsSync(join(dir, 'package.json')) && existsSync(join(dir, 'conformance'))) return join(dir, 'conformance');
    dir = dirname(dir);
  }
  throw kproxyError('KPROXY_CONFIG_INVALID', 'kproxy conformance: no directory given and no conformance/ directory next to this kproxy; name the case directories');
}

export async function conformanceCommand(dirs: string[], o: ConformanceOptions = {}): Promise<void> {
  if (!dirs.length) dirs = [ownCasesDir()];
  const adapters = o.nftShards !== undefined ? withShards(conformanceAdapters, parseShardList(o.nftShards)) : conformanceAdapters;
  const res = await runConformance(dirs, adapters, (l) => process.stdout.write(l + '\n'));
  if (res.failed > 0) process.exitCode = 1;
}
