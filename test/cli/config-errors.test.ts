// `kproxy run` with a bad configuration must exit 2 with a message naming the field and the
// value, before it touches anything. Each run happens inside a network namespace this test
// creates, so "touched nothing" is checked for real: after the exit the namespace holds no
// process, no nftables table and no iptables rule, and nothing listens on the healthz or
// metrics ports.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

const repo = resolve(import.meta.dirname, '../..');
const bin = join(repo, 'bin/kproxy.js');
const ns = `kpt-cfg-${process.pid}`;
let dir = '';
let manifests = '';
/** how long `kproxy --help` takes here: loading the code alone (the machine may be busy) */
let baselineMs = 0;

function ipNetns(args: string[]): string {
  return execFileSync('ip', ['netns', ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

before(() => {
  dir = mkdtempSync(join(tmpdir(), 'kpt-cfg-'));
  manifests = join(dir, 'manifests-never-created');
  try {
    ipNetns(['del', ns]);
  } catch {
    // not there: fine
  }
  ipNetns(['add', ns]);
  ipNetns(['exec', ns, 'ip', 'link', 'set', 'lo', 'up']);
  const start = Date.now();
  execFileSync(process.execPath, [bin, '--help'], { cwd: repo, stdio: 'ignore', timeout: 60_000 });
  baselineMs = Date.now() - start;
});

after(() => {
  try {
    ipNetns(['del', ns]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

interface Result {
  code: number | null;
  stdout: string;
  stderr: string;
  ms: number;
}

/** Runs `node bin/kproxy.js ARGS` in the namespace; killed after 60 s if it does not exit. */
function kproxy(args: string[]): Promise<Result> {
  const start = Date.now();
  return new Promise((res) => {
    execFile(
      'ip',
      ['netns', 'exec', ns, process.execPath, bin, ...args],
      { cwd: repo, timeout: 60_000, killSignal: 'SIGKILL', encoding: 'utf8' },
      (err, stdout, stderr) => {
        const code = err ? ((err as { code?: number | string }).code as number) ?? null : 0;
        res({ code: typeof code === 'number' ? code : null, stdout, stderr, ms: Date.now() - start });
      },
    );
  });
}

function assertNothingTouched(): void {
  assert.equal(ipNetns(['pids', ns]).trim(), '', 'no process stays in the namespace');
  const nft = execFileSync('ip', ['netns', 'exec', ns, 'nft', 'list', 'ruleset'], { encoding: 'utf8' });
  assert.equal(nft.trim(), '', `no nftables state expected, got:\n${nft}`);
  const ipt = execFileSync('ip', ['netns', 'exec', ns, 'iptables-save'], { encoding: 'utf8' });
  assert.doesNotMatch(ipt, /KUBE-|^-A /m, `no iptables rule expected, got:\n${ipt}`);
  const links = execFileSync('ip', ['netns', 'exec', ns, 'ip', '-o', 'link'], { encoding: 'utf8' });
  assert.doesNotMatch(links, /kube-ipvs0/);
  const listening = execFileSync('ip', ['netns', 'exec', ns, 'ss', '-Hltn'], { encoding: 'utf8' });
  assert.equal(listening.trim(), '', `nothing should listen, got:\n${listening}`);
  assert.equal(existsSync(manifests), false);
}

function assertConfigError(r: Result, ...needles: string[]): void {
  assert.equal(r.code, 2, `exit code 2 expected; stderr: ${r.stderr}`);
  // Under 5 s beyond what loading the code takes on this (shared, possibly busy) machine.
  assert.ok(r.ms < baselineMs + 5000, `must exit before starting anything, took ${r.ms} ms (loading alone: ${baselineMs} ms)`);
  assert.match(r.stderr, /KPROXY_CONFIG_INVALID/);
  for (const n of needles) assert.ok(r.stderr.includes(n), `stderr should include ${n}: ${r.stderr}`);
  assert.doesNotMatch(r.stdout, /starting kproxy/);
  assertNothingTouched();
}

test('unknown --mode', async () => {
  assertConfigError(await kproxy(['run', '--mode', 'bogus', '--manifests', manifests]), 'mode', '"bogus"');
});

test('--config with a negative syncPeriod', async () => {
  const cfg = join(dir, 'neg.yaml');
  writeFileSync(cfg, 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\niptables:\n  syncPeriod: -1s\n');
  assertConfigError(await kproxy(['run', '--config', cfg, '--manifests', manifests]), 'iptables.syncPeriod', '"-1s"');
});

test('--config with a value of the wrong type (an unknown field is only a warning, as upstream)', async () => {
  const cfg = join(dir, 'type.yaml');
  writeFileSync(cfg, 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmodee: iptables\niptables:\n  masqueradeBit: fourteen\n');
  assertConfigError(await kproxy(['run', '--config', cfg, '--manifests', manifests]), 'iptables.masqueradeBit', 'fourteen');
});

test('the bare command line (as upstream\'s DaemonSet starts kube-proxy): bad values exit 2', async () => {
  assertConfigError(await kproxy(['--proxy-mode=bogus', `--manifests=${manifests}`]), 'mode', '"bogus"');
  assertConfigError(await kproxy(['--iptables-masquerade-bit=32', `--manifests=${manifests}`]), 'iptables.masqueradeBit', '32');
  assertConfigError(await kproxy(['--oom-score-adj', 'high', `--manifests=${manifests}`]), '--oom-score-adj', '"high"');
});

test('an unknown flag exits 2 naming it, before anything starts', async () => {
  const cfg = join(dir, 'ok.yaml');
  writeFileSync(cfg, 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\n');
  for (const args of [[`--config=${cfg}`, '--hostname-override=n1', '--no-such-flag'], ['run', '--alsologtostderr', `--config=${cfg}`]]) {
    const r = await kproxy([...args, `--manifests=${manifests}`]);
    assert.equal(r.code, 2, `exit code 2 expected; stderr: ${r.stderr}`);
    assert.match(r.stderr, /KPROXY_FLAG_UNKNOWN: unknown flag: --(no-such-flag|alsologtostderr)/);
    assertNothingTouched();
  }
});

test('bad --cluster-cidr', async () => {
  assertConfigError(
    await kproxy(['run', '--mode', 'iptables', '--cluster-cidr', '10.0.0.0/33', '--manifests', manifests]),
    'clusterCIDR',
    '"10.0.0.0/33"',
  );
});

test('unknown --ipvs-scheduler', async () => {
  assertConfigError(
    await kproxy(['run', '--mode', 'ipvs', '--ipvs-scheduler', 'fastest', '--manifests', manifests]),
    'ipvs.scheduler',
    '"fastest"',
  );
});

test('a bad flag wins over a good file, and the file is validated even with good flags', async () => {
  const cfg = join(dir, 'good.yaml');
  writeFileSync(cfg, 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\n');
  assertConfigError(await kproxy(['run', '--config', cfg, '--mode', 'bogus', '--manifests', manifests]), 'mode', '"bogus"');
  const bad = join(dir, 'bad-cidr.yaml');
  writeFileSync(bad, 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nnodePortAddresses: ["nope"]\n');
  assertConfigError(await kproxy(['run', '--config', bad, '--mode', 'nftables', '--manifests', manifests]), 'nodePortAddresses[0]', '"nope"');
});

test('a missing --config file', async () => {
  assertConfigError(await kproxy(['run', '--config', join(dir, 'nope.yaml'), '--manifests', manifests]), '--config', 'nope.yaml');
});
