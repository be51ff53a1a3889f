// The ipvs mode on a real IPVS kernel: boots the IPVS VM once (../shared/ipvs-vm) and runs
// test/ipvs/in-vm.sh inside it, which drives the proxier against real IPVS, ipset, iptables
// and traffic, printing one RESULT line per check. Needs root (the VM runner does); not
// being root is a failure, not a skip.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { hostRunner } from '../../src/exec/runner.ts';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const vmRunner = path.resolve(repoRoot, '../shared/ipvs-vm/run-in-ipvs-vm.sh');

const EXPECTED_CHECKS = [
  'modprobe-loads-missing-modules',
  'sysctls-and-strictARP',
  'first-sync',
  'ipvsadm-Ln-shows-services',
  'clusterip-tcp',
  'nodeport-tcp',
  'clusterip-udp',
  'nodeport-udp',
  'rr-spreads-evenly',
  'masquerade-by-cluster-cidr',
  'unchanged-sync-writes-nothing',
  'sh-keeps-client-on-one-backend',
  'lc-prefers-idle-backend',
  'graceful-termination',
  'udp-real-server-removed-at-once',
  'trace-live',
  'unloadable-module-clear-error',
  'cleanup-leaves-no-residue',
];

test('ipvs mode end to end in the IPVS VM', { timeout: 300_000 }, async (t) => {
  assert.equal(process.getuid?.(), 0, 'the IPVS VM test must run as root (the VM runner needs it)');
  const started = Date.now();
  const r = await (async () => {
    const prev = process.env.IPVS_VM_EXTRA_BINS;
    process.env.IPVS_VM_EXTRA_BINS = 'socat curl';
    try {
      return await hostRunner.run(
        vmRunner,
        ['--timeout', '230', '--share', `${repoRoot}:/project`, '--share', '/usr/bin:/hostbin:ro', '--env', 'NODE=/hostbin/node', '--cwd', '/project', 'test/ipvs/in-vm.sh'],
        { timeoutMs: 260_000 },
      );
    } finally {
      if (prev === undefined) delete process.env.IPVS_VM_EXTRA_BINS;
      else process.env.IPVS_VM_EXTRA_BINS = prev;
    }
  })();
  const seconds = ((Date.now() - started) / 1000).toFixed(1);
  const out = r.stdout;
  const results = new Map<string, { ok: boolean; detail: string }>();
  for (const line of out.split('\n')) {
    const m = /^RESULT (ok|fail) (\S+) ?(.*)$/.exec(line.trim());
    if (m) results.set(m[2], { ok: m[1] === 'ok', detail: m[3] });
  }
  t.diagnostic(`VM run took ${seconds}s, exit ${r.code}`);
  for (const line of out.split('\n')) if (/^(in-vm:|RESULT)/.test(line.trim())) t.diagnostic(line.trim());
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
  assert.equal(r.code, 0, `in-vm.sh exited ${r.code}\n${out.slice(-3000)}\n${r.stderr.slice(-2000)}`);
});
