// Bundles the CLI into dist/ with esbuild (the transformer tsx itself uses), so that
// bin/kproxy.js starts without compiling TypeScript at run time: seconds on a small node,
// minutes in the software-emulated IPVS VM. Runs on `npm ci` / `npm install` (prepare).
// @kubernetes/client-node lands in its own chunk, loaded only with --kubeconfig.
import { build } from 'esbuild';
import { rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
rmSync(`${root}/dist`, { recursive: true, force: true });
await build({
  // userspace-worker: the processes of userspace.workers > 1 (src/modes/userspace/dataplane/workers.ts forks it).
  entryPoints: { kproxy: `${root}/src/cli/entry.ts`, 'userspace-worker': `${root}/src/modes/userspace/dataplane/worker-main.ts` },
  outdir: `${root}/dist`,
  bundle: true,
  splitting: true,
  format: 'esm',
  platform: 'node',
  target: 'node20',
  sourcemap: 'linked',
  // CommonJS dependencies (pino, yaml, ...) call require() for node builtins.
  banner: { js: "import { createRequire as __kpCreateRequire } from 'node:module'; const require = __kpCreateRequire(import.meta.url);" },
  logLevel: 'warning',
});
