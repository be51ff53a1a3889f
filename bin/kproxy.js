#!/usr/bin/env node
// Plain-node entry point. Runs the esbuild bundle in dist/ (built by `npm ci` through the
// prepare script) when it is at least as new as every source file; otherwise registers the
// tsx loader and runs the TypeScript sources as they are. Either way `node bin/kproxy.js`
// works on any machine where node_modules is present, including the IPVS test VM.
import { readdirSync, statSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));

function newestMtime(dir) {
  let newest = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = `${dir}/${e.name}`;
    newest = Math.max(newest, e.isDirectory() ? newestMtime(p) : statSync(p).mtimeMs);
  }
  return newest;
}

function bundleIsFresh() {
  if (process.env.KPROXY_NO_BUNDLE === '1') return false;
  try {
    return statSync(`${root}/dist/kproxy.js`).mtimeMs >= newestMtime(`${root}/src`);
  } catch {
    return false;
  }
}

if (bundleIsFresh()) {
  await import('../dist/kproxy.js');
} else {
  const { register } = await import('tsx/esm/api');
  register();
  const { main } = await import('../src/cli/main.ts');
  await main(process.argv);
}
