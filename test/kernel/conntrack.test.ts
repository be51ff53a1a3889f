// Conntrack: the `conntrack -D` filters of each stale flow, the cleaner's handling
// of conntrack's exit codes (KPROXY_CONNTRACK_FAILED logged, never thrown), and the conntrack
// sysctls and oom_score_adj applied at start with a fake sysctl. No kernel.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pino from 'pino';
import { applyStartSettings, conntrackCleaner, conntrackDeleteArgs, conntrackMax, conntrackSysctls, deletedCount, parseConntrackLine, unNATedDeletes, unNATedListArgs } from '../../src/kernel/conntrack.ts';
import { resolveConfig, ConfigError } from '../../src/config/config.ts';
import type { CommandRunner, RunResult } from '../../src/kernel/runner.ts';
import type { Sysctl } from '../../src/kernel/sysctl.ts';
import { ExecError } from '../../src/kernel/runner.ts';

/* eslint-disable @typescript-eslint/no-explicit-any */
function logger() {
  const logs: any[] = [];
  return { logs, log: pino({ level: 'info' }, { write: (s: string) => void logs.push(JSON.parse(s)) }) };
}

test('conntrackDeleteArgs: upstream filters per stale flow kind', () => {
  assert.deepEqual(conntrackDeleteArgs(4, { kind: 'endpoint', protocol: 'UDP', serviceIP: '172.30.0.10', port: 53, endpointIP: '10.180.0.1', endpointPort: 5353 }), [
    '-D', '-f', 'ipv4', '-p', 'udp', '--orig-dst', '172.30.0.10', '--orig-port-dst', '53', '--dst-nat', '10.180.0.1',
  ]);
  assert.deepEqual(conntrackDeleteArgs(6, { kind: 'endpoint', protocol: 'SCTP', serviceIP: '', port: 30053, endpointIP: 'fd00::1', endpointPort: 5353 }), [
    '-D', '-f', 'ipv6', '-p', 'sctp', '--orig-port-dst', '30053', '--dst-nat', 'fd00::1',
  ]);
  assert.deepEqual(conntrackDeleteArgs(4, { kind: 'service', protocol: 'UDP', ip: '172.30.0.10', port: 53 }), ['-D', '-f', 'ipv4', '-p', 'udp', '--orig-dst', '172.30.0.10', '--orig-port-dst', '53']);
  assert.deepEqual(conntrackDeleteArgs(4, { kind: 'nodePort', protocol: 'UDP', port: 30053 }), ['-D', '-f', 'ipv4', '-p', 'udp', '--orig-port-dst', '30053']);
  assert.equal(deletedCount('conntrack v1.4.6 (conntrack-tools): 2 flow entries have been deleted.\n'), 2);
  assert.equal(deletedCount('conntrack v1.4.6 (conntrack-tools): 0 flow entries have been deleted.\n'), 0);
  assert.equal(deletedCount('nothing'), null);
});

test('conntrackCleaner: counts deletions, "0 flow entries" with exit 1 is no error, failures logged as KPROXY_CONNTRACK_FAILED', async () => {
  const calls: string[][] = [];
  const answers: Array<RunResult | Error> = [
    { code: 0, stdout: '', stderr: 'conntrack v1.4.6 (conntrack-tools): 3 flow entries have been deleted.\n' },
    { code: 1, stdout: '', stderr: 'conntrack v1.4.6 (conntrack-tools): 0 flow entries have been deleted.\n' },
    { code: 1, stdout: '', stderr: 'conntrack v1.4.6 (conntrack-tools): Operation failed: invalid parameters\n' },
    new ExecError('KPROXY_EXEC_MISSING', 'conntrack not found'),
  ];
  const runner: CommandRunner = {
    run: async (cmd, args) => {
      assert.equal(cmd, 'conntrack');
      calls.push(args);
      const a = answers.shift()!;
      if (a instanceof Error) throw a;
      return a;
    },
  };
  const { logs, log } = logger();
  const r = await conntrackCleaner(runner, log).clean(4, [
    { kind: 'service', protocol: 'UDP', ip: '172.30.0.10', port: 53 },
    { kind: 'service', protocol: 'UDP', ip: '172.30.0.10', port: 53 }, // the same filter: run once
    { kind: 'service', protocol: 'UDP', ip: '172.30.0.11', port: 53 },
    { kind: 'nodePort', protocol: 'UDP', port: 30053 },
    { kind: 'nodePort', protocol: 'SCTP', port: 30054 },
  ]);
  assert.equal(calls.length, 4);
  assert.equal(r.deleted, 3);
  assert.equal(r.failed, 2);
  const warns = logs.filter((l) => l.code === 'KPROXY_CONNTRACK_FAILED');
  assert.equal(warns.length, 2);
  assert.match(warns[0].err, /invalid parameters/);
  assert.match(warns[1].err, /not found/);
});

// `conntrack -L -f ipv4 -p tcp --state SYN_SENT` as conntrack-tools 1.4.7 prints it (the
// first line is what a connection attempt made before the Service had rules leaves behind)
const LISTING4 = [
  'tcp      6 103 SYN_SENT src=203.0.113.2 dst=172.30.0.10 sport=55138 dport=80 [UNREPLIED] src=172.30.0.10 dst=203.0.113.2 sport=80 dport=55138 mark=0 use=1',
  // DNATed and masqueraded, not answered yet: a live attempt, kept
  'tcp      6 119 SYN_SENT src=203.0.113.2 dst=172.30.0.10 sport=55140 dport=80 [UNREPLIED] src=10.180.0.2 dst=10.180.0.254 sport=8080 dport=3748 mark=0 use=1',
  // never DNATed, but to an address that is no flagged service: kept
  'tcp      6 110 SYN_SENT src=203.0.113.2 dst=172.30.0.99 sport=41000 dport=80 [UNREPLIED] src=172.30.0.99 dst=203.0.113.2 sport=80 dport=41000 mark=0 use=1',
  // the flagged address on another port: kept
  'tcp      6 110 SYN_SENT src=203.0.113.2 dst=172.30.0.10 sport=41002 dport=81 [UNREPLIED] src=172.30.0.10 dst=203.0.113.2 sport=81 dport=41002 mark=0 use=1',
  // a flagged NodePort on a node address, never DNATed
  'tcp      6 100 SYN_SENT src=203.0.113.2 dst=192.168.0.2 sport=41004 dport=30080 [UNREPLIED] src=192.168.0.2 dst=203.0.113.2 sport=30080 dport=41004 mark=0 use=1',
  'conntrack v1.4.7 (conntrack-tools): 5 flow entries have been shown.',
].join('\n');

test('never-DNATed TCP attempts: one SYN_SENT listing; only the flagged address:port and NodePort entries whose reply is the original destination', () => {
  assert.deepEqual(unNATedListArgs(4), ['-L', '-f', 'ipv4', '-p', 'tcp', '--state', 'SYN_SENT']);
  assert.deepEqual(parseConntrackLine(LISTING4.split('\n')[1]), {
    orig: { src: '203.0.113.2', dst: '172.30.0.10', sport: 55140, dport: 80 },
    reply: { src: '10.180.0.2', dst: '10.180.0.254', sport: 8080, dport: 3748 },
  });
  assert.equal(parseConntrackLine('conntrack v1.4.7 (conntrack-tools): 5 flow entries have been shown.'), null);
  const flows = [
    { kind: 'unNATed', protocol: 'TCP', ip: '172.30.0.10', port: 80 },
    { kind: 'unNATed', protocol: 'TCP', ip: null, port: 30080 },
  ] as const;
  assert.deepEqual(unNATedDeletes(4, [...flows], LISTING4), [
    ['-D', '-f', 'ipv4', '-p', 'tcp', '--orig-src', '203.0.113.2', '--orig-dst', '172.30.0.10', '--sport', '55138', '--dport', '80', '--reply-src', '172.30.0.10', '--state', 'SYN_SENT'],
    ['-D', '-f', 'ipv4', '-p', 'tcp', '--orig-src', '203.0.113.2', '--orig-dst', '192.168.0.2', '--sport', '41004', '--dport', '30080', '--reply-src', '192.168.0.2', '--state', 'SYN_SENT'],
  ]);
  assert.deepEqual(unNATedDeletes(4, [flows[0]], ''), [], 'nothing listed: nothing deleted');
  // IPv6: conntrack prints compressed addresses; the flow's address may be written longer
  const v6 = 'tcp      6 119 SYN_SENT src=fd00:203::2 dst=fd00:172:30::10 sport=40000 dport=80 [UNREPLIED] src=fd00:172:30::10 dst=fd00:203::2 sport=80 dport=40000 mark=0 use=1';
  assert.deepEqual(unNATedDeletes(6, [{ kind: 'unNATed', protocol: 'TCP', ip: 'fd00:172:30:0:0:0:0:10', port: 80 }], v6), [
    ['-D', '-f', 'ipv6', '-p', 'tcp', '--orig-src', 'fd00:203::2', '--orig-dst', 'fd00:172:30::10', '--sport', '40000', '--dport', '80', '--reply-src', 'fd00:172:30::10', '--state', 'SYN_SENT'],
  ]);
});

test('conntrackCleaner: never-DNATed TCP attempts are listed once and deleted by exact tuple; a failed listing is logged, not thrown', async () => {
  const calls: string[][] = [];
  const runner: CommandRunner = {
    run: async (_cmd, args) => {
      calls.push(args);
      if (args[0] === '-L') return { code: 0, stdout: LISTING4, stderr: '' };
      return { code: 0, stdout: '', stderr: 'conntrack v1.4.7 (conntrack-tools): 1 flow entries have been deleted.\n' };
    },
  };
  const { log } = logger();
  const r = await conntrackCleaner(runner, log).clean(4, [
    { kind: 'unNATed', protocol: 'TCP', ip: '172.30.0.10', port: 80 },
    { kind: 'unNATed', protocol: 'TCP', ip: '172.30.0.11', port: 80 },
    { kind: 'service', protocol: 'UDP', ip: '172.30.0.53', port: 53 },
  ]);
  assert.deepEqual(calls.map((a) => a.slice(0, 2).concat(a.includes('--sport') ? [a[a.indexOf('--sport') + 1]] : [])), [
    ['-D', '-f'], // the UDP filter
    ['-L', '-f'], // one listing for both TCP addresses
    ['-D', '-f', '55138'],
  ]);
  assert.equal(r.deleted, 2);
  assert.equal(r.failed, 0);

  const { logs, log: log2 } = logger();
  const broken: CommandRunner = { run: async () => ({ code: 1, stdout: '', stderr: 'conntrack v1.4.7 (conntrack-tools): Operation failed: Permission denied' }) };
  const r2 = await conntrackCleaner(broken, log2).clean(4, [{ kind: 'unNATed', protocol: 'TCP', ip: '172.30.0.10', port: 80 }]);
  assert.equal(r2.failed, 1);
  assert.equal(r2.deleted, 0);
  assert.match(logs.find((l) => l.code === 'KPROXY_CONNTRACK_FAILED')?.err ?? '', /Permission denied/);
});

function fakeSysctl(values: Record<string, string>, readOnly: string[] = []): Sysctl & { values: Record<string, string>; writes: string[] } {
  const writes: string[] = [];
  return {
    values,
    writes,
    async get(n) {
      return n in values ? values[n] : null;
    },
    async set(n, v) {
      if (readOnly.includes(n)) throw new ExecError('KPROXY_SYSCTL_FAILED', `cannot set ${n}=${v}: EACCES`);
      writes.push(`${n}=${v}`);
      values[n] = v;
    },
  };
}

test('config: conntrack defaults as upstream v1alpha1, oomScoreAdj -999; bad fields refused', () => {
  const c = resolveConfig({ mode: 'iptables' });
  assert.deepEqual(c.conntrack, { maxPerCore: 32768, min: 131072, tcpEstablishedTimeoutSec: 86400, tcpCloseWaitTimeoutSec: 3600, tcpBeLiberal: false, udpTimeoutSec: 0, udpStreamTimeoutSec: 0 });
  assert.equal(c.oomScoreAdj, -999);
  const d = resolveConfig({ mode: 'iptables', conntrack: { maxPerCore: 0, udpTimeout: '45s', udpStreamTimeout: '2m', tcpBeLiberal: true }, oomScoreAdj: null } as any);
  assert.equal(d.conntrack.maxPerCore, 0);
  assert.equal(d.conntrack.udpTimeoutSec, 45);
  assert.equal(d.conntrack.udpStreamTimeoutSec, 120);
  assert.equal(d.conntrack.tcpBeLiberal, true);
  // upstream v1alpha1 defaulting: a null oomScoreAdj (kubeadm writes one) is -999
  assert.equal(d.oomScoreAdj, -999);
  assert.throws(() => resolveConfig({ mode: 'iptables', conntrack: { maxPerCore: -1 } } as any), ConfigError);
  // lenient decoding, as upstream: an unknown field is a warning
  const warned: string[] = [];
  resolveConfig({ mode: 'iptables', conntrack: { bogus: 1 } } as any, {}, (w) => warned.push(w));
  assert.match(warned.join('\n'), /^conntrack\.bogus: unknown field/);
});

test('conntrack settings: max from maxPerCore × cores with min; only the given timeouts', () => {
  const base = resolveConfig({ mode: 'iptables' }).conntrack;
  assert.equal(conntrackMax(base, 2), 131072, 'the floor');
  assert.equal(conntrackMax(base, 8), 262144);
  assert.equal(conntrackMax({ ...base, maxPerCore: 0 }, 8), 0);
  assert.deepEqual(conntrackSysctls({ ...base, udpTimeoutSec: 45, tcpBeLiberal: true }, 8), [
    ['net.netfilter.nf_conntrack_max', '262144'],
    ['net.netfilter.nf_conntrack_tcp_timeout_established', '86400'],
    ['net.netfilter.nf_conntrack_tcp_timeout_close_wait', '3600'],
    ['net.netfilter.nf_conntrack_tcp_be_liberal', '1'],
    ['net.netfilter.nf_conntrack_udp_timeout', '45'],
  ]);
});

test('applyStartSettings: sets what differs; a read-only or missing setting is skipped with ONE warning', async () => {
  const conntrack = { ...resolveConfig({ mode: 'iptables' }).conntrack, udpTimeoutSec: 45, udpStreamTimeoutSec: 120 };
  const sysctl = fakeSysctl(
    {
      'net.netfilter.nf_conntrack_max': '65536',
      'net.netfilter.nf_conntrack_tcp_timeout_established': '86400', // already right: not written
      'net.netfilter.nf_conntrack_tcp_timeout_close_wait': '60',
      'net.netfilter.nf_conntrack_udp_timeout': '30',
    },
    ['net.netfilter.nf_conntrack_max'],
  );
  const proc = fakeSysctl({ 'self.oom_score_adj': '0' });
  const { logs, log } = logger();
  const r = await applyStartSettings({ conntrack, oomScoreAdj: -999, cpus: 2, sysctl, proc, log });
  assert.deepEqual(sysctl.writes, ['net.netfilter.nf_conntrack_tcp_timeout_close_wait=3600', 'net.netfilter.nf_conntrack_udp_timeout=45']);
  assert.deepEqual(proc.writes, ['self.oom_score_adj=-999']);
  assert.equal(r.skipped.length, 2, 'nf_conntrack_max read-only, udp_timeout_stream missing');
  const warns = logs.filter((l) => l.level === 40);
  assert.equal(warns.length, 1);
  assert.equal(warns[0].code, 'KPROXY_SYSCTL_FAILED');
  assert.match(warns[0].skipped.join(' '), /nf_conntrack_max.*EACCES/);
  assert.match(warns[0].skipped.join(' '), /udp_timeout_stream \(missing\)/);
  // nothing to do: no log at all
  const { logs: quiet, log: qlog } = logger();
  await applyStartSettings({ conntrack: { ...conntrack, maxPerCore: 0, tcpEstablishedTimeoutSec: 0, tcpCloseWaitTimeoutSec: 0, udpTimeoutSec: 0, udpStreamTimeoutSec: 0 }, oomScoreAdj: null, cpus: 2, sysctl, proc, log: qlog });
  assert.equal(quiet.length, 0);
});
