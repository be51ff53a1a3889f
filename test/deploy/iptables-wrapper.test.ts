// The image's iptables wrapper (bin/iptables-wrapper) on this host, where both backends
// exist: in network namespaces the test creates, with rules put there through
// iptables-legacy and iptables-nft, it picks the backend as upstream's iptables-wrappers
// does, and on its first call points the six commands at that backend and runs it. The
// commands live in a temporary directory (as /usr/sbin in the image): the host's own
// iptables links are never touched.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readlinkSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Netns, uniqueName, repoRoot, sh } from '../support/netns.ts';

const WRAPPER = join(repoRoot, 'bin/iptables-wrapper');
const COMMANDS = ['iptables', 'iptables-save', 'iptables-restore', 'ip6tables', 'ip6tables-save', 'ip6tables-restore'];
const tag = uniqueName('kpt-ipw');
const dirs: string[] = [];
const namespaces: Netns[] = [];

after(async () => {
  for (const ns of namespaces) await ns.destroy();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** An sbin directory as the image has it: the six commands linked to the wrapper, beside both multi-call binaries. */
function imageSbin(): string {
  const d = mkdtempSync(join(tmpdir(), 'kp-ipw-'));
  dirs.push(d);
  for (const b of ['xtables-legacy-multi', 'xtables-nft-multi']) symlinkSync(`/usr/sbin/${b}`, join(d, b));
  for (const c of COMMANDS) symlinkSync(WRAPPER, join(d, c));
  return d;
}

let n = 0;
function namespace(): Netns {
  const ns = Netns.create(`${tag}-${n++}`);
  namespaces.push(ns);
  return ns;
}

/** Rules through one backend: `iptables-legacy ...` or `iptables-nft ...` in the namespace. */
function rules(ns: Netns, backend: 'legacy' | 'nft', lines: string[][]): void {
  for (const args of lines) ns.exec(`/usr/sbin/iptables-${backend}`, args);
}

const detect = (ns: Netns, sbin: string) => ns.exec('env', [`IPTABLES_WRAPPER_SBIN=${sbin}`, WRAPPER, 'detect']).trim();

const KUBE_RULES = [
  ['-t', 'nat', '-N', 'KUBE-SERVICES'],
  ['-t', 'nat', '-A', 'PREROUTING', '-j', 'KUBE-SERVICES'],
  ['-t', 'nat', '-A', 'OUTPUT', '-j', 'KUBE-SERVICES'],
  ['-t', 'nat', '-A', 'KUBE-SERVICES', '-d', '172.30.0.1/32', '-p', 'tcp', '--dport', '80', '-j', 'RETURN'],
];
const OTHER_RULES = (k: number) => Array.from({ length: k }, (_, i) => ['-A', 'INPUT', '-s', `10.9.${i}.0/24`, '-j', 'ACCEPT']);

test('a namespace without rules: nft', () => {
  assert.equal(detect(namespace(), imageSbin()), 'nft');
});

test('only legacy KUBE-* rules: legacy; the first call points all six commands at xtables-legacy-multi and runs it', () => {
  const ns = namespace();
  const sbin = imageSbin();
  rules(ns, 'legacy', KUBE_RULES);
  assert.equal(detect(ns, sbin), 'legacy');
  const out = ns.exec(join(sbin, 'iptables-save'), ['-t', 'nat']);
  assert.match(out, /^-A KUBE-SERVICES -d 172\.30\.0\.1\/32 -p tcp -m tcp --dport 80 -j RETURN$/m, 'the legacy rules, listed by the chosen backend');
  for (const c of COMMANDS) assert.equal(readlinkSync(join(sbin, c)), 'xtables-legacy-multi', c);
  // from then on the command is the backend itself
  ns.exec(join(sbin, 'iptables'), ['-t', 'nat', '-A', 'KUBE-SERVICES', '-j', 'RETURN']);
  assert.match(ns.exec('/usr/sbin/iptables-legacy-save', ['-t', 'nat']), /^-A KUBE-SERVICES -j RETURN$/m);
});

test('only nft rules: nft; the first call points the commands at xtables-nft-multi', () => {
  const ns = namespace();
  const sbin = imageSbin();
  rules(ns, 'nft', KUBE_RULES);
  assert.equal(detect(ns, sbin), 'nft');
  const out = ns.exec(join(sbin, 'iptables-save'), ['-t', 'nat']);
  assert.match(out, /^-A KUBE-SERVICES -d 172\.30\.0\.1\/32/m);
  for (const c of COMMANDS) assert.equal(readlinkSync(join(sbin, c)), 'xtables-nft-multi', c);
});

test('rules in both: the backend with more rules wins, legacy only with strictly more', () => {
  const more = namespace();
  rules(more, 'legacy', KUBE_RULES);
  rules(more, 'nft', OTHER_RULES(KUBE_RULES.length));
  // 3 legacy rules (the -N line is a chain, not a rule) against 4 nft rules
  assert.equal(detect(more, imageSbin()), 'nft');
  const tie = namespace();
  rules(tie, 'legacy', KUBE_RULES);
  rules(tie, 'nft', OTHER_RULES(3));
  assert.equal(detect(tie, imageSbin()), 'nft', 'a tie goes to nft');
  const fewer = namespace();
  rules(fewer, 'legacy', KUBE_RULES);
  rules(fewer, 'nft', OTHER_RULES(2));
  assert.equal(detect(fewer, imageSbin()), 'legacy');
});

test('kubelet\'s hint chain decides before any count: nft\'s first, then legacy\'s', () => {
  const legacyHint = namespace();
  rules(legacyHint, 'legacy', [['-t', 'mangle', '-N', 'KUBE-IPTABLES-HINT']]);
  rules(legacyHint, 'nft', OTHER_RULES(5));
  assert.equal(detect(legacyHint, imageSbin()), 'legacy', 'kubelet runs on legacy, whatever else nft holds');
  const nftHint = namespace();
  rules(nftHint, 'nft', [['-t', 'mangle', '-N', 'KUBE-KUBELET-CANARY']]);
  rules(nftHint, 'legacy', [...KUBE_RULES, ...OTHER_RULES(5)]);
  assert.equal(detect(nftHint, imageSbin()), 'nft', 'kubelet runs on nft, whatever else legacy holds');
});

test('a directory the wrapper cannot relink: it runs the chosen backend directly', () => {
  const ns = namespace();
  const sbin = imageSbin();
  rules(ns, 'legacy', KUBE_RULES);
  // a read-only bind mount of the directory, in a private mount namespace (root writes anywhere else)
  const script = `mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && exec ip netns exec "$2" "$1/iptables" --version`;
  const out = sh('unshare', ['-m', '--propagation', 'private', 'sh', '-c', script, 'sh', sbin, ns.name]);
  assert.match(out, /\(legacy\)/, 'iptables --version of the legacy backend');
  assert.equal(readlinkSync(join(sbin, 'iptables')), WRAPPER, 'the link is left alone');
});
