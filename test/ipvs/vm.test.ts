// The ipvs mode on a real IPVS kernel: boots the IPVS VM once (../shared/ipvs-vm) and runs
// test/ipvs/in-vm.sh inside it, which drives the proxier against real IPVS, ipset, iptables
// and traffic, printing one RESULT line per check. Needs root (the VM runner does); not
// being root is a failure, not a skip.
import { test } from 'node:test';
import { reportChecks, runInVm } from './vm-run.ts';

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
  'partial-syncs-equal-full-sync',
  'one-endpoint-change-runs-one-command',
  'behind-back-change-repaired-by-full-sync',
  'failed-partial-apply-falls-back-to-full',
  'long-names-traffic',
  'generated-services-ipvs-restore',
  'cleanup-leaves-no-residue',
];

test('ipvs mode end to end in the IPVS VM', { timeout: 600_000 }, async (t) => {
  const r = await runInVm('test/ipvs/in-vm.sh', 480);
  await reportChecks(t, 'test/ipvs/in-vm.sh', r, EXPECTED_CHECKS, (l) => {
    const m = /^RESULT (ok|fail) (\S+) ?(.*)$/.exec(l);
    return m ? { name: m[2], ok: m[1] === 'ok', detail: m[3] } : null;
  }, /^(in-vm:|RESULT)/);
});
