// The catalogue of KPROXY_* codes (src/errors.ts) against the sources, the tests and the docs:
// every code written in src/ is catalogued, every entry is used and has a meaning, every code
// is exercised by a test (the table below triggers those no other test names), and
// docs/troubleshooting.md's "Error codes" section is the catalogue (`npm run docs:gen` writes it).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { Writable } from 'node:stream';
import pino from 'pino';
import { ENV_VARS, ERROR_CODES, errorCode, type ErrorCode } from '../src/errors.ts';
import { ERRORS_BEGIN, ERRORS_END, TROUBLESHOOTING, withErrorCodes } from '../scripts/gen-docs.ts';
import type { CommandRunner, RunResult } from '../src/kernel/runner.ts';
import { runChecked } from '../src/kernel/runner.ts';
import { IPSetExec } from '../src/kernel/ipset/exec.ts';
import { Links } from '../src/kernel/links.ts';
import { procSysctl } from '../src/kernel/sysctl.ts';
import { IptablesExecutor } from '../src/kernel/iptables/exec.ts';
import { cleanupAll } from '../src/cli/cleanup.ts';
import { createSource } from '../src/cli/run.ts';
import { defaultManifests } from '../src/cli/demo.ts';
import { renderCommand } from '../src/cli/render.ts';
import { statusCommand } from '../src/cli/status.ts';
import { parseTarget, traceCommand } from '../src/cli/trace.ts';
import { resolveConfig } from '../src/config/config.ts';
import { parseNftText } from '../src/modes/nftables/parse.ts';
import { addElement, newRuleset } from '../src/modes/nftables/ruleset.ts';
import { loadTracer } from '../src/modes/iptables/tracer-link.ts';
import { modes } from '../src/modes/registry.ts';
import { mode as userspaceMode } from '../src/modes/userspace/index.ts';
import { UserspaceProxier } from '../src/modes/userspace/proxier.ts';
import { silentLogger, type Logger } from '../src/log.ts';
import { KubeConfig } from '@kubernetes/client-node';
import { ResilientInformer, resolveBackoff } from '../src/sources/k8s-informer.ts';
import { NftProxier } from '../src/modes/nftables/proxier.ts';
import { FakeNft } from '../src/kernel/nft/fake.ts';
import { planInput, slice, svc, testConfig } from './userspace/helpers.ts';

const root = resolve(import.meta.dirname, '..');
const CODE_RE = /\bKPROXY_[A-Z0-9_]+\b/g;

function files(dir: string, ext: RegExp): string[] {
  return readdirSync(dir).flatMap((e) => {
    const p = join(dir, e);
    return statSync(p).isDirectory() ? files(p, ext) : ext.test(p) ? [p] : [];
  });
}

function codesIn(paths: string[]): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const f of paths) {
    for (const m of readFileSync(f, 'utf8').matchAll(CODE_RE)) {
      const where = out.get(m[0]) ?? [];
      if (!where.includes(f)) where.push(f);
      out.set(m[0], where);
    }
  }
  return out;
}

const catalogue = new Set(Object.keys(ERROR_CODES));
const envVars = new Set(Object.keys(ENV_VARS));
const srcFiles = files(join(root, 'src'), /\.ts$/).filter((f) => !f.endsWith(join('src', 'errors.ts')));
const thisFile = join(root, 'test', 'errors.test.ts');
const testFiles = files(join(root, 'test'), /\.(ts|sh|json)$/).filter((f) => f !== thisFile);

test('every KPROXY_* name written in src/ is a catalogued code or a documented environment variable', () => {
  const unknown = [...codesIn(srcFiles)].filter(([c]) => !catalogue.has(c) && !envVars.has(c)).map(([c, w]) => `${c} (${w.join(', ')})`);
  assert.deepEqual(unknown, [], 'add these to ERROR_CODES in src/errors.ts');
});

test('every catalogue entry is used in src/ and says what it means', () => {
  const used = codesIn(srcFiles);
  assert.deepEqual([...catalogue].filter((c) => !used.has(c)), [], 'unused codes: delete them from the catalogue');
  for (const [code, meaning] of Object.entries(ERROR_CODES)) {
    assert.match(code, /^KPROXY_[A-Z0-9_]+$/);
    assert.ok(meaning.length >= 20, `${code}: a meaning that says what to do`);
  }
  for (const name of envVars) assert.ok(!catalogue.has(name), `${name} is both a code and an environment variable`);
});

// ---- triggers: codes no other test names, made to happen here -----------------------------

const failing: CommandRunner = { run: async (): Promise<RunResult> => ({ code: 1, stdout: '', stderr: 'operation not permitted' }) };

/** A logger that keeps every line, to assert on coded warnings. */
function capturingLogger(): { log: Logger; lines: () => string } {
  const chunks: string[] = [];
  const sink = new Writable({
    write(chunk, _enc, cb) {
      chunks.push(String(chunk));
      cb();
    },
  });
  return { log: pino({ level: 'debug' }, sink) as unknown as Logger, lines: () => chunks.join('') };
}

async function codeOf(f: () => unknown): Promise<ErrorCode | string | undefined> {
  try {
    await f();
  } catch (e) {
    return errorCode(e) ?? (e as Error).message;
  }
  return undefined;
}

async function loggedCode(code: ErrorCode, f: (log: Logger) => Promise<unknown>): Promise<ErrorCode | undefined> {
  const { log, lines } = capturingLogger();
  await f(log).catch(() => {});
  await new Promise((r) => setImmediate(r));
  return lines().includes(`${code}: `) ? code : undefined;
}

const TRIGGERS: Partial<Record<ErrorCode, () => Promise<ErrorCode | string | undefined>>> = {
  KPROXY_CLEANUP_FAILED: () => codeOf(() => cleanupAll(failing, silentLogger())),
  KPROXY_DEMO_MANIFESTS: () => codeOf(() => defaultManifests(['../../no-such-dir-for-kproxy'])),
  KPROXY_EXEC_FAILED: () => codeOf(() => runChecked(failing, 'true', [])),
  KPROXY_IPTABLES_FAILED: () => codeOf(() => new IptablesExecutor(failing, 4).ensureChain('nat', 'KUBE-SERVICES')),
  KPROXY_IPTABLES_SAVE_FAILED: () => codeOf(() => new IptablesExecutor(failing, 4).save('nat')),
  KPROXY_IPVS_CLEANUP_INCOMPLETE: () => codeOf(() => modes.ipvs.cleanup(failing, silentLogger())),
  KPROXY_IPVS_IPSET_FAILED: () => codeOf(() => new IPSetExec(failing).restore('create KUBE-CLUSTER-IP hash:ip,port')),
  KPROXY_IPVS_LINK_FAILED: () => codeOf(() => new Links(failing).ensureDummy('kube-ipvs0')),
  KPROXY_NFT_INTERNAL: () => codeOf(() => addElement(newRuleset('ip', 'kube-proxy'), 'no-such-set', { key: ['1.2.3.4'] })),
  KPROXY_NFT_PARSE: () => codeOf(() => parseNftText('add bogus ip kube-proxy\n')),
  KPROXY_NO_SOURCE: async () => {
    const saved = process.env.KUBERNETES_SERVICE_HOST;
    delete process.env.KUBERNETES_SERVICE_HOST;
    try {
      return await codeOf(() => createSource({}, resolveConfig({}), 'node-a', silentLogger()));
    } finally {
      if (saved !== undefined) process.env.KUBERNETES_SERVICE_HOST = saved;
    }
  },
  KPROXY_RENDER_INPUT: () => codeOf(() => renderCommand({ mode: 'iptables' })),
  // port 1 on loopback: nothing listens there, so both requests are refused at once
  KPROXY_STATUS_UNREACHABLE: () => codeOf(() => statusCommand({ healthzAddress: '127.0.0.1:1', metricsAddress: '127.0.0.1:1' })),
  KPROXY_SYSCTL_FAILED: () => codeOf(() => procSysctl('/nonexistent-kproxy-sysctl-root').set('net.ipv4.ip_forward', '1')),
  KPROXY_TRACE_BAD_PROTOCOL: async () => {
    const trace = await loadTracer();
    return codeOf(() => trace('*nat\nCOMMIT\n', { sourceIP: '10.0.0.1', protocol: 'ICMP', destIP: '172.30.0.1', destPort: 80 }, { localIPs: [] }));
  },
  KPROXY_TRACE_INPUT: () => codeOf(() => parseTarget('172.30.0.1')),
  KPROXY_TRACE_NO_INPUT: () => codeOf(() => modes.iptables.trace!({ from: '10.0.0.1', to: '172.30.0.1', port: 80, protocol: 'TCP', live: false }, { runner: failing })),
  KPROXY_TRACE_UNSUPPORTED: async () => {
    const m = modes.userspace as { trace?: unknown };
    const saved = m.trace;
    m.trace = undefined;
    try {
      return await codeOf(() => traceCommand({ mode: 'userspace', from: '10.0.0.1', to: '172.30.0.1:80', proto: 'tcp' }));
    } finally {
      m.trace = saved;
    }
  },
  KPROXY_USERSPACE_NO_REDIRECT: () =>
    loggedCode('KPROXY_USERSPACE_NO_REDIRECT', async (log) => {
      // only root probes iptables-restore: look like root whoever runs the test
      const saved = process.env.KPROXY_USERSPACE_REDIRECT;
      const getuid = process.getuid;
      delete process.env.KPROXY_USERSPACE_REDIRECT;
      process.getuid = () => 0;
      try {
        await userspaceMode.createProxier({ config: testConfig(), log, runner: failing });
      } finally {
        process.getuid = getuid;
        if (saved !== undefined) process.env.KPROXY_USERSPACE_REDIRECT = saved;
      }
    }),
  KPROXY_USERSPACE_UNSERVED: () =>
    loggedCode('KPROXY_USERSPACE_UNSERVED', async (log) => {
      // a ClusterIP that is not local and may not be redirected cannot be served
      const p = new UserspaceProxier({ config: testConfig(), log, runner: failing, redirect: false, localAddresses: () => [] });
      try {
        await p.sync(planInput([svc('web', { clusterIP: '172.30.0.41', ports: [{ port: 80 }] }), slice('web', [{ ip: '10.180.0.1' }], [{ port: 8080 }])]), new Set(), true);
      } finally {
        await p.stop();
      }
    }),
  KPROXY_NFT_STALE_CHAINS: () =>
    loggedCode('KPROXY_NFT_STALE_CHAINS', async (log) => {
      // the nft fake, refusing (as a busy kernel) only the transaction deleting retired chains
      const nft = new FakeNft({ refuse: (l) => (l.startsWith('delete chain') ? 'Could not process rule: Device or resource busy' : null) });
      const p = new NftProxier({ runner: nft, log, staleChainDelayMs: 0 });
      const objects = [svc('web', { clusterIP: '172.30.0.41', ports: [{ port: 80 }] }), slice('web', [{ ip: '10.180.0.1' }], [{ port: 8080 }])];
      await p.sync(planInput(objects), new Set(['ns/web']), true);
      await p.sync(planInput([]), new Set(['ns/web']), true);
      await p.sync(planInput([]), new Set(), true);
    }),
  KPROXY_SOURCE_HANDLER_FAILED: () =>
    loggedCode('KPROXY_SOURCE_HANDLER_FAILED', async (log) => {
      // an informer that is running (no API server needed: the event is handed in as the
      // watch would) and whose handler throws
      const inf = new ResilientInformer({
        kc: new KubeConfig(),
        path: '/api/v1/services',
        what: 'services',
        log,
        backoff: resolveBackoff(),
        onChange: () => {
          throw new Error('handler bug');
        },
        onListed: () => {},
      });
      const internals = inf as unknown as { stopped: boolean; onAddOrUpdate(o: unknown): void };
      internals.stopped = false;
      internals.onAddOrUpdate(svc('web', { clusterIP: '172.30.0.41', ports: [{ port: 80 }] }));
      internals.stopped = true;
    }),
  KPROXY_USERSPACE_BIND: async () => {
    // the planner believes 203.0.113.41 is local, the kernel knows it is not: EADDRNOTAVAIL
    const p = new UserspaceProxier({ config: testConfig(), log: silentLogger(), runner: failing, redirect: false, localAddresses: () => ['203.0.113.41'] });
    try {
      return await codeOf(() =>
        p.sync(planInput([svc('web', { clusterIP: '203.0.113.41', ports: [{ port: 80 }] }), slice('web', [{ ip: '10.180.0.1' }], [{ port: 8080 }])]), new Set(), true),
      );
    } finally {
      await p.stop();
    }
  },
};

for (const [code, trigger] of Object.entries(TRIGGERS)) {
  test(`${code} is what a user meets when it happens`, async () => {
    assert.equal(await trigger!(), code);
  });
}

test('every catalogued code is exercised by a test', () => {
  const named = codesIn(testFiles);
  const untested = [...catalogue].filter((c) => !named.has(c) && !(c in TRIGGERS));
  assert.deepEqual(untested, [], 'add a trigger to TRIGGERS in test/errors.test.ts or a test that meets the code');
});

// ---- docs/troubleshooting.md -----------------------------------------------------------------

test("docs/troubleshooting.md's Error codes section is the catalogue", () => {
  const text = readFileSync(TROUBLESHOOTING, 'utf8');
  assert.ok(text.includes(ERRORS_BEGIN) && text.includes(ERRORS_END), 'docs/troubleshooting.md needs the generated Error codes section between its markers');
  assert.equal(withErrorCodes(text), text, 'docs/troubleshooting.md is out of date: run npm run docs:gen');
  for (const code of Object.keys(ERROR_CODES)) assert.ok(text.includes(`| \`${code}\` |`), `${code} has a row`);
});
