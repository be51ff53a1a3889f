// Builders of ProxyState/PlanInput for the ipvs tests (test addresses per the project plan).
import { resolveConfig, type ProxyConfig, type RawConfig } from '../../src/config/config.ts';
import type { Endpoint, Protocol, ServicePort } from '../../src/core/model.ts';
import { port } from '../support/ports.ts';
import { joinHostPort } from '../../src/core/ip.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import type { CommandRunner } from '../../src/kernel/runner.ts';
import { silentLogger, type Logger } from '../../src/log.ts';
import { createIpvsProxier } from '../../src/modes/ipvs/proxier.ts';
import type { FakeHost } from './fake.ts';

export function svc(name: string, clusterIP: string, servicePort: number, opts: Partial<Omit<ServicePort, 'portName'>> & { portName?: string } = {}): ServicePort {
  const { portName = '', ...rest } = opts;
  return port('ns', name, portName, { clusterIP, port: servicePort, family: clusterIP.includes(':') ? 6 : 4, ...rest });
}

export function ep(ip: string, port: number, opts: Partial<Endpoint> = {}): Endpoint {
  return {
    ip,
    port,
    key: joinHostPort(ip, port),
    isLocal: false,
    ready: true,
    serving: true,
    terminating: false,
    zoneHints: [],
    nodeHints: [],
    ...opts,
  };
}

export function input(entries: Array<[ServicePort, Endpoint[]]>, raw: RawConfig = {}, node: Partial<PlanInput['node']> = {}): PlanInput {
  const config: ProxyConfig = resolveConfig({ mode: 'ipvs', ...raw });
  const services = new Map<string, ServicePort>();
  const endpoints = new Map<string, Endpoint[]>();
  for (const [s, eps] of entries) {
    services.set(s.key, s);
    endpoints.set(s.key, [...eps].sort((a, b) => (a.key < b.key ? -1 : 1)));
  }
  return {
    state: { services, endpoints },
    config,
    node: { nodeName: 'node-a', nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4, ...node },
  };
}

/**
 * The ipvs mode's whole kernel state through the same commands a user would run (`ipvsadm
 * -Sn`, `ipset save`, the addresses on kube-ipvs0, `iptables-save`), normalised so that two
 * kernels holding the same rules compare equal: lines sorted where the kernel's order is a
 * hash order, ipset's per-set random initval and sizes and iptables' counters dropped.
 */
export async function kernelSnapshot(runner: CommandRunner, family: 4 | 6 = 4): Promise<Record<'ipvs' | 'ipsets' | 'addresses' | 'iptables', string>> {
  const out = async (cmd: string, args: string[]) => (await runner.run(cmd, args, { timeoutMs: 60_000 })).stdout;
  const sorted = (text: string) => text.split('\n').filter((l) => l.trim() !== '').sort().join('\n');
  const ipsets = (await out('ipset', ['save']))
    .split('\n')
    .filter((l) => /^(create|add) KUBE-/.test(l))
    .map((l) => l.replace(/ (initval 0x[0-9a-f]+|bucketsize \d+|hashsize \d+|maxelem \d+)/g, '').replace(/\s+$/, ''));
  const addrs = (await out('ip', ['-o', 'addr', 'show', 'dev', 'kube-ipvs0']))
    .split('\n')
    .map((l) => /\sinet6?\s+(\S+)/.exec(l)?.[1] ?? '')
    .filter(Boolean);
  const ipt = (await out(family === 6 ? 'ip6tables-save' : 'iptables-save', []))
    .split('\n')
    .filter((l) => l !== '' && !l.startsWith('#'))
    .map((l) => l.replace(/ \[\d+:\d+\]$/, ''));
  return { ipvs: sorted(await out('ipvsadm', ['-Sn'])), ipsets: sorted(ipsets.join('\n')), addresses: sorted(addrs.join('\n')), iptables: ipt.join('\n') };
}

/** One Service of a random world: drawn from small pools so that Services share set entries, addresses and virtual servers. */
interface WorldService {
  name: string;
  clusterIP: string;
  ports: Array<{ port: number; name: string; protocol: Protocol; nodePort: number }>;
  externalIPs: string[];
  lbIPs: string[];
  ranges: string[];
  extLocal: boolean;
  intLocal: boolean;
  sticky: number;
  /** endpoint IPs (10.180.0.1 and .2 are on this node) */
  eps: string[];
}

/**
 * A seeded random sequence of Service changes for the partial-sync equivalence checks (the fake
 * host here, the real kernel in the IPVS VM): `change()` mutates 1–3 Services and returns
 * their keys, `input()` is the whole state now.
 */
export class RandomWorld {
  private readonly svcs = new Map<string, WorldService>();
  private next = 0;

  constructor(private readonly rand: () => number, size = 8, private readonly raw: RawConfig = {}) {
    for (let i = 0; i < size; i++) this.add();
  }

  private pick<T>(xs: T[]): T {
    return xs[Math.floor(this.rand() * xs.length)];
  }

  private some<T>(xs: T[], p: number): T[] {
    return xs.filter(() => this.rand() < p);
  }

  private fresh(name: string, n: number): WorldService {
    const ports: WorldService['ports'] = [];
    const count = this.rand() < 0.3 ? 2 : 1;
    for (let j = 0; j < count; j++) {
      ports.push({
        port: this.pick([80, 81, 53]),
        name: count > 1 ? `p${j}` : '',
        protocol: this.rand() < 0.25 ? 'UDP' : 'TCP',
        nodePort: this.rand() < 0.5 ? 30000 + n * 2 + j : 0,
      });
    }
    // one port number and protocol once per Service (the API server's rule)
    const uniq = ports.filter((p, i) => ports.findIndex((q) => q.port === p.port && q.protocol === p.protocol) === i);
    const lbIPs = this.rand() < 0.3 ? [this.pick(['1.2.3.4', '1.2.3.5'])] : [];
    return {
      name,
      clusterIP: `172.30.${Math.floor(n / 200)}.${(n % 200) + 10}`,
      ports: uniq,
      externalIPs: this.some(['203.0.113.10', '203.0.113.11', '192.168.0.2'], 0.15),
      lbIPs,
      ranges: lbIPs.length ? this.pick([[], ['203.0.113.0/24'], ['192.168.0.0/24', '203.0.113.0/25']]) : [],
      extLocal: this.rand() < 0.3,
      intLocal: this.rand() < 0.15,
      sticky: this.rand() < 0.2 ? 10800 : 0,
      eps: this.some(['10.180.0.1', '10.180.0.2', '10.180.0.3', '10.180.0.4', '10.180.0.5'], 0.4),
    };
  }

  private add(): string {
    const n = this.next++;
    const s = this.fresh(`s${n}`, n);
    this.svcs.set(s.name, s);
    return `ns/${s.name}`;
  }

  /** 1–3 random changes; the keys ("ns/name") of the Services they touched */
  change(): Set<string> {
    const changed = new Set<string>();
    const k = 1 + Math.floor(this.rand() * 3);
    for (let i = 0; i < k; i++) {
      const names = [...this.svcs.keys()];
      const r = this.rand();
      if (r < 0.15 || names.length === 0) {
        changed.add(this.add());
        continue;
      }
      const name = this.pick(names);
      const s = this.svcs.get(name)!;
      changed.add(`ns/${name}`);
      if (r < 0.25) this.svcs.delete(name);
      else if (r < 0.45) this.svcs.set(name, { ...this.fresh(name, Number(name.slice(1))), name });
      else if (r < 0.6) s.eps = s.eps.slice(1);
      else {
        const ip = this.pick(['10.180.0.1', '10.180.0.2', '10.180.0.3', '10.180.0.4', '10.180.0.5', '10.180.0.6']);
        if (!s.eps.includes(ip)) s.eps = [...s.eps, ip];
      }
    }
    return changed;
  }

  input(): PlanInput {
    const entries: Array<[ServicePort, Endpoint[]]> = [];
    for (const s of this.svcs.values()) {
      for (const p of s.ports) {
        const sp = svc(s.name, s.clusterIP, p.port, {
          protocol: p.protocol, portName: p.name, nodePort: p.nodePort, externalIPs: s.externalIPs, loadBalancerVIPs: s.lbIPs,
          loadBalancerSourceRanges: s.ranges, externalPolicyLocal: s.extLocal, internalPolicyLocal: s.intLocal, stickyMaxAgeSeconds: s.sticky,
          healthCheckNodePort: s.extLocal && p.nodePort ? p.nodePort + 1000 : 0,
        });
        entries.push([sp, s.eps.map((ip) => ep(ip, p.protocol === 'UDP' ? 5353 : 8080, { isLocal: ip === '10.180.0.1' || ip === '10.180.0.2' }))]);
      }
    }
    return input(entries, { clusterCIDR: '10.0.0.0/8', ...this.raw });
  }
}

/** the commands among `calls` ("cmd args...") that read a whole table back: a partial sync runs none */
export function readsOfWholeState(calls: string[]): string[] {
  return calls.filter((c) => c === 'ipvsadm -Ln' || c === 'ipvsadm -Sn' || c === 'ipset save' || /^ip -o addr show/.test(c) || /^ip link show/.test(c) || /iptables-save/.test(c));
}

/** the lines of two snapshots that differ, for a failure message */
export function snapshotDiff(a: Record<string, string>, b: Record<string, string>): string {
  const out: string[] = [];
  for (const k of Object.keys(a)) {
    if (a[k] === b[k]) continue;
    const la = new Set(a[k].split('\n'));
    const lb = new Set(b[k].split('\n'));
    const only = (x: Set<string>, y: Set<string>) => [...x].filter((l) => !y.has(l)).slice(0, 4).join(' | ');
    out.push(`${k}: only in the first: ${only(la, lb) || '(order)'}; only in the second: ${only(lb, la) || '(order)'}`);
  }
  return out.join('; ');
}

/** An ipvs proxier on a fake host, as the unit tests run it: no graceful-termination wait, kernel 6.1. */
export function fakeHostProxier(host: FakeHost, o: { log?: Logger; config?: RawConfig; extraModules?: string[] } = {}) {
  return createIpvsProxier({
    config: resolveConfig({ mode: 'ipvs', ...o.config }),
    runner: host,
    log: o.log ?? silentLogger(),
    sysctl: host.sysctl(),
    moduleFS: host.moduleFS(),
    gracefulCheckMs: 0,
    kernelRelease: '6.1.0',
    ...(o.extraModules ? { extraModules: o.extraModules } : {}),
  });
}
