// The reference "20-line Node net pipe proxy" of bench/userspace.ts: each argument is
// LISTEN_HOST:LISTEN_PORT=TARGET_HOST:TARGET_PORT; every accepted connection is piped to a
// fresh connection to the target. No retries, no balancing, no bounds: the floor a Node
// proxy should beat.
import net from 'node:net';

// SIGTERM exits normally (a `node --cpu-prof` run writes its profile then).
process.on('SIGTERM', () => process.exit(0));
for (const arg of process.argv.slice(2)) {
  const [listen, target] = arg.split('=');
  const [lh, lp] = listen.split(':');
  const [th, tp] = target.split(':');
  net
    .createServer((c) => {
      const u = net.connect(Number(tp), th);
      c.pipe(u).pipe(c);
      c.on('error', () => u.destroy());
      u.on('error', () => c.destroy());
    })
    .listen(Number(lp), lh, () => process.stdout.write(`listening ${listen}\n`));
}
