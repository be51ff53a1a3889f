// Real kernel: a kproxy restart over the rules a previous process left (restart.ts:
// chains already as planned are adopted, the rest written in bounded chunks, the dispatch
// chains edited in place, stale chains deleted last), on the nf_tables backend
// (iptables-restore) and on legacy (iptables-legacy-restore), both families:
// - a new proxier's first sync over the same state writes no rule, and over a changed state
//   (Services removed, added, re-ported, endpoints changed) leaves kproxy's chains exactly as
//   ONE flushing restore of the new ruleset leaves them (rule order within every chain),
//   while another program's nat chain and its jump from PREROUTING survive;
// - during a restart over a changed state (nf_tables and legacy), bounded TCP probes from the node namespace to an
//   unchanged and to a changed Service all succeed (the old rules serve until each service is
//   switched whole);
// - the restart of an unchanged 2,000-Service ruleset writes no rule at all;
// - (nf_tables, IPv4 and IPv6) a restart over an older version's dispatch rules (every
//   dispatch rule's comment other, so every one differs) edits them in several restores of at
//   most 40 lines (the chunk size the test sets), KUBE-SERVICES never flushed, each Service's
//   new rules in one restore, and leaves the KUBE-* chains as one flushing restore of the new
//   ruleset does; during such a restart of 300 Services (60 lines per restore, 10 or more
//   dispatch restores) bounded TCP probes to an unchanged and a changed Service all succeed
//   (a deliberately broken form, every deletion in the first restores and the insertions
//   after, fails it).
// Every namespace and process is removed in `after`, also on failure.
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { hostRunner, type CommandRunner, type RunOptions, inputText } from '../../src/kernel/runner.ts';
import { silentLogger } from '../../src/log.ts';
import { getMode } from '../../src/modes/registry.ts';
import { IptablesProxier, jumpsPayload } from '../../src/modes/iptables/proxier.ts';
import { Netns, uniqueName, vethPair } from '../support/netns.ts';
import { waitFor } from '../support/wait.ts';
import { planInput, slice, svc, testConfig, tracker } from './helpers.ts';
import { kproxyChains } from './kernel-compare.ts';

const made: Netns[] = [];
after(async () => {
  for (const ns of made) await ns.destroy();
});
function netns(prefix: string): Netns {
  const ns = Netns.create(uniqueName(prefix));
  made.push(ns);
  return ns;
}

const legacyName = (b: string) => b.replace(/^(ip6?tables)/, '$1-legacy');

/** Runs in a namespace (legacy: the -legacy binaries, as update-alternatives would) and keeps every restore input. */
class Recording implements CommandRunner {
  restores: string[] = [];
  constructor(private readonly ns: Netns, private readonly legacy: boolean) {}
  async run(cmd: string, args: string[], opts?: RunOptions) {
    if (cmd.endsWith('-restore') && opts?.input) this.restores.push(inputText(opts.input));
    const bin = this.legacy && /^ip6?tables/.test(cmd) ? legacyName(cmd) : cmd;
    return hostRunner.run('ip', ['netns', 'exec', this.ns.name, bin, ...args], { timeoutMs: 60_000, ...opts });
  }
  /** rule lines (-A/-I/-D) the restores wrote */
  rulesWritten(): number {
    let n = 0;
    for (const r of this.restores) for (const l of r.split('\n')) if (/^-[AID] /.test(l)) n++;
    return n;
  }
}

/** Services i = 0..n-1 described by a small model, turned into API objects. */
interface Model {
  port: number;
  eps: number[];
  gone?: boolean;
}

function fixture(family: 4 | 6, models: Model[]) {
  const v6 = family === 6;
  const cluster = (i: number) => (v6 ? `fd00:172:30::${(i + 1).toString(16)}` : `172.30.${(i + 1) >> 8}.${(i + 1) & 255}`);
  const ep = (e: number) => (v6 ? `fd00:10:180::${e.toString(16)}` : `10.180.${e >> 8}.${e & 255}`);
  const lb = (i: number) => (v6 ? `fd00:1:2:3::${(i + 1).toString(16)}` : `1.2.${(i + 1) >> 8}.${(i + 1) & 255}`);
  const t = tracker(family);
  models.forEach((m, i) => {
    if (m.gone) return;
    const type = (['ClusterIP', 'NodePort', 'LoadBalancer'] as const)[i % 3];
    t.services.update(null, svc(`ns${i}`, `svc${i}`, {
      clusterIP: cluster(i),
      port: m.port,
      type,
      nodePort: type === 'ClusterIP' ? undefined : 30000 + i,
      etp: type === 'ClusterIP' ? undefined : i % 4 === 1 ? 'Local' : 'Cluster',
      lbIPs: type === 'LoadBalancer' ? [lb(i)] : undefined,
      sourceRanges: type === 'LoadBalancer' && i % 2 ? [v6 ? 'fd00:203::/64' : '203.0.113.0/25'] : undefined,
      affinitySeconds: i % 7 === 0 ? 60 : undefined,
    }));
    const eps = m.eps.map((e) => ({ ip: ep(e), nodeName: e % 2 ? 'test-node' : 'other' }));
    t.endpoints.update(null, slice(`ns${i}`, `svc${i}`, 's', eps, [{ port: 8080 }], family));
  });
  const keys = t.apply();
  return { t, keys, cluster };
}

/** The reference: one flushing restore of the state's full ruleset, plus the jumps kproxy adds. */
function flushingReference(ns: Netns, family: 4 | 6, legacy: boolean, input: ReturnType<typeof planInput>): void {
  const tool = (b: string) => (legacy ? legacyName(b) : b);
  const v6 = family === 6;
  ns.exec(tool(v6 ? 'ip6tables-restore' : 'iptables-restore'), ['-w', '5'], { input: getMode('iptables').render(input) });
  ns.exec(tool(v6 ? 'ip6tables-restore' : 'iptables-restore'), ['-w', '5', '--noflush'], { input: jumpsPayload(ns.exec(tool(v6 ? 'ip6tables-save' : 'iptables-save'), [])) });
}

const DISPATCH_RULE = /^-A (KUBE-SERVICES|KUBE-NODEPORTS|KUBE-EXTERNAL-SERVICES|KUBE-PROXY-FIREWALL) /;

/**
 * An older version's rules: every dispatch rule's comment given other text (as an upgrade
 * from a version whose comments differ finds them), through one flushing restore of the
 * namespace's whole save. Returns how many rules changed.
 */
function olderComments(ns: Netns, family: 4 | 6): number {
  const v6 = family === 6;
  let changed = 0;
  const save = ns.exec(v6 ? 'ip6tables-save' : 'iptables-save', []).split('\n').map((l) => {
    if (!DISPATCH_RULE.test(l) || !l.includes('--comment')) return l;
    changed++;
    return l.replace(/--comment (?:"([^"]*)"|(\S+))/, (_m, q: string | undefined, w: string | undefined) => `--comment "${q ?? w} (v0)"`);
  });
  ns.exec(v6 ? 'ip6tables-restore' : 'iptables-restore', ['-w', '5'], { input: save.join('\n') });
  return changed;
}

/** Whether a restore input edits a dispatch chain (or the filter table, all of whose chains are). */
const editsDispatch = (r: string) => /^(-[AID] KUBE-(SERVICES|NODEPORTS) |\*filter)/m.test(r);

/** Each Service a dispatch restore inserts rules of (`-I`, or `-A` after the chain's last rule; "ns/name" from the rule's comment). */
function insertedServices(r: string): Set<string> {
  return new Set([...r.matchAll(/^-(?:I KUBE-\S+ \d+|A KUBE-(?:SERVICES|NODEPORTS|EXTERNAL-SERVICES|PROXY-FIREWALL)) .*--comment "?(ns\d+\/svc\d+):/gm)].map((m) => m[1]));
}

function changedModels(base: Model[]): Model[] {
  return base.map((m, i) => {
    if (i % 11 === 3) return { ...m, gone: true }; // removed while kproxy was down
    if (i % 11 === 5) return { ...m, port: m.port + 1 }; // re-ported: new dispatch rules
    if (i % 5 === 2) return { ...m, eps: [...m.eps.slice(1), 1000 + i] }; // an endpoint replaced
    if (i % 13 === 7) return { ...m, eps: [] }; // all endpoints gone: REJECT in filter
    return m;
  });
}

for (const legacy of [false, true]) {
  for (const family of [4, 6] as const) {
    const backend = legacy ? 'legacy' : 'nf_tables';
    test(`IPv${family} ${backend}: a restart over the same rules writes nothing; over changed ones it equals a flushing restore; another program's chain survives`, async () => {
      const v6 = family === 6;
      const tool = (b: string) => (legacy ? legacyName(b) : b);
      const iptables = tool(v6 ? 'ip6tables' : 'iptables');
      const save = tool(v6 ? 'ip6tables-save' : 'iptables-save');
      const k = netns('kprst');
      const raw = netns('kprraw');
      const config = testConfig();
      const nodeIPs = [v6 ? 'fd00:192::2' : '192.168.0.2'];
      const base: Model[] = Array.from({ length: 24 }, (_, i) => ({ port: 80, eps: i % 9 === 4 ? [] : [3 * i + 1, 3 * i + 2, 3 * i + 3] }));
      k.exec(iptables, ['-w', '5', '-t', 'nat', '-N', 'OTHER-APP']);
      k.exec(iptables, ['-w', '5', '-t', 'nat', '-A', 'OTHER-APP', '-s', v6 ? 'fd00:99::/64' : '10.99.0.0/16', '-j', 'RETURN']);
      k.exec(iptables, ['-w', '5', '-t', 'nat', '-A', 'PREROUTING', '-j', 'OTHER-APP']);
      // nf_tables: small chunks, so the restart's leaf writes span several restores
      const chunkLines = legacy ? undefined : 30;

      // The previous process's first sync.
      const old = fixture(family, base);
      await new IptablesProxier({ runner: new Recording(k, legacy), log: silentLogger(), config, chunkLines }).sync(planInput(old.t, config, family, nodeIPs), old.keys, true);

      // A new process, same state: nothing written.
      const same = fixture(family, base);
      const r1 = new Recording(k, legacy);
      const sameInput = planInput(same.t, config, family, nodeIPs);
      await new IptablesProxier({ runner: r1, log: silentLogger(), config, chunkLines }).sync(sameInput, same.keys, true);
      assert.equal(r1.rulesWritten(), 0, `restores:\n${r1.restores.join('\n---\n')}`);
      flushingReference(raw, family, legacy, sameInput);
      assert.equal(kproxyChains(k, family, legacy), kproxyChains(raw, family, legacy), 'restart over the same state');

      // A new process, changed state.
      const next = fixture(family, changedModels(base));
      const r2 = new Recording(k, legacy);
      const nextInput = planInput(next.t, config, family, nodeIPs);
      await new IptablesProxier({ runner: r2, log: silentLogger(), config, chunkLines }).sync(nextInput, next.keys, true);
      const full = getMode('iptables').render(nextInput).split('\n').filter((l) => l.startsWith('-A ')).length;
      assert.ok(r2.rulesWritten() > 0 && r2.rulesWritten() < full / 2, `${r2.rulesWritten()} rule lines written of ${full}`);
      if (!legacy) assert.ok(r2.restores.length >= 3, `${r2.restores.length} restores`);
      // the dispatch chains were edited in place, not rewritten
      assert.ok(r2.restores.every((r) => !/^:KUBE-SERVICES /m.test(r)), 'KUBE-SERVICES not flushed');
      const raw2 = netns('kprraw');
      flushingReference(raw2, family, legacy, nextInput);
      const kernel = kproxyChains(k, family, legacy);
      assert.equal(kernel, kproxyChains(raw2, family, legacy), 'restart over a changed state');
      assert.doesNotMatch(kernel, /ns3\/svc3:/);
      assert.match(kernel, /ns5\/svc5:p80 cluster IP.* --dport 81 /);
      const nat = k.exec(save, ['-t', 'nat']);
      assert.match(nat, /^-A OTHER-APP -s \S+ -j RETURN$/m, 'the other program\'s rule is kept');
      assert.match(nat, /^-A PREROUTING -j OTHER-APP$/m, 'and its jump');
      assert.equal(nat.split('\n').filter((l) => /^-A PREROUTING .*-j KUBE-SERVICES$/.test(l)).length, 1, 'one jump into KUBE-SERVICES');
    });
  }
}

/** A client in `ns` that connects to each target every ~20 ms (bounded), printing one line per probe. */
const PROBE_CLIENT = `
const net = require('node:net');
const targets = process.argv[1].split(',');
const until = Date.now() + 120000;
let n = 0;
const one = (t) => new Promise((res) => {
  const at = t.lastIndexOf(':');
  const host = t.slice(0, at);
  const [h, p] = [host.startsWith('[') ? host.slice(1, -1) : host, t.slice(at + 1)];
  const s = net.connect({ host: h, port: Number(p) });
  const timer = setTimeout(() => { s.destroy(); res('timeout'); }, 5000);
  let got = '';
  s.on('data', (d) => { got += d; });
  s.on('end', () => { clearTimeout(timer); res(got === 'ok' ? 'ok' : 'bad:' + got); });
  s.on('error', (e) => { clearTimeout(timer); res('error:' + e.code); });
});
(async () => {
  while (Date.now() < until && n < 20000) {
    for (const t of targets) { const r = await one(t); n++; process.stdout.write(t + ' ' + r + '\\n'); }
    await new Promise((r) => setTimeout(r, 20));
  }
})();
`;

for (const legacy of [false, true]) test(`IPv4 ${legacy ? 'legacy' : 'nf_tables'}: during a restart over a changed state, an unchanged and a changed Service answer every probe`, async () => {
  const node = netns('kprnode');
  const pods = netns('kprpods');
  vethPair(node, 'vn', '192.168.0.2/24', pods, 'vs', '192.168.0.3/24');
  node.exec('ip', ['route', 'add', 'default', 'via', '192.168.0.3']);
  // every pod address answers: 10.0.0.0/8 is local in the pods namespace, one server on :8080
  pods.exec('ip', ['route', 'add', 'local', '10.0.0.0/8', 'dev', 'lo']);
  pods.spawn(process.execPath, ['-e', "require('node:net').createServer((s) => s.end('ok')).listen(8080, '0.0.0.0', () => console.log('listening'))"]);
  const config = testConfig();
  // enough Services that the restart spans many restores
  const base: Model[] = Array.from({ length: 300 }, (_, i) => ({ port: 80, eps: [2 * i + 1, 2 * i + 2] }));
  const old = fixture(4, base);
  await new IptablesProxier({ runner: new Recording(node, legacy), log: silentLogger(), config, chunkLines: 60 }).sync(planInput(old.t, config, 4, ['192.168.0.2']), old.keys, true);
  const changed = changedModels(base);
  // svc0 is unchanged, svc2 has an endpoint replaced; both are ClusterIP Services on port 80
  assert.deepEqual(changed[0], base[0]);
  assert.notDeepEqual(changed[2].eps, base[2].eps);
  const targets = [`${old.cluster(0)}:80`, `${old.cluster(2)}:80`];
  let out = '';
  await waitFor('the pod server', () => pods.exec('ss', ['-ltn']).includes(':8080'), 20_000);
  const client = node.spawn(process.execPath, ['-e', PROBE_CLIENT, targets.join(',')], { onOutput: (s) => (out += s) });
  try {
    // probes answer before the restart
    await waitFor('probes before the restart', () => targets.every((t) => out.includes(`${t} ok`)), 30_000);
    const next = fixture(4, changed);
    const r = new Recording(node, legacy);
    await new IptablesProxier({ runner: r, log: silentLogger(), config, chunkLines: 60 }).sync(planInput(next.t, config, 4, ['192.168.0.2']), next.keys, true);
    assert.ok(r.restores.length >= 3, `${r.restores.length} restores`);
    const during = out.length;
    await waitFor('probes after the restart', () => targets.every((t) => out.slice(during).includes(`${t} ok`)), 30_000);
  } finally {
    await node.kill(client);
  }
  const lines = out.split('\n').filter(Boolean);
  const failed = lines.filter((l) => !l.endsWith(' ok'));
  assert.deepEqual(failed.slice(0, 5), [], `${failed.length} of ${lines.length} probes failed`);
  assert.ok(lines.length >= 4);
});

test('IPv4 nf_tables: the restart of an unchanged 2,000-Service ruleset writes no rule', async () => {
  const k = netns('kprbig');
  const config = testConfig();
  const base: Model[] = Array.from({ length: 2000 }, (_, i) => ({ port: 80, eps: [3 * i + 1, 3 * i + 2] }));
  const old = fixture(4, base);
  const r0 = new Recording(k, false);
  await new IptablesProxier({ runner: r0, log: silentLogger(), config }).sync(planInput(old.t, config, 4, ['192.168.0.2']), old.keys, true);
  assert.ok(r0.rulesWritten() > 8000, `${r0.rulesWritten()} rules at the cold start`);
  const same = fixture(4, base);
  const r1 = new Recording(k, false);
  await new IptablesProxier({ runner: r1, log: silentLogger(), config }).sync(planInput(same.t, config, 4, ['192.168.0.2']), same.keys, true);
  assert.equal(r1.rulesWritten(), 0);
  assert.equal(r1.restores.length, 0);
});

for (const family of [4, 6] as const) test(`IPv${family} nf_tables: a restart over an older version's dispatch rules (every comment other) edits them in several bounded restores, each Service's in one, and equals a flushing restore`, async () => {
  const k = netns('kprcmt');
  const raw = netns('kprraw');
  const config = testConfig();
  const nodeIPs = [family === 6 ? 'fd00:192::2' : '192.168.0.2'];
  const base: Model[] = Array.from({ length: 60 }, (_, i) => ({ port: 80, eps: i % 9 === 4 ? [] : [3 * i + 1, 3 * i + 2, 3 * i + 3] }));
  // 40 lines per restore, leaf chunks and dispatch edits alike
  const chunkLines = 40;
  const old = fixture(family, base);
  await new IptablesProxier({ runner: new Recording(k, false), log: silentLogger(), config, chunkLines }).sync(planInput(old.t, config, family, nodeIPs), old.keys, true);
  const rewritten = olderComments(k, family);
  assert.ok(rewritten > 100, `${rewritten} dispatch rules given other comments`);

  const next = fixture(family, changedModels(base));
  const r = new Recording(k, false);
  const nextInput = planInput(next.t, config, family, nodeIPs);
  await new IptablesProxier({ runner: r, log: silentLogger(), config, chunkLines }).sync(nextInput, next.keys, true);
  const dispatch = r.restores.filter(editsDispatch);
  assert.ok(dispatch.length >= 4, `${dispatch.length} dispatch restores`);
  // every restore within the budget (no Service here has 40 dispatch edits)
  for (const [n, input] of r.restores.entries()) {
    const lines = input.split('\n').filter((l) => /^(-[AIDX] |:)/.test(l)).length;
    assert.ok(lines <= chunkLines, `restore ${n}: ${lines} lines`);
  }
  // KUBE-SERVICES is edited, never flushed; each Service's new dispatch rules come in one restore
  assert.ok(r.restores.every((x) => !/^:KUBE-SERVICES /m.test(x)), 'KUBE-SERVICES not flushed');
  const seen = new Map<string, number>();
  dispatch.forEach((x, n) => {
    for (const svcKey of insertedServices(x)) {
      assert.equal(seen.get(svcKey) ?? n, n, `${svcKey} inserted in two restores`);
      seen.set(svcKey, n);
    }
  });
  assert.ok(seen.size >= 40, `${seen.size} Services' dispatch rules rewritten`);
  flushingReference(raw, family, false, nextInput);
  const kernel = kproxyChains(k, family, false);
  assert.equal(kernel, kproxyChains(raw, family, false), 'the restart over an older version\'s rules');
  assert.doesNotMatch(kernel, /\(v0\)/);
});

for (const family of [4, 6] as const) test(`IPv${family} nf_tables: during a restart over an older version's dispatch rules, in several restores, an unchanged and a changed Service answer every probe`, async () => {
  const v6 = family === 6;
  const node = netns('kprnode');
  const pods = netns('kprpods');
  for (const ns of [node, pods]) ns.exec('sysctl', ['-qw', 'net.ipv6.conf.default.accept_dad=0']);
  vethPair(node, 'vn', v6 ? 'fd00:192::2/64' : '192.168.0.2/24', pods, 'vs', v6 ? 'fd00:192::3/64' : '192.168.0.3/24');
  node.exec('ip', v6 ? ['-6', 'route', 'add', 'default', 'via', 'fd00:192::3'] : ['route', 'add', 'default', 'via', '192.168.0.3']);
  // every pod address answers: the endpoints' prefix is local in the pods namespace, one server on :8080
  pods.exec('ip', v6 ? ['-6', 'route', 'add', 'local', 'fd00:10:180::/64', 'dev', 'lo'] : ['route', 'add', 'local', '10.0.0.0/8', 'dev', 'lo']);
  pods.spawn(process.execPath, ['-e', `require('node:net').createServer((s) => s.end('ok')).listen(8080, '${v6 ? '::' : '0.0.0.0'}', () => console.log('listening'))`]);
  const config = testConfig();
  const nodeIPs = [v6 ? 'fd00:192::2' : '192.168.0.2'];
  const base: Model[] = Array.from({ length: 300 }, (_, i) => ({ port: 80, eps: [2 * i + 1, 2 * i + 2] }));
  const old = fixture(family, base);
  await new IptablesProxier({ runner: new Recording(node, false), log: silentLogger(), config, chunkLines: 60 }).sync(planInput(old.t, config, family, nodeIPs), old.keys, true);
  assert.ok(olderComments(node, family) > 300);
  const changed = changedModels(base);
  // svc0 is unchanged (but its dispatch rule's text is an older version's), svc2 has an
  // endpoint replaced; both are ClusterIP Services on port 80
  assert.deepEqual(changed[0], base[0]);
  assert.notDeepEqual(changed[2].eps, base[2].eps);
  const target = (i: number) => (v6 ? `[${old.cluster(i)}]:80` : `${old.cluster(i)}:80`);
  const targets = [target(0), target(2)];
  let out = '';
  await waitFor('the pod server', () => pods.exec('ss', ['-ltn']).includes(':8080'), 20_000);
  const client = node.spawn(process.execPath, ['-e', PROBE_CLIENT, targets.join(',')], { onOutput: (s) => (out += s) });
  let r: Recording;
  try {
    await waitFor('probes before the restart', () => targets.every((t) => out.includes(`${t} ok`)), 30_000);
    const next = fixture(family, changed);
    r = new Recording(node, false);
    await new IptablesProxier({ runner: r, log: silentLogger(), config, chunkLines: 60, dispatchChunkLines: 60 }).sync(planInput(next.t, config, family, nodeIPs), next.keys, true);
    const during = out.length;
    await waitFor('probes after the restart', () => targets.every((t) => out.slice(during).includes(`${t} ok`)), 30_000);
  } finally {
    await node.kill(client);
  }
  assert.ok(r.restores.filter(editsDispatch).length >= 10, `${r.restores.filter(editsDispatch).length} dispatch restores`);
  assert.doesNotMatch(node.exec(v6 ? 'ip6tables-save' : 'iptables-save', ['-t', 'nat']), /\(v0\)/, 'every dispatch rule rewritten');
  const lines = out.split('\n').filter(Boolean);
  const failed = lines.filter((l) => !l.endsWith(' ok'));
  assert.deepEqual(failed.slice(0, 5), [], `${failed.length} of ${lines.length} probes failed`);
  assert.ok(lines.length >= 4);
});
