// Helper process for test/userspace/fd-exhaustion.test.ts, run inside its namespace:
//   hold-main.ts serve IP PORT ID   a backend that writes "ID\n" and keeps every connection open
//   hold-main.ts hold IP PORT N     opens N connections (10 at a time), each waiting at most 3 s
//                                   for its first line; prints {"ok": n, "failed": n} and keeps
//                                   the good ones open until killed
import net from 'node:net';

const [what, host, portText, arg] = process.argv.slice(2);
const port = Number(portText);

if (what === 'serve') {
  net
    .createServer((c) => {
      c.on('error', () => c.destroy());
      c.write(`${arg}\n`);
    })
    .listen(port, host, () => process.stdout.write('ready\n'));
} else {
  const n = Math.min(Number(arg), 5000);
  const held: net.Socket[] = [];
  let failed = 0;
  const one = () =>
    new Promise<void>((resolve) => {
      const s = net.connect({ host, port });
      const t = setTimeout(() => end(false), 3000);
      let done = false;
      function end(ok: boolean) {
        if (done) return;
        done = true;
        clearTimeout(t);
        if (ok) held.push(s);
        else {
          failed++;
          s.destroy();
        }
        resolve();
      }
      s.once('data', () => end(true));
      s.once('error', () => end(false));
      s.once('close', () => end(false));
    });
  for (let i = 0; i < n; i += 10) await Promise.all(Array.from({ length: Math.min(10, n - i) }, one));
  process.stdout.write(`${JSON.stringify({ ok: held.length, failed })}\n`);
  setInterval(() => {}, 60_000);
}
