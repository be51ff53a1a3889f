// One userspace TCP forwarder alone (no sync loop, no sources): LISTEN_HOST:PORT → TARGET
// HOST:PORT, for profiling the data path (`node --cpu-prof --import tsx
// bench/userspace-forwarder-main.ts 127.0.0.8:80 127.0.0.2:8080`) under bench/userspace.ts's load.
import { RoundRobinBalancer } from '../src/dataplane/balancer.ts';
import { TcpForwarder, newCounters } from '../src/dataplane/tcp.ts';
import { silentLogger } from '../src/log.ts';

const [listen, target, idleText] = process.argv.slice(2);
const [lh, lp] = listen.split(':');
const [th, tp] = target.split(':');
const balancer = new RoundRobinBalancer({ stickyMaxAgeSeconds: 0 });
balancer.setEndpoints([{ key: target, ip: th, port: Number(tp) }]);
const fwd = new TcpForwarder({ host: lh, port: Number(lp), balancer, counters: newCounters(), log: silentLogger(), idleTimeoutMs: Number(idleText ?? 0) });
await fwd.listen();
process.stdout.write(`listening ${listen}\n`);
// SIGTERM ends the process normally so --cpu-prof writes its profile.
process.on('SIGTERM', () => {
  fwd.destroy();
  process.exit(0);
});
