// The controller on a dual-stack node: one tracker and one proxier per IP
// family, as upstream's metaproxier. Each family's proxier sees only its family's Service
// ports; a family that fails does not stop the other; a family whose tools are missing is
// reported once (KPROXY_FAMILY_UNAVAILABLE) and the other keeps working. No kernel: fake
// source, fake proxiers.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pino from 'pino';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyController, chooseFamilies, familySectionMarker } from '../../src/sync/controller.ts';
import { startServers } from '../../src/server/servers.ts';
import type { ModeDeps, ModeModule, Proxier } from '../../src/modes/types.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import type { Source, SourceHandler } from '../../src/sources/types.ts';
import { type CommandRunner, ExecError } from '../../src/kernel/runner.ts';
import { waitFor } from '../support/wait.ts';
import { makeService, makeSlice } from '../support/builders.ts';

/* eslint-disable @typescript-eslint/no-explicit-any */
const dualSvc = (name: string, v4: string, v6: string) =>
  makeService('ns1', name, { clusterIP: v4, clusterIPs: [v4, v6], ipFamilies: ['IPv4', 'IPv6'], ports: [{ name: 'http', port: 80 }] });
const slice = (svc: string, type: 'IPv4' | 'IPv6', ip: string) =>
  makeSlice('ns1', svc, { name: `${svc}-${type.toLowerCase()}`, family: type === 'IPv6' ? 6 : 4, endpoints: [{ ip }], ports: [{ name: 'http', port: 8080 }] });

class FakeProxier implements Proxier {
  inputs: PlanInput[] = [];
  fulls: boolean[] = [];
  failWith: Error | null = null;
  constructor(readonly family: 4 | 6) {}
  async sync(input: PlanInput, _changed: Set<string>, full: boolean) {
    this.inputs.push(input);
    this.fulls.push(full);
    if (this.failWith) throw this.failWith;
    return { rulesWritten: input.state.services.size, rulesTotal: input.state.services.size, diff: `IPv${this.family} synced` };
  }
  dump() {
    return `rules of IPv${this.family}\n`;
  }
  async stop() {}
  lastPorts(): string[] {
    const i = this.inputs[this.inputs.length - 1];
    return i ? [...i.state.services.values()].map((p) => `${p.clusterIP}`) : [];
  }
}

interface Rig {
  ctrl: ProxyController;
  handler: () => SourceHandler;
  proxiers: Map<4 | 6, FakeProxier>;
  created: Array<4 | 6 | undefined>;
  logs: any[];
  close(): Promise<void>;
}

async function rig(opts: { missing?: 4 | 6; nodeIPs?: string[]; ipv6Disabled?: boolean } = {}): Promise<Rig> {
  let handler: SourceHandler | null = null;
  const source: Source = {
    start: async (h) => {
      handler = h;
    },
    stop: async () => {},
    health: () => ({ synced: true, connected: true, lastContactMs: Date.now() }),
  };
  const proxiers = new Map<4 | 6, FakeProxier>();
  const created: Array<4 | 6 | undefined> = [];
  const mode: ModeModule = {
    name: 'iptables',
    render: () => '',
    cleanup: async () => {},
    createProxier: async (deps: ModeDeps) => {
      created.push(deps.family);
      const family = deps.family ?? 4;
      if (family === opts.missing) throw new ExecError('KPROXY_EXEC_MISSING', `${family === 6 ? 'ip6tables' : 'iptables'}-restore not found; install the iptables package`);
      const p = new FakeProxier(family);
      proxiers.set(family, p);
      return p;
    },
  };
  const logs: any[] = [];
  const log = pino({ level: 'info' }, { write: (s: string) => void logs.push(JSON.parse(s)) });
  const runner = {
    run: async (cmd: string, args: string[]) =>
      cmd === 'sysctl' && args.includes('net.ipv6.conf.all.disable_ipv6') && opts.ipv6Disabled ? { code: 0, stdout: '1\n', stderr: '' } : { code: 0, stdout: '0\n', stderr: '' },
  } as unknown as CommandRunner;
  const config = { ...resolveConfig({ mode: 'iptables' }), minSyncPeriodMs: 5 };
  const ips = opts.nodeIPs ?? ['192.168.0.2', 'fd00::2'];
  const ctrl = new ProxyController({
    config, nodeName: 'node-a', mode, allModes: { iptables: mode } as any, source, sourceName: 'test', runner, log,
    skipCleanup: true, nodeIPs: () => ips, healthTimeoutMs: 60_000, backoffInitialMs: 20, backoffMaxMs: 50,
  });
  await ctrl.start();
  return { ctrl, handler: () => handler!, proxiers, created, logs, close: () => ctrl.stop() };
}

test('chooseFamilies: primary from the bind address or the node IPs; the other family when the node has it', () => {
  const cfg = resolveConfig({ mode: 'iptables' });
  assert.deepEqual(chooseFamilies(cfg, (f) => (f === 4 ? ['192.168.0.2'] : [])), [4]);
  assert.deepEqual(chooseFamilies(cfg, (f) => (f === 6 ? ['fd00::2'] : [])), [6]);
  assert.deepEqual(chooseFamilies(cfg, () => ['192.168.0.2', 'fd00::2']), [4, 6]);
  assert.deepEqual(chooseFamilies(cfg, () => []), [4], 'no address at all: IPv4, as upstream');
  assert.deepEqual(chooseFamilies({ ...cfg, bindAddress: '::' }, () => ['192.168.0.2', 'fd00::2']), [6, 4]);
  assert.deepEqual(chooseFamilies({ ...cfg, bindAddress: 'fd00::2' }, () => ['fd00::2']), [6]);
  assert.deepEqual(chooseFamilies({ ...cfg, clusterCIDRs: ['10.0.0.0/8', 'fd00:10::/64'] }, (f) => (f === 4 ? ['192.168.0.2'] : [])), [4, 6], 'a dual-stack clusterCIDR asks for both');
});

test('dual-stack: one proxier per family, each planned from its own family only', async () => {
  const r = await rig();
  try {
    assert.deepEqual(r.created, [4, 6]);
    assert.deepEqual(r.ctrl.families.map((f) => f.family), [4, 6]);
    const h = r.handler();
    h.onService(null, dualSvc('web', '172.30.0.10', 'fd00:172:30::10'));
    h.onEndpointSlice(null, slice('web', 'IPv4', '10.180.0.1'));
    h.onEndpointSlice(null, slice('web', 'IPv6', 'fd00:10:180::1'));
    h.onSynced();
    const p4 = r.proxiers.get(4)!;
    const p6 = r.proxiers.get(6)!;
    await waitFor('both families synced', () => r.ctrl.history.some((x) => x.ok), 20_000);
    assert.deepEqual(p4.lastPorts(), ['172.30.0.10']);
    assert.deepEqual(p6.lastPorts(), ['fd00:172:30::10']);
    const in4 = p4.inputs[p4.inputs.length - 1];
    const in6 = p6.inputs[p6.inputs.length - 1];
    assert.equal(in4.node.family, 4);
    assert.equal(in6.node.family, 6);
    assert.deepEqual(in4.node.nodeIPs, ['192.168.0.2'], 'each family gets only its own node IPs');
    assert.deepEqual(in6.node.nodeIPs, ['fd00::2']);
    assert.deepEqual([...in6.state.endpoints.values()].flat().map((e: any) => e.ip), ['fd00:10:180::1']);
    const rec = r.ctrl.history.find((x) => x.ok)!;
    assert.deepEqual(rec.families!.map((f) => [f.family, f.ok]), [[4, true], [6, true]]);
    assert.equal(rec.stats!.rulesTotal, 2, 'stats add up over the families');
    // /debug/rules: both families, IPv4 first, each behind its marker
    const dump = r.ctrl.dumpRules();
    assert.equal(dump, `${familySectionMarker(4)}\nrules of IPv4\n${familySectionMarker(6)}\nrules of IPv6\n`);
  } finally {
    await r.close();
  }
});

test('dual-stack: a failing family does not stop the other; its retry is a full sync; health waits for both', async () => {
  const r = await rig();
  try {
    const h = r.handler();
    h.onService(null, dualSvc('web', '172.30.0.10', 'fd00:172:30::10'));
    h.onSynced();
    await waitFor('first sync', () => r.ctrl.history.some((x) => x.ok), 20_000);
    const p4 = r.proxiers.get(4)!;
    const p6 = r.proxiers.get(6)!;
    p6.failWith = Object.assign(new Error('KPROXY_TEST: ip6tables-restore failed'), { code: 'KPROXY_TEST' });
    const lastOk = r.ctrl.health.verdict().lastUpdated;
    h.onService(null, dualSvc('api', '172.30.0.11', 'fd00:172:30::11'));
    await waitFor('IPv4 synced the new Service while IPv6 fails', () => p4.lastPorts().includes('172.30.0.11') && r.ctrl.loop.status.failures >= 2, 20_000);
    const failed = r.ctrl.history.filter((x) => !x.ok);
    assert.ok(failed.length >= 2);
    assert.match(failed[0].error!, /^IPv6: KPROXY_TEST: ip6tables-restore failed$/, 'the error names the family');
    assert.deepEqual(failed[0].families!.map((f) => [f.family, f.ok]), [[4, true], [6, false]]);
    assert.equal(r.ctrl.health.verdict().lastUpdated, lastOk, 'not up to date while one family waits');
    assert.ok(r.ctrl.health.verdict().oldestPendingQueued > 0, 'the IPv6 update still counts as pending');
    const retries6 = p6.fulls.slice(p6.fulls.length - (failed.length - 1));
    assert.ok(retries6.every((f) => f), `IPv6 retries are full syncs: ${p6.fulls}`);
    // IPv6 recovers: it gets the Service it missed, and the health clears
    p6.failWith = null;
    await waitFor('IPv6 catches up', () => p6.lastPorts().includes('fd00:172:30::11') && r.ctrl.history[r.ctrl.history.length - 1].ok, 20_000);
    assert.equal(r.ctrl.health.verdict().oldestPendingQueued, 0);
    assert.ok(r.ctrl.health.verdict().lastUpdated > lastOk);
  } finally {
    await r.close();
  }
});

test('a family whose tools are missing is reported once with KPROXY_FAMILY_UNAVAILABLE; the other keeps working', async () => {
  const r = await rig({ missing: 6 });
  try {
    assert.deepEqual(r.ctrl.families.map((f) => f.family), [4]);
    assert.deepEqual(r.ctrl.unavailableFamilies.map((u) => u.family), [6]);
    const h = r.handler();
    h.onService(null, dualSvc('web', '172.30.0.10', 'fd00:172:30::10'));
    h.onSynced();
    await waitFor('IPv4 synced', () => r.ctrl.history.some((x) => x.ok), 20_000);
    h.onService(null, dualSvc('api', '172.30.0.11', 'fd00:172:30::11'));
    await waitFor('IPv4 synced again', () => r.proxiers.get(4)!.lastPorts().includes('172.30.0.11'), 20_000);
    const reports = r.logs.filter((l) => /KPROXY_FAMILY_UNAVAILABLE/.test(l.msg));
    assert.equal(reports.length, 1, 'reported once, not per sync');
    assert.match(reports[0].msg, /^KPROXY_FAMILY_UNAVAILABLE: IPv6 is not served in iptables mode \(KPROXY_EXEC_MISSING: ip6tables-restore not found; install the iptables package\); IPv4 keeps working/);
    assert.equal(r.ctrl.dumpRules(), 'rules of IPv4\n', 'one family: its rules as they are, no marker');
    assert.ok(r.ctrl.history.every((x) => x.ok));
  } finally {
    await r.close();
  }
});

test('the primary family missing: the secondary runs alone; both missing: start fails with the tool error', async () => {
  const r = await rig({ missing: 4 });
  try {
    assert.deepEqual(r.ctrl.families.map((f) => f.family), [6]);
    assert.equal(r.ctrl.tracker, r.ctrl.families[0].tracker, 'the running family validates and reports');
  } finally {
    await r.close();
  }
  await assert.rejects(rig({ missing: 4, nodeIPs: ['192.168.0.2'] }), /KPROXY_EXEC_MISSING: iptables-restore not found/);
});

test('/debug/state and /debug/health show both families', async () => {
  const r = await rig();
  const log = pino({ level: 'silent' });
  const source: Source = { start: async () => {}, stop: async () => {}, health: () => ({ synced: true, connected: true, lastContactMs: Date.now() }) };
  const servers = await startServers({ ctrl: r.ctrl, source, mode: 'iptables', log }, '', '127.0.0.1:0');
  try {
    const h = r.handler();
    h.onService(null, dualSvc('web', '172.30.0.10', 'fd00:172:30::10'));
    h.onSynced();
    await waitFor('synced', () => r.ctrl.history.some((x) => x.ok), 20_000);
    const get = async (path: string) => (await fetch(`http://127.0.0.1:${servers.ports.metrics}${path}`, { signal: AbortSignal.timeout(10_000) })).text();
    const state = JSON.parse(await get('/debug/state'));
    assert.deepEqual(state.families.map((f: any) => [f.family, Object.values(f.services).map((p: any) => p.clusterIP)]), [
      ['IPv4', ['172.30.0.10']],
      ['IPv6', ['fd00:172:30::10']],
    ]);
    const rules = await get('/debug/rules');
    assert.match(rules, /# ==== kproxy IPv4 ====\nrules of IPv4\n# ==== kproxy IPv6 ====\nrules of IPv6\n/);
    const health = JSON.parse(await get('/debug/health'));
    assert.deepEqual(health.families, ['IPv4', 'IPv6']);
  } finally {
    await servers.close();
    await r.close();
  }
});

test('IPv6 disabled in the kernel: IPv6 reported unavailable once, no IPv6 proxier, IPv4 runs', async () => {
  const r = await rig({ ipv6Disabled: true });
  try {
    assert.deepEqual(r.created, [4], 'no IPv6 proxier is even created');
    assert.deepEqual(r.ctrl.families.map((f) => f.family), [4]);
    const reports = r.logs.filter((l) => /KPROXY_FAMILY_UNAVAILABLE/.test(l.msg));
    assert.equal(reports.length, 1);
    assert.match(reports[0].msg, /IPv6 is not served in iptables mode \(IPv6 is disabled in the kernel \(net\.ipv6\.conf\.all\.disable_ipv6 = 1\)\)/);
  } finally {
    await r.close();
  }
});
