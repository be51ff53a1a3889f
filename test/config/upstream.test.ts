// The v1alpha1 KubeProxyConfiguration against upstream: kubeadm-generated config.conf files
// read unchanged, and upstream's validation cases (pkg/proxy/apis/config/validation/
// validation_test.go), ported as data: each invalid document is refused with
// KPROXY_CONFIG_INVALID naming the field and the value, each valid one is accepted.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ConfigError, parseConfigText, resolveConfig, type ProxyConfig } from '../../src/config/config.ts';
import { loadConfigFile } from '../../src/config/load.ts';

const fixtures = join(import.meta.dirname, 'fixtures');
const HEAD = 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n';

function resolveText(text: string, warnings: string[] = []): ProxyConfig {
  return resolveConfig(parseConfigText(HEAD + text), {}, (w) => warnings.push(w));
}

test('kubeadm config.conf files work unchanged, with upstream defaults filled', () => {
  for (const [file, mode, cidrs] of [
    ['kubeadm-v1.34-config.conf', 'iptables', []],
    ['kubeadm-v1.27-config.conf', 'iptables', ['10.244.0.0/16']],
    ['kubeadm-v1.20-config.conf', 'iptables', []],
  ] as const) {
    const warnings: string[] = [];
    const c = resolveConfig(loadConfigFile(join(fixtures, file)), {}, (w) => warnings.push(w));
    assert.deepEqual(warnings, [], `${file}: no warning for a stock kubeadm file`);
    assert.equal(c.mode, mode, file);
    assert.deepEqual(c.clusterCIDRs, cidrs, file);
    assert.equal(c.kubeconfig, '/var/lib/kube-proxy/kubeconfig.conf', file);
    assert.equal(c.healthzBindAddress, '0.0.0.0:10256', file);
    assert.equal(c.metricsBindAddress, '127.0.0.1:10249', file);
    assert.equal(c.syncPeriodMs, 30_000, file);
    assert.equal(c.minSyncPeriodMs, 1_000, file);
    assert.equal(c.masqueradeBit, 14, file);
    assert.equal(c.localhostNodePorts, true, file);
    assert.equal(c.oomScoreAdj, -999, `${file}: a null oomScoreAdj is upstream's -999`);
    assert.equal(c.conntrack.min, 131072, file);
    assert.equal(c.conntrack.tcpEstablishedTimeoutSec, 86400, file);
    assert.equal(c.conntrack.tcpCloseWaitTimeoutSec, 3600, file);
    assert.equal(c.configSyncPeriodMs, 15 * 60_000, file);
    assert.equal(c.detectLocalMode, 'ClusterCIDR', file);
    assert.equal(c.logging.verbosity, 0, file);
  }
  // kubeadm v1.27's maxPerCore: 0 means "leave nf_conntrack_max alone"
  assert.equal(resolveConfig(loadConfigFile(join(fixtures, 'kubeadm-v1.27-config.conf'))).conntrack.maxPerCore, 0);
  assert.equal(resolveConfig(loadConfigFile(join(fixtures, 'kubeadm-v1.34-config.conf'))).conntrack.maxPerCore, 32768);
  // the files are kept as kubeadm wrote them
  assert.match(readFileSync(join(fixtures, 'kubeadm-v1.34-config.conf'), 'utf8'), /^apiVersion: kubeproxy\.config\.k8s\.io\/v1alpha1\nbindAddress: 0\.0\.0\.0\n/);
});

test('a config file in JSON reads as YAML does (upstream decodes both)', () => {
  const c = resolveConfig(parseConfigText(JSON.stringify({ apiVersion: 'kubeproxy.config.k8s.io/v1alpha1', kind: 'KubeProxyConfiguration', mode: 'ipvs', ipvs: { scheduler: 'lc' } })));
  assert.deepEqual([c.mode, c.ipvs.scheduler], ['ipvs', 'lc']);
});

test('fields that do not apply here get a one-line warning each; the rest of the file applies', () => {
  const cases: Array<[string, RegExp]> = [
    ['winkernel:\n  enableDSR: true\n  networkName: vxlan0\n', /^winkernel\.enableDSR, winkernel\.networkName: Windows only/],
    ['windowsRunAsService: true\n', /^windowsRunAsService: Windows only/],
    ['clientConnection:\n  contentType: application/vnd.kubernetes.protobuf\n', /^clientConnection\.contentType: "application\/vnd\.kubernetes\.protobuf" ignored/],
    ['enableProfiling: true\n', /^enableProfiling: ignored/],
    ['featureGates:\n  NFTablesProxyMode: true\n', /^featureGates: NFTablesProxyMode ignored/],
    ['logging:\n  vmodule:\n  - proxier=4\n', /^logging\.vmodule: ignored/],
    ['iptables:\n  snatNodeInternalIP: true\n', /^iptables\.snatNodeInternalIP: not supported/],
    ['Mode: ipvs\n', /^Mode: read as mode/],
  ];
  for (const [text, re] of cases) {
    const warnings: string[] = [];
    resolveText(text, warnings);
    assert.equal(warnings.length, 1, `${text}: ${JSON.stringify(warnings)}`);
    assert.match(warnings[0], re);
    assert.doesNotMatch(warnings[0], /\n/);
  }
  // Go's decoder matches field names case-insensitively
  assert.equal(resolveText('Mode: ipvs\n').mode, 'ipvs');
});

// upstream validation_test.go, as [name, document, field named, value named]
const INVALID: Array<[string, string, string, string]> = [
  ['invalid BindAddress', 'bindAddress: 10.10.12.11:2000\n', 'bindAddress', '10.10.12.11:2000'],
  ['invalid HealthzBindAddress port', 'healthzBindAddress: 0.0.0.0:12345678\n', 'healthzBindAddress', '12345678'],
  ['invalid HealthzBindAddress IP', 'healthzBindAddress: 0.0.0.x:10256\n', 'healthzBindAddress', '0.0.0.x'],
  ['invalid MetricsBindAddress', 'metricsBindAddress: 127.0.0.1:0\n', 'metricsBindAddress', '127.0.0.1:0'],
  ['ClusterCIDR missing subset range', 'clusterCIDR: 192.168.59.0\n', 'clusterCIDR[0]', '192.168.59.0'],
  ['Invalid number of ClusterCIDRs', 'clusterCIDR: 192.168.59.0/24,fd00:192:168::/64,10.0.0.0/16\n', 'clusterCIDR', '192.168.59.0/24,fd00:192:168::/64,10.0.0.0/16'],
  ['Two IPv4 ClusterCIDRs', 'clusterCIDR: 192.168.59.0/24,10.0.0.0/16\n', 'clusterCIDR', '192.168.59.0/24,10.0.0.0/16'],
  ['ConfigSyncPeriod must be > 0', 'configSyncPeriod: -1s\n', 'configSyncPeriod', '-1s'],
  ['IPVS mode selected without providing required SyncPeriod', 'mode: ipvs\nipvs:\n  syncPeriod: -5s\n', 'ipvs.syncPeriod', '-5s'],
  ['interfacePrefix is empty', 'detectLocalMode: InterfaceNamePrefix\ndetectLocal:\n  interfaceNamePrefix: ""\n', 'detectLocal.interfaceNamePrefix', 'must not be empty'],
  ['bridgeInterfaceName is empty', 'detectLocalMode: BridgeInterface\ndetectLocal:\n  bridgeInterface: ""\n', 'detectLocal.bridgeInterface', 'must not be empty'],
  ['invalid DetectLocalMode', 'detectLocalMode: Guess\n', 'detectLocalMode', 'Guess'],
  ['invalid proxy mode (Windows only)', 'mode: kernelspace\n', 'mode', 'kernelspace'],
  ['invalid proxy mode', 'mode: non-existing\n', 'mode', 'non-existing'],
  ['invalid iptables masqueradeBit', 'iptables:\n  masqueradeBit: -10\n', 'iptables.masqueradeBit', '-10'],
  ['invalid iptables syncPeriod', 'iptables:\n  syncPeriod: -5s\n', 'iptables.syncPeriod', '-5s'],
  ['invalid iptables minSyncPeriod', 'iptables:\n  minSyncPeriod: -1s\n', 'iptables.minSyncPeriod', '-1s'],
  ['minSyncPeriod greater than syncPeriod', 'iptables:\n  syncPeriod: 5s\n  minSyncPeriod: 10s\n', 'iptables.minSyncPeriod', '10s'],
  ['invalid nftables masqueradeBit', 'mode: nftables\nnftables:\n  masqueradeBit: 32\n', 'nftables.masqueradeBit', '32'],
  ['invalid IPVS scheduler', 'mode: ipvs\nipvs:\n  scheduler: fancy\n', 'ipvs.scheduler', 'fancy'],
  ['invalid IPVS TCPTimeout', 'mode: ipvs\nipvs:\n  tcpTimeout: -1s\n', 'ipvs.tcpTimeout', '-1s'],
  ['invalid IPVS TCPFinTimeout', 'mode: ipvs\nipvs:\n  tcpFinTimeout: -1s\n', 'ipvs.tcpFinTimeout', '-1s'],
  ['invalid IPVS UDPTimeout', 'mode: ipvs\nipvs:\n  udpTimeout: -1s\n', 'ipvs.udpTimeout', '-1s'],
  ['invalid IPVS ExcludeCIDRs', 'mode: ipvs\nipvs:\n  excludeCIDRs: ["10.20.30.40", "400.10.2.2/32"]\n', 'ipvs.excludeCIDRs[0]', '10.20.30.40'],
  ['invalid conntrack MaxPerCore', 'conntrack:\n  maxPerCore: -1\n', 'conntrack.maxPerCore', '-1'],
  ['invalid conntrack Min', 'conntrack:\n  min: -1\n', 'conntrack.min', '-1'],
  ['invalid conntrack TCPEstablishedTimeout', 'conntrack:\n  tcpEstablishedTimeout: -5s\n', 'conntrack.tcpEstablishedTimeout', '-5s'],
  ['invalid conntrack TCPCloseWaitTimeout', 'conntrack:\n  tcpCloseWaitTimeout: -5s\n', 'conntrack.tcpCloseWaitTimeout', '-5s'],
  ['invalid conntrack UDPTimeout', 'conntrack:\n  udpTimeout: -5s\n', 'conntrack.udpTimeout', '-5s'],
  ['invalid conntrack UDPStreamTimeout', 'conntrack:\n  udpStreamTimeout: -5s\n', 'conntrack.udpStreamTimeout', '-5s'],
  ['OOMScoreAdj out of range (high)', 'oomScoreAdj: 1001\n', 'oomScoreAdj', '1001'],
  ['OOMScoreAdj out of range (low)', 'oomScoreAdj: -1001\n', 'oomScoreAdj', '-1001'],
  ['negative Burst', 'clientConnection:\n  burst: -5\n', 'clientConnection.burst', '-5'],
  ['invalid PortRange', 'portRange: 40000-30000\n', 'portRange', '40000-30000'],
  ['invalid ipv4 nodePortAddresses', 'nodePortAddresses: ["10.20.30.40/24", "10.20.30.4/33"]\n', 'nodePortAddresses[1]', '10.20.30.4/33'],
  ['invalid ipv6 nodePortAddresses', 'nodePortAddresses: ["::1/128", "2001:db8::/32", "2001:db8:xyz/64"]\n', 'nodePortAddresses[2]', '2001:db8:xyz/64'],
  ['invalid nodePortAddresses keyword', 'nodePortAddresses: ["primary", "loopback"]\n', 'nodePortAddresses[1]', 'loopback'],
  ['invalid ShowHiddenMetricsForVersion', 'showHiddenMetricsForVersion: "1.1"\n', 'showHiddenMetricsForVersion', '1.1'],
  ['invalid logging format', 'logging:\n  format: xml\n', 'logging.format', 'xml'],
  ['invalid logging verbosity', 'logging:\n  verbosity: -1\n', 'logging.verbosity', '-1'],
  // Go's decoder: a value of the wrong type is an error naming the field
  ['string for an int', 'oomScoreAdj: lots\n', 'oomScoreAdj', 'lots'],
  ['number for a duration', 'configSyncPeriod: 30\n', 'configSyncPeriod', '30'],
  ['bad duration', 'iptables:\n  syncPeriod: 1d\n', 'iptables.syncPeriod', '1d'],
  ['string for a bool', 'bindAddressHardFail: "yes"\n', 'bindAddressHardFail', 'yes'],
  ['scalar for a list', 'nodePortAddresses: 10.0.0.0/8\n', 'nodePortAddresses', '10.0.0.0/8'],
];

test('upstream validation cases: invalid values are refused naming the field and the value', () => {
  for (const [name, text, field, value] of INVALID) {
    assert.throws(() => resolveText(text), (e: unknown) => {
      assert.ok(e instanceof ConfigError, `${name}: ${String(e)}`);
      assert.equal(e.code, 'KPROXY_CONFIG_INVALID');
      assert.equal(e.field, field, name);
      assert.ok(e.message.includes(value), `${name}: ${JSON.stringify(e.message)} should name ${value}`);
      return true;
    }, name);
  }
});

// upstream validation_test.go's valid cases (and defaulting that makes them valid)
const VALID: Array<[string, string, (c: ProxyConfig) => void]> = [
  ['minimal', '', (c) => assert.equal(c.mode, 'iptables')],
  ['IPv6 bind address', 'bindAddress: "fd00:192:168:59::103"\nhealthzBindAddress: "[fd00:192:168:59::103]:10256"\nmetricsBindAddress: "[::1]:10249"\n', (c) => assert.equal(c.healthzBindAddress, '[fd00:192:168:59::103]:10256')],
  ['empty healthzBindAddress gets the default', 'healthzBindAddress: ""\n', (c) => assert.equal(c.healthzBindAddress, '0.0.0.0:10256')],
  ['IPv6 bindAddress: IPv6 default server addresses', 'bindAddress: "::"\n', (c) => assert.deepEqual([c.healthzBindAddress, c.metricsBindAddress], ['[::]:10256', '[::1]:10249'])],
  ['a bare IP gets the default port', 'healthzBindAddress: 127.0.0.1\nmetricsBindAddress: 0.0.0.0\n', (c) => assert.deepEqual([c.healthzBindAddress, c.metricsBindAddress], ['127.0.0.1:10256', '0.0.0.0:10249'])],
  ['dual-stack ClusterCIDR', 'clusterCIDR: 192.168.59.0/24,fd00:192:168::/64\n', (c) => assert.deepEqual(c.clusterCIDRs, ['192.168.59.0/24', 'fd00:192:168::/64'])],
  ['ipvs mode', 'mode: ipvs\nipvs:\n  syncPeriod: 10s\n  minSyncPeriod: 5s\n  excludeCIDRs: ["10.20.30.40/24"]\n', (c) => assert.deepEqual([c.syncPeriodMs, c.minSyncPeriodMs], [10_000, 5_000])],
  ['ipvs section not validated outside ipvs mode', 'ipvs:\n  tcpTimeout: -1s\n', (c) => assert.equal(c.ipvs.tcpTimeoutMs, 0)],
  ['nftables masqueradeBit not validated outside nftables mode', 'nftables:\n  masqueradeBit: 40\n', (c) => assert.equal(c.masqueradeBit, 14)],
  ['nodePortAddresses primary', 'nodePortAddresses: ["primary"]\n', (c) => assert.deepEqual(c.nodePortAddresses, ['primary'])],
  // kubernetes#138427 (1.37): the keywords mix with each other and with CIDRs; before it,
  // upstream's table refused "primary" beside a CIDR
  ['nodePortAddresses primary/CIDR mix', 'nodePortAddresses: ["primary", "127.0.0.1/32"]\n', (c) => assert.deepEqual(c.nodePortAddresses, ['primary', '127.0.0.1/32'])],
  ['nodePortAddresses keywords', 'nodePortAddresses: ["primary", "localhost", "all", "10.0.0.0/8"]\n', (c) => assert.deepEqual(c.nodePortAddresses, ['primary', 'localhost', 'all', '10.0.0.0/8'])],
  ['ShowHiddenMetricsForVersion: the previous minor', 'showHiddenMetricsForVersion: "1.33"\n', () => {}],
  ['PortRange forms', 'portRange: 30000-31000\n', () => {}],
  ['PortRange A+N', 'portRange: "30000+100"\n', () => {}],
  ['ClusterCIDR ignored (not validated) in NodeCIDR mode', 'detectLocalMode: NodeCIDR\nclusterCIDR: not-a-cidr\n', (c) => assert.deepEqual(c.clusterCIDRs, [])],
  ['minSyncPeriod 0 in ipvs mode', 'mode: ipvs\nipvs:\n  minSyncPeriod: 0s\n', (c) => assert.equal(c.minSyncPeriodMs, 0)],
  ['json logging', 'logging:\n  format: json\n  verbosity: 4\n  flushFrequency: 10s\n', (c) => assert.deepEqual(c.logging, { format: 'json', verbosity: 4 })],
];

test('upstream validation cases: valid documents are accepted', () => {
  for (const [name, text, check] of VALID) {
    let c: ProxyConfig;
    try {
      c = resolveText(text);
    } catch (e) {
      assert.fail(`${name}: ${(e as Error).message}`);
    }
    check(c);
  }
});

test('wrong apiVersion or kind is an error, as upstream\'s decoder', () => {
  for (const [text, field] of [
    ['apiVersion: kubeproxy.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n', 'apiVersion'],
    ['apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n', 'apiVersion'],
    ['apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n', 'kind'],
  ]) {
    assert.throws(() => parseConfigText(text), (e: unknown) => e instanceof ConfigError && e.field === field, text);
  }
});
