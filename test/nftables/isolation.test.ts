// Hostile input in nftables mode, and failure isolation:
// - comments stay within nft's 128-byte limit whatever the names (kubernetes#139515);
// - a loopback, unspecified, multicast or broadcast address is never a Service VIP;
// - when nft refuses lines of one Service, that Service is left out, reported, and every
//   other Service is programmed in the same sync.
// Unit tests: the "kernel" is the nft fake (src/kernel/nft/fake.ts), refusing marked lines as nft reports them.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import pino from 'pino';
import { resolveConfig } from '../../src/config/config.ts';
import { FakeNft } from '../../src/kernel/nft/fake.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { COMMENT_LENGTH_MAX, nftComment } from '../../src/modes/nftables/names.ts';
import { optionsFromInput, planPortFragment, planRuleset } from '../../src/modes/nftables/plan.ts';
import { dumpRuleset } from '../../src/modes/nftables/ruleset.ts';
import { NftProxier } from '../../src/modes/nftables/proxier.ts';
import { endpoint, label63, port, stateOf } from '../support/ports.ts';

const NODE = { nodeName: 'node-a', nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4 as const };
const config = resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8' });
const input = (state: PlanInput['state']): PlanInput => ({ state, config, node: NODE });

function comments(text: string): string[] {
  return [...text.matchAll(/comment "([^"]*)"/g)].map((m) => m[1]);
}

test('a Service with 63+63+15-character names gets comments nft accepts (<= 128 bytes), still naming it', () => {
  const ns = label63('n');
  const name = label63('s');
  const sp = port(ns, name, 'abcdefghijklmno', { nodePort: 30080, externalIPs: ['1.2.3.4'], loadBalancerVIPs: ['1.2.3.5'] });
  assert.ok(sp.key.length > COMMENT_LENGTH_MAX, 'the untruncated comment is over the limit');
  // No endpoints: every map element of the port carries the "ns/name:port" comment.
  const text = dumpRuleset(planRuleset(stateOf([[sp, []]]), optionsFromInput(input(stateOf([])))));
  const cs = comments(text);
  assert.ok(cs.length >= 4, 'the no-endpoint elements have comments');
  for (const c of cs) assert.ok(Buffer.byteLength(c) <= COMMENT_LENGTH_MAX, `comment of ${Buffer.byteLength(c)} bytes: ${c}`);
  const svcComment = cs.find((c) => c.startsWith(`${ns}/`))!;
  assert.ok(svcComment.endsWith('...'), svcComment);
  assert.equal(svcComment.length, COMMENT_LENGTH_MAX);
  // Object names stay within NFT_NAME_MAXLEN (256 with the NUL).
  for (const m of text.matchAll(/^add (?:chain|set|map) ip kube-proxy (\S+)/gm)) assert.ok(m[1].length <= 255, m[1]);
  // Deterministic: the same input truncates the same way.
  assert.equal(nftComment(sp.key), svcComment);
});

test('nftComment keeps short comments, cuts long ones at a character boundary, and never lets a quote through', () => {
  assert.equal(nftComment('ns/svc:http'), 'ns/svc:http');
  assert.equal(nftComment('a"b\nc'), 'a_b_c');
  const multi = 'é'.repeat(100); // 200 bytes
  const cut = nftComment(multi);
  assert.ok(Buffer.byteLength(cut) <= COMMENT_LENGTH_MAX);
  assert.ok(cut.endsWith('...') && !cut.includes('\uFFFD'));
  assert.equal(nftComment('x'.repeat(128)), 'x'.repeat(128));
  assert.equal(nftComment('x'.repeat(129)).length, 128);
});

test('a loopback, unspecified, multicast or broadcast VIP never reaches a rule; the planner says why', () => {
  const o = optionsFromInput(input(stateOf([])));
  const lo = port('ns', 'lo', 'http'); // no endpoints: its VIP would get the reject verdict
  lo.clusterIP = '127.0.0.1';
  const frag = planPortFragment(o, lo, []);
  assert.equal(frag.chains.length + frag.elements.length, 0, 'nothing planned for a loopback ClusterIP');
  assert.deepEqual(frag.skipped?.map((s) => [s.field, s.ip, s.reason]), [['clusterIP', '127.0.0.1', 'loopback address']]);

  const ext = port('ns', 'ext', 'http', {
    clusterIP: '172.30.0.9',
    externalIPs: ['0.0.0.0', '224.0.0.1', '1.2.3.4'],
    loadBalancerVIPs: ['255.255.255.255', '127.0.0.53', '1.2.3.5'],
  });
  const text = dumpRuleset(planRuleset(stateOf([[lo, []], [ext, []]]), o));
  for (const bad of ['127.0.0.1', '0.0.0.0', '224.0.0.1', '255.255.255.255', '127.0.0.53']) {
    assert.ok(!text.includes(` ${bad} `), `${bad} must not be matched: ${text.split('\n').filter((l) => l.includes(bad)).join('\n')}`);
  }
  // The good addresses of the same port are still served.
  assert.match(text, /no-endpoint-services \{ 1\.2\.3\.4 \. tcp \. 80 /);
  assert.match(text, /no-endpoint-services \{ 1\.2\.3\.5 \. tcp \. 80 /);
  assert.match(text, /no-endpoint-services \{ 172\.30\.0\.9 \. tcp \. 80 /);
  const skipped = planPortFragment(o, ext, []).skipped?.map((s) => `${s.field} ${s.ip}`);
  assert.deepEqual(skipped, ['externalIPs 0.0.0.0', 'externalIPs 224.0.0.1', 'loadBalancerVIPs 255.255.255.255', 'loadBalancerVIPs 127.0.0.53']);
});

/** The fake kernel, refusing (as nft reports it) every line containing one of `poison`; at most `maxErrors` reported per transaction. */
function refusingNft(poison: string[], maxErrors?: number): FakeNft {
  const refuse = (l: string) => (poison.some((p) => l.includes(p)) ? 'Could not resolve hostname: Address family for hostname not supported' : null);
  return new FakeNft({ refuse, maxErrors });
}

/** The `nft -f` transactions sent (applied or refused). */
function transactions(nft: FakeNft): number {
  return nft.calls.filter((c) => c.args[0] === '-f').length;
}

function capture() {
  const lines: Array<{ level: number; msg: string; service?: string }> = [];
  const log = pino({ level: 'debug' }, new Writable({ write(chunk, _e, cb) { for (const l of String(chunk).split('\n')) if (l) lines.push(JSON.parse(l)); cb(); } }));
  return { log, lines };
}

function threeServices(badEndpointIP: string) {
  const good1 = port('ns', 'good1', 'http', { clusterIP: '172.30.0.1' });
  const bad = port('ns', 'bad', 'http', { clusterIP: '172.30.0.2' });
  const bad2 = port('ns', 'bad', 'dns', { clusterIP: '172.30.0.2', port: 53, protocol: 'UDP', portName: { namespace: 'ns', name: 'bad', port: 'dns', protocol: 'UDP' } });
  const good2 = port('ns', 'good2', 'http', { clusterIP: '172.30.0.3' });
  return stateOf([
    [good1, [endpoint('10.180.0.1')]],
    [bad, [endpoint(badEndpointIP)]],
    [bad2, [endpoint('10.180.1.2', 5353)]],
    [good2, [endpoint('10.180.0.3')]],
  ]);
}

test('nft refusing one Service: it is left out (all its ports) and reported, the others are programmed in the same sync', async () => {
  const nft = refusingNft(['fd00::66']);
  const { log, lines } = capture();
  const proxier = new NftProxier({ runner: nft, log });
  const state = threeServices('fd00::66');
  const stats = await proxier.sync(input(state), new Set(state.services.keys()), true);
  assert.deepEqual(stats.excludedServices, ['ns/bad']);
  assert.equal(nft.applied.length, 1, 'one transaction applied');
  const applied = nft.applied[0];
  assert.match(applied, /172\.30\.0\.1 \. tcp \. 80 : goto service-/);
  assert.match(applied, /172\.30\.0\.3 \. tcp \. 80 : goto service-/);
  assert.ok(!applied.includes('172.30.0.2'), 'no port of the refused Service is left in');
  const warn = lines.filter((l) => l.msg.startsWith('KPROXY_SYNC_SERVICE_EXCLUDED'));
  assert.equal(warn.length, 1);
  assert.equal(warn[0].service, 'ns/bad');
  assert.match(warn[0].msg, /nft refused the rules of Service ns\/bad \(line \d+: Could not resolve hostname.*fd00::66/);

  // A partial sync of another Service: still excluded, not reported again, the others still fine.
  const changedGood = new Set(['ns/good1']);
  const s2 = await proxier.sync(input(state), changedGood, false);
  assert.deepEqual(s2.excludedServices, ['ns/bad']);
  assert.equal(lines.filter((l) => l.msg.startsWith('KPROXY_SYNC_SERVICE_EXCLUDED')).length, 1, 'reported once');

  // The Service is fixed: it changes, is tried again and programmed.
  const fixed = threeServices('10.180.0.2');
  const s3 = await proxier.sync(input(fixed), new Set(['ns/bad']), false);
  assert.equal(s3.excludedServices, undefined);
  assert.match(proxier.dump(), /172\.30\.0\.2 \. tcp \. 80 : goto service-/);
  assert.match(proxier.dump(), /172\.30\.0\.2 \. udp \. 53 : goto service-/);
});

test('a refused line of the fixed table still fails the sync (nothing to leave out)', async () => {
  const nft = refusingNft(['masquerade fully-random']);
  const proxier = new NftProxier({ runner: nft, log: pino({ level: 'silent' }) });
  const state = threeServices('10.180.0.2');
  await assert.rejects(proxier.sync(input(state), new Set(), true), /KPROXY_NFT_APPLY/);
  assert.equal(transactions(nft), 1, 'no retry when no Service wrote the line');
});

test('retries per sync are bounded', async () => {
  const ports = Array.from({ length: 10 }, (_, i) => port('ns', `bad${i}`, 'http', { clusterIP: `172.30.1.${i + 1}` }));
  const state = stateOf(ports.map((p, i) => [p, [endpoint(`fd00::${i + 1}`)]]));
  // One error per call (as iptables-restore does): ten bad Services need ten retries.
  const nft = refusingNft(['fd00::'], 1);
  const proxier = new NftProxier({ runner: nft, log: pino({ level: 'silent' }) });
  await assert.rejects(proxier.sync(input(state), new Set(), true), /KPROXY_NFT_APPLY/);
  assert.equal(transactions(nft), 5, 'one attempt and four retries');
  // The next sync continues where it stopped: the full sync gives every one another chance.
  const nft2 = refusingNft(['fd00::']);
  const p2 = new NftProxier({ runner: nft2, log: pino({ level: 'silent' }) });
  const stats = await p2.sync(input(state), new Set(), true);
  assert.equal(stats.excludedServices?.length, 10, 'nft reports every bad line at once: one retry suffices');
  assert.equal(transactions(nft2), 2);
});

test('a line nft cannot even split (a name with a space, past validation) is still traced to its Service', async () => {
  const weird = port('ns', 'weird', 'a b', { clusterIP: '172.30.0.9' });
  weird.portName = { ...weird.portName, port: 'a b' };
  const state = stateOf([
    [port('ns', 'good1', 'http', { clusterIP: '172.30.0.1' }), [endpoint('10.180.0.1')]],
    [weird, [endpoint('10.180.0.9')]],
  ]);
  // One error per call: the first refused line is a chain declaration nft cannot split.
  const nft = refusingNft(['/a b'], 1);
  const proxier = new NftProxier({ runner: nft, log: pino({ level: 'silent' }) });
  const stats = await proxier.sync(input(state), new Set(), true);
  assert.deepEqual(stats.excludedServices, ['ns/weird']);
  assert.match(nft.applied[0], /172\.30\.0\.1 \. tcp \. 80 : goto service-/);
});
