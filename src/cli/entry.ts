// The bundle's entry point (scripts/build.mjs → dist/kproxy.js).
import { main } from './main.ts';

await main(process.argv);
