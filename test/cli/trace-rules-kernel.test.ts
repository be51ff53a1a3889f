// `kproxy trace --rules` on dumps the real tools write: kproxy's rules for a known set of
// Services are loaded into a network namespace this test creates (iptables-restore /
// ip6tables-restore, nft -f; the nftables mode both as one table and as two shard tables
// kube-proxy-0/1), dumped with `iptables-save` (also `-c`, with counters), `ip6tables-save`,
// `nft list ruleset` and `nft -a list ruleset` (handles), and a packet is traced through the
// dump offline. The expected answers come from the Services' layout (which endpoints back
// which address, which Service has none), not from kproxy's tracer; for iptables and nftables also from
// real traffic: a client namespace connects through the node namespace to backends in two pod
// namespaces, and the endpoints reached, the peer address they saw (masquerade) and the
// refusals must be what the trace of the node's `iptables-save -c` / `nft -a list ruleset` says. Every namespace and
// backend is removed in `after`, also on failure.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { Netns, repoRoot, uniqueName, vethPair } from '../support/netns.ts';
import { makeService, makeSlice } from '../support/builders.ts';
import { stateOf } from '../../src/conformance/case.ts';
import { optionsFromCase } from '../../src/modes/nftables/conformance.ts';
import { planShards } from '../../src/modes/nftables/shards.ts';
import { dumpRuleset } from '../../src/modes/nftables/ruleset.ts';
import { traceSavedRules } from '../../src/modes/trace-saved.ts';

const NODE_IP = '192.168.0.2';
const NODE_IP6 = '2001:db8::1';
const OBJECTS = [
  makeService('ns1', 'web', { type: 'NodePort', clusterIP: '172.30.0.41', clusterIPs: ['172.30.0.41'], ports: [{ name: 'http', port: 80, targetPort: 8080, protocol: 'TCP', nodePort: 30080 }] }),
  makeSlice('ns1', 'web', { endpoints: [{ ip: '10.180.1.1' }, { ip: '10.180.2.1' }], ports: [{ name: 'http', port: 8080 }] }),
  makeService('ns1', 'empty', { clusterIP: '172.30.0.42', clusterIPs: ['172.30.0.42'], ports: [{ name: 'http', port: 80, protocol: 'TCP' }] }),
  makeService('ns2', 'dns', { clusterIP: '172.30.0.10', clusterIPs: ['172.30.0.10'], ports: [{ name: 'dns', port: 53, targetPort: 5353, protocol: 'UDP' }] }),
  makeSlice('ns2', 'dns', { endpoints: [{ ip: '10.180.1.9' }], ports: [{ name: 'dns', port: 5353, protocol: 'UDP' }] }),
  makeService('ns3', 'web6', { ipFamilies: ['IPv6'], clusterIP: 'fd00:172:30::42', clusterIPs: ['fd00:172:30::42'], ports: [{ name: 'http', port: 80, targetPort: 8080, protocol: 'TCP' }] }),
  makeSlice('ns3', 'web6', { family: 6, endpoints: [{ ip: 'fd00:10:180::1' }], ports: [{ name: 'http', port: 8080 }] }),
];

/** What each packet must meet, from the objects above. */
const FLOWS: Array<{ name: string; from: string; to: string; port: number; proto?: 'TCP' | 'UDP'; output: string; nftOutput?: string; masq?: boolean; v6?: boolean }> = [
  { name: 'pod to cluster IP: both endpoints of ns1/web', from: '10.0.0.2', to: '172.30.0.41', port: 80, output: '10.180.1.1:8080, 10.180.2.1:8080' },
  { name: 'outside client to the NodePort: masqueraded', from: '203.0.113.2', to: NODE_IP, port: 30080, output: '10.180.1.1:8080, 10.180.2.1:8080', masq: true },
  { name: 'Service without endpoints: rejected', from: '10.0.0.2', to: '172.30.0.42', port: 80, output: 'REJECT' },
  { name: 'UDP cluster IP', from: '10.0.0.2', to: '172.30.0.10', port: 53, proto: 'UDP', output: '10.180.1.9:5353' },
  // iptables leaves it alone; the nftables mode rejects a ClusterIP's other ports (upstream's
  // cluster-ips-check, "Reject traffic to invalid ports of ClusterIPs")
  { name: 'the TCP port of a UDP-only Service is not served', from: '10.0.0.2', to: '172.30.0.10', port: 53, proto: 'TCP', output: '', nftOutput: 'REJECT' },
  { name: 'IPv6 cluster IP', from: 'fd00:10::2', to: 'fd00:172:30::42', port: 80, output: '[fd00:10:180::1]:8080', v6: true },
];

const NS = uniqueName('kpt-trr');
const dir = mkdtempSync(join(tmpdir(), 'kpt-trr-'));
let ns: Netns;
const others: Netns[] = [];
const servers: ChildProcess[] = [];

function kproxy(args: string[]): string {
  return execFileSync(process.execPath, [join(repoRoot, 'bin/kproxy.js'), ...args], { encoding: 'utf8', timeout: 120_000 });
}

/** Each flow through the dump(s): output and masquerade as the layout says. */
function checkFlows(files: string[], only: (f: (typeof FLOWS)[number]) => boolean): void {
  const read = files.map((name) => ({ name, text: execFileSync('cat', [join(dir, name)], { encoding: 'utf8' }) }));
  for (const f of FLOWS.filter(only)) {
    const r = traceSavedRules({ files: read, from: f.from, to: f.to, port: f.port, protocol: f.proto ?? 'TCP', nodeIPs: [NODE_IP, NODE_IP6] });
    const want = r.mode === 'nftables' ? (f.nftOutput ?? f.output) : f.output;
    assert.equal(r.output, want, `${files.join('+')}: ${f.name}\n${r.rules.join('\n')}\n${r.notes.join('\n')}`);
    if (f.masq !== undefined) assert.equal(r.masq, f.masq, `${files.join('+')}: ${f.name} masquerade`);
    assert.deepEqual(r.warnings, [], `${files.join('+')}: every line of the dump is read`);
  }
}

before(() => {
  ns = Netns.create(NS);
  writeFileSync(join(dir, 'objects.yaml'), OBJECTS.map((o) => stringify(o)).join('---\n'));
});

after(async () => {
  for (const p of servers) {
    try {
      process.kill(-p.pid!, 'SIGKILL');
    } catch {
      /* gone */
    }
  }
  for (const o of others) await o.destroy();
  await ns?.destroy();
  rmSync(dir, { recursive: true, force: true });
});

describe('iptables: iptables-save / ip6tables-save of the rules kproxy installs', () => {
  before(() => {
    const payload = kproxy(['render', '--mode', 'iptables', '--manifests', dir, '--node-ip', `${NODE_IP},${NODE_IP6}`]);
    const [v4, v6] = payload.split('# ==== kproxy IPv6 ====');
    assert.match(v4, /\*nat/);
    assert.match(v6, /\*nat/);
    ns.exec('iptables-restore', ['--noflush'], { input: v4 });
    ns.exec('ip6tables-restore', ['--noflush'], { input: v6 });
    // the jumps a node has from the built-in chains (kube-proxy adds them apart from the restore)
    for (const [bin, table, chain, target] of [
      ['iptables', 'nat', 'PREROUTING', 'KUBE-SERVICES'], ['iptables', 'filter', 'FORWARD', 'KUBE-SERVICES'],
      ['ip6tables', 'nat', 'PREROUTING', 'KUBE-SERVICES'], ['ip6tables', 'filter', 'FORWARD', 'KUBE-SERVICES'],
    ]) {
      ns.exec(bin, ['-t', table, '-I', chain, '-m', 'comment', '--comment', 'kubernetes service portals', '-j', target]);
    }
    writeFileSync(join(dir, 'iptables-save.txt'), ns.exec('iptables-save', []));
    writeFileSync(join(dir, 'iptables-save-c.txt'), ns.exec('iptables-save', ['-c']));
    writeFileSync(join(dir, 'ip6tables-save.txt'), ns.exec('ip6tables-save', []));
  });

  test('IPv4 flows through iptables-save, with and without counters', () => {
    checkFlows(['iptables-save.txt'], (f) => !f.v6);
    checkFlows(['iptables-save-c.txt'], (f) => !f.v6);
  });

  test('IPv6 flows through ip6tables-save; given both dumps, the packet picks its family', () => {
    checkFlows(['ip6tables-save.txt'], (f) => !!f.v6);
    checkFlows(['iptables-save.txt', 'ip6tables-save.txt'], () => true);
  });

  test('kproxy trace --rules on the command line: the text and the --json answer', () => {
    const text = kproxy(['trace', '--rules', join(dir, 'iptables-save-c.txt'), '--from', '203.0.113.2', '--to', `${NODE_IP}:30080`, '--node-ip', NODE_IP]);
    assert.match(text, /^verdict: +DNAT$/m);
    assert.match(text, /^endpoints: +10\.180\.1\.1:8080, 10\.180\.2\.1:8080$/m);
    assert.match(text, /^masquerade: +yes$/m);
    assert.match(text, /^note: +read .*iptables-save-c\.txt: iptables-save \(line \d+: a "\*TABLE" line of iptables-save\)$/m);
    const j = JSON.parse(kproxy(['trace', '--rules', join(dir, 'ip6tables-save.txt'), '--from', 'fd00:10::2', '--to', '[fd00:172:30::42]:80', '--json']));
    assert.equal(j.output, '[fd00:10:180::1]:8080');
    assert.deepEqual(j.warnings, []);
  });

  test('a line spliced into the real dump is named in the output, and the rest still traces', () => {
    const lines = execFileSync('cat', [join(dir, 'iptables-save.txt')], { encoding: 'utf8' }).split('\n');
    const at = lines.findIndex((l) => l.startsWith('-A KUBE-SERVICES'));
    lines.splice(at, 0, '-A KUBE-SERVICES -m comment --comment "unterminated -j DROP');
    writeFileSync(join(dir, 'broken.txt'), lines.join('\n'));
    const j = JSON.parse(kproxy(['trace', '--rules', join(dir, 'broken.txt'), '--from', '10.0.0.2', '--to', '172.30.0.41:80', '--json']));
    assert.equal(j.output, '10.180.1.1:8080, 10.180.2.1:8080');
    assert.deepEqual(j.warnings, [`${join(dir, 'broken.txt')} line ${at + 1}: not parsed (unterminated quote), left out: -A KUBE-SERVICES -m comment --comment "unterminated -j DROP`]);
  });
});

// A backend says who it is and which peer address it saw; the client makes `n` connections
// (each bounded to 2 s) and prints one line per attempt: "pod1 203.0.113.2" or "ERR ECONNREFUSED".
const BACKEND = `require('node:net').createServer((s) => { s.on('error', () => {}); s.end(process.argv[1] + ' ' + s.remoteAddress.replace(/^::ffff:/, '') + '\\n'); }).listen(8080, () => console.log('ready'));
setTimeout(() => process.exit(0), 300000).unref();`;
const CLIENT = `const net = require('node:net'); const [host, port, n] = process.argv.slice(1);
(async () => { for (let i = 0; i < Number(n); i++) console.log(await new Promise((res) => {
  const s = net.connect({ host, port: Number(port) }); let b = '';
  const t = setTimeout(() => { s.destroy(); res('ERR TIMEOUT'); }, 2000);
  s.on('data', (d) => (b += d)); s.on('end', () => { clearTimeout(t); res(b.trim()); });
  s.on('error', (e) => { clearTimeout(t); res('ERR ' + e.code); }); })); })();`;

const PODS = [
  { name: 'pod1', ip: '10.180.1.1', gw: '10.180.1.254' },
  { name: 'pod2', ip: '10.180.2.1', gw: '10.180.2.254' },
];
const CLIENT_IP = '203.0.113.2';
let client: Netns | undefined;

/** What `n` connections from the client met: the pods that answered, the peers they saw, or the errors. */
function connect(to: string, port: number, n: number): string[] {
  return client!.exec(process.execPath, ['-e', CLIENT, to, String(port), String(n)]).trim().split('\n');
}

/** The trace of the saved dump against real connections from the client namespace. */
function agreeWithTraffic(name: string, text: string, flows: Array<readonly [string, number]>): void {
  for (const [to, port] of flows) {
    const r = traceSavedRules({ files: [{ name, text }], from: CLIENT_IP, to, port, protocol: 'TCP', nodeIPs: [NODE_IP] });
    // 20 tries: each of two endpoints unseen with probability 2^-20
    const met = connect(to, port, 20);
    if (r.output === 'REJECT') {
      assert.deepEqual([...new Set(met)], ['ERR ECONNREFUSED'], `${name} ${to}:${port}`);
      continue;
    }
    const byIP = new Map(PODS.map((p) => [p.name, `${p.ip}:8080`]));
    const reached = [...new Set(met.map((l) => byIP.get(l.split(' ')[0]) ?? l))].sort();
    assert.deepEqual(reached, r.output.split(', '), `${name} ${to}:${port}: the endpoints real packets reached`);
    const peers = new Set(met.map((l) => l.split(' ')[1]));
    assert.equal(r.masq, !peers.has(CLIENT_IP), `${name} ${to}:${port}: masqueraded (peers seen: ${[...peers].join(', ')})`);
  }
}

describe('iptables: the answer of the saved dump is what real packets meet', () => {

  before(async () => {
    ns.exec('sysctl', ['-qw', 'net.ipv4.ip_forward=1']);
    // a default route, as a node has: service VIPs are routed (then DNATed) like any address
    ns.exec('ip', ['link', 'add', 'kptd0', 'type', 'veth', 'peer', 'name', 'kptd1']);
    ns.exec('ip', ['link', 'set', 'kptd0', 'up']);
    ns.exec('ip', ['route', 'add', 'default', 'dev', 'kptd0']);
    ns.exec('iptables', ['-t', 'nat', '-I', 'POSTROUTING', '-m', 'comment', '--comment', 'kubernetes postrouting rules', '-j', 'KUBE-POSTROUTING']);
    const c = Netns.create(`${NS}-c`);
    client = c;
    others.push(c);
    vethPair(c, 'eth0', `${CLIENT_IP}/24`, ns, 'kptc0', '203.0.113.1/24');
    ns.exec('ip', ['addr', 'add', `${NODE_IP}/24`, 'dev', 'kptc0']);
    c.exec('ip', ['route', 'add', 'default', 'via', '203.0.113.1']);
    for (const [i, p] of PODS.entries()) {
      const pod = Netns.create(`${NS}-p${i + 1}`);
      others.push(pod);
      vethPair(pod, 'eth0', `${p.ip}/24`, ns, `kptp${i + 1}`, `${p.gw}/24`);
      pod.exec('ip', ['route', 'add', 'default', 'via', p.gw]);
      const child = spawn('ip', ['netns', 'exec', pod.name, process.execPath, '-e', BACKEND, p.name], { stdio: ['ignore', 'pipe', 'inherit'], detached: true });
      servers.push(child);
      await new Promise<void>((res, rej) => {
        const t = setTimeout(() => rej(new Error(`${p.name} did not start`)), 10_000);
        child.stdout!.on('data', (d: Buffer) => d.toString().includes('ready') && (clearTimeout(t), res()));
      });
    }
    writeFileSync(join(dir, 'live-iptables-save.txt'), ns.exec('iptables-save', ['-c']));
  });

  test('cluster IP, NodePort and a Service without endpoints: the trace of the dump and the traffic agree', () => {
    const text = execFileSync('cat', [join(dir, 'live-iptables-save.txt')], { encoding: 'utf8' });
    agreeWithTraffic('live-iptables-save.txt', text, [['172.30.0.41', 80], [NODE_IP, 30080], ['172.30.0.42', 80]]);
  });
});

describe('nftables: nft list ruleset of the tables kproxy installs', () => {
  before(() => {
    const payload = kproxy(['render', '--mode', 'nftables', '--manifests', dir, '--node-ip', `${NODE_IP},${NODE_IP6}`]);
    // the iptables mode's rules (iptables-nft tables) go: one mode at a time, as on a node
    ns.exec('nft', ['flush', 'ruleset']);
    ns.exec('nft', ['-f', '-'], { input: payload.split('\n').filter((l) => !l.startsWith('# ====')).join('\n') });
    writeFileSync(join(dir, 'ruleset.txt'), ns.exec('nft', ['list', 'ruleset']));
    writeFileSync(join(dir, 'ruleset-a.txt'), ns.exec('nft', ['-a', 'list', 'ruleset']));
  });

  test('both families through nft list ruleset and nft -a list ruleset (handles)', () => {
    const listed = execFileSync('cat', [join(dir, 'ruleset-a.txt')], { encoding: 'utf8' });
    assert.match(listed, /^table ip kube-proxy \{ # handle \d+$/m);
    assert.match(listed, /^table ip6 kube-proxy \{ # handle \d+$/m);
    checkFlows(['ruleset.txt'], () => true);
    checkFlows(['ruleset-a.txt'], () => true);
  });

  test('real traffic meets what the trace of nft list ruleset says', () => {
    agreeWithTraffic('ruleset-a.txt', execFileSync('cat', [join(dir, 'ruleset-a.txt')], { encoding: 'utf8' }), [['172.30.0.41', 80], [NODE_IP, 30080], ['172.30.0.42', 80]]);
  });

  test('the sharded shape: Services spread over kube-proxy-0 and kube-proxy-1, traced together', () => {
    ns.exec('nft', ['flush', 'ruleset']);
    const cfg = { mode: 'nftables', ipFamily: 'IPv4', nodeName: 'node-a', nodePortAddresses: [`${NODE_IP}/32`] };
    const tables = planShards(stateOf(cfg, OBJECTS), optionsFromCase(cfg), 2);
    assert.deepEqual(tables.map((t) => t.table), ['kube-proxy-0', 'kube-proxy-1']);
    for (const t of tables) ns.exec('nft', ['-f', '-'], { input: dumpRuleset(t) });
    writeFileSync(join(dir, 'sharded.txt'), ns.exec('nft', ['list', 'ruleset']));
    const r = traceSavedRules({ files: [{ name: 'sharded.txt', text: ns.exec('nft', ['list', 'ruleset']) }], from: '10.0.0.2', to: '172.30.0.41', port: 80, protocol: 'TCP', nodeIPs: [NODE_IP] });
    assert.match(r.notes.join('\n'), /tables traced together, in the order listed: kube-proxy-0, kube-proxy-1/);
    checkFlows(['sharded.txt'], (f) => !f.v6);
  });
});
