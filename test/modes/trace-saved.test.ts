// Tracing saved rules offline (src/modes/trace-saved.ts): the format is known from the text;
// dumps of older kube-proxy versions and of real tools trace (counters, `-a` handles, a shell
// prompt pasted in, names instead of numbers); a line that cannot be read is named with its
// number and text, and the trace still answers from the rest. The expected answers follow
// from the Services each fixture describes (which endpoints back which address), not from
// re-reading kproxy's own output. The IPVS fixtures (test/modes/fixtures/saved-rules) are in
// the text forms of `ipvsadm -Ln`, `ipvsadm -Sn` and `ipset save` (the host has no IPVS).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { detectRulesFormat, iptablesSaveFamily, traceSavedRules, type RulesFile } from '../../src/modes/trace-saved.ts';
import { KproxyError } from '../../src/errors.ts';

const FIX = join(import.meta.dirname, 'fixtures/saved-rules');
const file = (name: string, text = readFileSync(join(FIX, name), 'utf8')): RulesFile => ({ name, text });
const UPSTREAM_IPT = readFileSync(join(import.meta.dirname, '../../conformance/flows/iptables-TestTracePacket/rules.iptables-save'), 'utf8');
const UPSTREAM_NFT = readFileSync(join(import.meta.dirname, '../../conformance/flows/nftables-TestTracePacketV4/rules.nft'), 'utf8');

function trace(files: RulesFile[], from: string, to: string, port: number, extra: { protocol?: 'TCP' | 'UDP'; nodeIPs?: string[]; family?: 4 | 6 } = {}) {
  return traceSavedRules({ files, from, to, port, protocol: extra.protocol ?? 'TCP', nodeIPs: extra.nodeIPs ?? [], family: extra.family });
}

test('the format is known from a line only one tool writes', () => {
  const cases: Array<[string, string, string]> = [
    [UPSTREAM_IPT, 'iptables-save', 'line 1'],
    [readFileSync(join(FIX, 'older-kube-proxy.iptables-save'), 'utf8'), 'iptables-save', 'line 3'],
    [UPSTREAM_NFT, 'nft', 'line 1'],
    ['table ip kube-proxy { # handle 4\n\tchain services {\n\t}\n}\n', 'nft', 'line 1'],
    [readFileSync(join(FIX, 'ipvsadm-Ln.txt'), 'utf8'), 'ipvsadm', 'line 1'],
    [readFileSync(join(FIX, 'ipvsadm-Sn.txt'), 'utf8'), 'ipvsadm', 'line 1'],
    ['TCP  10.96.0.1:443 rr\n  -> 192.168.0.2:6443 Masq 1 0 0\n', 'ipvsadm', 'line 1'],
    [readFileSync(join(FIX, 'ipset-save.txt'), 'utf8'), 'ipset', 'line 1'],
  ];
  for (const [text, format, line] of cases) {
    const d = detectRulesFormat(text);
    assert.equal(d?.format, format, text.slice(0, 60));
    assert.ok(d!.why.startsWith(`${line}:`), d!.why);
  }
  assert.equal(detectRulesFormat('hello\nthis is a bug report\n-A is not enough\n'), null);
  assert.throws(
    () => trace([{ name: 'notes.txt', text: 'hello\n' }], '10.0.0.2', '172.30.0.41', 80),
    (e: unknown) => e instanceof KproxyError && e.code === 'KPROXY_TRACE_INPUT' && /notes\.txt: not the output of .*--rules-format/.test(e.message),
  );
  // forced: a text with no telling line reads as the format given
  const forced = trace([{ name: 'part.txt', text: '-A KUBE-SERVICES -d 172.30.0.41/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.180.0.1:80\n', format: 'iptables-save' }], '10.0.0.2', '172.30.0.41', 80);
  assert.equal(forced.output, '');
  assert.match(forced.warnings.join('\n'), /part\.txt line 1: outside a \*TABLE \.\.\. COMMIT block, left out: -A KUBE-SERVICES/);
});

test("upstream's TestTracePacket text (unquoted multi-word comments) traces to upstream's answers", () => {
  const f = file('rules.iptables-save', UPSTREAM_IPT);
  const node = ['192.168.0.2'];
  assert.equal(trace([f], '10.0.0.2', '172.30.0.44', 80).output, '10.180.0.4:80, 10.180.0.5:80');
  const lb = trace([f], '192.168.0.2', '192.168.99.22', 80, { nodeIPs: node });
  assert.deepEqual([lb.output, lb.masq, lb.mode], ['10.180.0.2:80', true, 'iptables']);
  assert.equal(trace([f], '192.168.0.2', '192.168.0.2', 30000, { nodeIPs: node }).output, 'ACCEPT');
  assert.deepEqual(trace([f], '10.0.0.2', '172.30.0.44', 80).warnings, []);
  // without --node-ip the node's own address is not LOCAL: the packet is taken as an outside
  // client's (upstream's DROP flow), and the trace says why
  const noNode = trace([f], '192.168.0.2', '192.168.99.22', 80);
  assert.deepEqual([noNode.output, noNode.masq], ['DROP', false]);
  assert.match(noNode.notes.join('\n'), /no --node-ip/);
});

test('an older kube-proxy dump (KUBE-XLB, KUBE-FW, KUBE-MARK-DROP, iptables-save -c counters, a pasted prompt) traces', () => {
  const f = file('older-kube-proxy.iptables-save');
  const node = ['192.168.0.2'];
  // externalTrafficPolicy Local without local endpoints: KUBE-XLB marks for drop
  const drop = trace([f], '203.0.113.2', '192.168.0.2', 32070, { nodeIPs: node });
  assert.equal(drop.output, 'DROP');
  assert.ok(drop.rules.some((r) => r.includes('has no local endpoints')), drop.rules.join('\n'));
  // the node itself is routed to the service chain, masqueraded
  const local = trace([f], '192.168.0.2', '192.168.0.2', 32070, { nodeIPs: node });
  assert.deepEqual([local.output, local.masq], ['10.244.1.3:80', true]);
  // load balancer IP through KUBE-FW → KUBE-XLB: an outside client gets the local endpoint only
  assert.equal(trace([f], '203.0.113.2', '10.149.30.186', 80).output, '10.244.112.45:80');
  // a pod is sent to the whole service
  assert.equal(trace([f], '10.244.5.5', '10.149.30.186', 80).output, '10.244.112.45:80, 10.244.112.46:80');
  const rej = trace([f], '10.244.5.5', '10.96.33.9', 80);
  assert.equal(rej.output, 'REJECT');
  // the shell prompt pasted above the dump is named, not fatal
  assert.deepEqual(rej.warnings, ['older-kube-proxy.iptables-save line 1: outside a *TABLE ... COMMIT block, left out: root@node-1:~# iptables-save -c']);
  assert.match(rej.read.join('\n'), /older-kube-proxy\.iptables-save: iptables-save \(line 3: a "\*TABLE" line/);
});

test('an unreadable iptables line is named with its number and text; the rest still traces', () => {
  const lines = UPSTREAM_IPT.split('\n');
  const at = lines.findIndex((l) => l.startsWith('-A KUBE-SERVICES -m comment --comment "ns4/svc4:p80 cluster IP"'));
  lines.splice(at, 0, '-A KUBE-SERVICES -m comment --comment "never closed -j KUBE-SVC-4SW47YFZTEDKD3PK', '@@@ garbage @@@');
  const r = trace([file('bug-report.txt', lines.join('\n'))], '10.0.0.2', '172.30.0.44', 80);
  assert.equal(r.output, '10.180.0.4:80, 10.180.0.5:80');
  assert.equal(r.warnings.length, 2, r.warnings.join('\n'));
  assert.match(r.warnings[0], new RegExp(`^bug-report\\.txt line ${at + 1}: not parsed \\(unterminated quote\\), left out: -A KUBE-SERVICES -m comment --comment "never closed`));
  assert.match(r.warnings[1], new RegExp(`^bug-report\\.txt line ${at + 2}: .*@@@ garbage @@@`));
});

test('the family: ip6tables-save is refused for an IPv4 packet, with the reason; --family must agree with the packet', () => {
  const v6 = '# Generated by ip6tables-save v1.8.9\n*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\n-A KUBE-SERVICES -d fd00:172:30::41/128 -p tcp -m tcp --dport 80 -j DNAT --to-destination [fd00:10:180::1]:80\nCOMMIT\n';
  assert.equal(iptablesSaveFamily(v6), 6);
  assert.equal(iptablesSaveFamily(UPSTREAM_IPT), 4);
  assert.equal(iptablesSaveFamily('# Generated by ip6tables-nft-save v1.8.7 on Tue\n*nat\nCOMMIT\n'), 6);
  assert.equal(iptablesSaveFamily('# Generated by iptables-legacy-save v1.8.7 on Tue\n*nat\n-A X -d fd00::1 -j Y\nCOMMIT\n'), 4);
  const legacy = trace([file('nft-save.txt', '# Warning: iptables-legacy tables present, use iptables-legacy-save to see them\n' + UPSTREAM_IPT)], '10.0.0.2', '172.30.0.41', 80);
  assert.match(legacy.notes.join('\n'), /nft-save\.txt: "Warning: iptables-legacy tables present.*ask for iptables-legacy-save too/);
  assert.equal(trace([file('v6.txt', v6)], 'fd00:10::2', 'fd00:172:30::41', 80).output, '[fd00:10:180::1]:80');
  assert.throws(() => trace([file('v6.txt', v6)], '10.0.0.2', '172.30.0.41', 80), /no IPv4 iptables rules .*v6\.txt holds IPv6 rules/);
  // both files given: the packet's family picks
  const both = trace([file('v6.txt', v6), file('v4.txt', UPSTREAM_IPT)], '10.0.0.2', '172.30.0.41', 80);
  assert.equal(both.output, '10.180.0.1:80');
  assert.match(both.notes.join('\n'), /v6\.txt \(iptables-save\) is not used/);
  assert.throws(() => trace([file('v4.txt', UPSTREAM_IPT)], '10.0.0.2', '172.30.0.41', 80, { family: 6 }), /--family 6 but the packet's addresses are IPv4/);
});

test("nft list ruleset output: handles, counters, other tables, upstream's TestTracePacketV4 answers", () => {
  const listing = `table inet filter { # handle 1
\tchain input { # handle 1
\t\ttype filter hook input priority filter; policy accept;
\t\tct state established,related counter packets 812 bytes 90210 accept # handle 4
\t}
}
table ip kube-proxy { # handle 7
\tcomment "rules for kube-proxy"
\tmap service-ips { # handle 2
\t\ttype ipv4_addr . inet_proto . inet_service : verdict
\t\tcomment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
\t\telements = { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80,
\t\t\t     172.30.0.44 . tcp . 80 : goto service-LAUZTJTB-ns4/svc4/tcp/p80 }
\t}
\tchain nat-prerouting { # handle 3
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t\tcounter packets 10 bytes 600 jump services # handle 20
\t}
\tchain services { # handle 4
\t\tip daddr . meta l4proto . th dport vmap @service-ips # handle 21
\t}
\tchain service-ULMVA6XW-ns1/svc1/tcp/p80 { # handle 5
\t\tip daddr 172.30.0.41 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade # handle 22
\t\tnumgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 } # handle 23
\t}
\tchain service-LAUZTJTB-ns4/svc4/tcp/p80 { # handle 6
\t\tnumgen random mod 2 vmap { 0 : goto endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80, 1 : goto endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 } # handle 24
\t}
\tchain endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 { # handle 8
\t\tip saddr 10.180.0.1 jump mark-for-masquerade # handle 25
\t\tmeta l4proto tcp counter packets 3 bytes 180 dnat to 10.180.0.1:80 # handle 26
\t}
\tchain endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80 { # handle 9
\t\tmeta l4proto tcp dnat to 10.180.0.4:80 # handle 27
\t}
\tchain endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 { # handle 10
\t\tmeta l4proto tcp dnat to 10.180.0.5:80 # handle 28
\t}
\tchain mark-for-masquerade { # handle 11
\t\tmeta mark set meta mark | 0x00004000 # handle 29
\t}
}
`;
  const f = file('ruleset.txt', listing);
  const one = trace([f], '10.0.0.2', '172.30.0.41', 80);
  assert.deepEqual([one.output, one.masq, one.mode], ['10.180.0.1:80', false, 'nftables']);
  assert.deepEqual(one.warnings, []);
  assert.match(one.notes.join('\n'), /not traced .*table inet filter/);
  assert.equal(trace([f], '10.0.0.2', '172.30.0.44', 80).output, '10.180.0.4:80, 10.180.0.5:80');
  assert.equal(trace([f], '203.0.113.2', '172.30.0.41', 80).masq, true);
  // upstream's transaction text, as its test hands it to knftables' ParseDump
  const up = file('rules.nft', UPSTREAM_NFT);
  assert.equal(trace([up], '203.0.113.130', '5.6.7.8', 80, { nodeIPs: ['192.168.0.2'] }).output, 'DROP');
  assert.equal(trace([up], '10.0.0.2', '192.168.0.2', 3001, { nodeIPs: ['192.168.0.2'] }).output, '10.180.0.2:80');
  // no kube-proxy table of the packet's family: refused, naming what there is
  assert.throws(() => trace([f], 'fd00::2', 'fd00::41', 80), /no ip6 kube-proxy table .*tables: inet filter, ip kube-proxy/);
});

test('an unreadable nft line is named; a rule piece the tracer does not know makes the rule "may match"', () => {
  const text = `table ip kube-proxy {
\tchain nat-prerouting {
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t\tjump services
\t}
\t%%% not nft %%%
\tchain services {
\t\tct state established,related accept
\t\tip daddr 172.30.0.41 tcp dport 80 meta skuid 1000 goto svc
\t}
\tchain svc {
\t\tmeta l4proto tcp dnat to 10.180.0.1:80
\t}
}
stray text after the table
`;
  const r = trace([file('dump.nft', text)], '10.0.0.2', '172.30.0.41', 80);
  // a first packet has no established connection: the accept is not taken
  assert.equal(r.output, '10.180.0.1:80');
  assert.deepEqual(r.warnings, [
    'dump.nft line 6: not understood in table ip kube-proxy, left out: %%% not nft %%%',
    'dump.nft line 15: not understood outside a table, left out: stray text after the table',
  ]);
  assert.match(r.notes.join('\n'), /may match: services: ip daddr 172\.30\.0\.41 tcp dport 80 meta skuid 1000 goto svc: "meta skuid 1000" not evaluated/);
  // the pieces the tracer knows still decide: another address does not match
  assert.equal(trace([file('dump.nft', text)], '10.0.0.2', '172.30.0.42', 80).output, '');
});

test('IPVS: ipvsadm -Ln with ipset save and iptables-save: virtual server → real servers, source ranges, masquerade', () => {
  const files = [file('ipvsadm-Ln.txt'), file('ipset-save.txt'), file('ipvs-iptables-save.txt')];
  const node = { nodeIPs: ['192.168.0.2'] };
  const dns = trace(files, '10.244.1.5', '10.96.0.10', 53, { protocol: 'UDP', ...node });
  assert.deepEqual([dns.mode, dns.output, dns.masq], ['ipvs', '10.244.0.2:53, 10.244.0.3:53', false]);
  assert.deepEqual(dns.warnings, []);
  // from outside the cluster CIDR (KUBE-SERVICES ! -s 10.244.0.0/16): masqueraded
  assert.equal(trace(files, '192.168.0.2', '10.96.0.10', 53, { protocol: 'UDP', ...node }).masq, true);
  // a weight-0 real server takes no new connections; persistence is ClientIP affinity
  const web = trace(files, '10.244.1.5', '10.96.105.7', 80, node);
  assert.equal(web.output, '10.244.1.7:8080, 10.244.2.3:8080');
  assert.match(web.notes.join('\n'), /draining \(weight 0, no new connections\): 10\.244\.3\.9:8080/);
  assert.match(web.notes.join('\n'), /persistence 10800s/);
  // LoadBalancer source ranges: 203.0.113.0/25 only
  assert.equal(trace(files, '203.0.113.200', '1.2.3.4', 80, node).output, 'DROP');
  const lb = trace(files, '203.0.113.2', '1.2.3.4', 80, node);
  assert.deepEqual([lb.output, lb.masq], ['10.244.1.7:8080, 10.244.2.3:8080', true]);
  // a NodePort on the node's address is masqueraded (KUBE-NODE-PORT-TCP)
  assert.deepEqual(Object.values((({ output, masq }) => ({ output, masq }))(trace(files, '203.0.113.2', '192.168.0.2', 30080, node))), ['10.244.1.7:8080, 10.244.2.3:8080', true]);
  // no real server: IPVS answers ICMP port unreachable
  assert.equal(trace(files, '10.244.1.5', '10.96.200.1', 8443, node).output, 'REJECT');
  // hairpin: an endpoint reaching itself through the service is masqueraded (KUBE-LOOP-BACK)
  assert.equal(trace(files, '10.244.1.7', '10.96.105.7', 80, node).masq, true);
  assert.equal(trace(files, '10.244.2.3', '10.96.105.7', 80, node).masq, false);
  // not a virtual server: left alone
  assert.equal(trace(files, '10.244.1.5', '10.96.0.99', 80, node).output, '');
});

test('IPVS: ipvsadm -Sn gives the same answers as -Ln; what is missing or unreadable is said', () => {
  const ln = [file('ipvsadm-Ln.txt'), file('ipset-save.txt'), file('ipvs-iptables-save.txt')];
  const sn = [file('ipvsadm-Sn.txt'), file('ipset-save.txt'), file('ipvs-iptables-save.txt')];
  const packets: Array<[string, string, number, 'TCP' | 'UDP']> = [
    ['10.244.1.5', '10.96.0.10', 53, 'UDP'],
    ['10.244.1.5', '10.96.105.7', 80, 'TCP'],
    ['203.0.113.200', '1.2.3.4', 80, 'TCP'],
    ['203.0.113.2', '192.168.0.2', 30080, 'TCP'],
    ['10.244.1.5', '10.96.200.1', 8443, 'TCP'],
  ];
  for (const [from, to, port, protocol] of packets) {
    const a = trace(ln, from, to, port, { protocol, nodeIPs: ['192.168.0.2'] });
    const b = trace(sn, from, to, port, { protocol, nodeIPs: ['192.168.0.2'] });
    assert.deepEqual([b.output, b.masq], [a.output, a.masq], `${from} -> ${to}:${port}`);
  }
  // ipvsadm -L without -n prints names: those lines are named, the numeric ones still trace
  const named = `IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
TCP  ip-10-45-0-1.ap-southeast-1. rr
  -> master01:6443                Masq    1      5          19
UDP  10.96.0.10:53 rr
  -> 10.244.0.2:53                Masq    1      0          12
FWM  258 rr
`;
  const r = trace([file('ipvs.txt', named)], '10.244.1.5', '10.96.0.10', 53, { protocol: 'UDP' });
  assert.equal(r.output, '10.244.0.2:53');
  assert.deepEqual(r.warnings, [
    'ipvs.txt line 4: virtual server address ip-10-45-0-1.ap-southeast-1. is not numeric IP:PORT (ipvsadm -L without -n?), left out: TCP  ip-10-45-0-1.ap-southeast-1. rr',
    'ipvs.txt line 5: real server address master01:6443 is not numeric IP:PORT (ipvsadm -L without -n?), left out: -> master01:6443                Masq    1      5          19',
    'ipvs.txt line 8: a firewall-mark virtual server (kube-proxy makes none), not traced: FWM  258 rr',
  ]);
  assert.match(r.notes.join('\n'), /no ipset save given/);
  assert.match(r.notes.join('\n'), /no iptables-save \(nat table\) given/);
  // an ipset line that cannot be read is named too
  const sets = trace([file('ipvsadm-Ln.txt'), file('sets.txt', 'create KUBE-CLUSTER-IP hash:ip,port family inet\nadd KUBE-CLUSTER-IP 10.96.0.10,udp:53\nadd KUBE-NOPE 1.2.3.4,tcp:80\nflush\n')], '10.244.1.5', '10.96.0.10', 53, { protocol: 'UDP' });
  assert.deepEqual(sets.warnings, [
    'sets.txt line 3: entry of set KUBE-NOPE, which no "create" line before it makes, left out: add KUBE-NOPE 1.2.3.4,tcp:80',
    'sets.txt line 4: not understood, left out: flush',
  ]);
  assert.throws(() => trace([file('ipset-save.txt')], '10.244.1.5', '10.96.0.10', 53), /ipset save alone/);
  // an IPVS node's iptables rules alone: traced as iptables, with the advice to give the rest
  const alone = trace([file('ipvs-iptables-save.txt')], '10.244.1.5', '10.96.0.10', 53, { protocol: 'UDP' });
  assert.equal(alone.mode, 'iptables');
  assert.match(alone.notes.join('\n'), /the node runs the IPVS mode; give its ipvsadm -Ln and ipset save/);
  // IPv6: bracketed addresses, and the family's sets (KUBE-6-*)
  const v6 = [
    file('ipvs6.txt', 'TCP  [fd00:10:96::1]:443 rr\n  -> [2001:db8::1]:6443            Masq    1      0          0\n'),
    file('ipset6.txt', 'create KUBE-6-CLUSTER-IP hash:ip,port family inet6 hashsize 1024 maxelem 65536 comment\nadd KUBE-6-CLUSTER-IP fd00:10:96::1,tcp:443\n'),
  ];
  const r6 = trace(v6, 'fd00:10:244::5', 'fd00:10:96::1', 443);
  assert.deepEqual([r6.output, r6.warnings], ['[2001:db8::1]:6443', []]);
});
