// A client for kernel tests, run inside a namespace. Sends N bounded requests and prints one
// JSON line: {"replies": {"<id>": count}, "errors": {"<code>": count}}.
// Usage: client-main.ts tcp|udp IP PORT N [timeoutMs] [bindIP] [pauseMs]
import { connect } from 'node:net';
import { createSocket } from 'node:dgram';

const [proto, ip, portText, nText, timeoutText, bindIP, pauseText] = process.argv.slice(2);
const pauseMs = Math.min(Number(pauseText ?? 0) || 0, 1000);
const port = Number(portText);
const n = Math.min(Number(nText), 10_000);
const timeoutMs = Number(timeoutText ?? 2000);

function tcpOnce(): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = connect({ host: ip, port, localAddress: bindIP || undefined });
    let data = '';
    const t = setTimeout(() => s.destroy(new Error('ETIMEDOUT')), timeoutMs);
    s.on('data', (d) => (data += d));
    s.on('end', () => {
      clearTimeout(t);
      resolve(data.trim());
    });
    s.on('error', (e) => {
      clearTimeout(t);
      reject(e);
    });
  });
}

function udpOnce(): Promise<string> {
  return new Promise((resolve, reject) => {
    const u = createSocket(ip.includes(':') ? 'udp6' : 'udp4');
    const t = setTimeout(() => {
      u.close();
      reject(Object.assign(new Error('timeout'), { code: 'ETIMEDOUT' }));
    }, timeoutMs);
    u.on('message', (m) => {
      clearTimeout(t);
      u.close();
      resolve(m.toString().trim());
    });
    u.on('error', (e) => {
      clearTimeout(t);
      u.close();
      reject(e);
    });
    const send = () => u.send('ping', port, ip);
    if (bindIP) u.bind(0, bindIP, send);
    else send();
  });
}

const replies: Record<string, number> = {};
const errors: Record<string, number> = {};
for (let i = 0; i < n; i++) {
  try {
    const r = proto === 'udp' ? await udpOnce() : await tcpOnce();
    replies[r] = (replies[r] ?? 0) + 1;
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code ?? (e as Error).message;
    errors[code] = (errors[code] ?? 0) + 1;
  }
  if (pauseMs) await new Promise((r) => setTimeout(r, pauseMs));
}
process.stdout.write(JSON.stringify({ replies, errors }) + '\n');
