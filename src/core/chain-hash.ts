// The hash part of upstream's chain names: the first characters of the RFC 4648 base32
// encoding (standard alphabet) of the SHA-256 of a text. The iptables mode takes 16
// characters (pkg/proxy/iptables/proxier.go portProtoHash, servicePortEndpointChainName), the
// nftables mode 8 (pkg/proxy/nftables/proxier.go hashAndTruncate). Pure.
import { hash } from 'node:crypto';

const B32 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';

/** The first `chars` characters of base32(sha256(text)); 5 bytes give exactly 8 characters. */
export function sha256Base32Prefix(text: string, chars: number): string {
  // One-shot: a Hash object per name costs more than the hashing (60,000 names at 10,000 Services).
  const buf = hash('sha256', text, 'buffer');
  let out = '';
  let bits = 0;
  let value = 0;
  for (let i = 0; out.length < chars; i++) {
    value = (value << 8) | buf[i];
    bits += 8;
    while (bits >= 5 && out.length < chars) {
      out += B32[(value >>> (bits - 5)) & 31];
      bits -= 5;
    }
    value &= (1 << bits) - 1;
  }
  return out;
}
