// How long the manifests source takes to load one big file, how much memory it takes, and
// how long the event loop is blocked at most meanwhile (health checks answer within that).
//   node --import tsx bench/manifests-load.ts [--services 10000]
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { silentLogger } from '../src/log.ts';
import { ManifestsSource } from '../src/sources/manifests.ts';
import { bigManifest } from '../test/support/big-manifest.ts';

export interface ManifestsLoadResult {
  services: number;
  delivered: number;
  fileBytes: number;
  loadMs: number;
  /** the longest time the event loop did not run a 1 ms timer during the load */
  maxBlockMs: number;
  rssBefore: number;
  rssAfter: number;
}

export async function manifestsLoad(n: number): Promise<ManifestsLoadResult> {
  const dir = mkdtempSync(join(tmpdir(), 'kproxy-bench-manifests-'));
  try {
    const text = bigManifest(n);
    writeFileSync(join(dir, 'services.yaml'), text);
    global.gc?.();
    const rssBefore = process.memoryUsage().rss;
    let delivered = 0;
    let maxBlockMs = 0;
    let last = performance.now();
    const ticker = setInterval(() => {
      const now = performance.now();
      maxBlockMs = Math.max(maxBlockMs, now - last);
      last = now;
    }, 1);
    const src = new ManifestsSource({ dir, nodeName: 'bench', log: silentLogger(), pollMs: 3_600_000 });
    const t0 = performance.now();
    try {
      await src.start({ onService: () => void delivered++, onEndpointSlice: () => {}, onSynced: () => {} });
    } finally {
      clearInterval(ticker);
    }
    const loadMs = performance.now() - t0;
    maxBlockMs = Math.max(maxBlockMs, performance.now() - last);
    const rssAfter = process.memoryUsage().rss;
    await src.stop();
    return { services: n, delivered, fileBytes: Buffer.byteLength(text), loadMs, maxBlockMs, rssBefore, rssAfter };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  const { values } = parseArgs({ options: { services: { type: 'string', default: '10000' } } });
  const r = await manifestsLoad(Number(values.services));
  const mb = (x: number) => (x / 1024 / 1024).toFixed(1);
  console.log(`file: ${mb(r.fileBytes)} MiB, ${r.services} services; delivered ${r.delivered}`);
  console.log(`load: ${r.loadMs.toFixed(0)} ms; longest event-loop block: ${r.maxBlockMs.toFixed(0)} ms`);
  console.log(`rss: ${mb(r.rssBefore)} MiB before, ${mb(r.rssAfter)} MiB after (+${mb(r.rssAfter - r.rssBefore)} MiB)`);
}
