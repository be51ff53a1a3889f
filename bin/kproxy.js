#!/usr/bin/env node
// Plain-node entry point: registers the tsx loader so the TypeScript sources run as they are
// (no build step), then hands over to the CLI. Works anywhere node_modules is present,
// including inside the IPVS test VM where the project directory is shared.
import { register } from 'tsx/esm/api';

register();
const { main } = await import('../src/cli/main.ts');
await main(process.argv);
