import { test } from 'node:test';
import assert from 'node:assert/strict';
import { caseLocalIPs, caseOptions } from '../../src/modes/iptables/case-options.ts';

const base = { mode: 'iptables', nodeName: 'test-node' };
const ifaces = { lo: ['127.0.0.1/8', '::1/128'], eth0: ['192.168.0.2/24', '192.168.1.2/24', '192.168.99.11/24', '2001:db8::1/64'] };

test('detector: explicit ClusterCIDR, none when absent or null, only CIDRs of the case family', () => {
  assert.deepEqual(caseOptions({ ...base, localDetector: { mode: 'ClusterCIDR', clusterCIDR: '10.0.0.0/8' } }).localDetector?.ifNotLocal, ['!', '-s', '10.0.0.0/8']);
  assert.equal(caseOptions({ ...base }).localDetector, null);
  assert.equal(caseOptions({ ...base, localDetector: null }).localDetector, null);
  assert.equal(caseOptions({ ...base, localTrafficDetector: { mode: 'None' } }).localDetector, null);
  assert.equal(caseOptions({ ...base, ipFamily: 'IPv6', localDetector: { mode: 'ClusterCIDR', clusterCIDR: '10.0.0.0/8' } }).localDetector, null);
  assert.deepEqual(caseOptions({ ...base, ipFamily: 'IPv6', clusterCIDR: '10.0.0.0/8,fd00:10::/64' }).localDetector?.ifLocal, ['-s', 'fd00:10::/64']);
});

test('nodePortAddresses pick interface addresses of the family; null means all local addresses', () => {
  assert.equal(caseOptions({ ...base, nodePortAddresses: null, networkInterfaces: ifaces }).nodePorts.matchAll, true);
  const o = caseOptions({ ...base, nodePortAddresses: ['192.168.0.0/24', '192.168.1.0/24', '2001:db8::/64', '127.0.0.0/8'], hostInterfaces: ifaces });
  assert.deepEqual(o.nodePorts, { matchAll: false, ips: ['192.168.0.2', '192.168.1.2', '127.0.0.1'] });
  const v6 = caseOptions({ ...base, ipFamily: 'IPv6', nodePortAddresses: ['192.168.0.0/24', '2001:db8::/64'], networkInterfaces: ifaces });
  assert.deepEqual(v6.nodePorts, { matchAll: false, ips: ['2001:db8::1'] });
  assert.equal(caseOptions({ ...base, nodePortAddresses: ['2001:db8::/64'], networkInterfaces: ifaces }).nodePorts.matchAll, true, 'no CIDR of the family: all');
});

test('mark, nfacct counters and defaults of the upstream fake proxier', () => {
  const d = caseOptions({ ...base });
  assert.equal(d.masqueradeMark, '0x4000');
  assert.equal(d.localhostNodePorts, true);
  assert.equal(d.nfacctCTStateInvalidDropped, true);
  assert.equal(d.largeClusterEndpointsThreshold, 1000);
  assert.equal(caseOptions({ ...base, masqueradeBit: 14 }).masqueradeMark, '0x00004000');
  const nf = caseOptions({ ...base, nfAcctCounters: ['localhost_nps_accepted_pkts'] });
  assert.deepEqual([nf.nfacctCTStateInvalidDropped, nf.nfacctLocalhostNodePortsAccepted], [false, true]);
  const none = caseOptions({ ...base, nfacctCounters: {} });
  assert.deepEqual([none.nfacctCTStateInvalidDropped, none.nfacctLocalhostNodePortsAccepted], [false, false]);
});

test('tracer local IPs: loopback plus the test node IPs', () => {
  assert.deepEqual(caseLocalIPs({ ...base, testNodeIPs: ['192.168.0.2', '2001:db8::1'] }), ['127.0.0.1', '::1', '192.168.0.2', '2001:db8::1']);
});
