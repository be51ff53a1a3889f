// A stateful fake of the host for the ipvs mode's unit tests: ipvsadm, ipset, ip, iptables
// and modprobe over in-memory kernel state, rejecting what the kernel rejects (a real server
// for a missing virtual server, an entry for a missing set, a rule using a missing set, a
// set destroyed while a rule uses it, an unknown module).
import { type CommandRunner, type RunResult, ExecError } from '../../src/kernel/runner.ts';
import {
  formatTable,
  parseRules,
  realServerKey,
  splitHostPort,
  virtualServerKey,
  type IpvsTable,
  type RealServer,
} from '../../src/kernel/ipvs/model.ts';
import { normalizeEntry } from '../../src/kernel/ipset/model.ts';
import { cidrContains } from '../../src/core/ip.ts';
import type { ModuleFS } from '../../src/kernel/modules.ts';
import type { Sysctl } from '../../src/kernel/sysctl.ts';
import type { Protocol } from '../../src/core/model.ts';
import { BUILTIN_CHAINS, FakeIptables, type FakeTables } from '../../src/kernel/iptables/fake.ts';

const ok = (stdout = ''): RunResult => ({ code: 0, stdout, stderr: '' });
const fail = (stderr: string, code = 1): RunResult => ({ code, stdout: '', stderr });

interface FakeSet {
  type: string;
  family: string;
  entries: Set<string>;
}


/**
 * What the kernel refuses in an ipset entry, with the real ipset 7.17 messages (checked with
 * the real binary in test/kernel/ipset/ipset-kernel.test.ts): written out here rather than borrowed
 * from the planner, so that the fake can catch the planner getting it wrong.
 */
function kernelRefusal(type: string, entry: string): string | null {
  const parts = entry.split(',');
  const unspecified = parts[0] === '0.0.0.0' || parts[0] === '::';
  if (type === 'hash:ip' && unspecified) return 'Null-valued element, cannot be stored in a hash type of set';
  if (type === 'hash:ip,port' && unspecified) return 'Kernel error received: Invalid argument';
  if (type === 'hash:ip,port,net' && /\/0$/.test(parts[2] ?? '')) return 'The value of the CIDR parameter of the IP address is invalid';
  return null;
}

export class FakeHost implements CommandRunner {
  ipvs: IpvsTable = new Map();
  sets = new Map<string, FakeSet>();
  links = new Map<string, Set<string>>([['lo', new Set(['127.0.0.1'])]]);
  /** the iptables of each family: the iptables package's one fake, refusing also a match on a missing ipset */
  readonly ipt: Record<'4' | '6', FakeIptables> = { '4': this.fakeIptables(4), '6': this.fakeIptables(6) };
  loadedModules = new Set<string>();
  availableModules = new Set(['ip_vs', 'ip_vs_rr', 'ip_vs_wrr', 'ip_vs_lc', 'ip_vs_wlc', 'ip_vs_sh', 'ip_vs_dh', 'ip_vs_sed', 'ip_vs_nq', 'ip_vs_mh', 'ip_vs_lblc', 'ip_vs_lblcr', 'nf_conntrack']);
  sysctls = new Map<string, string>();
  timeouts: string[] | null = null;
  /** binaries that are "not installed" */
  missing = new Set<string>();
  calls: string[] = [];
  /** test hooks: entries ("SET entry") and ipvsadm lines the "kernel" refuses besides its rules */
  refuseSetEntries = new Map<string, string>();
  refuseIpvsLines: Array<{ match: RegExp; error: string; /** like ipvsadm's fail(): the batch ends there */ abort?: boolean }> = [];

  private fakeIptables(family: 4 | 6): FakeIptables {
    return new FakeIptables(family, {
      check: (_table, spec) => {
        const set = /--match-set (\S+)/.exec(spec);
        return set && !this.sets.has(set[1]) ? `Set ${set[1]} doesn't exist.` : null;
      },
    });
  }

  /** iptables family → table → chain → rules (the text after `-A CHAIN`) */
  get iptables(): Record<'4' | '6', Record<string, Map<string, string[]>>> {
    const view = (t: FakeTables) => Object.fromEntries(t);
    return { '4': view(this.ipt['4'].tables), '6': view(this.ipt['6'].tables) };
  }

  async run(cmd: string, args: string[], opts: { input?: string } = {}): Promise<RunResult> {
    this.calls.push([cmd, ...args].join(' '));
    if (this.missing.has(cmd)) throw new ExecError('KPROXY_EXEC_MISSING', `${cmd} not found; install the package that provides it`);
    const input = opts.input ?? '';
    switch (cmd) {
      case 'ipvsadm':
        return this.ipvsadm(args, input);
      case 'ipset':
        return this.ipset(args, input);
      case 'ip':
        return this.ip(args, input);
      case 'iptables':
      case 'iptables-restore':
      case 'iptables-save':
        return this.ipt['4'].run(cmd, args, { input });
      case 'ip6tables':
      case 'ip6tables-restore':
      case 'ip6tables-save':
        return this.ipt['6'].run(cmd, args, { input });
      case 'modprobe': {
        const m = args[args.length - 1];
        if (!this.availableModules.has(m)) return fail(`modprobe: FATAL: Module ${m} not found in directory /lib/modules/6.1.0-fake`);
        this.loadedModules.add(m);
        return ok();
      }
      default:
        return fail(`${cmd}: not modelled`, 127);
    }
  }

  // ---------------------------------------------------------------- ipvsadm
  private ipvsadm(args: string[], input: string): RunResult {
    if (args[0] === '-Ln' && args.length === 1) return ok(this.listing());
    if (args[0] === '-Ln') {
      // one service: `ipvsadm -Ln -t VIP:PORT`
      const protocol: Protocol = args[1] === '-u' ? 'UDP' : args[1] === '--sctp-service' ? 'SCTP' : 'TCP';
      const hp = splitHostPort(args[2] ?? '');
      const key = hp ? virtualServerKey({ ...hp, protocol }) : '';
      return this.ipvs.has(key) ? ok(this.listing(key)) : fail('No such service');
    }
    if (args[0] === '-Sn') return ok(formatTable(this.ipvs));
    if (args[0] === '--set') {
      this.timeouts = args.slice(1);
      return ok();
    }
    if (args[0] === '-R') {
      const errors: string[] = [];
      for (const line of input.split('\n')) {
        if (!line.trim()) continue;
        const fatal = this.refuseIpvsLines.find((r) => r.abort && r.match.test(line));
        if (fatal) return { code: 2, stdout: '', stderr: errors.map((e) => e + '\n').join('') + fatal.error + '\n' };
        const e = this.ipvsLine(line);
        if (e) errors.push(e);
      }
      // like ipvsadm: carries on after a failing line and exits 0
      return { code: 0, stdout: '', stderr: errors.map((e) => e + '\n').join('') };
    }
    if (args[0] === '-D') {
      const e = this.ipvsLine(args.join(' '));
      return e ? fail(e) : ok();
    }
    return fail('ipvsadm: unsupported by fake');
  }

  private ipvsLine(line: string): string | null {
    const hooked = this.refuseIpvsLines.find((r) => !r.abort && r.match.test(line));
    if (hooked) return hooked.error;
    const op = line.trim().split(/\s+/)[0];
    const asAdd = line.replace(/^\s*-[AEDaed]/, op === op.toUpperCase() ? '-A' : '-a');
    const w = line.trim().split(/\s+/);
    const protoFlag = w[1];
    const hp = splitHostPort(w[2] ?? '');
    const protocol: Protocol = protoFlag === '-u' ? 'UDP' : protoFlag === '--sctp-service' ? 'SCTP' : 'TCP';
    if (!hp) return 'Invalid address';
    const key = virtualServerKey({ ...hp, protocol });
    const vs = this.ipvs.get(key);
    if (op === '-A' || op === '-E') {
      const parsed = parseRules(`-A ${w.slice(1).join(' ')}`).get(key);
      if (!parsed) return 'Invalid line';
      if (!/^(rr|wrr|lc|wlc|lblc|lblcr|sh|dh|sed|nq|mh)$/.test(parsed.vs.scheduler)) return 'Scheduler or persistence engine not found';
      if (op === '-A' && vs) return 'Service already exists';
      if (op === '-E' && !vs) return 'No such service';
      this.ipvs.set(key, { vs: parsed.vs, reals: vs?.reals ?? new Map() });
      return null;
    }
    if (op === '-D') {
      if (!vs) return 'No such service';
      this.ipvs.delete(key);
      return null;
    }
    if (!vs) return 'Service not defined';
    const ri = w.indexOf('-r');
    const rhp = splitHostPort(w[ri + 1] ?? '');
    if (!rhp) return 'Invalid real server';
    const rk = realServerKey(rhp);
    const cur = vs.reals.get(rk);
    if (op === '-d') {
      if (!cur) return 'No such destination';
      vs.reals.delete(rk);
      return null;
    }
    const parsed = parseRules(`-A ${w[1]} ${w[2]} -s rr\n${asAdd}`).get(key)?.reals.get(rk);
    if (!parsed) return 'Invalid line';
    if (op === '-a' && cur) return 'Destination already exists';
    if (op === '-e' && !cur) return 'No such destination';
    vs.reals.set(rk, { ...parsed, activeConn: cur?.activeConn ?? 0, inactConn: cur?.inactConn ?? 0 });
    return null;
  }

  private listing(only?: string): string {
    const out = ['IP Virtual Server version 1.2.1 (size=4096)', 'Prot LocalAddress:Port Scheduler Flags', '  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn'];
    for (const [key, { vs, reals }] of this.ipvs) {
      if (only !== undefined && key !== only) continue;
      const hp = vs.address.includes(':') ? `[${vs.address}]:${vs.port}` : `${vs.address}:${vs.port}`;
      let line = `${vs.protocol.padEnd(4)} ${hp} ${vs.scheduler}`;
      if (vs.schedFlags.length) line += ` (${vs.schedFlags.join(',')})`;
      if (vs.persistence) line += ` persistent ${vs.persistence}`;
      out.push(line);
      for (const r of reals.values()) {
        const fwd = { masq: 'Masq', route: 'Route', tunnel: 'Tunnel', local: 'Local' }[r.forward];
        out.push(`  -> ${realServerKey(r).padEnd(28)} ${fwd.padEnd(7)} ${String(r.weight).padEnd(6)} ${String(r.activeConn ?? 0).padEnd(10)} ${r.inactConn ?? 0}`);
      }
    }
    return out.join('\n') + '\n';
  }

  /** test helper: pretend connections are open on a real server */
  setConns(vsKey: string, rsKey: string, active: number, inact = 0): void {
    const rs = this.ipvs.get(vsKey)?.reals.get(rsKey) as RealServer | undefined;
    if (!rs) throw new Error(`no real server ${vsKey} ${rsKey}`);
    rs.activeConn = active;
    rs.inactConn = inact;
  }

  // ---------------------------------------------------------------- ipset
  private setsInUse(): Set<string> {
    const used = new Set<string>();
    for (const fam of Object.values(this.iptables)) {
      for (const t of Object.values(fam)) for (const rules of t.values()) for (const r of rules) {
        const m = /--match-set (\S+)/.exec(r);
        if (m) used.add(m[1]);
      }
    }
    return used;
  }

  private ipset(args: string[], input: string): RunResult {
    if (args[0] === 'save') {
      const out: string[] = [];
      for (const [name, s] of this.sets) {
        out.push(s.type === 'bitmap:port' ? `create ${name} bitmap:port range 0-65535 comment` : `create ${name} ${s.type} family ${s.family} hashsize 1024 maxelem 65536 comment bucketsize 12 initval 0x1`);
        for (const e of s.entries) out.push(`add ${name} ${e}`);
      }
      return ok(out.join('\n') + (out.length ? '\n' : ''));
    }
    if (args[0] === '-') return this.ipsetInteractive(input);
    if (args[0] === 'list' && args[1] === '-n') return ok([...this.sets.keys()].map((n) => n + '\n').join(''));
    if (args[0] === 'destroy') {
      const name = args[1];
      if (!this.sets.has(name)) return fail('ipset v7.17: The set with the given name does not exist');
      if (this.setsInUse().has(name)) return fail('ipset v7.17: Set cannot be destroyed: it is in use by a kernel component');
      this.sets.delete(name);
      return ok();
    }
    if (args[0] === 'restore') {
      let n = 0;
      for (const line of input.split('\n')) {
        n++;
        const w = line.trim().split(/\s+/);
        if (!w[0]) continue;
        const exist = w.includes('-exist');
        const s = this.sets.get(w[1]);
        if (w[0] === 'create') {
          if (s && (!exist || s.type !== w[2])) return fail(`ipset v7.17: Error in line ${n}: Set cannot be created: set with the same name already exists`);
          if (!s) {
            const fi = w.indexOf('family');
            this.sets.set(w[1], { type: w[2], family: fi >= 0 ? w[fi + 1] : 'inet', entries: new Set() });
          }
        } else if (w[0] === 'add' || w[0] === 'del') {
          if (!s) return fail(`ipset v7.17: Error in line ${n}: The set with the given name does not exist`);
          const e = normalizeEntry(w[2]);
          const refused = w[0] === 'add' ? (kernelRefusal(s.type, e) ?? this.refuseSetEntries.get(`${w[1]} ${e}`) ?? null) : null;
          if (refused) return fail(`ipset v7.17: Error in line ${n}: ${refused}`);
          if (w[0] === 'add') {
            if (s.entries.has(e) && !exist) return fail(`ipset v7.17: Error in line ${n}: Element cannot be added to the set: it's already added`);
            s.entries.add(e);
          } else {
            if (!s.entries.has(e) && !exist) return fail(`ipset v7.17: Error in line ${n}: Element cannot be deleted from the set: it's not added`);
            s.entries.delete(e);
          }
        } else if (w[0] === 'destroy') {
          if (!s) return fail(`ipset v7.17: Error in line ${n}: The set with the given name does not exist`);
          if (this.setsInUse().has(w[1])) return fail(`ipset v7.17: Error in line ${n}: Set cannot be destroyed: it is in use by a kernel component`);
          this.sets.delete(w[1]);
        } else return fail(`ipset v7.17: Error in line ${n}: unknown command ${w[0]}`);
      }
      return ok();
    }
    return fail('ipset: unsupported by fake');
  }

  /** whether the kernel's set match finds `entry` in a set: a hash:ip,port,net entry holds the addresses of its net */
  private member(s: FakeSet, entry: string): boolean {
    const e = normalizeEntry(entry);
    if (s.entries.has(e)) return true;
    if (s.type !== 'hash:ip,port,net') return false;
    const [ip, port, addr] = e.split(',');
    return [...s.entries].some((x) => {
      const [xi, xp, net] = x.split(',');
      return xi === ip && xp === port && net.includes('/') && cidrContains(net, addr);
    });
  }

  /** `ipset -`: one stderr line per `test` line, as ipset 7.17's interactive mode prints them; `quit` ends it */
  private ipsetInteractive(input: string): RunResult {
    const err: string[] = [];
    for (const line of input.split('\n')) {
      const w = line.trim().split(/\s+/);
      if (!w[0]) continue;
      if (w[0] === 'quit') break;
      if (w[0] !== 'test' || w.length !== 3) {
        err.push(`ipset v7.17: Syntax error: unsupported by fake: ${line.trim()}`);
        continue;
      }
      const s = this.sets.get(w[1]);
      if (!s) err.push('ipset v7.17: The set with the given name does not exist');
      else err.push(this.member(s, w[2]) ? `Warning: ${w[2]} is in set ${w[1]}.` : `${w[2]} is NOT in set ${w[1]}.`);
    }
    return { code: 0, stdout: 'ipset> '.repeat(err.length + 1), stderr: err.map((l) => l + '\n').join('') };
  }

  // ---------------------------------------------------------------- ip
  private ip(args: string[], input = ''): RunResult {
    if (args[0] === '-batch') {
      for (const line of input.split('\n')) {
        if (!line.trim()) continue;
        const r = this.ip(line.trim().split(/\s+/));
        if (r.code !== 0) return r;
      }
      return ok();
    }
    const a = args.join(' ');
    let m: RegExpExecArray | null;
    if ((m = /^link show dev (\S+)$/.exec(a))) return this.links.has(m[1]) ? ok(`1: ${m[1]}: <BROADCAST,NOARP>`) : fail(`Device "${m[1]}" does not exist.`);
    if ((m = /^link add (\S+) type dummy$/.exec(a))) {
      if (this.links.has(m[1])) return fail('RTNETLINK answers: File exists', 2);
      this.links.set(m[1], new Set());
      return ok();
    }
    if ((m = /^link del (\S+)$/.exec(a))) {
      if (!this.links.delete(m[1])) return fail('Cannot find device', 1);
      return ok();
    }
    if ((m = /^-o addr show dev (\S+)$/.exec(a))) {
      const addrs = this.links.get(m[1]);
      if (!addrs) return fail(`Device "${m[1]}" does not exist.`);
      return ok([...addrs].map((ip) => `5: ${m![1]}    ${ip.includes(':') ? 'inet6' : 'inet'} ${ip}/${ip.includes(':') ? 128 : 32} scope global ${m![1]}`).join('\n') + '\n');
    }
    if ((m = /^-o addr show dev (\S+) to ([0-9a-f:.]+)\/(\d+)$/.exec(a))) {
      const addrs = this.links.get(m[1]);
      if (!addrs) return fail(`Device "${m[1]}" does not exist.`);
      const ip = m[2];
      return ok(addrs.has(ip) ? `5: ${m[1]}    ${ip.includes(':') ? 'inet6' : 'inet'} ${ip}/${m[3]} scope global ${m[1]}\n` : '');
    }
    if (a === '-o addr show') {
      const out: string[] = [];
      for (const [dev, addrs] of this.links) for (const ip of addrs) out.push(`5: ${dev}    ${ip.includes(':') ? 'inet6' : 'inet'} ${ip}/32 scope global ${dev}`);
      return ok(out.join('\n') + '\n');
    }
    if ((m = /^addr (add|del) ([0-9a-f:.]+)\/\d+ dev (\S+)$/.exec(a))) {
      const addrs = this.links.get(m[3]);
      if (!addrs) return fail('Cannot find device');
      if (m[1] === 'add') {
        if (addrs.has(m[2])) return fail('RTNETLINK answers: File exists', 2);
        addrs.add(m[2]);
      } else if (!addrs.delete(m[2])) return fail('RTNETLINK answers: Cannot assign requested address', 2);
      return ok();
    }
    return fail(`ip ${a}: not modelled`);
  }

  // ---------------------------------------------------------------- iptables
  /** chains of ours still present in a family (for residue checks) */
  kubeChains(fam: '4' | '6'): string[] {
    const out: string[] = [];
    for (const [t, chains] of this.ipt[fam].tables) for (const c of chains.keys()) if (c.startsWith('KUBE-')) out.push(`${t}/${c}`);
    return out;
  }

  jumpsInBuiltins(fam: '4' | '6'): string[] {
    const out: string[] = [];
    for (const [t, chains] of this.ipt[fam].tables) {
      for (const b of BUILTIN_CHAINS[t]) for (const r of chains.get(b) ?? []) if (/-j KUBE-/.test(r)) out.push(`${t}/-A ${b} ${r}`);
    }
    return out;
  }

  // ---------------------------------------------------------------- modules, sysctl
  moduleFS(): ModuleFS {
    return {
      readFile: async (p) => (p === '/proc/modules' ? [...this.loadedModules].map((m) => `${m} 16384 0 - Live 0x0`).join('\n') + '\n' : p.endsWith('modules.builtin') ? 'kernel/net/netfilter/nf_conntrack_builtin_fake.ko\n' : null),
      exists: async () => false,
      release: () => '6.1.0-fake',
    };
  }

  sysctl(): Sysctl {
    return {
      get: async (n) => this.sysctls.get(n) ?? null,
      set: async (n, v) => {
        this.sysctls.set(n, v);
      },
    };
  }
}
