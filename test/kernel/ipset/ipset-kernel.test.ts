// The ipset entries of the ipvs mode against the real `ipset` binary and kernel, inside a
// network namespace this test creates (ipsets are per namespace; the host kernel has ipset
// even without IPVS). Checks that the planner's idea of what the kernel refuses
// (entryRefusal), the fake's refusals and its messages match the kernel, that the isolating
// restore keeps every good entry around refused ones, and that whole plans restore cleanly.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { hostRunner, type CommandRunner } from '../../../src/kernel/runner.ts';
import { IPSetExec } from '../../../src/kernel/ipset/exec.ts';
import { createLine, entryRefusal, formatIPSets, normalizeEntry, type IPSetType } from '../../../src/kernel/ipset/model.ts';
import { plan } from '../../../src/modes/ipvs/planner.ts';
import { skippedVIPs } from '../../../src/core/vip.ts';
import { Netns, sh } from '../../support/netns.ts';
import { FakeHost } from '../../ipvs/fake.ts';
import { ep, input, svc } from '../../ipvs/support.ts';

const NS = `kpd2-ipset-${process.pid}`;

// Kernel tests never skip (CI runs as root with ipset installed by scripts/setup-system.sh).

let ns: Netns | null = null;
function netns(): Netns {
  ns ??= Netns.create(NS);
  return ns;
}
after(() => {
  sh('ip', ['netns', 'del', NS], { allowFail: true });
});

/** runs commands inside the test's namespace */
const inNs: CommandRunner = {
  run: (cmd, args, opts) => hostRunner.run('ip', ['netns', 'exec', NS, cmd, ...args], opts),
};

async function ipset(input: string): Promise<{ code: number; stderr: string }> {
  const r = await inNs.run('ipset', ['restore'], { input, timeoutMs: 20_000 });
  return { code: r.code, stderr: r.stderr };
}

/** every set type × family the ipvs mode uses, with entries it may write and edge cases */
const CASES: Array<{ type: IPSetType; family: 4 | 6; entries: string[] }> = [
  { type: 'hash:ip', family: 4, entries: ['172.30.0.10', '0.0.0.0', '255.255.255.255', '127.0.0.1'] },
  { type: 'hash:ip', family: 6, entries: ['fd00::10', '::', '::1'] },
  { type: 'hash:ip,port', family: 4, entries: ['172.30.0.10,tcp:80', '0.0.0.0,tcp:80', '1.2.3.4,udp:0', '1.2.3.4,sctp:65535', '224.0.0.1,tcp:80'] },
  { type: 'hash:ip,port', family: 6, entries: ['fd00::10,tcp:80', '::,tcp:80', '2001:db8::4,sctp:5000'] },
  { type: 'hash:ip,port,ip', family: 4, entries: ['10.180.0.1,tcp:8080,10.180.0.1', '0.0.0.0,tcp:80,0.0.0.0'] },
  { type: 'hash:ip,port,ip', family: 6, entries: ['fd00:10::1,tcp:80,fd00:10::1'] },
  {
    type: 'hash:ip,port,net',
    family: 4,
    entries: ['1.2.3.4,tcp:80,10.0.0.0/8', '1.2.3.4,tcp:80,0.0.0.0/0', '1.2.3.4,tcp:80,0.0.0.0/1', '1.2.3.4,tcp:80,128.0.0.0/1', '1.2.3.4,tcp:80,203.0.113.7', '0.0.0.0,tcp:80,10.0.0.0/8'],
  },
  { type: 'hash:ip,port,net', family: 6, entries: ['2001:db8::4,tcp:80,fd00::/8', '2001:db8::4,tcp:80,::/0', '2001:db8::4,tcp:80,8000::/1'] },
  { type: 'bitmap:port', family: 4, entries: ['30080', '0', '65535'] },
];

test('entryRefusal and the fake agree with the real ipset on every set type and family', async () => {
  netns();
  let i = 0;
  for (const c of CASES) {
    const name = `kpd2-t${i++}`;
    const create = createLine({ name, type: c.type, family: c.family });
    assert.equal((await ipset(create + '\n')).code, 0, create);
    const fake = new FakeHost();
    await fake.run('ipset', ['restore'], { input: create + '\n' });
    for (const raw of c.entries) {
      const e = normalizeEntry(raw);
      const real = await ipset(`add ${name} ${e} -exist\n`);
      const predicted = entryRefusal(c.type, c.family, e);
      assert.equal(predicted === null, real.code === 0, `${c.type} inet${c.family === 6 ? '6' : ''} ${e}: kernel ${real.code === 0 ? 'accepts' : `refuses (${real.stderr.trim()})`}, entryRefusal says ${predicted ?? 'ok'}`);
      const f = await fake.run('ipset', ['restore'], { input: `add ${name} ${e} -exist\n` });
      assert.equal(f.code === 0, real.code === 0, `fake and kernel disagree on ${c.type} ${e}`);
      if (real.code !== 0) {
        const msg = (s: string) => s.replace(/^.*Error in line \d+: /s, '').trim();
        assert.equal(msg(f.stderr), msg(real.stderr), `fake message for ${c.type} ${e}`);
      }
    }
    await ipset(`destroy ${name}\n`);
  }
});

test('restoreIsolating against the real ipset: refused lines are named, every other line is applied', async () => {
  netns();
  const x = new IPSetExec(inNs);
  const script = [
    createLine({ name: 'kpd2-cidr', type: 'hash:ip,port,net', family: 4 }),
    createLine({ name: 'kpd2-ipport', type: 'hash:ip,port', family: 4 }),
    'add kpd2-cidr 1.2.3.4,tcp:80,10.0.0.0/8 -exist',
    'add kpd2-cidr 1.2.3.4,tcp:80,0.0.0.0/0 -exist',
    'add kpd2-cidr 1.2.3.4,tcp:80,203.0.113.0/24 -exist',
    'add kpd2-ipport 0.0.0.0,tcp:80 -exist',
    'add kpd2-ipport 172.30.0.10,tcp:80 -exist',
    'create kpd2-bad hash:nonsense family inet -exist',
    'add kpd2-bad 1.2.3.4 -exist',
    'add kpd2-ipport 172.30.0.11,tcp:80 -exist',
  ].join('\n');
  try {
    const { refused } = await x.restoreIsolating(script);
    // (in the order ipset finds them: a syntax error before the kernel errors of the lines
    // it had batched, which it drops unsent; so every try starts from the first line again)
    assert.deepEqual(
      refused.map((r) => r.line).sort(),
      ['add kpd2-bad 1.2.3.4 -exist', 'add kpd2-cidr 1.2.3.4,tcp:80,0.0.0.0/0 -exist', 'add kpd2-ipport 0.0.0.0,tcp:80 -exist', 'create kpd2-bad hash:nonsense family inet -exist'],
    );
    assert.match(refused.find((r) => r.line.includes('0.0.0.0/0'))!.error, /CIDR parameter/);
    const saved = netns().exec('ipset', ['save']);
    for (const e of ['1.2.3.4,tcp:80,10.0.0.0/8', '1.2.3.4,tcp:80,203.0.113.0/24', '172.30.0.10,tcp:80', '172.30.0.11,tcp:80']) {
      assert.ok(saved.includes(e), `${e} applied:\n${saved}`);
    }
  } finally {
    await ipset('destroy kpd2-cidr\ndestroy kpd2-ipport\n');
  }
});

test('a whole plan with allow-all source ranges and a 0.0.0.0 service restores into the real ipset in one go', async () => {
  netns();
  const v4Zero = svc('zero', '0.0.0.0', 80, { externalIPs: ['0.0.0.0'] });
  const eps = [ep('10.180.0.1', 8080, { isLocal: true })];
  const v4 = plan(
    input([
      [svc('lb', '172.30.0.20', 80, { nodePort: 30080, loadBalancerVIPs: ['1.2.3.4'], loadBalancerSourceRanges: ['0.0.0.0/0'], externalPolicyLocal: true, healthCheckNodePort: 30999 }), eps],
      [svc('fw', '172.30.0.21', 80, { loadBalancerVIPs: ['1.2.3.5'], loadBalancerSourceRanges: ['203.0.113.0/24', '192.168.0.0/24'] }), eps],
      [v4Zero, eps],
      [svc('sctp', '172.30.0.22', 80, { protocol: 'SCTP', nodePort: 30081 }), eps],
    ]),
  );
  const v6 = plan(
    input([[svc('lb6', 'fd00::20', 80, { loadBalancerVIPs: ['2001:db8::4'], loadBalancerSourceRanges: ['::/0'] }), [ep('fd00:10::1', 80, { isLocal: true })]]], {}, { family: 6, nodeIPs: ['fd00::2'] }),
  );
  // rename the sets so that nothing can collide with a real kube-proxy's sets
  const script = (formatIPSets(v4.sets) + formatIPSets(v6.sets)).replace(/KUBE-/g, 'kpd2-');
  try {
    const r = await ipset(script);
    assert.equal(r.code, 0, r.stderr);
    // 0.0.0.0 never reaches a set: the planner leaves the unspecified VIP out (src/core/vip.ts)
    // and reports it, or, behind that, entryRefusal reports it.
    const zeroSkipped = skippedVIPs([v4Zero]).some((x) => x.ip === '0.0.0.0') || v4.rejected.some((x) => x.owner === 'ns/zero:');
    assert.ok(zeroSkipped, 'the 0.0.0.0 service is reported');
    assert.ok(!/^add \S+ 0\.0\.0\.0,/m.test(formatIPSets(v4.sets)), 'no 0.0.0.0 entry is written');
    assert.ok(netns().exec('ipset', ['list', 'kpd2-LOAD-BALANCER-SOURCE-CIDR']).includes('1.2.3.5,tcp:80,203.0.113.0/24'));
  } finally {
    const names = netns().exec('ipset', ['list', '-n']).split('\n').filter((n) => n.startsWith('kpd2-'));
    if (names.length) await ipset(names.map((n) => `destroy ${n}`).join('\n') + '\n');
  }
});
