// The nftables mode's proxier per IP family: the IPv6 one is made only
// when the kernel takes an `ip6` table (checked with `nft -c`, nothing committed).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mode } from '../../src/modes/nftables/index.ts';
import { resolveConfig } from '../../src/config/config.ts';
import { silentLogger } from '../../src/log.ts';
import type { CommandRunner, RunResult } from '../../src/kernel/runner.ts';

function fakeNft(ip6: boolean): { runner: CommandRunner; calls: string[] } {
  const calls: string[] = [];
  const runner = {
    run: async (cmd: string, args: string[], opts?: { input?: string }): Promise<RunResult> => {
      calls.push([cmd, ...args, opts?.input ?? ''].join(' ').trim());
      if (args[0] === '--version') return { code: 0, stdout: 'nftables v1.0.6\n', stderr: '' } as RunResult;
      if (args[0] === '-c' && /ip6/.test(opts?.input ?? '') && !ip6) return { code: 1, stdout: '', stderr: 'Error: Could not process rule: Operation not supported\n' } as RunResult;
      return { code: 0, stdout: '', stderr: '' } as RunResult;
    },
  } as unknown as CommandRunner;
  return { runner, calls };
}

const config = resolveConfig({}, { mode: 'nftables' });

test('nftables: the IPv6 proxier checks that the kernel takes an ip6 table; IPv4 does not ask', async () => {
  const ok = fakeNft(true);
  await mode.createProxier({ config, log: silentLogger(), runner: ok.runner, family: 6 });
  assert.deepEqual(ok.calls, ['nft --version', 'nft -c -f - add table ip6 kube-proxy']);
  const v4 = fakeNft(false);
  await mode.createProxier({ config, log: silentLogger(), runner: v4.runner, family: 4 });
  assert.deepEqual(v4.calls, ['nft --version']);
  const no = fakeNft(false);
  await assert.rejects(
    mode.createProxier({ config, log: silentLogger(), runner: no.runner, family: 6 }),
    /KPROXY_EXEC_FAILED: nft cannot create the ip6 kube-proxy table: Error: Could not process rule: Operation not supported; load nf_tables with IPv6 support/,
  );
});
