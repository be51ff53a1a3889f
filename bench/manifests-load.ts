// How long the manifests source takes to load one big file, how much memory it takes, and
// how long the event loop is blocked at most meanwhile (health checks answer within that).
//   node --import tsx bench/manifests-load.ts [--services 10000]
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { silentLogger } from '../src/log.ts';
import { ManifestsSource } from '../src/sources/manifests.ts';
import { bigManifest } from '../test/support/big-manifest.ts';

const { values } = parseArgs({ options: { services: { type: 'string', default: '10000' } } });
const n = Number(values.services);
const dir = mkdtempSync(join(tmpdir(), 'kproxy-bench-manifests-'));
try {
  const text = bigManifest(n);
  writeFileSync(join(dir, 'services.yaml'), text);
  const mb = (x: number) => (x / 1024 / 1024).toFixed(1);
  global.gc?.();
  const rssBefore = process.memoryUsage().rss;
  let services = 0;
  let maxGapMs = 0;
  let last = performance.now();
  const ticker = setInterval(() => {
    const now = performance.now();
    maxGapMs = Math.max(maxGapMs, now - last);
    last = now;
  }, 1);
  const src = new ManifestsSource({ dir, nodeName: 'bench', log: silentLogger(), pollMs: 3_600_000 });
  const t0 = performance.now();
  await src.start({ onService: () => void services++, onEndpointSlice: () => {}, onSynced: () => {} });
  const loadMs = performance.now() - t0;
  const now = performance.now();
  maxGapMs = Math.max(maxGapMs, now - last);
  clearInterval(ticker);
  const rssAfter = process.memoryUsage().rss;
  await src.stop();
  console.log(`file: ${mb(Buffer.byteLength(text))} MiB, ${n} services; delivered ${services}`);
  console.log(`load: ${loadMs.toFixed(0)} ms; longest event-loop block: ${maxGapMs.toFixed(0)} ms`);
  console.log(`rss: ${mb(rssBefore)} MiB before, ${mb(rssAfter)} MiB after (+${mb(rssAfter - rssBefore)} MiB)`);
} finally {
  rmSync(dir, { recursive: true, force: true });
}
