// One job: the benches time kproxy as it is run, `node bin/kproxy.js`, which runs the esbuild
// bundle when it is fresh (bin/bundle.js): a bench builds it first when it is stale.
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { bundleIsFresh, root } from '../bin/bundle.js';

export type Entry = 'dist bundle' | 'tsx sources';

/** What `node bin/kproxy.js` runs now. */
export function bundleEntry(): Entry {
  return bundleIsFresh() ? 'dist bundle' : 'tsx sources';
}

/** Builds dist/ (scripts/build.mjs) when it is stale, unless KPROXY_NO_BUNDLE=1; then what bin/kproxy.js runs. */
export function ensureBundle(bench: string): Entry {
  if (process.env.KPROXY_NO_BUNDLE !== '1' && !bundleIsFresh()) {
    process.stderr.write(`${bench}: building the bundle (scripts/build.mjs)\n`);
    execFileSync(process.execPath, [join(root, 'scripts/build.mjs')], { cwd: root, stdio: ['ignore', 'ignore', 'inherit'] });
  }
  return bundleEntry();
}
