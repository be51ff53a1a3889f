import { test } from 'node:test';
import assert from 'node:assert/strict';
import { endpointChainName, hash16, isServiceChainName, probability, serviceChains } from '../../src/modes/iptables/names.ts';
import { servicePortsOf } from '../../src/core/convert.ts';
import { svc } from './helpers.ts';

test('chain names are upstream hashes of servicePortName + protocol [+ endpoint]', () => {
  // Values from upstream's TestOverallIPTablesRules golden.
  assert.equal(hash16('ns1/svc1:p80tcp'), 'XPGD46QRK7WJZT7O');
  const [sp] = servicePortsOf(svc('ns5', 'svc5', { clusterIP: '172.30.0.45' }), 4);
  const c = serviceChains(sp);
  assert.deepEqual([c.svc, c.svl, c.ext, c.fw], ['KUBE-SVC-NUKIZ6OKUXPJNT4C', 'KUBE-SVL-NUKIZ6OKUXPJNT4C', 'KUBE-EXT-NUKIZ6OKUXPJNT4C', 'KUBE-FW-NUKIZ6OKUXPJNT4C']);
  assert.equal(endpointChainName('ns1/svc1:p80', 'tcp', '10.180.0.1:80'), 'KUBE-SEP-SXIVWICOYRO3J4NJ');
  assert.equal(endpointChainName('ns5/svc5:p80', 'tcp', '10.180.0.3:80'), 'KUBE-SEP-I77PXRDZVX7PMWMN');
});

test('an unnamed port is "ns/name" without a colon, as ServicePortName.String()', () => {
  const [sp] = servicePortsOf(svc('ns1', 'svc1', { clusterIP: '172.30.0.41', portName: '' }), 4);
  assert.equal(serviceChains(sp).nameString, 'ns1/svc1');
  assert.equal(serviceChains(sp).svc, 'KUBE-SVC-' + hash16('ns1/svc1tcp'));
});

test('protocol is part of the hash, lower-cased', () => {
  const [tcp] = servicePortsOf(svc('ns', 's', { clusterIP: '172.30.0.1', protocol: 'TCP' }), 4);
  const [udp] = servicePortsOf(svc('ns', 's', { clusterIP: '172.30.0.1', protocol: 'UDP' }), 4);
  assert.notEqual(serviceChains(tcp).svc, serviceChains(udp).svc);
  assert.equal(serviceChains(udp).svc, 'KUBE-SVC-' + hash16('ns/s:p80udp'));
});

test('probabilities are %0.10f of 1/n', () => {
  assert.equal(probability(2), '0.5000000000');
  assert.equal(probability(3), '0.3333333333');
  assert.equal(probability(6), '0.1666666667');
  assert.equal(probability(1000), '0.0010000000');
  assert.equal(probability(7), (1 / 7).toFixed(10));
});

test('service chain names are recognised by prefix; top-level chains are not', () => {
  for (const c of ['KUBE-SVC-X', 'KUBE-SVL-X', 'KUBE-EXT-X', 'KUBE-FW-X', 'KUBE-SEP-X']) assert.ok(isServiceChainName(c), c);
  for (const c of ['KUBE-SERVICES', 'KUBE-NODEPORTS', 'KUBE-MARK-MASQ', 'KUBE-FIREWALL', 'DOCKER']) assert.ok(!isServiceChainName(c), c);
});

test('names are the same for a replaced ServicePort object (the cache is per object, the names per text)', () => {
  const [a] = servicePortsOf(svc('ns5', 'svc5', { clusterIP: '172.30.0.45' }), 4);
  const [b] = servicePortsOf(svc('ns5', 'svc5', { clusterIP: '172.30.0.46' }), 4);
  const [c] = servicePortsOf(svc('ns5', 'svc6', { clusterIP: '172.30.0.45' }), 4);
  assert.notEqual(a, b);
  assert.strictEqual(serviceChains(a), serviceChains(a));
  assert.deepEqual(serviceChains(b), serviceChains(a));
  assert.equal(serviceChains(a).svc, 'KUBE-SVC-NUKIZ6OKUXPJNT4C');
  assert.equal(serviceChains(c).svc, 'KUBE-SVC-' + hash16('ns5/svc6:p80tcp'));
});
