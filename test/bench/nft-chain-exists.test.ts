// Real kernel: bench/nft-chain-exists.py, the benchmarks' O(1) poll for an nftables chain (one
// netlink GETCHAIN), answers exists / absent / no table as `nft list chain` would, in a
// namespace the test creates and removes.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { hostRunner, runChecked } from '../../src/kernel/runner.ts';
import { uniqueName } from '../support/netns.ts';

const NS = uniqueName('kpt-nft-getchain');
const SCRIPT = join(resolve(import.meta.dirname, '../..'), 'bench/nft-chain-exists.py');
const PYTHON = existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';
const CHAIN = 'endpoint-2FVK5KLX-ns/svc20/tcp/http__10.180.20.1/8080';

function probe(family: string, table: string, chain: string) {
  return hostRunner.run('ip', ['netns', 'exec', NS, PYTHON, '-S', SCRIPT, family, table, chain], { timeoutMs: 20_000 });
}

before(async () => {
  await runChecked(hostRunner, 'ip', ['netns', 'add', NS], { timeoutMs: 10_000 });
});

after(async () => {
  await hostRunner.run('ip', ['netns', 'del', NS], { timeoutMs: 10_000 });
});

test('nft-chain-exists.py: 0 for a chain that exists, 1 for one that does not or a missing table, 2 for bad usage', async () => {
  assert.equal((await probe('ip', 'kube-proxy', CHAIN)).code, 1, 'no table yet');
  await runChecked(hostRunner, 'ip', ['netns', 'exec', NS, 'nft', '-f', '-'], {
    input: `add table ip kube-proxy\nadd chain ip kube-proxy ${CHAIN}\nadd table ip6 kube-proxy\n`,
    timeoutMs: 10_000,
  });
  assert.equal((await probe('ip', 'kube-proxy', CHAIN)).code, 0, 'the chain');
  assert.equal((await probe('ip', 'kube-proxy', CHAIN.replace('10.180.20.1', '10.180.20.2'))).code, 1, 'another endpoint');
  assert.equal((await probe('ip6', 'kube-proxy', CHAIN)).code, 1, 'the other family');
  assert.equal((await probe('bogus', 'kube-proxy', CHAIN)).code, 2, 'bad family');
  await runChecked(hostRunner, 'ip', ['netns', 'exec', NS, 'nft', 'delete', 'chain', 'ip', 'kube-proxy', CHAIN], { timeoutMs: 10_000 });
  assert.equal((await probe('ip', 'kube-proxy', CHAIN)).code, 1, 'deleted');
});
