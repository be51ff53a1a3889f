// kube-proxy's command line (src/cli/flags.ts): every flag of upstream's options.go lands on
// its configuration field with upstream's defaults, Go's pflag syntax is read as pflag reads
// it, bad input is refused naming the flag, and --config takes precedence as upstream's
// Options.Complete gives it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse as parseYAML } from 'yaml';
import { ConfigError } from '../../src/config/config.ts';
import { KproxyError } from '../../src/errors.ts';
import { FLAGS, FLAG_NAMES, helpText, levelForVerbosity, parseFlags, type ProxyInvocation } from '../../src/cli/flags.ts';
import { invocationOf, versionText } from '../../src/cli/main.ts';

function inv(...args: string[]): ProxyInvocation {
  const r = invocationOf(args);
  assert.ok('cfg' in r, `a proxy invocation expected for ${args.join(' ')}`);
  return r;
}

/** the value at a dotted path of the effective v1alpha1 document */
function at(doc: Record<string, unknown>, path: string): unknown {
  return path.split('.').reduce<unknown>((o, k) => (o as Record<string, unknown> | undefined)?.[k], doc);
}

function refused(args: string[], code: 'KPROXY_FLAG_UNKNOWN' | 'KPROXY_CONFIG_INVALID', ...needles: string[]): void {
  assert.throws(() => invocationOf(args), (e: unknown) => {
    assert.ok(e instanceof KproxyError, String(e));
    assert.equal(e.code, code, e.message);
    for (const n of needles) assert.ok(e.message.includes(n), `${JSON.stringify(e.message)} should name ${n}`);
    return true;
  }, args.join(' '));
}

// What `kube-proxy --write-config-to=F` writes on Linux with no other flag (v1.34): upstream's
// v1alpha1 defaults after platformApplyDefaults.
const UPSTREAM_DEFAULTS: Array<[string, unknown]> = [
  ['apiVersion', 'kubeproxy.config.k8s.io/v1alpha1'],
  ['kind', 'KubeProxyConfiguration'],
  ['bindAddress', '0.0.0.0'],
  ['bindAddressHardFail', false],
  ['clientConnection.burst', 10],
  ['clientConnection.qps', 5],
  ['clientConnection.contentType', 'application/vnd.kubernetes.protobuf'],
  ['clientConnection.kubeconfig', ''],
  ['clusterCIDR', ''],
  ['configSyncPeriod', '15m0s'],
  ['conntrack.maxPerCore', 32768],
  ['conntrack.min', 131072],
  ['conntrack.tcpBeLiberal', false],
  ['conntrack.tcpCloseWaitTimeout', '1h0m0s'],
  ['conntrack.tcpEstablishedTimeout', '24h0m0s'],
  ['conntrack.udpStreamTimeout', '0s'],
  ['conntrack.udpTimeout', '0s'],
  ['detectLocalMode', 'ClusterCIDR'],
  ['enableProfiling', false],
  ['healthzBindAddress', '0.0.0.0:10256'],
  ['hostnameOverride', ''],
  ['iptables.localhostNodePorts', true],
  ['iptables.masqueradeAll', false],
  ['iptables.masqueradeBit', 14],
  ['iptables.minSyncPeriod', '1s'],
  ['iptables.syncPeriod', '30s'],
  ['ipvs.minSyncPeriod', '0s'],
  ['ipvs.syncPeriod', '30s'],
  ['ipvs.scheduler', ''],
  ['ipvs.strictARP', false],
  ['ipvs.excludeCIDRs', null],
  ['logging.flushFrequency', '5s'],
  ['logging.format', 'text'],
  ['logging.verbosity', 0],
  ['metricsBindAddress', '127.0.0.1:10249'],
  ['mode', 'iptables'],
  ['nftables.masqueradeBit', 14],
  ['nftables.minSyncPeriod', '1s'],
  ['nftables.syncPeriod', '30s'],
  ['nodePortAddresses', null],
  ['oomScoreAdj', -999],
  ['portRange', ''],
  ['showHiddenMetricsForVersion', ''],
];

test('no flags: upstream defaults', () => {
  const { cfg, warnings, cleanup, initOnly, logLevel } = inv();
  for (const [path, want] of UPSTREAM_DEFAULTS) assert.deepEqual(at(cfg.v1alpha1, path), want, path);
  assert.deepEqual(warnings, []);
  assert.equal(cleanup, false);
  assert.equal(initOnly, false);
  assert.equal(logLevel, 'info');
});

// [command line, field of the effective v1alpha1 document, value]
const FLAG_TABLE: Array<[string[], string, unknown]> = [
  [['--kubeconfig=/k'], 'clientConnection.kubeconfig', '/k'],
  [['--kube-api-content-type=application/json'], 'clientConnection.contentType', 'application/json'],
  [['--kube-api-burst=20'], 'clientConnection.burst', 20],
  [['--kube-api-qps=7.5'], 'clientConnection.qps', 7.5],
  [['--hostname-override=Node-A'], 'hostnameOverride', 'node-a'],
  [['--bind-address=10.1.2.3'], 'bindAddress', '10.1.2.3'],
  [['--healthz-bind-address=127.0.0.1:1234'], 'healthzBindAddress', '127.0.0.1:1234'],
  [['--healthz-bind-address=127.0.0.1'], 'healthzBindAddress', '127.0.0.1:10256'],
  [['--metrics-bind-address=0.0.0.0:9999'], 'metricsBindAddress', '0.0.0.0:9999'],
  [['--metrics-bind-address='], 'metricsBindAddress', ''],
  [['--bind-address-hard-fail'], 'bindAddressHardFail', true],
  [['--profiling'], 'enableProfiling', true],
  [['--show-hidden-metrics-for-version=1.33'], 'showHiddenMetricsForVersion', '1.33'],
  [['--proxy-mode=nftables'], 'mode', 'nftables'],
  [['--proxy-mode', 'ipvs'], 'mode', 'ipvs'],
  [['--iptables-masquerade-bit=9'], 'iptables.masqueradeBit', 9],
  [['--masquerade-all'], 'iptables.masqueradeAll', true],
  [['--masquerade-all=false'], 'iptables.masqueradeAll', false],
  [['--iptables-localhost-nodeports=false'], 'iptables.localhostNodePorts', false],
  [['--iptables-sync-period=1m'], 'iptables.syncPeriod', '1m0s'],
  [['--iptables-min-sync-period=250ms'], 'iptables.minSyncPeriod', '250ms'],
  [['--proxy-mode=nftables', '--iptables-sync-period=45s'], 'nftables.syncPeriod', '45s'],
  [['--proxy-mode=ipvs', '--ipvs-sync-period=2m'], 'ipvs.syncPeriod', '2m0s'],
  [['--proxy-mode=ipvs', '--ipvs-min-sync-period=5s'], 'ipvs.minSyncPeriod', '5s'],
  [['--ipvs-scheduler=wrr'], 'ipvs.scheduler', 'wrr'],
  [['--proxy-mode=ipvs', '--ipvs-exclude-cidrs=10.0.0.0/8,192.168.0.0/16'], 'ipvs.excludeCIDRs', ['10.0.0.0/8', '192.168.0.0/16']],
  [['--ipvs-strict-arp'], 'ipvs.strictARP', true],
  [['--ipvs-tcp-timeout=15m'], 'ipvs.tcpTimeout', '15m0s'],
  [['--ipvs-tcpfin-timeout=30s'], 'ipvs.tcpFinTimeout', '30s'],
  [['--ipvs-udp-timeout=5m'], 'ipvs.udpTimeout', '5m0s'],
  [['--detect-local-mode=NodeCIDR'], 'detectLocalMode', 'NodeCIDR'],
  [['--detect-local-mode=BridgeInterface', '--pod-bridge-interface=cbr0'], 'detectLocal.bridgeInterface', 'cbr0'],
  [['--detect-local-mode=InterfaceNamePrefix', '--pod-interface-name-prefix=veth'], 'detectLocal.interfaceNamePrefix', 'veth'],
  [['--cluster-cidr=10.244.0.0/16,fd00:10:244::/56'], 'clusterCIDR', '10.244.0.0/16,fd00:10:244::/56'],
  [['--nodeport-addresses=192.168.0.0/24,10.0.0.0/8'], 'nodePortAddresses', ['192.168.0.0/24', '10.0.0.0/8']],
  [['--nodeport-addresses=primary'], 'nodePortAddresses', ['primary']],
  [['--nodeport-addresses=primary,localhost'], 'nodePortAddresses', ['primary', 'localhost']],
  [['--oom-score-adj=-500'], 'oomScoreAdj', -500],
  [['--conntrack-max-per-core=0'], 'conntrack.maxPerCore', 0],
  [['--conntrack-min=1000'], 'conntrack.min', 1000],
  [['--conntrack-tcp-timeout-established=2h'], 'conntrack.tcpEstablishedTimeout', '2h0m0s'],
  [['--conntrack-tcp-timeout-close-wait=30m'], 'conntrack.tcpCloseWaitTimeout', '30m0s'],
  [['--conntrack-tcp-be-liberal'], 'conntrack.tcpBeLiberal', true],
  [['--conntrack-udp-timeout=30s'], 'conntrack.udpTimeout', '30s'],
  [['--conntrack-udp-timeout-stream=2m'], 'conntrack.udpStreamTimeout', '2m0s'],
  [['--config-sync-period=5m'], 'configSyncPeriod', '5m0s'],
  [['--healthz-port=0'], 'healthzBindAddress', ''],
  [['--healthz-bind-address=127.0.0.2', '--healthz-port=20256'], 'healthzBindAddress', '127.0.0.2:20256'],
  [['--metrics-port=0'], 'metricsBindAddress', ''],
  [['--feature-gates=NFTablesProxyMode=true,TopologyAwareHints=false', '--feature-gates=AllAlpha=t'], 'featureGates', { NFTablesProxyMode: true, TopologyAwareHints: false, AllAlpha: true }],
  [['-v=4'], 'logging.verbosity', 4],
  [['-v', '3'], 'logging.verbosity', 3],
  [['-v5'], 'logging.verbosity', 5],
  [['--v=2'], 'logging.verbosity', 2],
  [['--logging-format=json'], 'logging.format', 'json'],
  [['--log-flush-frequency=10s'], 'logging.flushFrequency', '10s'],
  [['--proxy-mode=userspace', '--udp-timeout=2s'], 'udpIdleTimeout', '2s'],
  // Go syntax: "_" reads as "-", the last of a repeated flag wins, list flags append
  [['--hostname_override=n1'], 'hostnameOverride', 'n1'],
  [['--proxy-mode=ipvs', '--proxy-mode=nftables'], 'mode', 'nftables'],
  [['--nodeport-addresses=10.0.0.0/8', '--nodeport-addresses=192.168.0.0/16'], 'nodePortAddresses', ['10.0.0.0/8', '192.168.0.0/16']],
  [['--masquerade-all=t'], 'iptables.masqueradeAll', true],
  [['--masquerade-all=0'], 'iptables.masqueradeAll', false],
  [['--oom-score-adj', '-1000'], 'oomScoreAdj', -1000],
  // kproxy's --mode, and it wins over --proxy-mode
  [['--mode=nftables', '--proxy-mode=ipvs'], 'mode', 'nftables'],
];

test('every flag sets its configuration field (table)', () => {
  for (const [args, path, want] of FLAG_TABLE) {
    assert.deepEqual(at(inv(...args).cfg.v1alpha1, path), want, `${args.join(' ')} → ${path}`);
  }
});

test('the table and the help cover every flag of upstream\'s options.go', () => {
  const upstream = [
    'config', 'write-config-to', 'cleanup', 'feature-gates', 'kubeconfig', 'master', 'kube-api-content-type', 'kube-api-burst',
    'kube-api-qps', 'hostname-override', 'bind-address', 'healthz-bind-address', 'metrics-bind-address', 'bind-address-hard-fail',
    'profiling', 'show-hidden-metrics-for-version', 'init-only', 'proxy-mode', 'iptables-masquerade-bit', 'masquerade-all',
    'iptables-localhost-nodeports', 'iptables-sync-period', 'iptables-min-sync-period', 'ipvs-sync-period', 'ipvs-min-sync-period',
    'ipvs-scheduler', 'ipvs-exclude-cidrs', 'ipvs-strict-arp', 'ipvs-tcp-timeout', 'ipvs-tcpfin-timeout', 'ipvs-udp-timeout',
    'detect-local-mode', 'pod-bridge-interface', 'pod-interface-name-prefix', 'cluster-cidr', 'nodeport-addresses', 'oom-score-adj',
    'conntrack-max-per-core', 'conntrack-min', 'conntrack-tcp-timeout-established', 'conntrack-tcp-timeout-close-wait',
    'conntrack-tcp-be-liberal', 'conntrack-udp-timeout', 'conntrack-udp-timeout-stream', 'config-sync-period', 'healthz-port',
    'metrics-port', 'v', 'vmodule', 'logging-format', 'log-flush-frequency', 'log-json-info-buffer-size', 'log-json-split-stream',
    'log-text-info-buffer-size', 'log-text-split-stream', 'version', 'help',
  ];
  const help = helpText();
  for (const f of upstream) {
    assert.ok(FLAG_NAMES.includes(f), `--${f} is accepted`);
    assert.ok(help.includes(`--${f} `) || help.includes(`--${f}\n`), `--help lists --${f}`);
  }
  // and each is accepted on the command line with a value of its type
  const sample: Record<string, string> = { bool: 'true', version: 'false', int32: '1', level: '1', float32: '1.5', duration: '1s', strings: '10.0.0.0/8', ip: '10.0.0.1', ipport: '127.0.0.1:1', mapStringBool: 'X=true', string: 'x' };
  for (const f of FLAGS.filter((s) => !['help', 'config', 'write-config-to'].includes(s.name))) {
    assert.doesNotThrow(() => parseFlags([`--${f.name}=${sample[f.type]}`]), `--${f.name}`);
  }
});

test('flags kproxy cannot honour are accepted with a one-line warning each', () => {
  const cases: Array<[string[], RegExp]> = [
    [['--windows-service'], /^--windows-service: Windows only/],
    [['--vmodule=proxier=4'], /^--vmodule: ignored/],
    [['--log-text-split-stream'], /^--log-text-split-stream: ignored/],
    [['--healthz-port=10256'], /^--healthz-port: deprecated/],
    [['--proxy-port-range=30000-31000'], /^--proxy-port-range: deprecated/],
    [['--profiling'], /^enableProfiling: ignored/],
    [['--kube-api-qps=50'], /^clientConnection\.qps\/burst: accepted, not used/],
    [['--feature-gates=KubeProxyDrainingTerminatingNodes=true'], /^featureGates: KubeProxyDrainingTerminatingNodes ignored/],
  ];
  for (const [args, re] of cases) {
    const { warnings } = inv(...args);
    assert.ok(warnings.some((w) => re.test(w)), `${args.join(' ')}: ${JSON.stringify(warnings)}`);
    for (const w of warnings) assert.doesNotMatch(w, /\n/, 'one line');
  }
  // a boolean note flag set to false says nothing
  assert.deepEqual(inv('--windows-service=false').warnings, []);
});

test('--master is honoured (no warning), with or without --config', () => {
  const a = inv('--master=https://10.0.0.1:6443');
  assert.equal(a.master, 'https://10.0.0.1:6443');
  assert.deepEqual(a.warnings, []);
  assert.equal(inv().master, undefined);
  const dir = mkdtempSync(join(tmpdir(), 'kpt-master-'));
  try {
    const file = join(dir, 'c.yaml');
    writeFileSync(file, 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n');
    const b = inv(`--config=${file}`, '--master=http://127.0.0.1:8080');
    assert.equal(b.master, 'http://127.0.0.1:8080');
    assert.ok(!b.warnings.some((w) => w.includes('--master')), JSON.stringify(b.warnings));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('bad command lines are refused naming the flag (exit 2 in the CLI)', () => {
  refused(['--bogus'], 'KPROXY_FLAG_UNKNOWN', '--bogus');
  refused(['--bogus=1'], 'KPROXY_FLAG_UNKNOWN', '--bogus');
  refused(['--alsologtostderr'], 'KPROXY_FLAG_UNKNOWN', '--alsologtostderr');
  refused(['-config=/x'], 'KPROXY_FLAG_UNKNOWN', '"c"', '--config');
  refused(['--kubeconfig'], 'KPROXY_FLAG_UNKNOWN', 'needs an argument', '--kubeconfig');
  refused(['--masquerade-all', 'false'], 'KPROXY_FLAG_UNKNOWN', 'does not take any arguments', '"false"');
  refused(['extra'], 'KPROXY_FLAG_UNKNOWN', '"extra"');
  refused(['--masquerade-all=yes'], 'KPROXY_CONFIG_INVALID', '--masquerade-all', '"yes"');
  refused(['--kube-api-burst=ten'], 'KPROXY_CONFIG_INVALID', '--kube-api-burst', '"ten"');
  refused(['--kube-api-burst=4294967296'], 'KPROXY_CONFIG_INVALID', '--kube-api-burst');
  refused(['--kube-api-qps=fast'], 'KPROXY_CONFIG_INVALID', '--kube-api-qps', '"fast"');
  refused(['--iptables-sync-period=30'], 'KPROXY_CONFIG_INVALID', '--iptables-sync-period', '"30"');
  refused(['--bind-address=10.0.0.1:80'], 'KPROXY_CONFIG_INVALID', '--bind-address', '"10.0.0.1:80"');
  refused(['--healthz-bind-address=localhost:10256'], 'KPROXY_CONFIG_INVALID', '--healthz-bind-address', '"localhost:10256"');
  refused(['--feature-gates=A'], 'KPROXY_CONFIG_INVALID', '--feature-gates', '"A"');
  // upstream featuregate.SetFromMap: an unknown gate fails the start, a known one is accepted
  refused(['--feature-gates=Foo=true,NFTablesProxyMode=true'], 'KPROXY_CONFIG_INVALID', 'featureGates: unrecognized feature gate: Foo', 'ServiceTrafficDistribution');
  refused(['--feature-gates=nftablesProxyMode=true'], 'KPROXY_CONFIG_INVALID', 'unrecognized feature gate: nftablesProxyMode');
  refused(['-v=-1'], 'KPROXY_CONFIG_INVALID', '--v', '"-1"');
  refused(['--version=maybe'], 'KPROXY_CONFIG_INVALID', '--version', '"maybe"');
  // values that parse but fail upstream's validation name the configuration field
  refused(['--proxy-mode=kernelspace'], 'KPROXY_CONFIG_INVALID', 'mode', '"kernelspace"');
  refused(['--iptables-masquerade-bit=32'], 'KPROXY_CONFIG_INVALID', 'iptables.masqueradeBit', '32');
  refused(['--oom-score-adj=1001'], 'KPROXY_CONFIG_INVALID', 'oomScoreAdj', '1001');
  refused(['--cluster-cidr=10.0.0.0/8,10.1.0.0/16'], 'KPROXY_CONFIG_INVALID', 'clusterCIDR', 'dual-stack');
  refused(['--nodeport-addresses=primary,10.0.0.0/88'], 'KPROXY_CONFIG_INVALID', 'nodePortAddresses[1]', '10.0.0.0/88');
  refused(['--detect-local-mode=BridgeInterface'], 'KPROXY_CONFIG_INVALID', 'detectLocal.bridgeInterface', 'must not be empty');
  refused(['--show-hidden-metrics-for-version=1.20'], 'KPROXY_CONFIG_INVALID', 'showHiddenMetricsForVersion', '1.20');
  refused(['--hostname-override=   '], 'KPROXY_CONFIG_INVALID', '--hostname-override', 'empty hostname-override is invalid');
  refused(['--conntrack-min=-1'], 'KPROXY_CONFIG_INVALID', 'conntrack.min', '-1');
});

test('--help, --version, -h', () => {
  assert.deepEqual(invocationOf(['--help']), { help: true });
  assert.deepEqual(invocationOf(['-h']), { help: true });
  assert.deepEqual(invocationOf(['--version']), { version: true });
  assert.deepEqual(invocationOf(['--version=raw']), { version: 'raw' });
  assert.ok('cfg' in invocationOf(['--version=false']));
  assert.match(versionText(false), /^kproxy version v\d+\.\d+\.\d+ \(kube-proxy compatible v1\.\d+\)\n$/);
  assert.equal(JSON.parse(versionText(true)).gitVersion.startsWith('v'), true);
});

test('-v maps klog levels onto the logger; --log-level wins', () => {
  assert.deepEqual([0, 1, 2, 4, 5, 10].map(levelForVerbosity), ['info', 'info', 'debug', 'debug', 'trace', 'trace']);
  assert.equal(inv('-v=4').logLevel, 'debug');
  assert.equal(inv('-v=4', '--log-level=warn').logLevel, 'warn');
});

test('--cleanup, --init-only, --write-config-to, --manifests are passed on', () => {
  const r = inv('--cleanup', '--init-only=true', '--write-config-to=/tmp/x.yaml', '--manifests=/m');
  assert.deepEqual([r.cleanup, r.initOnly, r.writeConfigTo, r.manifests], [true, true, '/tmp/x.yaml', '/m']);
});

test("the manifests source's allocation flags: kube-apiserver's names and syntax, checked before anything runs, warned about without --manifests", () => {
  const r = inv('--manifests=/m', '--service-cluster-ip-range=10.96.0.0/12,fd00:96::/108', '--service-node-port-range=20000+999', '--manifests-state=/s.json');
  assert.deepEqual([r.serviceClusterIPRange, r.serviceNodePortRange, r.manifestsState], ['10.96.0.0/12,fd00:96::/108', '20000+999', '/s.json']);
  assert.deepEqual(r.warnings, []);
  refused(['--manifests=/m', '--service-cluster-ip-range=10.0.0.0/24,10.1.0.0/24'], 'KPROXY_CONFIG_INVALID', '--service-cluster-ip-range', 'must be of different IP family');
  refused(['--manifests=/m', '--service-cluster-ip-range=fd00::/56'], 'KPROXY_CONFIG_INVALID', 'shortest allowed prefix length for service CIDR is 64');
  assert.equal(inv('--manifests=/m', '--service-node-port-range=30000').serviceNodePortRange, '30000', 'one port is a range of one');
  refused(['--service-node-port-range=1-70000'], 'KPROXY_CONFIG_INVALID', '--service-node-port-range', 'cannot be greater than 65535');
  const without = inv('--service-cluster-ip-range=10.0.0.0/24', '--manifests-state=/s.json');
  assert.deepEqual(without.warnings, [
    "--service-cluster-ip-range: applies to --manifests only (a cluster's API server allocates for its Services); ignored",
    "--manifests-state: applies to --manifests only (a cluster's API server allocates for its Services); ignored",
  ]);
  const help = helpText();
  assert.match(help, /--service-cluster-ip-range string +kproxy: with --manifests, .* \(default 10\.0\.0\.0\/24\)/);
  assert.match(help, /--service-node-port-range string +kproxy: .* \(default 30000-32767\)/);
  assert.match(help, /--manifests-state string +kproxy: /);
});

test('with --config, the file wins over config flags (warned), but not over --hostname-override, -v, --mode', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kpt-flags-'));
  try {
    const f = join(dir, 'config.conf');
    writeFileSync(f, [
      'apiVersion: kubeproxy.config.k8s.io/v1alpha1',
      'kind: KubeProxyConfiguration',
      'mode: ipvs',
      'clusterCIDR: 10.244.0.0/16',
      'hostnameOverride: from-file',
      'logging:',
      '  verbosity: 1',
      'clientConnection:',
      '  kubeconfig: /from/file',
      '',
    ].join('\n'));
    const r = inv(`--config=${f}`, '--proxy-mode=nftables', '--cluster-cidr=10.0.0.0/8', '--kubeconfig=/from/flag', '--healthz-port=0', '--hostname-override=FROM-FLAG', '-v=5');
    assert.equal(r.cfg.mode, 'ipvs');
    assert.deepEqual(r.cfg.clusterCIDRs, ['10.244.0.0/16']);
    assert.equal(r.cfg.kubeconfig, '/from/file');
    assert.equal(r.cfg.healthzBindAddress, '0.0.0.0:10256', '--healthz-port is ignored with --config');
    assert.equal(r.cfg.hostnameOverride, 'from-flag', '--hostname-override wins, lower-cased');
    assert.equal(r.cfg.logging.verbosity, 5, 'logging flags win');
    assert.equal(r.logLevel, 'trace');
    assert.equal(r.configFile, f);
    for (const flag of ['proxy-mode', 'cluster-cidr', 'kubeconfig', 'healthz-port']) {
      assert.ok(r.warnings.some((w) => w.startsWith(`--${flag}: ignored because --config is given`)), `${flag}: ${JSON.stringify(r.warnings)}`);
    }
    assert.ok(!r.warnings.some((w) => /hostname-override|--v:/.test(w)));
    // without -v the file's verbosity stays; kproxy's --mode overrides the file
    const s = inv(`--config=${f}`, '--mode=nftables');
    assert.equal(s.cfg.logging.verbosity, 1);
    assert.equal(s.cfg.mode, 'nftables');
    assert.equal(s.cfg.hostnameOverride, 'from-file');
    // a missing file is refused naming it
    refused([`--config=${join(dir, 'nope.conf')}`], 'KPROXY_CONFIG_INVALID', '--config', 'nope.conf');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('--write-config-to output reads back as the same configuration', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kpt-flags-'));
  try {
    const r = inv('--proxy-mode=nftables', '--cluster-cidr=10.244.0.0/16', '--conntrack-udp-timeout=30s', '--iptables-sync-period=1m', '-v=2');
    const f = join(dir, 'written.yaml');
    writeFileSync(f, JSON.stringify(r.cfg.v1alpha1));
    const back = inv(`--config=${f}`);
    // upstream's default content type is protobuf, which kproxy does not speak: the one warning
    assert.deepEqual(back.warnings, ['clientConnection.contentType: "application/vnd.kubernetes.protobuf" ignored; kproxy talks JSON to the API server']);
    // the written file spells out nftables' default NodePort addresses ("primary"), which the
    // effective configuration leaves implicit (empty = the mode's default)
    assert.deepEqual(back.cfg.nodePortAddresses, ['primary']);
    assert.deepEqual(r.cfg.nodePortAddresses, []);
    assert.deepEqual({ ...back.cfg, nodePortAddresses: [] }, r.cfg);
    assert.equal(parseYAML(readFileSync(f, 'utf8')).nftables.syncPeriod, '1m0s');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('ConfigError is what a bad flag value throws', () => {
  assert.throws(() => parseFlags(['--kube-api-burst=x']), ConfigError);
});
