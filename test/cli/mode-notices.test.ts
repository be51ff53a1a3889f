// KEP-5495 (the IPVS deprecation warning and Event) and KEP-5343 (the warning when the mode
// falls back to the default): the log line, and the events.k8s.io/v1 Event the real
// @kubernetes/client-node client posts to an API server (a local HTTP server that records the
// request).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { hostname } from 'node:os';
import { KubeConfig } from '@kubernetes/client-node';
import { resolveConfig } from '../../src/config/config.ts';
import { parseFlags, proxyInvocation } from '../../src/cli/flags.ts';
import { announceModeNotices } from '../../src/cli/mode-announce.ts';
import { createNodeEventRecorder, nodeEvent, type NodeEventRecorder } from '../../src/sources/k8s-events.ts';
import { createLogger, silentLogger } from '../../src/log.ts';

const IPVS_MSG = "The ipvs proxier has been deprecated and will be disabled by default in Kubernetes 1.40 and removed in Kubernetes 1.43. Migrate to the 'nftables' proxier instead.";

function captureLog(): { log: ReturnType<typeof createLogger>; lines: Array<Record<string, unknown>> } {
  const lines: Array<Record<string, unknown>> = [];
  const log = createLogger({ level: 'info', dest: { write: (s: string) => lines.push(JSON.parse(s) as Record<string, unknown>) } });
  return { log, lines };
}

function recordingRecorder(): { rec: NodeEventRecorder; calls: string[][] } {
  const calls: string[][] = [];
  return { rec: { eventf: async (...a) => void calls.push(a) }, calls };
}

interface Captured { method: string; url: string; body: Record<string, any> } // eslint-disable-line @typescript-eslint/no-explicit-any

async function eventSink(): Promise<{ url: string; requests: Captured[]; close: () => Promise<void> }> {
  const requests: Captured[] = [];
  const server = http.createServer((req, res) => {
    let data = '';
    req.on('data', (c) => (data += c));
    req.on('end', () => {
      const body = data ? JSON.parse(data) : {};
      requests.push({ method: req.method ?? '', url: req.url ?? '', body });
      res.writeHead(201, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return { url, requests, close: () => new Promise<void>((r) => server.close(() => r())) };
}

function kubeConfigFor(server: string): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: 'c', server, skipTLSVerify: true }],
    users: [{ name: 'u', token: 'tok' }],
    contexts: [{ name: 'x', cluster: 'c', user: 'u' }],
    currentContext: 'x',
  });
  return kc;
}

test('ipvs mode: a warning line and a Warning Event IPVSDeprecation/StartKubeProxy on the Node', async () => {
  const { log, lines } = captureLog();
  const { rec, calls } = recordingRecorder();
  await announceModeNotices(resolveConfig({ mode: 'ipvs' }), log, rec);
  const warns = lines.filter((l) => l.level === 40);
  assert.deepEqual(warns.map((l) => l.msg), [IPVS_MSG]);
  assert.deepEqual(calls, [['Warning', 'IPVSDeprecation', 'StartKubeProxy', IPVS_MSG]]);
});

test('iptables, nftables and userspace set explicitly: no notice, no Event', async () => {
  for (const mode of ['iptables', 'nftables', 'userspace']) {
    const { log, lines } = captureLog();
    const { rec, calls } = recordingRecorder();
    await announceModeNotices(resolveConfig({ mode }), log, rec);
    assert.deepEqual(lines.filter((l) => (l.level as number) >= 40), [], mode);
    assert.deepEqual(calls, [], mode);
  }
});

test('the manifests source (no recorder): the log line alone', async () => {
  const { log, lines } = captureLog();
  await announceModeNotices(resolveConfig({ mode: 'ipvs' }), log, undefined);
  assert.deepEqual(lines.filter((l) => l.level === 40).map((l) => l.msg), [IPVS_MSG]);
});

test('an unset mode falls back to iptables with the KEP-5343 warning; a mode set anywhere does not', async () => {
  const { log, lines } = captureLog();
  const { rec, calls } = recordingRecorder();
  const cfg = resolveConfig({});
  assert.equal(cfg.mode, 'iptables');
  assert.equal(cfg.modeDefaulted, true);
  await announceModeNotices(cfg, log, rec);
  const warn = lines.filter((l) => l.level === 40);
  assert.equal(warn.length, 1);
  assert.match(String(warn[0]!.msg), /default will change to 'nftables' in Kubernetes 1\.40/);
  assert.deepEqual(calls.map((c) => c.slice(0, 3)), [['Warning', 'ProxyModeDefaulted', 'StartKubeProxy']]);

  // upstream's condition is the mode after flags and the file: blank ("") counts as unset
  assert.equal(resolveConfig({ mode: '' }).modeDefaulted, true);
  assert.equal(resolveConfig({ mode: 'iptables' }).modeDefaulted, false);
  assert.equal(resolveConfig({}, { mode: 'iptables' }).modeDefaulted, false);
  // kube-proxy's command line: no flag and no file → defaulted; --proxy-mode → not; a --config
  // file without mode → defaulted (the file replaces --proxy-mode, as upstream); with mode → not
  assert.equal(proxyInvocation(parseFlags([]), undefined).cfg.modeDefaulted, true);
  assert.equal(proxyInvocation(parseFlags(['--proxy-mode=iptables']), undefined).cfg.modeDefaulted, false);
  assert.equal(proxyInvocation(parseFlags(['--proxy-mode=iptables']), { kind: 'KubeProxyConfiguration' }).cfg.modeDefaulted, true);
  assert.equal(proxyInvocation(parseFlags([]), { mode: 'nftables' }).cfg.modeDefaulted, false);
});

test('the Event upstream\'s recorder builds: name, namespace, reporting controller and instance, regarding the Node', () => {
  const now = new Date(Date.UTC(2026, 0, 2, 3, 4, 5, 678));
  const ev = nodeEvent('node-a', 'Warning', 'IPVSDeprecation', 'StartKubeProxy', IPVS_MSG, now, 'host-1');
  assert.equal(ev.metadata?.name, `node-a.${(BigInt(now.getTime()) * 1_000_000n).toString(16)}`);
  assert.equal(ev.metadata?.namespace, 'default');
  assert.equal(ev.reportingController, 'kube-proxy');
  assert.equal(ev.reportingInstance, 'kube-proxy-host-1');
  assert.deepEqual(ev.regarding, { apiVersion: 'v1', kind: 'Node', name: 'node-a' });
  assert.equal(ev.type, 'Warning');
  assert.equal(ev.note, IPVS_MSG);
  // client-go clips a note over 1024 bytes to 1021 + "..."
  assert.equal(Buffer.byteLength(nodeEvent('n', 'Warning', 'r', 'a', 'x'.repeat(2000), now, 'h').note!), 1024);
});

test('the recorder posts the Event to events.k8s.io/v1 in namespace default through client-node', async (t) => {
  const sink = await eventSink();
  t.after(() => sink.close());
  const rec = createNodeEventRecorder(kubeConfigFor(sink.url), 'node-a', silentLogger());
  const { log } = captureLog();
  await announceModeNotices(resolveConfig({ mode: 'ipvs' }), log, rec);
  assert.equal(sink.requests.length, 1);
  const r = sink.requests[0]!;
  assert.equal(r.method, 'POST');
  assert.equal(r.url.split('?')[0], '/apis/events.k8s.io/v1/namespaces/default/events');
  assert.equal(r.body.apiVersion, 'events.k8s.io/v1');
  assert.equal(r.body.kind, 'Event');
  assert.equal(r.body.type, 'Warning');
  assert.equal(r.body.reason, 'IPVSDeprecation');
  assert.equal(r.body.action, 'StartKubeProxy');
  assert.equal(r.body.note, IPVS_MSG);
  assert.equal(r.body.reportingController, 'kube-proxy');
  assert.equal(r.body.reportingInstance, `kube-proxy-${hostname()}`);
  assert.deepEqual(r.body.regarding, { apiVersion: 'v1', kind: 'Node', name: 'node-a' });
  assert.match(r.body.metadata.name, /^node-a\.[0-9a-f]+$/);
  // MicroTime: RFC 3339 with microseconds
  assert.match(r.body.eventTime, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/);
});

test('an API server that refuses the Event: logged, never thrown', async (t) => {
  const server = http.createServer((_req, res) => { res.writeHead(403, { 'content-type': 'application/json' }); res.end('{"kind":"Status","code":403}'); });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.after(() => new Promise<void>((r) => server.close(() => r())));
  const { log, lines } = captureLog();
  const rec = createNodeEventRecorder(kubeConfigFor(`http://127.0.0.1:${(server.address() as AddressInfo).port}`), 'node-a', log);
  await rec.eventf('Warning', 'IPVSDeprecation', 'StartKubeProxy', IPVS_MSG);
  assert.ok(lines.some((l) => l.msg === 'Server rejected event (will not retry!)' && l.reason === 'IPVSDeprecation'));
});

test('kproxy started without a mode, in a namespace of its own: the warning in its log; with --proxy-mode=iptables none', async (t) => {
  const { Netns, uniqueName, waitFor } = await import('../support/netns.ts');
  const { mkdtempSync, rmSync, cpSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const { join } = await import('node:path');
  const ns = Netns.create(uniqueName('kpt-modew'));
  const dir = mkdtempSync(join(tmpdir(), 'kp-modew-'));
  t.after(async () => {
    await ns.destroy();
    rmSync(dir, { recursive: true, force: true });
  });
  cpSync(join(import.meta.dirname, '../../examples/manifests'), join(dir, 'm'), { recursive: true });
  const start = async (extra: string[]) => {
    let log = '';
    const p = ns.kproxy(['--manifests', join(dir, 'm'), '--manifests-state', join(dir, 'state.json'), '--hostname-override=node-a',
      '--healthz-bind-address=127.0.0.1:10256', '--metrics-bind-address=127.0.0.1:10249', ...extra], (s) => (log += s));
    try {
      await waitFor('kproxy synced', () => log.includes('"msg":"synced"'), 30_000, 100).catch((e) => assert.fail(`${e.message}\n${log}`));
    } finally {
      await ns.kill(p);
    }
    return log.split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>);
  };
  const defaulted = await start([]);
  const w = defaulted.filter((l) => l.reason === 'ProxyModeDefaulted');
  assert.equal(w.length, 1, JSON.stringify(defaulted));
  assert.equal(w[0]!.level, 40);
  assert.equal(w[0]!.mode, 'iptables');
  const explicit = await start(['--proxy-mode=iptables']);
  assert.ok(explicit.some((l) => l.msg === 'synced'));
  assert.deepEqual(explicit.filter((l) => l.reason === 'ProxyModeDefaulted' || l.level === 40 && /default/i.test(String(l.msg))), []);
});
