#!/usr/bin/env node
// Plain-node entry point. Runs the esbuild bundle in dist/ when it is fresh (bundle.js);
// otherwise registers the tsx loader and runs the TypeScript sources as they are. Either way
// `node bin/kproxy.js` works on any machine where node_modules is present, including the
// IPVS test VM.
import { bundleIsFresh } from './bundle.js';

if (bundleIsFresh()) {
  await import('../dist/kproxy.js');
} else {
  const { register } = await import('tsx/esm/api');
  register();
  const { main } = await import('../src/cli/main.ts');
  await main(process.argv);
}
