// Whether the esbuild bundle in dist/ (built by `npm ci` through the prepare script) is what
// `node bin/kproxy.js` runs: it is when it is at least as new as every source file, and
// KPROXY_NO_BUNDLE=1 is not set. bin/kproxy.js runs the TypeScript sources through tsx
// otherwise; the benches build the bundle first, to time kproxy as it is run.
import { readdirSync, statSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

/** the repository root */
export const root = fileURLToPath(new URL('..', import.meta.url));

function newestMtime(dir) {
  let newest = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = `${dir}/${e.name}`;
    newest = Math.max(newest, e.isDirectory() ? newestMtime(p) : statSync(p).mtimeMs);
  }
  return newest;
}

export function bundleIsFresh() {
  if (process.env.KPROXY_NO_BUNDLE === '1') return false;
  try {
    return statSync(`${root}/dist/kproxy.js`).mtimeMs >= newestMtime(`${root}/src`);
  } catch {
    return false;
  }
}
