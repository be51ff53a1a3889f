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
import { hostRunner } from '../../src/kernel/runner.ts';
import path from 'node:path';
import { repoRoot, reportChecks, runInVm } from './vm-run.ts';


const EXPECTED_CHECKS = [
  'setup',
  'iptables-healthz',
  'iptables-traffic',
  'iptables-rules-in-place',
  'iptables-no-ipvs-deprecation',
  'ipvs-rr-healthz',
  'ipvs-rr-traffic',
  'ipvs-rr-deprecation-warning',
  'iptables-to-ipvs-no-svc-sep-chains',
  'ipvs-rr-ipvsadm',
  'ipvs-sh-healthz',
  'ipvs-sh-traffic',
  'ipvs-sh-ipvsadm',
  'ipvs-sh-one-client-one-backend',
  'ipv6-setup',
  'ipvs-ds-healthz',
  'ipvs-ds-traffic',
  'ipvs-ds-ipv6-virtual-server',
  'ipvs-ds-trace-live-v4',
  'ipvs-ds-trace-live-v6',
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

// TCG emulation: kproxy takes 30–90 s to start in the VM, more on a loaded host; the limit only
// stops a hung VM.
const vmTimeoutS = 600;

test('kproxy CLI in the IPVS VM: ipvs rr → sh by config, ipvs dual-stack, mode switching, cleanup', { timeout: (vmTimeoutS + 45) * 1000 }, async (t) => {
  await buildBundle();
  const r = await runInVm('test/ipvs/in-vm-cli.sh', vmTimeoutS);
  await reportChecks(t, 'test/ipvs/in-vm-cli.sh', r, EXPECTED_CHECKS, (l) => {
    const m = /^(PASS|FAIL) ([^\s:]+):? ?(.*)$/.exec(l);
    return m ? { name: m[2], ok: m[1] === 'PASS', detail: m[3] } : null;
  }, /^(in-vm-cli:|PASS|FAIL)/);
});
