// A UDP client for kernel tests that keeps ONE socket (one fixed source port) and sends a
// datagram every INTERVAL ms to IP:PORT, printing "REPLY <answer>" per reply, so a test can
// see which backend conntrack sends the same flow to over time, and "SENT" per datagram
// sent. Exits after LIFETIME ms.
// Usage: udp-pinned-main.ts IP PORT SRCPORT [INTERVAL=200] [LIFETIME=120000]
import { createSocket } from 'node:dgram';

const [ip, port, srcPort, interval = '200', lifetime = '120000'] = process.argv.slice(2);
const s = createSocket(ip.includes(':') ? 'udp6' : 'udp4');
s.on('message', (m) => process.stdout.write(`REPLY ${m.toString().trim()}\n`));
s.on('error', (e) => process.stdout.write(`ERROR ${e.message}\n`));
s.bind(Number(srcPort), () => {
  process.stdout.write('READY\n');
  const t = setInterval(() => s.send('ping', Number(port), ip, (err) => { if (!err) process.stdout.write('SENT\n'); }), Number(interval));
  setTimeout(() => {
    clearInterval(t);
    s.close();
    process.exit(0);
  }, Number(lifetime)).unref();
});
process.on('SIGTERM', () => process.exit(0));
