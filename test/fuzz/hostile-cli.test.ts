// Hostile input, on the real kernel in namespaces this test creates: a directory of
// thousands of hostile files next to three good Services.
// 1. `kproxy render` in every mode exits 0, says what it skipped, and plans the good Services;
//    its payloads pass the real binaries (iptables-restore, nft -c -f then nft -f, ipset restore).
// 2. `kproxy run` over the same directory (iptables, nftables, userspace) stays up, programs
//    the good Services (real traffic reaches their pods), keeps localhost reachable, and still
//    applies a good change while more hostile files arrive.
//   node ns (kproxy; 10.180.250.254, 127.0.0.1:18080 "localhost" service) ── veth ── pod ns (10.180.250.1, .2)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { Netns, repoRoot, uniqueName, vethPair, waitFor } from '../support/netns.ts';
import { GOOD, goodManifests, hostileCorpus } from '../support/hostile.ts';

const FILES = Number(process.env.KPROXY_FUZZ_FILES ?? 2000);
const SEED = Number(process.env.KPROXY_FUZZ_SEED ?? 12);
const dir = mkdtempSync(join(tmpdir(), 'kp-hostile-'));
// the allocations of Services without a clusterIP: kept here, never in the host's /var/lib/kproxy
const state = join(mkdtempSync(join(tmpdir(), 'kp-hostile-state-')), 'allocations.json');
const tag = uniqueName('kpfz');
const node = new Netns(`${tag}-n`);
const pods = new Netns(`${tag}-p`);

function writeGood(extraEndpoint = false): void {
  writeFileSync(join(dir, 'good.yaml'), goodManifests(extraEndpoint ? ['10.180.250.5'] : []));
}

before(async () => {
  for (const f of hostileCorpus(FILES, SEED)) writeFileSync(join(dir, f.name), f.content);
  writeGood();
  for (const ns of [node, pods]) Netns.create(ns.name);
  vethPair(node, 'to-pods', '10.180.250.254/16', pods, 'eth0', '10.180.250.1/16');
  pods.exec('ip', ['addr', 'add', '10.180.250.2/16', 'dev', 'eth0']);
  pods.exec('ip', ['addr', 'add', '10.180.250.5/16', 'dev', 'eth0']);
  pods.exec('ip', ['route', 'add', 'default', 'via', '10.180.250.254']);
  node.exec('ip', ['route', 'add', 'default', 'dev', 'to-pods']);
  node.exec('sysctl', ['-qw', 'net.ipv4.ip_forward=1']);
  for (const [id, ip] of [['pod-1', '10.180.250.1'], ['pod-2', '10.180.250.2'], ['pod-5', '10.180.250.5']]) {
    const p = pods.node('test/support/backend-main.ts', [id, `tcp:${ip}:8080`]);
    await waitFor(`backend ${id}`, () => new Promise<boolean>((r) => p.stdout!.once('data', () => r(true))), 20_000);
  }
  const local = node.node('test/support/backend-main.ts', ['localhost', 'tcp:127.0.0.1:18080']);
  await waitFor('localhost backend', () => new Promise<boolean>((r) => local.stdout!.once('data', () => r(true))), 20_000);
});

after(async () => {
  for (const ns of [node, pods]) await ns.destroy();
  rmSync(dir, { recursive: true, force: true });
  rmSync(dirname(state), { recursive: true, force: true });
});

function render(mode: string): { code: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, [join(repoRoot, 'bin/kproxy.js'), 'render', '--mode', mode, '--manifests', dir, '--manifests-state', state, '--hostname-override', 'fuzz-node', '--node-ip', '10.180.250.254'], {
    encoding: 'utf8',
    timeout: 180_000,
    maxBuffer: 512 * 1024 * 1024,
  });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** `cmd` in the node namespace with `input` on stdin; the exit code and stderr. */
function inNode(cmd: string, args: string[], input: string): { code: number | null; stderr: string } {
  const r = spawnSync('ip', ['netns', 'exec', node.name, cmd, ...args], { input, encoding: 'utf8', timeout: 120_000, maxBuffer: 256 * 1024 * 1024 });
  return { code: r.status, stderr: r.stderr };
}

function section(payload: string, header: string): string {
  const start = payload.indexOf(`# ${header}\n`);
  assert.ok(start >= 0, `section "${header}" in the ipvs render`);
  const body = payload.slice(start + header.length + 3);
  const next = body.search(/^# (sysctls|addresses|ipset restore|ipvsadm -R|ip6?tables-restore)/m);
  return next < 0 ? body : body.slice(0, next);
}

/**
 * One family's payload of a render: a dual-stack state prints a section per family, each
 * opened by `# ==== kproxy IPv4 ====` (IPv6); a single-family one prints its payload alone.
 */
function familyPart(out: string, family: 4 | 6): string {
  const parts = out.split(/^(?=# ==== kproxy IPv[46] ====$)/m);
  if (parts.length === 1) return family === 4 ? out : '';
  return parts.find((p) => p.startsWith(`# ==== kproxy IPv${family} ====\n`)) ?? '';
}

function clearNode(): void {
  node.exec('nft', ['flush', 'ruleset'], { allowFail: true });
  for (const bin of ['iptables', 'ip6tables']) {
    for (const t of ['nat', 'filter', 'mangle']) {
      node.exec(bin, ['-t', t, '-F'], { allowFail: true });
      node.exec(bin, ['-t', t, '-X'], { allowFail: true });
    }
  }
  node.exec('ipset', ['destroy'], { allowFail: true });
}

function tcpReplies(ip: string, port: number, n: number): Record<string, number> {
  const out = node.exec(process.execPath, ['--import', 'tsx', join(repoRoot, 'test/support/client-main.ts'), 'tcp', ip, String(port), String(n), '2000']);
  return (JSON.parse(out.trim().split('\n').at(-1)!) as { replies: Record<string, number> }).replies;
}

for (const mode of ['iptables', 'nftables', 'ipvs', 'userspace']) {
  test(`render --mode ${mode} over ${FILES} hostile files: exit 0, skipped listed, good Services planned, payload accepted by the kernel`, () => {
    const r = render(mode);
    assert.equal(r.code, 0, `render exited ${r.code}: ${r.stderr.slice(-2000)}`);
    assert.match(r.stderr, /skipped/, 'render says what it skipped');
    for (const g of GOOD) assert.ok(r.stdout.includes(g.ip), `good Service ${g.name} (${g.ip}) planned`);
    clearNode();
    if (mode === 'iptables') {
      const a = inNode('iptables-restore', ['--noflush'], familyPart(r.stdout, 4));
      assert.equal(a.code, 0, `iptables-restore refused the payload: ${a.stderr.slice(0, 2000)}`);
      const v6 = familyPart(r.stdout, 6);
      if (v6) {
        const a6 = inNode('ip6tables-restore', ['--noflush'], v6);
        assert.equal(a6.code, 0, `ip6tables-restore refused the IPv6 payload: ${a6.stderr.slice(0, 2000)}`);
      }
      const saved = node.exec('iptables-save', ['-t', 'nat']);
      for (const g of GOOD) assert.ok(saved.includes(`-d ${g.ip}/32`), `${g.ip} in the kernel's nat table`);
    } else if (mode === 'nftables') {
      const c = inNode('nft', ['-c', '-f', '-'], r.stdout);
      assert.equal(c.code, 0, `nft -c refused the payload: ${c.stderr.slice(0, 2000)}`);
      const a = inNode('nft', ['-f', '-'], r.stdout);
      assert.equal(a.code, 0, `nft -f refused the payload: ${a.stderr.slice(0, 2000)}`);
      const listed = node.exec('nft', ['list', 'table', 'ip', 'kube-proxy']);
      for (const g of GOOD) assert.ok(listed.includes(g.ip), `${g.ip} in the kernel's kube-proxy table`);
    } else if (mode === 'ipvs') {
      const v4 = familyPart(r.stdout, 4);
      const sets = inNode('ipset', ['restore'], section(v4, 'ipset restore'));
      assert.equal(sets.code, 0, `ipset restore refused the payload: ${sets.stderr.slice(0, 2000)}`);
      // The host kernel has no IPVS, so it has no `-m ipvs` match either: those rules are
      // checked in the IPVS VM tests; every other line goes through the real iptables-restore.
      const withoutIpvsMatch = (text: string) => text.split('\n').filter((l) => !/ -m ipvs /.test(l)).join('\n');
      const a = inNode('iptables-restore', ['--noflush'], withoutIpvsMatch(section(v4, 'iptables-restore --noflush')));
      assert.equal(a.code, 0, `iptables-restore refused the ipvs payload: ${a.stderr.slice(0, 2000)}`);
      const v6 = familyPart(r.stdout, 6);
      if (v6) {
        const sets6 = inNode('ipset', ['restore'], section(v6, 'ipset restore'));
        assert.equal(sets6.code, 0, `ipset restore refused the IPv6 payload: ${sets6.stderr.slice(0, 2000)}`);
        const a6 = inNode('ip6tables-restore', ['--noflush'], withoutIpvsMatch(section(v6, 'ip6tables-restore --noflush')));
        assert.equal(a6.code, 0, `ip6tables-restore refused the ipvs IPv6 payload: ${a6.stderr.slice(0, 2000)}`);
      }
      const listed = node.exec('ipset', ['list', 'KUBE-CLUSTER-IP']);
      for (const g of GOOD) assert.ok(listed.includes(g.ip), `${g.ip} in KUBE-CLUSTER-IP`);
    }
    clearNode();
  });
}

for (const mode of ['iptables', 'nftables', 'userspace']) {
  test(`run --mode ${mode} over ${FILES} hostile files: stays up, serves the good Services, keeps localhost reachable`, async () => {
    clearNode();
    writeGood();
    let log = '';
    const kp: ChildProcess = node.kproxy(
      ['run', '--mode', mode, '--manifests', dir, '--manifests-state', state, '--hostname-override', 'fuzz-node', '--healthz-bind-address', '127.0.0.1:10256', '--metrics-bind-address', '127.0.0.1:10249'],
      (s) => {
        log = (log + s).slice(-20_000);
      },
    );
    try {
      const ok = (replies: Record<string, number>, ids: string[]) => ids.every((id) => (replies[id] ?? 0) > 0);
      // A wait that runs out says what kproxy logged meanwhile.
      const withLog = <T>(p: Promise<T>) => p.catch((e: Error) => assert.fail(`${e.message}; kproxy's log:\n${log.slice(-4000)}`));
      await withLog(waitFor('good Service a reaches both pods', () => ok(tcpReplies(GOOD[0].ip, 80, 12), ['pod-1', 'pod-2']), 120_000, 500));
      assert.equal(kp.exitCode, null, `kproxy exited: ${log.slice(-3000)}`);
      // More hostile files arrive while it runs, and a good change must still be applied.
      for (const f of hostileCorpus(200, SEED + 1)) writeFileSync(join(dir, `late-${f.name}`), f.content);
      writeGood(true);
      await withLog(waitFor('the new endpoint of good Service a gets traffic', () => ok(tcpReplies(GOOD[0].ip, 80, 24), ['pod-5']), 120_000, 500));
      for (let k = 0; k < 3; k++) {
        assert.ok((tcpReplies('127.0.0.1', 18080, 2).localhost ?? 0) === 2, 'localhost stays reachable');
        const code = node.exec('curl', ['-s', '-o', '/dev/null', '-w', '%{http_code}', '--max-time', '5', 'http://127.0.0.1:10256/livez'], { allowFail: true });
        assert.equal(code, '200', `livez answers 200 (got ${code})`);
        await new Promise((r) => setTimeout(r, 1000));
      }
      assert.equal(kp.exitCode, null, `kproxy exited: ${log.slice(-3000)}`);
      assert.equal(kp.signalCode, null, `kproxy killed: ${log.slice(-3000)}`);
    } finally {
      await node.kill(kp);
      for (const f of hostileCorpus(200, SEED + 1)) rmSync(join(dir, `late-${f.name}`), { force: true });
      writeGood();
      clearNode();
    }
  });
}
