// A backend for kernel tests, run inside a namespace: TCP servers answer "<id>\n" and close;
// UDP servers answer "<id>" to every datagram. Usage: backend-main.ts ID tcp:IP:PORT udp:IP:PORT ...
import { createServer } from 'node:net';
import { createSocket } from 'node:dgram';

const [id, ...listens] = process.argv.slice(2);
let ready = 0;
for (const spec of listens) {
  const parts = spec.split(':');
  const proto = parts[0];
  const port = parts[parts.length - 1];
  const ip = parts.slice(1, -1).join(':');
  if (proto === 'tcp') {
    const s = createServer((c) => {
      c.on('error', () => {});
      c.end(`${id}\n`);
    });
    s.listen(Number(port), ip, () => {
      if (++ready === listens.length) process.stdout.write('READY\n');
    });
  } else {
    const u = createSocket(ip.includes(':') ? 'udp6' : 'udp4');
    u.on('message', (_m, r) => u.send(id, r.port, r.address));
    u.bind(Number(port), ip, () => {
      if (++ready === listens.length) process.stdout.write('READY\n');
    });
  }
}
setTimeout(() => process.exit(0), 15 * 60_000).unref();
process.on('SIGTERM', () => process.exit(0));
