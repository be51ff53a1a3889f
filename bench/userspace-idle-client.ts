// Opens N idle TCP connections to HOST:PORT (in batches, each awaited), prints "held N" and
// keeps them until killed. Used by bench/userspace.ts to measure memory per idle connection.
import net from 'node:net';

const [host, portText, nText] = process.argv.slice(2);
const port = Number(portText);
const n = Number(nText);
const sockets: net.Socket[] = [];
let failed = 0;

function open(): Promise<void> {
  return new Promise((resolve) => {
    const s = net.connect({ host, port });
    s.once('connect', () => {
      sockets.push(s);
      resolve();
    });
    s.once('error', () => {
      failed++;
      resolve();
    });
  });
}

for (let i = 0; i < n; i += 200) await Promise.all(Array.from({ length: Math.min(200, n - i) }, open));
process.stdout.write(`held ${sockets.length} failed ${failed}\n`);
setInterval(() => {}, 60_000);
