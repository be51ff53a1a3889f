import { test } from 'node:test';
import assert from 'node:assert/strict';
import { plan } from '../../src/modes/ipvs/planner.ts';
import { mode } from '../../src/modes/ipvs/index.ts';
import { formatTable, parseListing, parseRules } from '../../src/kernel/ipvs/model.ts';
import { setName } from '../../src/modes/ipvs/names.ts';
import { ep, input, svc } from './support.ts';

const entries = (p: ReturnType<typeof plan>, set: string) => [...(p.sets.get(set)?.entries ?? [])].sort();

test('a ClusterIP service: one virtual server, NAT real servers of weight 1, VIP bound, sets filled', () => {
  const p = plan(input([[svc('web', '172.30.0.10', 80), [ep('10.180.0.1', 8080), ep('10.180.0.2', 8080)]]]));
  assert.equal(
    formatTable(p.table),
    ['-A -t 172.30.0.10:80 -s rr', '-a -t 172.30.0.10:80 -r 10.180.0.1:8080 -m -w 1', '-a -t 172.30.0.10:80 -r 10.180.0.2:8080 -m -w 1', ''].join('\n'),
  );
  assert.deepEqual(p.boundAddresses, ['172.30.0.10']);
  assert.deepEqual(entries(p, 'KUBE-CLUSTER-IP'), ['172.30.0.10,tcp:80']);
  assert.deepEqual(entries(p, 'KUBE-IPVS-IPS'), ['172.30.0.10']);
  assert.match(p.iptables, /-A KUBE-SERVICES -m comment --comment "Kubernetes service cluster ip \+ port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP src,dst -j KUBE-MARK-MASQ/);
});

test('NodePort, ExternalIP and LoadBalancer VIPs each get virtual servers; node IPs are not bound', () => {
  const s = svc('np', '172.30.0.20', 80, { protocol: 'UDP', nodePort: 30053, externalIPs: ['203.0.113.7'], loadBalancerVIPs: ['1.2.3.4'] });
  const p = plan(input([[s, [ep('10.180.0.1', 53)]]], { ipvs: { scheduler: 'sh' } }, { nodeIPs: ['192.168.0.2', '192.168.0.3', '127.0.0.1'] }));
  assert.deepEqual([...p.table.keys()].sort(), ['1.2.3.4:80/UDP', '172.30.0.20:80/UDP', '192.168.0.2:30053/UDP', '192.168.0.3:30053/UDP', '203.0.113.7:80/UDP']);
  for (const st of p.table.values()) assert.equal(st.vs.scheduler, 'sh');
  assert.deepEqual(p.boundAddresses, ['1.2.3.4', '172.30.0.20', '203.0.113.7']);
  assert.deepEqual(entries(p, 'KUBE-NODE-PORT-UDP'), ['30053']);
  assert.deepEqual(entries(p, 'KUBE-EXTERNAL-IP'), ['203.0.113.7,udp:80']);
  assert.deepEqual(entries(p, 'KUBE-LOAD-BALANCER'), ['1.2.3.4,udp:80']);
  assert.match(p.iptables, /-A KUBE-NODE-PORT -p udp -m comment --comment "Kubernetes nodeport UDP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-UDP dst -j KUBE-MARK-MASQ/);
});

test('externalTrafficPolicy Local: external VIPs use local endpoints, cluster IP uses all; local sets filled', () => {
  const s = svc('loc', '172.30.0.30', 80, { nodePort: 30080, loadBalancerVIPs: ['1.2.3.4'], externalPolicyLocal: true, healthCheckNodePort: 30999 });
  const p = plan(input([[s, [ep('10.180.0.1', 80, { isLocal: true }), ep('10.180.1.1', 80)]]]));
  assert.deepEqual([...p.table.get('172.30.0.30:80/TCP')!.reals.keys()], ['10.180.0.1:80', '10.180.1.1:80']);
  assert.deepEqual([...p.table.get('1.2.3.4:80/TCP')!.reals.keys()], ['10.180.0.1:80']);
  assert.deepEqual([...p.table.get('192.168.0.2:30080/TCP')!.reals.keys()], ['10.180.0.1:80']);
  assert.deepEqual(entries(p, 'KUBE-NODE-PORT-LOCAL-TCP'), ['30080']);
  assert.deepEqual(entries(p, 'KUBE-LOAD-BALANCER-LOCAL'), ['1.2.3.4,tcp:80']);
  assert.deepEqual(entries(p, 'KUBE-HEALTH-CHECK-NODE-PORT'), ['30999']);
  assert.deepEqual(entries(p, 'KUBE-LOOP-BACK'), ['10.180.0.1,tcp:80,10.180.0.1']);
});

test('ClientIP affinity → persistence; mh → mh-port flag; timeouts and strictARP planned', () => {
  const s = svc('sticky', '172.30.0.40', 443, { stickyMaxAgeSeconds: 10800 });
  const p = plan(input([[s, [ep('10.180.0.1', 443)]]], { ipvs: { scheduler: 'mh', strictARP: true, tcpTimeout: '900s', udpTimeout: '5m' } }));
  const st = p.table.get('172.30.0.40:443/TCP')!;
  assert.equal(st.vs.persistence, 10800);
  assert.deepEqual(st.vs.schedFlags, ['mh-port']);
  assert.equal(formatTable(p.table).split('\n')[0], '-A -t 172.30.0.40:443 -s mh -b mh-port -p 10800');
  assert.deepEqual(p.timeouts, { tcp: 900, tcpFin: 0, udp: 300 });
  const names = p.sysctls.map((x) => `${x.name}=${x.value}`);
  assert.ok(names.includes('net.ipv4.conf.all.arp_ignore=1') && names.includes('net.ipv4.conf.all.arp_announce=2'));
  assert.ok(names.includes('net.ipv4.vs.conntrack=1') && names.includes('net.ipv4.vs.expire_nodest_conn=1'));
});

test('LoadBalancer source ranges: FW + source CIDR sets; node outside the ranges is blocked via -m ipvs', () => {
  const s = svc('fw', '172.30.0.50', 80, { loadBalancerVIPs: ['1.2.3.4'], loadBalancerSourceRanges: ['203.0.113.0/25'] });
  const p = plan(input([[s, [ep('10.180.0.1', 80)]]]));
  assert.deepEqual(entries(p, 'KUBE-LOAD-BALANCER-FW'), ['1.2.3.4,tcp:80']);
  assert.deepEqual(entries(p, 'KUBE-LOAD-BALANCER-SOURCE-CIDR'), ['1.2.3.4,tcp:80,203.0.113.0/25']);
  assert.match(p.iptables, /-A KUBE-IPVS-OUT-FILTER -s 1.2.3.4 -m ipvs --vaddr 1.2.3.4 --vproto tcp --vport 80 -j DROP/);
});

test('cluster CIDR and masqueradeAll change the KUBE-CLUSTER-IP masquerade rule', () => {
  const s: [ReturnType<typeof svc>, ReturnType<typeof ep>[]] = [svc('m', '172.30.0.60', 80), [ep('10.180.0.1', 80)]];
  assert.match(plan(input([s], { clusterCIDR: '10.0.0.0/8' })).iptables, /KUBE-CLUSTER-IP dst,dst ! -s 10.0.0.0\/8 -j KUBE-MARK-MASQ/);
  assert.match(plan(input([s], { iptables: { masqueradeAll: true } })).iptables, /KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ/);
});

test('IPv6: KUBE-6- sets (31 characters at most), inet6 family, ::1 return rule', () => {
  const s = svc('v6', 'fd00:30::10', 80, { loadBalancerVIPs: ['fd00:1::4'], loadBalancerSourceRanges: ['fd00:99::/64'] });
  const p = plan(input([[s, [ep('fd00:180::1', 80)]]], {}, { family: 6, nodeIPs: ['fd00:192::2'] }));
  assert.equal(setName('loadBalancerSourceCIDR', 6), 'KUBE-6-LOAD-BALANCER-SOURCE-CID');
  assert.deepEqual(entries(p, 'KUBE-6-CLUSTER-IP'), ['fd00:30::10,tcp:80']);
  assert.equal(p.sets.get('KUBE-6-CLUSTER-IP')!.family, 6);
  assert.match(p.iptables, /-A KUBE-SERVICES -s ::1\/128 -j RETURN/);
  assert.ok(formatTable(p.table).includes('-A -t [fd00:1::4]:80 -s rr\n-a -t [fd00:1::4]:80 -r [fd00:180::1]:80 -m -w 1'));
});

test('no endpoints: the virtual server exists without real servers; render is the dry-run text', () => {
  const inp = input([[svc('empty', '172.30.0.70', 80), []]]);
  const p = plan(inp);
  assert.equal(p.table.get('172.30.0.70:80/TCP')!.reals.size, 0);
  const text = mode.render(inp);
  for (const want of ['-A -t 172.30.0.70:80 -s rr', 'create KUBE-CLUSTER-IP hash:ip,port', 'add KUBE-CLUSTER-IP 172.30.0.70,tcp:80', 'ip addr add 172.30.0.70/32 dev kube-ipvs0', '*nat', 'net.ipv4.vs.conntrack=1']) {
    assert.ok(text.includes(want), `render lacks ${want}\n${text}`);
  }
});

test('parsers read the formats ipvsadm 1.31 prints (captured in the VM)', () => {
  const rules = parseRules('-A -t 10.96.0.1:80 -s rr -p 10800\n-a -t 10.96.0.1:80 -r 10.244.0.2:8080 -m -w 0\n-A -t 10.96.0.2:80 -s mh -b mh-port\n-A --sctp-service 10.96.0.4:80 -s wrr\n-A -t [fd00::1]:80 -s rr -p 300\n-a -t [fd00::1]:80 -r [fd00::10]:8080 -m -w 1\n');
  assert.equal(rules.get('10.96.0.1:80/TCP')!.vs.persistence, 10800);
  assert.equal(rules.get('10.96.0.1:80/TCP')!.reals.get('10.244.0.2:8080')!.weight, 0);
  assert.deepEqual(rules.get('10.96.0.2:80/TCP')!.vs.schedFlags, ['mh-port']);
  assert.ok(rules.has('10.96.0.4:80/SCTP'));
  assert.ok(rules.get('[fd00::1]:80/TCP')!.reals.has('[fd00::10]:8080'));
  const listing = parseListing(`IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
TCP  10.96.0.1:80 rr persistent 10800
  -> 10.244.0.1:8080              Masq    1      3          2
TCP  10.96.0.2:80 mh (mh-port)
UDP  10.96.0.3:53 sh
`);
  const rs = listing.get('10.96.0.1:80/TCP')!.reals.get('10.244.0.1:8080')!;
  assert.deepEqual([rs.weight, rs.activeConn, rs.inactConn, rs.forward], [1, 3, 2, 'masq']);
  assert.deepEqual(listing.get('10.96.0.2:80/TCP')!.vs.schedFlags, ['mh-port']);
  assert.equal(listing.get('10.96.0.3:53/UDP')!.vs.scheduler, 'sh');
});
