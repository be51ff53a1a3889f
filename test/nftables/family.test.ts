// The nftables mode's proxier per IP family: the IPv6 one is made only
// when the kernel takes an `ip6` table (checked with `nft -c`, nothing committed).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mode } from '../../src/modes/nftables/index.ts';
import { resolveConfig } from '../../src/config/config.ts';
import { silentLogger } from '../../src/log.ts';
import { FakeNft } from '../../src/kernel/nft/fake.ts';

/** The nft fake, with or without IPv6 in the kernel's nf_tables; the commands it was given. */
function fakeNft(ip6: boolean): { runner: FakeNft; calls: () => string[] } {
  const runner = new FakeNft({ families: ip6 ? ['ip', 'ip6'] : ['ip'] });
  return { runner, calls: () => runner.calls.map((c) => ['nft', ...c.args, c.input ?? ''].join(' ').trim()) };
}

const config = resolveConfig({}, { mode: 'nftables' });

test('nftables: the IPv6 proxier checks that the kernel takes an ip6 table; IPv4 does not ask', async () => {
  const ok = fakeNft(true);
  await mode.createProxier({ config, log: silentLogger(), runner: ok.runner, family: 6 });
  assert.deepEqual(ok.calls(), ['nft --version', 'nft -c -f - add table ip6 kube-proxy']);
  const v4 = fakeNft(false);
  await mode.createProxier({ config, log: silentLogger(), runner: v4.runner, family: 4 });
  assert.deepEqual(v4.calls(), ['nft --version']);
  const no = fakeNft(false);
  await assert.rejects(
    mode.createProxier({ config, log: silentLogger(), runner: no.runner, family: 6 }),
    /KPROXY_EXEC_FAILED: nft cannot create the ip6 kube-proxy table: \/dev\/stdin:1:\S+ Error: Could not process rule: Operation not supported[\s\S]*; load nf_tables with IPv6 support/,
  );
});
