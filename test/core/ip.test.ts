// Unit tests for src/core/ip.ts: canonical IP text (what reaches a rule), CIDR parsing with
// host bits masked, containment and host:port joining.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { canonicalIP, ipFamily, parseCIDR, cidrContains, joinHostPort, isLoopback } from '../../src/core/ip.ts';

test('canonicalIP reads sloppy IPv4 leading zeros as decimal', () => {
  assert.equal(canonicalIP('010.000.000.001'), '10.0.0.1');
  assert.equal(canonicalIP('010.001.002.003'), '10.1.2.3');
  assert.equal(canonicalIP('1.2.3.04'), '1.2.3.4');
  assert.equal(canonicalIP('172.30.0.41'), '172.30.0.41');
  assert.equal(canonicalIP('0.0.0.0'), '0.0.0.0');
  assert.equal(canonicalIP('255.255.255.255'), '255.255.255.255');
});

test('canonicalIP rejects what is not an IP address', () => {
  const bad = [
    '', ' ', '1.2.3', '1.2.3.4.5', '256.1.1.1', '1.2.3.-4', '0x1.2.3.4', '1.2.3.4/24', '1.2.3.', '.1.2.3',
    '1.2.3.0004', 'foo', 'example.com', '1::2::3', '12345::1', ':::', '1:2:3:4:5:6:7:8:9', 'g::1',
    // a zone index is not an address: it must never reach a rule
    'fe80::1%eth0',
  ];
  for (const s of bad) assert.equal(canonicalIP(s), null, `expected null for ${JSON.stringify(s)}`);
  assert.equal(canonicalIP(undefined as unknown as string), null);
  assert.equal(canonicalIP(42 as unknown as string), null);
});

test('canonicalIP prints IPv6 per RFC 5952', () => {
  const cases: Array<[string, string]> = [
    ['::', '::'],
    ['::1', '::1'],
    ['0:0:0:0:0:0:0:1', '::1'],
    ['2001:DB8::1', '2001:db8::1'], // lower case
    ['2001:0db8:0000:0000:0000:0000:0002:0001', '2001:db8::2:1'], // leading zeros dropped
    ['2001:db8::0:1', '2001:db8::1'],
    ['2001:db8:0:0:1:0:0:1', '2001:db8::1:0:0:1'], // first of two equal runs
    ['1:0:0:2:0:0:0:3', '1:0:0:2::3'], // longest run wins
    ['2001:db8:0:1:1:1:1:1', '2001:db8:0:1:1:1:1:1'], // a single zero word is not compressed
    ['1:2:3:4:5:6:7::', '1:2:3:4:5:6:7:0'],
    ['fd00:10:180::', 'fd00:10:180::'],
    ['1:2:3:4:5:6:1.2.3.4', '1:2:3:4:5:6:102:304'],
    ['::1.2.3.4', '::102:304'], // deprecated IPv4-compatible form prints as hex, as Go does
  ];
  for (const [raw, want] of cases) assert.equal(canonicalIP(raw), want, raw);
});

test('canonicalIP prints IPv4-mapped IPv6 as plain IPv4 (as Go does)', () => {
  assert.equal(canonicalIP('::ffff:1.2.3.4'), '1.2.3.4');
  assert.equal(canonicalIP('::FFFF:0102:0304'), '1.2.3.4');
  assert.equal(ipFamily('::ffff:10.180.0.1'), 4);
});

test('ipFamily', () => {
  assert.equal(ipFamily('10.180.0.1'), 4);
  assert.equal(ipFamily('010.180.000.001'), 4);
  assert.equal(ipFamily('fd00::1'), 6);
  assert.equal(ipFamily('nope'), null);
});

test('parseCIDR masks host bits and canonicalises', () => {
  assert.deepEqual(parseCIDR('10.1.2.3/8'), { ip: '10.0.0.0', prefix: 8, family: 4, text: '10.0.0.0/8' });
  assert.equal(parseCIDR('010.1.2.3/16')?.text, '10.1.0.0/16');
  assert.equal(parseCIDR('192.168.0.2/32')?.text, '192.168.0.2/32');
  assert.equal(parseCIDR('192.168.0.255/25')?.text, '192.168.0.128/25');
  assert.equal(parseCIDR('1.2.3.4/0')?.text, '0.0.0.0/0');
  assert.deepEqual(parseCIDR('2001:DB8::1/64'), { ip: '2001:db8::', prefix: 64, family: 6, text: '2001:db8::/64' });
  assert.equal(parseCIDR('fd00::ff/128')?.text, 'fd00::ff/128');
  assert.equal(parseCIDR('fd00::ff/120')?.text, 'fd00::/120');
  assert.equal(parseCIDR('::/0')?.text, '::/0');
});

test('parseCIDR rejects invalid forms', () => {
  for (const s of ['10.0.0.0', '10.0.0.0/', '10.0.0.0/33', '10.0.0.0/-1', '10.0.0.0/a', '10.0.0/8', 'fd00::/129', '/8', 'x/8', '10.0.0.0/8/8', '10.0.0.0/1000']) {
    assert.equal(parseCIDR(s), null, s);
  }
});

test('cidrContains', () => {
  assert.equal(cidrContains('10.0.0.0/8', '10.180.0.1'), true);
  assert.equal(cidrContains('10.0.0.0/8', '11.0.0.1'), false);
  assert.equal(cidrContains('10.0.0.0/8', '010.180.000.001'), true);
  assert.equal(cidrContains('172.30.0.0/16', '172.30.255.255'), true);
  assert.equal(cidrContains('172.30.0.0/16', '172.31.0.0'), false);
  assert.equal(cidrContains('0.0.0.0/0', '203.0.113.9'), true);
  assert.equal(cidrContains('192.168.0.2/32', '192.168.0.2'), true);
  assert.equal(cidrContains('192.168.0.2/32', '192.168.0.3'), false);
  assert.equal(cidrContains('fd00::/64', 'fd00::1'), true);
  assert.equal(cidrContains('fd00::/64', 'fd00:0:0:1::1'), false);
  assert.equal(cidrContains('::/0', '1.2.3.4'), false, 'families never mix');
  assert.equal(cidrContains('0.0.0.0/0', '::1'), false, 'families never mix');
  assert.equal(cidrContains('10.0.0.0/8', '::ffff:10.1.1.1'), true, 'IPv4-mapped is IPv4');
  assert.equal(cidrContains('not a cidr', '10.0.0.1'), false);
  assert.equal(cidrContains('10.0.0.0/8', 'not an ip'), false);
  const parsed = parseCIDR('10.180.0.0/16')!;
  assert.equal(cidrContains(parsed, '10.180.3.4'), true);
});

test('joinHostPort brackets IPv6 only', () => {
  assert.equal(joinHostPort('10.180.0.1', 80), '10.180.0.1:80');
  assert.equal(joinHostPort('fd00::1', 8080), '[fd00::1]:8080');
  assert.equal(joinHostPort('::', 0), '[::]:0');
});

test('isLoopback', () => {
  assert.equal(isLoopback('127.0.0.1'), true);
  assert.equal(isLoopback('127.255.0.9'), true);
  assert.equal(isLoopback('::1'), true);
  assert.equal(isLoopback('10.0.0.1'), false);
  assert.equal(isLoopback('::2'), false);
});

test('isIPv4/isIPv6 answer as node:net does (they replace it so that core stays pure)', async () => {
  const net = await import('node:net');
  const { isIPv4, isIPv6 } = await import('../../src/core/ip.ts');
  const samples = ['1.2.3.4', '01.2.3.4', '255.255.255.255', '256.1.1.1', '1.2.3', '1.2.3.4.5', '', '::', '::1', 'fe80::1%eth0', 'fe80::1%',
    '::ffff:1.2.3.4', '1:2:3:4:5:6:7:8', '1:2:3:4:5:6:7:8:9', '1::2::3', '2001:db8::1.2.3.4', ':::', '1:2:3:4:5:6:1.2.3.4', '12345::1', 'g::1', ' 1.2.3.4'];
  for (const s of samples) {
    assert.equal(isIPv4(s), net.isIPv4(s), `isIPv4(${JSON.stringify(s)})`);
    assert.equal(isIPv6(s), net.isIPv6(s), `isIPv6(${JSON.stringify(s)})`);
  }
});
