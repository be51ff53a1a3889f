// The nft fake (src/kernel/nft/fake.ts) refuses what the kernel refuses and accepts what it
// accepts: every case is one `nft -f` transaction after a common start, sent both to the fake
// and to the real nft in a network namespace this test creates (removed in `after`). Then
// the fake's own properties: atomicity (a refused transaction changes nothing), every refused
// line reported, `-c` checks only, and its listing read as the proxier reads the kernel's.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { hostRunner, runChecked } from '../../src/kernel/runner.ts';
import { FakeNft } from '../../src/kernel/nft/fake.ts';
import { NftExecutor } from '../../src/kernel/nft/exec.ts';
import { uniqueName } from '../support/netns.ts';
import { nsRunner } from '../nftables/objects.ts';

const NS = uniqueName('kpt-nft-fake');
const T = 'ip kpt-fake';

/** The start of every case: a table with a base chain, a regular chain, a set and a verdict map. */
const START = [
  `add table ${T} { comment "fake" ; }`,
  `add chain ${T} base { type nat hook prerouting priority -100 ; }`,
  `add chain ${T} svc`,
  `add chain ${T} ep`,
  `add set ${T} ips { type ipv4_addr ; comment "ips" ; }`,
  `add map ${T} dispatch { type ipv4_addr . inet_proto . inet_service : verdict ; }`,
  `add rule ${T} base ip daddr @ips jump svc`,
  `add rule ${T} svc goto ep`,
  `add element ${T} ips { 172.30.0.1 comment "a" }`,
  `add element ${T} dispatch { 172.30.0.1 . tcp . 80 : goto svc }`,
].join('\n') + '\n';

/** [what, transaction, whether the kernel takes it] */
const CASES: Array<[string, string, boolean]> = [
  ['a jump to a missing chain', `add rule ${T} svc jump nowhere`, false],
  ['a goto in a chain body to a missing chain', `add chain ${T} svc { goto nowhere ; }`, false],
  ['@set of a missing set', `add rule ${T} svc ip daddr @nope accept`, false],
  ['a verdict into a missing chain', `add element ${T} dispatch { 172.30.0.2 . tcp . 80 : goto nowhere }`, false],
  ['an element into a missing set', `add element ${T} nope { 172.30.0.2 }`, false],
  ['a rule in a missing chain', `add rule ${T} nope accept`, false],
  ['anything in a missing table', `add chain ip kpt-none x`, false],
  ['create of an existing table', `create table ${T}`, false],
  ['create of an existing chain', `create chain ${T} svc`, false],
  ['create of an existing set', `create set ${T} ips { type ipv4_addr ; }`, false],
  ['a set re-declared with another type', `add set ${T} ips { type ipv6_addr ; }`, false],
  ['a map element whose key is there with another verdict', `add element ${T} dispatch { 172.30.0.1 . tcp . 80 : goto ep }`, false],
  ['deleting a chain still jumped to', `delete chain ${T} ep`, false],
  ['deleting a chain a map element goes to', `flush chain ${T} base\ndelete chain ${T} svc`, false],
  ['deleting a set a rule uses', `delete set ${T} ips`, false],
  ['deleting a missing chain', `delete chain ${T} nope`, false],
  ['deleting a missing set', `delete set ${T} nope`, false],
  ['deleting a missing element', `delete element ${T} ips { 172.30.0.9 }`, false],
  ['flushing a missing chain', `flush chain ${T} nope`, false],
  ['add of existing objects (declarations are idempotent)', `add table ${T}\nadd chain ${T} svc\nadd set ${T} ips { type ipv4_addr ; comment "ips" ; }`, true],
  ['the same element again', `add element ${T} ips { 172.30.0.1 }`, true],
  ['rules as a chain body and elements as a set body', `add chain ${T} ep { ip daddr 10.0.0.1 accept ; }\nadd map ${T} dispatch { type ipv4_addr . inet_proto . inet_service : verdict ; elements = { 172.30.0.3 . udp . 53 : goto ep } ; }`, true],
  ['deleting a chain once unreferenced', `flush chain ${T} svc\ndelete chain ${T} ep`, true],
  ['deleting an element, then its set is free', `flush chain ${T} base\ndelete set ${T} ips`, true],
  ['a changed element: deleted first, then added', `delete element ${T} dispatch { 172.30.0.1 . tcp . 80 }\nadd element ${T} dispatch { 172.30.0.1 . tcp . 80 : goto ep }`, true],
  ['deleting the table', `delete table ${T}`, true],
];

before(async () => {
  await runChecked(hostRunner, 'ip', ['netns', 'add', NS], { timeoutMs: 10_000 });
});

after(async () => {
  await hostRunner.run('ip', ['netns', 'del', NS], { timeoutMs: 10_000 });
});

test('the fake refuses what the kernel refuses and takes what it takes', async () => {
  const kernel = new NftExecutor(nsRunner(NS));
  for (const [what, tx, takes] of CASES) {
    await nsRunner(NS).run('nft', ['delete', 'table', 'ip', 'kpt-fake'], { timeoutMs: 10_000 });
    await kernel.apply(START);
    const k = await kernel.apply(tx + '\n').then(() => true, () => false);
    assert.equal(k, takes, `${what}: the kernel ${takes ? 'takes' : 'refuses'} it`);
    const fake = new FakeNft();
    assert.equal((await fake.run('nft', ['-f', '-'], { input: START })).code, 0, `${what}: the fake takes the start`);
    const r = await fake.run('nft', ['-f', '-'], { input: tx + '\n' });
    assert.equal(r.code === 0, takes, `${what}: the fake ${takes ? 'takes' : 'refuses'} it: ${r.stderr}`);
  }
});

test('a refused transaction changes nothing; every refused line is reported; -c only checks', async () => {
  const fake = new FakeNft();
  await fake.run('nft', ['-f', '-'], { input: START });
  const before = fake.dump('ip', 'kpt-fake');
  const r = await fake.run('nft', ['-f', '-'], { input: `add chain ${T} fresh\nadd rule ${T} fresh jump a\nadd rule ${T} fresh jump b\n` });
  assert.equal(r.code, 1);
  assert.deepEqual([...r.stderr.matchAll(/^\/dev\/stdin:(\d+):/gm)].map((m) => m[1]), ['2', '3']);
  assert.equal(fake.dump('ip', 'kpt-fake'), before, 'nothing of it applied');
  const check = await fake.run('nft', ['-c', '-f', '-'], { input: `add chain ${T} checked\n` });
  assert.equal(check.code, 0);
  assert.equal(fake.dump('ip', 'kpt-fake'), before, '-c applies nothing');
  assert.deepEqual(await new NftExecutor(fake).existingTables('ip', ['kpt-none', 'kpt-fake']), ['kpt-fake']);
});

test('the fake lists a table in nft\'s block form', async () => {
  const fake = new FakeNft();
  await fake.run('nft', ['-f', '-'], { input: START });
  const listed = (await fake.run('nft', ['list', 'table', 'ip', 'kpt-fake'])).stdout;
  assert.equal(
    listed,
    [
      'table ip kpt-fake {',
      '\tcomment "fake"',
      '\tset ips {',
      '\t\ttype ipv4_addr',
      '\t\tcomment "ips"',
      '\t\telements = { 172.30.0.1 comment "a" }',
      '\t}',
      '\tmap dispatch {',
      '\t\ttype ipv4_addr . inet_proto . inet_service : verdict',
      '\t\telements = { 172.30.0.1 . tcp . 80 : goto svc }',
      '\t}',
      '\tchain base {',
      '\t\ttype nat hook prerouting priority -100; policy accept;',
      '\t\tip daddr @ips jump svc',
      '\t}',
      '\tchain svc {',
      '\t\tgoto ep',
      '\t}',
      '\tchain ep {',
      '\t}',
      '}',
      '',
    ].join('\n'),
  );
  assert.equal((await fake.run('nft', ['list', 'table', 'ip', 'kpt-none'])).code, 1);
});
