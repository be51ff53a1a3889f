// Userspace TCP forwarders alone (no sync loop, no sources), one per LISTEN_HOST:PORT=TARGET_HOST:PORT
// argument, with kproxy's TcpForwarder: for profiling the data path next to the naive pipe
// (bench/userspace-profile.ts). --idle-timeout-ms=N sets the idle timeout (kproxy's default
// is 24 h; 0 = none); --tcp=net|raw the TCP path (default net: TcpForwarder; raw:
// RawTcpForwarder on libuv handles, src/modes/userspace/dataplane/tcp-raw.ts).
import { RoundRobinBalancer } from '../src/modes/userspace/dataplane/balancer.ts';
import { newBudget, newCounters } from '../src/modes/userspace/dataplane/tcp.ts';
import { createTcpForwarder, type AnyTcpForwarder } from '../src/modes/userspace/dataplane/tcp-raw.ts';
import { silentLogger } from '../src/log.ts';

const args = process.argv.slice(2);
const idleArg = args.find((a) => a.startsWith('--idle-timeout-ms='));
const idleTimeoutMs = idleArg ? Number(idleArg.split('=')[1]) : 24 * 3600_000;
const budget = newBudget(0);
const tcpArg = args.find((a) => a.startsWith('--tcp='));
const path = tcpArg?.split('=')[1] === 'raw' ? 'raw' : 'net';
const forwarders: AnyTcpForwarder[] = [];
for (const arg of args.filter((a) => !a.startsWith('--'))) {
  const [listen, target] = arg.split('=');
  const [lh, lp] = listen.split(':');
  const [th, tp] = target.split(':');
  const balancer = new RoundRobinBalancer({ stickyMaxAgeSeconds: 0 });
  balancer.setEndpoints([{ key: target, ip: th, port: Number(tp) }]);
  const fwd = createTcpForwarder({ host: lh, port: Number(lp), balancer, counters: newCounters(), log: silentLogger(), idleTimeoutMs, budget, admit: () => true }, path);
  if (fwd.constructor.name !== (path === 'raw' ? 'RawTcpForwarder' : 'TcpForwarder')) throw new Error(`--tcp=${path}: got ${fwd.constructor.name}`);
  await fwd.listen();
  forwarders.push(fwd);
  process.stdout.write(`listening ${listen}\n`);
}
// SIGTERM ends the process normally so --cpu-prof writes its profile.
process.on('SIGTERM', () => {
  for (const f of forwarders) f.destroy();
  process.exit(0);
});
