// Property: every Service and EndpointSlice the API server accepts (test/support/valid-objects.ts:
// DNS labels up to 63 characters for namespaces, names and port names, all-digit port names,
// IANA named targetPorts, both families and dual-stack, every Service type, multi-port,
// externalTrafficPolicy and internalTrafficPolicy, ClientIP affinity, source ranges, external
// and load-balancer IPs) is
//   (a) accepted by validation: the trackers' onInvalid (kproxy_invalid_objects_total) stays 0
//       and nothing is reported;
//   (b) planned by every mode: each mode's render holds every service port that upstream
//       programs (not headless, not ExternalName), by ClusterIP and port and by NodePort;
//   (c) accepted by the real kernel, inside a network namespace this test creates:
//       iptables-restore --test / ip6tables-restore --test of the iptables mode's rules and the
//       userspace mode's redirects, `nft -c -f` of the nftables mode's table and of the same
//       Services spread over 3 tables (the sharded form), `ipset restore` of the ipvs mode's
//       sets. The ipvs mode's virtual servers and iptables rules need an IPVS kernel: the same
//       generator runs through them in the IPVS VM (test/ipvs/fixtures/vm-checks.ts,
//       check generated-services-ipvs-restore).
// Reproduce a failure with KPROXY_FUZZ_SEED=<seed>; fast-check prints the shrunk case.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { resolveConfig, type ModeName } from '../../src/config/config.ts';
import { joinHostPort } from '../../src/core/ip.ts';
import { modes } from '../../src/modes/registry.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { optionsFromInput } from '../../src/modes/nftables/plan.ts';
import { planShards } from '../../src/modes/nftables/shards.ts';
import { dumpRuleset } from '../../src/modes/nftables/ruleset.ts';
import { planUserspace, restorePayload, hasRules } from '../../src/modes/userspace/plan.ts';
import { plan as planIpvs } from '../../src/modes/ipvs/planner.ts';
import { formatIPSets } from '../../src/kernel/ipset/model.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import { Netns, uniqueName } from '../support/netns.ts';
import { NODE_IP, NODE_NAME, trackWorld, world, type ExpectedPort, type World } from '../support/valid-objects.ts';

const MODES: ModeName[] = ['iptables', 'nftables', 'ipvs', 'userspace'];
const FAMILIES = [4, 6] as const;
const seed = Number(process.env.KPROXY_FUZZ_SEED ?? 20261207);
const CONFIG = Object.fromEntries(MODES.map((m) => [m, resolveConfig({ mode: m, clusterCIDR: '10.0.0.0/8,fd00:10::/32' })]));

interface Planned {
  inputs: Record<ModeName, PlanInput>;
  invalid: string[];
  reports: string[];
}

/** The world through a family's trackers, and each mode's plan input for it. */
function track(w: World, family: 4 | 6): Planned {
  const { state, invalid, reports } = trackWorld(w, family);
  const node = { nodeName: NODE_NAME, nodeIPs: [NODE_IP[family]], nodeLabels: {}, family };
  const inputs = Object.fromEntries(MODES.map((m) => [m, { state, config: CONFIG[m], node }])) as Record<ModeName, PlanInput>;
  return { inputs, invalid, reports };
}

const PROTO_IPVSADM = { TCP: '-t', UDP: '-u', SCTP: '--sctp-service' } as const;

/** What a mode's render must hold for one service port of one family: text a user would grep for. */
function expectedText(mode: ModeName, p: ExpectedPort, family: 4 | 6): string[] {
  const ip = p.clusterIPs[family];
  if (p.skipped || !ip) return [];
  const proto = p.protocol.toLowerCase();
  const out: string[] = [];
  switch (mode) {
    case 'iptables':
      // the ClusterIP rule (nat when it has endpoints, filter REJECT/DROP when not) and the NodePort one
      out.push(`-p ${proto} -d ${ip} --dport ${p.port} `);
      if (p.nodePort) out.push(`-p ${proto} --dport ${p.nodePort} `);
      out.push(`"${p.namespace}/${p.name}${p.portName ? `:${p.portName}` : ''}`);
      break;
    case 'nftables':
      // an element of service-ips or no-endpoint-services (the latter with a comment before the verdict)
      out.push(`{ ${ip} . ${proto} . ${p.port} `);
      if (p.nodePort) out.push(`{ ${proto} . ${p.nodePort} `);
      break;
    case 'ipvs':
      out.push(`-A ${PROTO_IPVSADM[p.protocol]} ${joinHostPort(ip, p.port)} `);
      if (p.nodePort) out.push(`-A ${PROTO_IPVSADM[p.protocol]} ${joinHostPort(NODE_IP[family], p.nodePort)} `);
      break;
    case 'userspace':
      // Node has no SCTP sockets: the render says so for the port
      if (p.protocol === 'SCTP') out.push(`# ${p.namespace}/${p.name}:${p.portName}: SCTP is not served`);
      else {
        // a DNAT to a proxy port, or the DROP of internalTrafficPolicy Local without local endpoints
        out.push(`-p ${proto} -m ${proto} -d ${ip}/${family === 4 ? 32 : 128} --dport ${p.port} `);
        if (p.nodePort) out.push(`-p ${proto} -m ${proto} --dport ${p.nodePort} `);
      }
      break;
  }
  return out;
}

test('objects inside the API server\'s rules: validation accepts all, every mode plans every service port', () => {
  fc.assert(
    fc.property(world(), (w) => {
      for (const family of FAMILIES) {
        const { inputs, invalid, reports } = track(w, family);
        assert.deepEqual(invalid, [], `IPv${family}: kproxy_invalid_objects_total would count these`);
        assert.deepEqual(reports, [], `IPv${family}: reported`);
        for (const m of MODES) {
          const out = modes[m].render(inputs[m]);
          for (const p of w.ports) {
            for (const want of expectedText(m, p, family)) {
              assert.ok(out.includes(want), `${m} IPv${family}: ${p.namespace}/${p.name}:${p.portName} ${p.protocol}/${p.port}: no ${JSON.stringify(want)} in\n${out}`);
            }
          }
        }
      }
    }),
    { seed, numRuns: 300, includeErrorInReport: true },
  );
});

// ---- (c) the real kernel ----------------------------------------------------------------------

const ns = new Netns(uniqueName('kpt-valid'));
before(() => {
  Netns.create(ns.name);
});
after(async () => {
  await ns.destroy();
});

/** Runs a restore-like tool in the namespace; the kernel's refusal (stderr) is the failure message. */
function kernelAccepts(what: string, cmd: string, args: string[], text: string): void {
  try {
    ns.exec(cmd, args, { input: text });
  } catch (e) {
    assert.fail(`${what}: ${(e as Error).message}\n--- input ---\n${text}`);
  }
}

const KERNEL_RUNS = 40;
const stats = { worlds: 0, services: 0, ports: 0, iptables: 0, nftables: 0, sharded: 0, userspace: 0, ipsets: 0 };

test(`the kernel accepts every mode's rules for ${KERNEL_RUNS} generated worlds (iptables, ip6tables, nft, ipset)`, { timeout: 600_000 }, (t) => {
  fc.assert(
    fc.property(world(), (w) => {
      stats.worlds++;
      stats.services += w.services.length;
      stats.ports += w.ports.length;
      for (const family of FAMILIES) {
        const { inputs } = track(w, family);
        const restore = family === 4 ? 'iptables-restore' : 'ip6tables-restore';

        kernelAccepts(`iptables mode IPv${family}`, restore, ['--test'], modes.iptables.render(inputs.iptables));
        stats.iptables++;

        kernelAccepts(`nftables mode IPv${family}`, 'nft', ['-c', '-f', '-'], modes.nftables.render(inputs.nftables));
        stats.nftables++;
        const sharded = planShards(inputs.nftables.state, optionsFromInput(inputs.nftables), 3).map(dumpRuleset).join('');
        kernelAccepts(`nftables mode IPv${family}, 3 tables`, 'nft', ['-c', '-f', '-'], sharded);
        stats.sharded++;

        const us = planUserspace(inputs.userspace, { redirect: true });
        if (hasRules(us)) {
          const ports = new Map(us.listeners.map((l, i) => [l.id, 40000 + i]));
          kernelAccepts(`userspace mode IPv${family}`, restore, ['--test'], restorePayload(us, (id) => ports.get(id) ?? 1));
          stats.userspace++;
        }

        const ipvs = planIpvs(inputs.ipvs);
        try {
          kernelAccepts(`ipvs mode IPv${family} sets`, 'ipset', ['restore'], formatIPSets(ipvs.sets));
        } finally {
          ns.exec('ipset', ['destroy'], { allowFail: true });
        }
        stats.ipsets++;
      }
    }),
    { seed: seed + 1, numRuns: KERNEL_RUNS, interruptAfterTimeLimit: 480_000, markInterruptAsFailure: true, includeErrorInReport: true },
  );
  t.diagnostic(`kernel accepted: ${JSON.stringify(stats)}`);
});

// ---- the longest names the API server accepts, every feature that derives a name ------------

const L63 = (c: string) => `${c}-${'x'.repeat(59)}-${c}`;
const DIGITS63 = '1234567890'.repeat(6) + '123';

/**
 * One dual-stack LoadBalancer Service at every limit at once: 63-character namespace, name and
 * port names (one all digits), every protocol (SCTP is the longest in nftables names),
 * externalTrafficPolicy and internalTrafficPolicy Local, ClientIP affinity, source ranges,
 * external and LB IPs, and endpoints with the longest addresses and ports ([IPv6 of 39
 * characters]:65535), local and remote.
 */
function longestWorld(): World {
  const ns = L63('n');
  const name = L63('s');
  const ports = [
    { name: L63('p'), protocol: 'SCTP', port: 65535, targetPort: 'abcdefghijklmno', nodePort: 32767 },
    { name: DIGITS63, protocol: 'UDP', port: 65534, targetPort: 65535, nodePort: 32766 },
    { name: '8443', protocol: 'TCP', port: 8443, targetPort: 65535, nodePort: 32765 },
  ];
  const v6 = ['fd00:10:180:ffff:ffff:ffff:ffff:fffe', 'fd00:10:180:ffff:ffff:ffff:ffff:ffff'];
  const v4 = ['10.180.255.253', '10.180.255.254'];
  const service: K8sService & { status: unknown } = {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { namespace: ns, name },
    spec: {
      type: 'LoadBalancer',
      clusterIP: '172.30.255.254',
      clusterIPs: ['172.30.255.254', 'fd00:172:30:ffff:ffff:ffff:ffff:fffe'],
      ipFamilies: ['IPv4', 'IPv6'],
      externalIPs: ['198.51.100.254', '2001:db8:ffff:ffff:ffff:ffff:ffff:fffe'],
      loadBalancerSourceRanges: ['203.0.113.0/24', '2001:db8:ffff:ffff::/64'],
      externalTrafficPolicy: 'Local',
      internalTrafficPolicy: 'Local',
      healthCheckNodePort: 32764,
      sessionAffinity: 'ClientIP',
      sessionAffinityConfig: { clientIP: { timeoutSeconds: 86400 } },
      ports,
    },
    status: { loadBalancer: { ingress: [{ ip: '1.2.255.254' }, { ip: '2001:db8:ff:ffff:ffff:ffff:ffff:fffe' }] } },
  };
  const slices: K8sEndpointSlice[] = (['IPv4', 'IPv6'] as const).map((family) => ({
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { namespace: ns, name: `${name}-${family.toLowerCase()}`, labels: { 'kubernetes.io/service-name': name } },
    addressType: family,
    ports: ports.map((p) => ({ name: p.name, protocol: p.protocol, port: 65535 })),
    endpoints: (family === 'IPv4' ? v4 : v6).map((ip, i) => ({ addresses: [ip], conditions: { ready: true }, nodeName: i === 0 ? NODE_NAME : 'node-b' })),
  }));
  const expected = ports.map((p) => ({
    namespace: ns, name, portName: p.name, protocol: p.protocol as 'TCP' | 'UDP' | 'SCTP', port: p.port, nodePort: p.nodePort,
    clusterIPs: { 4: '172.30.255.254', 6: 'fd00:172:30:ffff:ffff:ffff:ffff:fffe' }, skipped: false,
  }));
  return { services: [service], slices, ports: expected };
}

const longest = (texts: Iterable<string>) => Math.max(0, ...[...texts].map((t) => Buffer.byteLength(t)));
const all = (re: RegExp, text: string) => [...text.matchAll(re)].map((m) => m[1]);

test('the longest names the API server accepts: every mode\'s derived names within the kernel\'s limits, accepted', (t) => {
  const w = longestWorld();
  for (const family of FAMILIES) {
    const { inputs, invalid, reports } = track(w, family);
    assert.deepEqual([invalid, reports], [[], []]);
    const restore = family === 4 ? 'iptables-restore' : 'ip6tables-restore';

    const ipt = modes.iptables.render(inputs.iptables);
    for (const p of w.ports) for (const want of expectedText('iptables', p, family)) assert.ok(ipt.includes(want), want);
    // iptables: chain names at most 28 characters (XT_EXTENSION_MAXNAMELEN 29 with the NUL), comments
    // at most 255 bytes (XT_MAX_COMMENT_LEN 256), recent-match names at most 199 (XT_RECENT_NAME_LEN 200)
    const chains = all(/^:(\S+) /gm, ipt);
    const comments = [...ipt.matchAll(/--comment (?:"([^"]*)"|(\S+))/g)].map((m) => m[1] ?? m[2]);
    const recent = all(/--name (\S+)/g, ipt);
    assert.ok(longest(chains) <= 28 && longest(comments) <= 255 && longest(recent) <= 199, `${longest(chains)} ${longest(comments)} ${longest(recent)}`);
    assert.ok(comments.some((c) => c.includes(`${w.ports[0].namespace}/${w.ports[0].name}:${w.ports[0].portName}`)), 'the whole name in a comment');
    kernelAccepts(`iptables mode IPv${family}`, restore, ['--test'], ipt);

    // nftables: object names at most 255 bytes (NFT_NAME_MAXLEN 256), comments at most 128 (NFTNL_UDATA_COMMENT_MAXLEN)
    const nft = modes.nftables.render(inputs.nftables);
    for (const p of w.ports) for (const want of expectedText('nftables', p, family)) assert.ok(nft.includes(want), want);
    const nftNames = all(/^add (?:chain|set|map) ip6? \S+ (\S+)/gm, nft);
    const nftComments = all(/comment "([^"]*)"/g, nft);
    assert.ok(longest(nftNames) <= 255 && longest(nftComments) <= 128, `${longest(nftNames)} ${longest(nftComments)}`);
    kernelAccepts(`nftables mode IPv${family}`, 'nft', ['-c', '-f', '-'], nft);
    const sharded = planShards(inputs.nftables.state, optionsFromInput(inputs.nftables), 2).map(dumpRuleset).join('');
    kernelAccepts(`nftables mode IPv${family}, 2 tables`, 'nft', ['-c', '-f', '-'], sharded);

    // userspace: its redirects' comments
    const us = planUserspace(inputs.userspace, { redirect: true });
    const payload = restorePayload(us, () => 40000);
    assert.ok(longest(all(/--comment "([^"]*)"/g, payload)) <= 255);
    kernelAccepts(`userspace mode IPv${family}`, restore, ['--test'], payload);

    // ipvs: set names at most 31 characters (IPSET_MAXNAMELEN 32)
    const ipvs = planIpvs(inputs.ipvs);
    const sets = formatIPSets(ipvs.sets);
    assert.ok(longest(all(/^create (\S+)/gm, sets)) <= 31);
    try {
      kernelAccepts(`ipvs mode IPv${family} sets`, 'ipset', ['restore'], sets);
    } finally {
      ns.exec('ipset', ['destroy'], { allowFail: true });
    }
    t.diagnostic(`IPv${family}: longest iptables chain ${longest(chains)}, comment ${longest(comments)} bytes, recent name ${longest(recent)}; nft name ${longest(nftNames)} bytes, comment ${longest(nftComments)}`);
  }
});
