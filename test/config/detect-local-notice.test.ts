// upstream getLocalDetectors: "Detect-local-mode set to ClusterCIDR, but no cluster CIDR
// specified for primary IP family" when the primary family has no cluster CIDR.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { detectLocalNotice, resolveConfig } from '../../src/config/config.ts';

test('ClusterCIDR (the default) without a cluster CIDR of the primary family: upstream\'s notice', () => {
  const cfg = resolveConfig({ mode: 'iptables' });
  assert.equal(cfg.detectLocalMode, 'ClusterCIDR');
  assert.deepEqual(detectLocalNotice(cfg, 4), {
    msg: 'Detect-local-mode set to ClusterCIDR, but no cluster CIDR specified for primary IP family',
    fields: { ipFamily: 'IPv4', clusterCIDRs: [] },
  });
  // an IPv6 CIDR only, IPv4 primary: still the notice, naming the CIDRs given
  const v6 = resolveConfig({ mode: 'nftables', clusterCIDR: 'fd00:10::/48' });
  assert.deepEqual(detectLocalNotice(v6, 4)?.fields, { ipFamily: 'IPv4', clusterCIDRs: ['fd00:10::/48'] });
  // ...but none when IPv6 is the primary family
  assert.equal(detectLocalNotice(v6, 6), null);
});

test('no notice with a CIDR of the primary family, another detect-local mode, or userspace mode', () => {
  assert.equal(detectLocalNotice(resolveConfig({ mode: 'iptables', clusterCIDR: '10.244.0.0/16' }), 4), null);
  assert.equal(detectLocalNotice(resolveConfig({ mode: 'ipvs', clusterCIDR: '10.244.0.0/16,fd00:10::/48' }), 6), null);
  assert.equal(detectLocalNotice(resolveConfig({ mode: 'iptables', detectLocalMode: 'NodeCIDR' }), 4), null);
  assert.equal(detectLocalNotice(resolveConfig({ mode: 'iptables', detectLocalMode: 'BridgeInterface', detectLocal: { bridgeInterface: 'cbr0' } }), 4), null);
  assert.equal(detectLocalNotice(resolveConfig({ mode: 'userspace' }), 4), null);
  assert.equal(detectLocalNotice(resolveConfig({ mode: 'iptables' }), undefined), null);
});
