// `node bin/kproxy.js [kube-proxy's flags]` as a process: the exits that do not start the
// proxy (--version, --help, --write-config-to, --init-only, refused command lines) and what
// they print. No root and no kernel state needed (--init-only runs in the userspace mode,
// which leaves the conntrack sysctls alone, with an oom-score-adj of 0).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse as parseYAML } from 'yaml';
import { repoRoot } from '../support/netns.ts';

const dir = mkdtempSync(join(tmpdir(), 'kpt-bare-'));
after(() => rmSync(dir, { recursive: true, force: true }));

function kproxy(...args: string[]): { code: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, [join(repoRoot, 'bin/kproxy.js'), ...args], { cwd: repoRoot, encoding: 'utf8', timeout: 120_000, killSignal: 'SIGKILL' });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

test('--version and --help exit 0', () => {
  const v = kproxy('--version');
  assert.equal(v.code, 0, v.stderr);
  assert.match(v.stdout, /^kproxy version v\d+\.\d+\.\d+ \(kube-proxy compatible v1\.\d+\)\n$/);
  const h = kproxy('--help');
  assert.equal(h.code, 0, h.stderr);
  for (const f of ['--config string', '--proxy-mode', '--conntrack-max-per-core', '-v, --v', '--write-config-to']) assert.ok(h.stdout.includes(f), f);
});

test('--write-config-to writes the effective v1alpha1 configuration and exits 0', () => {
  const out = join(dir, 'written.conf');
  const r = kproxy(`--write-config-to=${out}`, '--proxy-mode=ipvs', '--ipvs-scheduler=lc', '--cluster-cidr=10.244.0.0/16', '--hostname-override=Node-1', '-v=2');
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stderr, /Wrote configuration/);
  const doc = parseYAML(readFileSync(out, 'utf8'));
  assert.equal(doc.apiVersion, 'kubeproxy.config.k8s.io/v1alpha1');
  assert.equal(doc.kind, 'KubeProxyConfiguration');
  assert.deepEqual([doc.mode, doc.ipvs.scheduler, doc.clusterCIDR, doc.hostnameOverride, doc.logging.verbosity], ['ipvs', 'lc', '10.244.0.0/16', 'node-1', 2]);
  assert.equal(doc.conntrack.maxPerCore, 32768);
  // and kproxy reads it back as a --config file
  const again = join(dir, 'again.conf');
  const r2 = kproxy(`--config=${out}`, `--write-config-to=${again}`);
  assert.equal(r2.code, 0, r2.stderr);
  assert.deepEqual(parseYAML(readFileSync(again, 'utf8')), doc);
});

test('--init-only does the privileged start-up steps and exits 0', () => {
  const r = kproxy('--init-only', '--proxy-mode=userspace', '--oom-score-adj=0', `--manifests=${join(dir, 'none')}`);
  assert.equal(r.code, 0, r.stderr + r.stdout);
  assert.match(r.stdout, /init-only: initialization done/);
  assert.equal(existsSync(join(dir, 'none')), false);
});

test('refused command lines exit 2 naming what is wrong', () => {
  const cases: Array<[string[], RegExp]> = [
    [['--no-such-flag'], /KPROXY_FLAG_UNKNOWN: unknown flag: --no-such-flag/],
    [['--masquerade-all', 'false'], /KPROXY_FLAG_UNKNOWN: "kproxy" does not take any arguments, got \["false"\]/],
    [['rendr'], /KPROXY_FLAG_UNKNOWN: unknown command "rendr"/],
    [['run', '--kubeconfig'], /KPROXY_FLAG_UNKNOWN: flag needs an argument: --kubeconfig/],
    [['--conntrack-min=lots'], /KPROXY_CONFIG_INVALID: --conntrack-min: invalid argument "lots"/],
    [['--proxy-mode=kernelspace'], /KPROXY_CONFIG_INVALID: mode: unknown mode "kernelspace"/],
  ];
  for (const [args, re] of cases) {
    const r = kproxy(...args);
    assert.equal(r.code, 2, `${args.join(' ')}: ${r.stderr}`);
    assert.match(r.stderr, re);
  }
});
