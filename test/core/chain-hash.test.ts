import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import fc from 'fast-check';
import { sha256Base32Prefix } from '../../src/core/chain-hash.ts';

test('the hash parts of upstream golden chain names', () => {
  // pkg/proxy/iptables/proxier_test.go: KUBE-SVC-XPGD46QRK7WJZT7O is ns1/svc1:p80 tcp
  assert.equal(sha256Base32Prefix('ns1/svc1:p80tcp', 16), 'XPGD46QRK7WJZT7O');
  // pkg/proxy/nftables/proxier_test.go: service-ULMVA6XW-ns1/svc1/tcp/p80
  assert.equal(sha256Base32Prefix('ns1/svc1/tcp/p80', 8), 'ULMVA6XW');
  // RFC 4648 base32 of sha256(""), e3b0c442...
  assert.equal(sha256Base32Prefix('', 16), '4OYMIQUY7QOBJGX3');
});

/** base32 by the book: the digest as one big number, 5 bits at a time from the top. */
function reference(text: string, chars: number): string {
  const digest = createHash('sha256').update(text, 'utf8').digest();
  const big = BigInt(`0x${digest.toString('hex')}`);
  const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';
  let out = '';
  for (let i = 0; i < chars; i++) out += alphabet[Number((big >> BigInt(256 - 5 * (i + 1))) & 31n)];
  return out;
}

test('any text, any prefix length up to a whole digest, equals base32 by the book', () => {
  fc.assert(
    fc.property(fc.string({ unit: 'binary' }), fc.integer({ min: 1, max: 51 }), (text, chars) => {
      assert.equal(sha256Base32Prefix(text, chars), reference(text, chars));
    }),
  );
});
