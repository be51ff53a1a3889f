// Unit tests for src/config/config.ts: upstream defaults, flags over the file, durations, and
// validation errors that name the field and the bad value.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  ConfigError,
  masqueradeMark,
  parseConfigText,
  parseDuration,
  resolveConfig,
} from '../../src/config/config.ts';
import { loadConfigFile } from '../../src/config/load.ts';

const HEAD = 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n';

/** Asserts that fn throws a ConfigError whose message names every needle (field, value). */
function throwsConfig(fn: () => unknown, field: string, ...needles: string[]): void {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof ConfigError, `want ConfigError, got ${String(e)}`);
    assert.equal(e.code, 'KPROXY_CONFIG_INVALID');
    assert.equal(e.field, field);
    assert.ok(e.message.startsWith('KPROXY_CONFIG_INVALID: '), e.message);
    assert.ok(e.message.includes(field), `message ${JSON.stringify(e.message)} should name ${field}`);
    for (const n of needles) assert.ok(e.message.includes(n), `message ${JSON.stringify(e.message)} should include ${n}`);
    return true;
  });
}

test('upstream defaults', () => {
  const c = resolveConfig(parseConfigText(HEAD + 'mode: ""\n'));
  assert.equal(c.mode, 'iptables');
  assert.equal(c.masqueradeBit, 14);
  assert.equal(c.masqueradeAll, false);
  assert.equal(c.syncPeriodMs, 30_000);
  assert.equal(c.minSyncPeriodMs, 1_000);
  assert.equal(c.healthzBindAddress, '0.0.0.0:10256');
  assert.equal(c.metricsBindAddress, '127.0.0.1:10249');
  assert.equal(c.udpIdleTimeoutMs, 250);
  assert.equal(c.ipvs.scheduler, 'rr');
  assert.equal(c.localhostNodePorts, true);
  assert.deepEqual(c.clusterCIDRs, []);
  assert.deepEqual(c.nodePortAddresses, []);
  assert.equal(c.hostnameOverride, '');
  // no file at all gives the same
  assert.deepEqual(resolveConfig(), c);
  assert.deepEqual(resolveConfig(parseConfigText('')), c);
});

test('masqueradeMark prints %#08x of 1<<bit', () => {
  assert.equal(masqueradeMark(14), '0x00004000');
  assert.equal(masqueradeMark(0), '0x00000001');
  assert.equal(masqueradeMark(31), '0x80000000');
  assert.equal(masqueradeMark(resolveConfig().masqueradeBit), '0x00004000');
});

test('file values are read', () => {
  const c = resolveConfig(
    parseConfigText(
      HEAD +
        [
          'mode: ipvs',
          'clusterCIDR: 10.0.0.0/8,fd00::/48',
          'hostnameOverride: node-a',
          'healthzBindAddress: 127.0.0.1:20256',
          'metricsBindAddress: "[::1]:20249"',
          'nodePortAddresses: ["192.168.0.0/24"]',
          'udpIdleTimeout: 1s',
          'ipvs:',
          '  scheduler: wrr',
          '  syncPeriod: 1m',
          '  minSyncPeriod: 2s',
          '  excludeCIDRs: ["10.1.2.3/16"]',
          '  strictARP: true',
          'iptables:',
          '  masqueradeBit: 15',
          '  masqueradeAll: true',
        ].join('\n'),
    ),
  );
  assert.equal(c.mode, 'ipvs');
  assert.deepEqual(c.clusterCIDRs, ['10.0.0.0/8', 'fd00::/48']);
  assert.equal(c.hostnameOverride, 'node-a');
  assert.equal(c.healthzBindAddress, '127.0.0.1:20256');
  assert.equal(c.metricsBindAddress, '[::1]:20249');
  assert.deepEqual(c.nodePortAddresses, ['192.168.0.0/24']);
  assert.equal(c.udpIdleTimeoutMs, 1000);
  assert.equal(c.ipvs.scheduler, 'wrr');
  assert.equal(c.syncPeriodMs, 60_000, 'ipvs mode syncs on the ipvs section periods');
  assert.equal(c.minSyncPeriodMs, 2_000);
  assert.deepEqual(c.ipvs.excludeCIDRs, ['10.1.0.0/16']);
  assert.equal(c.ipvs.strictARP, true);
  assert.equal(c.masqueradeBit, 15);
  assert.equal(c.masqueradeAll, true);
});

test('nftables mode reads its own section', () => {
  const c = resolveConfig(parseConfigText(HEAD + 'mode: nftables\nnftables:\n  masqueradeBit: 20\n  syncPeriod: 10s\n  minSyncPeriod: 500ms\n'));
  assert.equal(c.mode, 'nftables');
  assert.equal(c.masqueradeBit, 20);
  assert.equal(c.syncPeriodMs, 10_000);
  assert.equal(c.minSyncPeriodMs, 500);
});

test('nftables.tables: "auto" by default, or a number of tables; written back only when given', () => {
  const auto = resolveConfig(parseConfigText(HEAD + 'mode: nftables\n'));
  assert.equal(auto.nftables.tables, 'auto');
  assert.equal((auto.v1alpha1.nftables as Record<string, unknown>).tables, undefined, 'upstream decodes no such field');
  assert.equal(resolveConfig(parseConfigText(HEAD + 'mode: nftables\nnftables:\n  tables: auto\n')).nftables.tables, 'auto');
  const one = resolveConfig(parseConfigText(HEAD + 'mode: nftables\nnftables:\n  tables: 1\n'));
  assert.equal(one.nftables.tables, 1);
  assert.equal((one.v1alpha1.nftables as Record<string, unknown>).tables, 1);
  assert.equal(resolveConfig(parseConfigText(HEAD + 'nftables:\n  tables: 64\n')).nftables.tables, 64);
  for (const bad of ['0', '65', '2.5', '"4"', 'many', '-1']) {
    throwsConfig(() => resolveConfig(parseConfigText(HEAD + `mode: nftables\nnftables:\n  tables: ${bad}\n`)), 'nftables.tables', 'auto');
  }
});

test('flags override the file', () => {
  const raw = parseConfigText(
    HEAD +
      [
        'mode: iptables',
        'clusterCIDR: 10.0.0.0/8',
        'hostnameOverride: from-file',
        'healthzBindAddress: 0.0.0.0:1111',
        'metricsBindAddress: 127.0.0.1:2222',
        'nodePortAddresses: ["192.168.0.0/24"]',
        'ipvs:',
        '  scheduler: lc',
        'iptables:',
        '  masqueradeAll: false',
      ].join('\n'),
  );
  const c = resolveConfig(raw, {
    mode: 'nftables',
    clusterCidr: '10.244.0.0/16',
    hostnameOverride: 'from-flag',
    healthzBindAddress: '127.0.0.1:3333',
    metricsBindAddress: '127.0.0.1:4444',
    nodeportAddresses: '192.168.1.0/24, 10.0.0.0/8',
    masqueradeAll: true,
    ipvsScheduler: 'sh',
  });
  assert.equal(c.mode, 'nftables');
  assert.deepEqual(c.clusterCIDRs, ['10.244.0.0/16']);
  assert.equal(c.hostnameOverride, 'from-flag');
  assert.equal(c.healthzBindAddress, '127.0.0.1:3333');
  assert.equal(c.metricsBindAddress, '127.0.0.1:4444');
  assert.deepEqual(c.nodePortAddresses, ['192.168.1.0/24', '10.0.0.0/8']);
  assert.equal(c.masqueradeAll, true);
  assert.equal(c.ipvs.scheduler, 'sh');
  // unset flags leave the file alone
  const d = resolveConfig(raw, {});
  assert.equal(d.mode, 'iptables');
  assert.equal(d.hostnameOverride, 'from-file');
  assert.equal(d.ipvs.scheduler, 'lc');
});

test('parseDuration reads Go durations', () => {
  const cases: Array<[string | number, number | null]> = [
    ['30s', 30_000],
    ['1m', 60_000],
    ['1m30s', 90_000],
    ['1h', 3_600_000],
    ['250ms', 250],
    ['1.5s', 1500],
    ['0', 0],
    ['0s', 0],
    ['500us', 0.5],
    ['-1s', -1000],
    [' 2s ', 2000],
    [1500, 1500],
    ['', null],
    ['30', null],
    ['s', null],
    ['1s1', null],
    ['1 s', null],
    ['1d', null],
    ['abc', null],
    [Number.NaN, null],
  ];
  for (const [text, want] of cases) assert.equal(parseDuration(text), want, JSON.stringify(text));
});

test('durations in the file parse', () => {
  const c = resolveConfig(parseConfigText(HEAD + 'iptables:\n  syncPeriod: 1m30s\n  minSyncPeriod: 250ms\nudpIdleTimeout: 2s\n'));
  assert.equal(c.syncPeriodMs, 90_000);
  assert.equal(c.minSyncPeriodMs, 250);
  assert.equal(c.udpIdleTimeoutMs, 2000);
});

test('a zero period means the default, as upstream (kubeadm writes "0s")', () => {
  const c = resolveConfig(parseConfigText(HEAD + 'iptables:\n  syncPeriod: 0s\n  minSyncPeriod: 0s\nudpIdleTimeout: 0s\n'));
  assert.equal(c.syncPeriodMs, 30_000);
  assert.equal(c.minSyncPeriodMs, 1_000);
  assert.equal(c.udpIdleTimeoutMs, 250);
});

test('validation: unknown mode names the field and value', () => {
  throwsConfig(() => resolveConfig({}, { mode: 'bogus' }), 'mode', '"bogus"');
  throwsConfig(() => resolveConfig(parseConfigText(HEAD + 'mode: kernelspace\n')), 'mode', '"kernelspace"');
});

test('validation: bad CIDRs name the field and value', () => {
  throwsConfig(() => resolveConfig({}, { clusterCidr: '10.0.0.0/33' }), 'clusterCIDR[0]', '"10.0.0.0/33"');
  throwsConfig(() => resolveConfig({}, { clusterCidr: '10.0.0.0/8,nope' }), 'clusterCIDR[1]', '"nope"');
  throwsConfig(() => resolveConfig(parseConfigText(HEAD + 'clusterCIDR: 10.0.0.0\n')), 'clusterCIDR[0]', '"10.0.0.0"');
  throwsConfig(
    () => resolveConfig(parseConfigText(HEAD + 'nodePortAddresses: ["192.168.0.0/24", "192.168.0.300/24"]\n')),
    'nodePortAddresses[1]',
    '"192.168.0.300/24"',
  );
  throwsConfig(() => resolveConfig({}, { nodeportAddresses: 'garbage' }), 'nodePortAddresses[0]', '"garbage"');
  throwsConfig(() => resolveConfig(parseConfigText(HEAD + 'mode: ipvs\nipvs:\n  excludeCIDRs: ["x/8"]\n')), 'ipvs.excludeCIDRs[0]', '"x/8"');
  // upstream validates the ipvs section in ipvs mode only
  assert.deepEqual(resolveConfig(parseConfigText(HEAD + 'ipvs:\n  excludeCIDRs: ["x/8"]\n')).ipvs.excludeCIDRs, []);
});

test('validation: unknown IPVS scheduler', () => {
  throwsConfig(() => resolveConfig({}, { ipvsScheduler: 'fastest' }), 'ipvs.scheduler', '"fastest"');
  throwsConfig(() => resolveConfig(parseConfigText(HEAD + 'ipvs:\n  scheduler: RR\n')), 'ipvs.scheduler', '"RR"');
  for (const s of ['rr', 'wrr', 'lc', 'wlc', 'lblc', 'lblcr', 'sh', 'dh', 'sed', 'nq', 'mh']) {
    assert.equal(resolveConfig({}, { ipvsScheduler: s }).ipvs.scheduler, s);
  }
});

test('validation: negative and malformed periods', () => {
  throwsConfig(() => resolveConfig(parseConfigText(HEAD + 'iptables:\n  syncPeriod: -1s\n')), 'iptables.syncPeriod', '"-1s"');
  throwsConfig(() => resolveConfig(parseConfigText(HEAD + 'iptables:\n  minSyncPeriod: -5s\n')), 'iptables.minSyncPeriod', '"-5s"');
  throwsConfig(() => resolveConfig(parseConfigText(HEAD + 'mode: ipvs\nipvs:\n  syncPeriod: -30s\n')), 'ipvs.syncPeriod', '"-30s"');
  throwsConfig(() => resolveConfig(parseConfigText(HEAD + 'mode: nftables\nnftables:\n  syncPeriod: -2m\n')), 'nftables.syncPeriod', '"-2m"');
  // a top-level period is named as such
  throwsConfig(() => resolveConfig(parseConfigText(HEAD + 'syncPeriod: -1s\n')), 'syncPeriod', '"-1s"');
  throwsConfig(() => resolveConfig(parseConfigText(HEAD + 'iptables:\n  syncPeriod: soon\n')), 'iptables.syncPeriod', '"soon"');
  throwsConfig(() => resolveConfig(parseConfigText(HEAD + 'udpIdleTimeout: -1ms\n')), 'udpIdleTimeout', '"-1ms"');
  throwsConfig(() => resolveConfig(parseConfigText(HEAD + 'iptables:\n  syncPeriod: 1s\n  minSyncPeriod: 5s\n')), 'iptables.minSyncPeriod');
});

test('validation: masqueradeBit out of range', () => {
  throwsConfig(() => resolveConfig(parseConfigText(HEAD + 'iptables:\n  masqueradeBit: 32\n')), 'iptables.masqueradeBit', '32');
  throwsConfig(() => resolveConfig(parseConfigText(HEAD + 'iptables:\n  masqueradeBit: -1\n')), 'iptables.masqueradeBit', '-1');
});

test('validation: bad bind addresses', () => {
  throwsConfig(() => resolveConfig({}, { healthzBindAddress: 'localhost:10256' }), 'healthzBindAddress', '"localhost:10256"');
  throwsConfig(() => resolveConfig({}, { metricsBindAddress: '127.0.0.1:99999' }), 'metricsBindAddress', '"127.0.0.1:99999"');
  throwsConfig(() => resolveConfig({}, { metricsBindAddress: '999.0.0.1:10249' }), 'metricsBindAddress', '"999.0.0.1:10249"');
});

test('lenient decoding: an unknown field is a warning naming its path, at any depth', () => {
  const warnings: string[] = [];
  const c = resolveConfig(parseConfigText(HEAD + 'bogusField: 1\niptables:\n  masqueradeBits: 14\nipvs:\n  schedular: wrr\nconntrack:\n  maxPerCPU: 3\n'), {}, (w) => warnings.push(w));
  assert.equal(c.mode, 'iptables');
  assert.equal(c.ipvs.scheduler, 'rr', 'the misspelt field is ignored');
  for (const f of ['bogusField', 'iptables.masqueradeBits', 'ipvs.schedular', 'conntrack.maxPerCPU']) {
    assert.ok(warnings.some((w) => w.startsWith(`${f}: unknown field`)), `a warning names ${f}: ${JSON.stringify(warnings)}`);
  }
  assert.equal(warnings.length, 4);
});

test('validation: wrong types name the field', () => {
  throwsConfig(() => resolveConfig(parseConfigText(HEAD + 'iptables:\n  masqueradeBit: "fourteen"\n')), 'iptables.masqueradeBit', 'an integer');
  throwsConfig(() => resolveConfig(parseConfigText(HEAD + 'nodePortAddresses: 10.0.0.0/8\n')), 'nodePortAddresses', 'a list');
  throwsConfig(() => resolveConfig(parseConfigText(HEAD + 'iptables: true\n')), 'iptables', 'a mapping');
  throwsConfig(() => resolveConfig(parseConfigText(HEAD + 'iptables:\n  syncPeriod: 30\n')), 'iptables.syncPeriod', 'duration');
});

test('validation: wrong kind or apiVersion', () => {
  throwsConfig(
    () => parseConfigText('apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n'),
    'kind',
    '"KubeletConfiguration"',
  );
  throwsConfig(() => parseConfigText('apiVersion: kubeproxy.config.k8s.io/v1\nkind: KubeProxyConfiguration\n'), 'apiVersion', '"kubeproxy.config.k8s.io/v1"');
});

test('validation: not YAML, not a mapping', () => {
  throwsConfig(() => parseConfigText('mode: [unclosed\n', 'cfg.yaml'), 'cfg.yaml', 'not valid YAML');
  assert.throws(() => parseConfigText('- a\n- b\n'), ConfigError);
});

test('loadConfigFile reads a file and reports an unreadable one', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kpt-config-'));
  try {
    const f = join(dir, 'c.yaml');
    writeFileSync(f, HEAD + 'mode: nftables\n');
    assert.equal(resolveConfig(loadConfigFile(f)).mode, 'nftables');
    throwsConfig(() => loadConfigFile(join(dir, 'missing.yaml')), '--config', 'missing.yaml');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

// ---- detectLocalMode (upstream pkg/proxy/apis/config/validation) and nodePortAddresses ----

test('detectLocalMode: upstream values, default ClusterCIDR, flags over the file', () => {
  assert.equal(resolveConfig({}).detectLocalMode, 'ClusterCIDR');
  assert.equal(resolveConfig({ detectLocalMode: 'NodeCIDR' }).detectLocalMode, 'NodeCIDR');
  const c = resolveConfig(parseConfigText(`${HEAD}detectLocalMode: BridgeInterface\ndetectLocal:\n  bridgeInterface: cbr0\n`));
  assert.deepEqual([c.detectLocalMode, c.detectLocal.bridgeInterface], ['BridgeInterface', 'cbr0']);
  const f = resolveConfig({ detectLocalMode: 'NodeCIDR' }, { detectLocalMode: 'InterfaceNamePrefix', podInterfaceNamePrefix: 'veth' });
  assert.deepEqual([f.detectLocalMode, f.detectLocal.interfaceNamePrefix], ['InterfaceNamePrefix', 'veth']);
});

test('detectLocalMode: invalid combinations are refused naming the field', () => {
  throwsConfig(() => resolveConfig({ detectLocalMode: 'PodCIDR' }), 'detectLocalMode', 'PodCIDR', 'ClusterCIDR');
  throwsConfig(() => resolveConfig({ detectLocalMode: 'BridgeInterface' }), 'detectLocal.bridgeInterface', 'must not be empty');
  throwsConfig(() => resolveConfig({}, { detectLocalMode: 'InterfaceNamePrefix' }), 'detectLocal.interfaceNamePrefix', 'must not be empty');
  throwsConfig(() => resolveConfig({ detectLocalMode: 'BridgeInterface', detectLocal: { bridgeInterface: 'a/b' } }), 'detectLocal.bridgeInterface', 'a/b');
  throwsConfig(() => resolveConfig({}, { podBridgeInterface: 'x'.repeat(16) }), 'detectLocal.bridgeInterface', 'at most 15');
  const warned: string[] = [];
  resolveConfig({ detectLocal: { bridge: 'cbr0' } } as never, {}, (w) => warned.push(w));
  assert.match(warned.join('\n'), /^detectLocal\.bridge: unknown field/);
  // ClusterCIDR without clusterCIDR is allowed (upstream detects nothing, with a warning)
  assert.deepEqual(resolveConfig({ detectLocalMode: 'ClusterCIDR' }).clusterCIDRs, []);
});

test('nodePortAddresses: CIDRs and the keywords primary, localhost and all in any combination (kubernetes#138427); a bad entry names its index', () => {
  assert.deepEqual(resolveConfig({ nodePortAddresses: ['primary'] }).nodePortAddresses, ['primary']);
  assert.deepEqual(resolveConfig({}, { nodeportAddresses: '10.0.0.0/8,192.168.0.0/16' }).nodePortAddresses, ['10.0.0.0/8', '192.168.0.0/16']);
  assert.deepEqual(resolveConfig({ nodePortAddresses: ['primary', '10.0.0.0/8'] }).nodePortAddresses, ['primary', '10.0.0.0/8']);
  assert.deepEqual(resolveConfig({}, { nodeportAddresses: 'localhost,primary,all' }).nodePortAddresses, ['localhost', 'primary', 'all']);
  throwsConfig(() => resolveConfig({ nodePortAddresses: ['primary', 'Localhost'] }), 'nodePortAddresses[1]', 'Localhost');
  throwsConfig(() => resolveConfig({ nodePortAddresses: ['10.0.0.0/8', 'nope'] }), 'nodePortAddresses[1]', 'nope');
});

test('formatDuration prints Go\'s time.Duration.String(), and parseDuration reads it back (property)', async () => {
  const { formatDuration } = await import('../../src/config/config.ts');
  const fc = (await import('fast-check')).default;
  for (const [msIn, text] of [[0, '0s'], [250, '250ms'], [1000, '1s'], [90_000, '1m30s'], [3_600_000, '1h0m0s'], [86_400_000, '24h0m0s'], [1500, '1.5s'], [-2000, '-2s']] as const) {
    assert.equal(formatDuration(msIn), text);
  }
  fc.assert(fc.property(fc.integer({ min: -1e9, max: 1e9 }), (n) => parseDuration(formatDuration(n)) === n), { numRuns: 500 });
});
