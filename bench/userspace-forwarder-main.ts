// Userspace TCP forwarders alone (no sync loop, no sources), one per LISTEN_HOST:PORT=TARGET_HOST:PORT
// argument, with kproxy's TcpForwarder: for profiling the data path next to the naive pipe
// (bench/userspace-profile.ts). --idle-timeout-ms=N sets the idle timeout (kproxy's default
// is 24 h; 0 = none).
import { RoundRobinBalancer } from '../src/dataplane/balancer.ts';
import { TcpForwarder, newBudget, newCounters } from '../src/dataplane/tcp.ts';
import { silentLogger } from '../src/log.ts';

const args = process.argv.slice(2);
const idleArg = args.find((a) => a.startsWith('--idle-timeout-ms='));
const idleTimeoutMs = idleArg ? Number(idleArg.split('=')[1]) : 24 * 3600_000;
const budget = newBudget(0);
const forwarders: TcpForwarder[] = [];
for (const arg of args.filter((a) => !a.startsWith('--'))) {
  const [listen, target] = arg.split('=');
  const [lh, lp] = listen.split(':');
  const [th, tp] = target.split(':');
  const balancer = new RoundRobinBalancer({ stickyMaxAgeSeconds: 0 });
  balancer.setEndpoints([{ key: target, ip: th, port: Number(tp) }]);
  const fwd = new TcpForwarder({ host: lh, port: Number(lp), balancer, counters: newCounters(), log: silentLogger(), idleTimeoutMs, budget, admit: () => true });
  await fwd.listen();
  forwarders.push(fwd);
  process.stdout.write(`listening ${listen}\n`);
}
// SIGTERM ends the process normally so --cpu-prof writes its profile.
process.on('SIGTERM', () => {
  for (const f of forwarders) f.destroy();
  process.exit(0);
});
