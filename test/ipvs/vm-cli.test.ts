// kproxy's real command line on a real IPVS kernel: boots the IPVS VM once
// (../shared/ipvs-vm) and runs test/ipvs/in-vm-cli.sh inside it, which starts
// `kproxy run --config CFG --manifests DIR` in iptables → ipvs (rr) → ipvs (sh, by editing the
// config) → nftables → userspace mode, checks traffic and the absence of the previous mode's
// state after every switch, then `kproxy cleanup`. One "PASS name" / "FAIL name: detail" line
// per check becomes one subtest here. Needs root (the VM runner does); not being root is a
// failure, not a skip.
//
// Start-up cost: under the VM's software emulation TypeScript through tsx needs 35-130 s per
// process; bin/kproxy.js runs the esbuild bundle in dist/ instead when it is fresh (12-30 s
// there), so the test rebuilds it first and every command in the VM is /project/bin/kproxy.js.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { tmpdir } from 'node:os';
import { fileURLToPath } from 'node:url';
import { hostRunner } from '../../src/exec/runner.ts';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const vmRunner = path.resolve(repoRoot, '../shared/ipvs-vm/run-in-ipvs-vm.sh');

const EXPECTED_CHECKS = [
  'setup',
  'iptables-healthz',
  'iptables-traffic',
  'iptables-rules-in-place',
  'ipvs-rr-healthz',
  'ipvs-rr-traffic',
  'iptables-to-ipvs-no-svc-sep-chains',
  'ipvs-rr-ipvsadm',
  'ipvs-sh-healthz',
  'ipvs-sh-traffic',
  'ipvs-sh-ipvsadm',
  'ipvs-sh-one-client-one-backend',
  'nftables-healthz',
  'nftables-traffic',
  'ipvs-to-nftables-no-ipvs-residue',
  'nftables-table-in-place',
  'userspace-healthz',
  'userspace-traffic',
  'nftables-to-userspace-no-nft-table',
  'cleanup-exits-0',
  'cleanup-leaves-nothing',
  'cleanup-traffic-stops',
];

/** Makes sure dist/ (the bundle bin/kproxy.js runs when it is fresh) matches src/. */
async function buildBundle(): Promise<void> {
  const r = await hostRunner.run(process.execPath, [path.join(repoRoot, 'scripts/build.mjs')], { timeoutMs: 120_000 });
  assert.equal(r.code, 0, `scripts/build.mjs failed: ${r.stderr}`);
}

const vmTimeoutS = 225;

test('kproxy CLI in the IPVS VM: ipvs rr → sh by config, mode switching, cleanup', { timeout: (vmTimeoutS + 45) * 1000 }, async (t) => {
  assert.equal(process.getuid?.(), 0, 'the IPVS VM CLI test must run as root (the VM runner needs it)');
  const started = Date.now();
  await buildBundle();
  let r: { code: number; stdout: string; stderr: string };
  const prev = process.env.IPVS_VM_EXTRA_BINS;
  process.env.IPVS_VM_EXTRA_BINS = 'socat curl';
  try {
    r = await hostRunner.run(
      vmRunner,
      ['--timeout', String(vmTimeoutS), '--share', `${repoRoot}:/project`, '--share', '/usr/bin:/hostbin:ro',
        '--env', 'NODE=/hostbin/node', '--cwd', '/project', 'test/ipvs/in-vm-cli.sh'],
      { timeoutMs: (vmTimeoutS + 15) * 1000 },
    );
  } finally {
    if (prev === undefined) delete process.env.IPVS_VM_EXTRA_BINS;
    else process.env.IPVS_VM_EXTRA_BINS = prev;
  }
  const seconds = ((Date.now() - started) / 1000).toFixed(1);
  const out = r.stdout;
  const results = new Map<string, { ok: boolean; detail: string }>();
  for (const line of out.split('\n')) {
    const m = /^(PASS|FAIL) ([^\s:]+):? ?(.*)$/.exec(line.trim());
    if (m) results.set(m[2], { ok: m[1] === 'PASS', detail: m[3] });
  }
  t.diagnostic(`VM run took ${seconds}s, exit ${r.code}`);
  for (const line of out.split('\n')) if (/^(in-vm-cli:|PASS|FAIL)/.test(line.trim())) t.diagnostic(line.trim());
  for (const name of EXPECTED_CHECKS) {
    await t.test(name, () => {
      const res = results.get(name);
      assert.ok(res, `check ${name} did not report (VM exit ${r.code})\n${out.slice(-3000)}\n${r.stderr.slice(-2000)}`);
      assert.ok(res.ok, `${name}: ${res.detail}`);
    });
  }
  for (const [name, res] of results) {
    if (!EXPECTED_CHECKS.includes(name)) await t.test(name, () => assert.ok(res.ok, `${name}: ${res.detail}`));
  }
  assert.equal(r.code, 0, `in-vm-cli.sh exited ${r.code}\n${out.slice(-3000)}\n${r.stderr.slice(-2000)}`);
});
