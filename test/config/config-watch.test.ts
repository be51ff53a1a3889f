// As upstream kube-proxy: a running `kproxy --config=F` exits (status 1, "content of the proxy
// server's configuration file was updated") when F changes, so that its pod restarts with the
// new configuration; rewriting the same bytes does not restart it. Runs kproxy in the
// userspace mode on an empty --manifests directory with its servers on loopback: no root and
// no kernel state needed.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, mkdirSync, writeFileSync, renameSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { repoRoot } from '../support/netns.ts';
import { waitFor } from '../support/wait.ts';
import { watchConfigFile, CONFIG_CHANGED_MESSAGE } from '../../src/cli/config-watch.ts';

const dir = mkdtempSync(join(tmpdir(), 'kpt-cfgwatch-'));
const procs: ChildProcess[] = [];

after(() => {
  for (const p of procs) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});

function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const s = createServer();
    s.once('error', rej);
    s.listen(0, '127.0.0.1', () => {
      const a = s.address();
      s.close(() => res(typeof a === 'object' && a ? a.port : 0));
    });
  });
}

async function configText(extra = ''): Promise<string> {
  const [h, m] = [await freePort(), await freePort()];
  return [
    'apiVersion: kubeproxy.config.k8s.io/v1alpha1',
    'kind: KubeProxyConfiguration',
    'mode: userspace',
    `healthzBindAddress: 127.0.0.1:${h}`,
    `metricsBindAddress: 127.0.0.1:${m}`,
    'oomScoreAdj: 0',
    extra,
  ].join('\n');
}

interface Running {
  proc: ChildProcess;
  out: () => string;
  exited: Promise<number | null>;
}

/** `node bin/kproxy.js --config=F --manifests=D --hostname-override=node-a`: the bare command line. */
async function startKproxy(name: string, text: string): Promise<{ run: Running; file: string }> {
  const file = join(dir, `${name}.conf`);
  const manifests = join(dir, `${name}-manifests`);
  mkdirSync(manifests);
  writeFileSync(file, text);
  let out = '';
  const proc = spawn(process.execPath, [join(repoRoot, 'bin/kproxy.js'), `--config=${file}`, `--manifests=${manifests}`, '--hostname-override=node-a'], {
    cwd: repoRoot,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  procs.push(proc);
  proc.stdout!.on('data', (d) => (out += d));
  proc.stderr!.on('data', (d) => (out += d));
  const exited = new Promise<number | null>((res) => proc.on('exit', (code) => res(code)));
  const run = { proc, out: () => out, exited };
  const port = /healthzBindAddress: 127\.0\.0\.1:(\d+)/.exec(text)![1];
  await waitFor('kproxy serving /healthz', async () => {
    if (proc.exitCode !== null) throw new Error(`kproxy exited early (${proc.exitCode}):\n${out}`);
    try {
      const r = await fetch(`http://127.0.0.1:${port}/healthz`, { signal: AbortSignal.timeout(2000) });
      return r.status === 200;
    } catch {
      return false;
    }
  }, 60_000, 200).catch((e) => assert.fail(`${(e as Error).message}\n${out}`));
  return { run, file };
}

async function exitWithin(run: Running, ms: number): Promise<number | null> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<'timeout'>((res) => (timer = setTimeout(() => res('timeout'), ms)));
  const r = await Promise.race([run.exited, timeout]);
  clearTimeout(timer);
  if (r === 'timeout') assert.fail(`kproxy did not exit within ${ms} ms of the config change:\n${run.out()}`);
  return r;
}

test('a changed --config file ends kproxy with status 1 and upstream\'s message; the same bytes do not', async () => {
  const text = await configText();
  const { run, file } = await startKproxy('edit', text);
  // the same content again (a touch, an unchanged ConfigMap sync): kproxy keeps running
  writeFileSync(file, text);
  await new Promise((r) => setTimeout(r, 3000));
  assert.equal(run.proc.exitCode, null, `kproxy must keep running after a rewrite with the same bytes:\n${run.out()}`);
  writeFileSync(file, text + '\nclusterCIDR: 10.0.0.0/8\n');
  assert.equal(await exitWithin(run, 20_000), 1);
  // the last lines may still be in the pipe when the exit is seen
  await waitFor('upstream\'s message', () => run.out().includes(CONFIG_CHANGED_MESSAGE), 10_000).catch(() => assert.fail(run.out()));
});

test('a ConfigMap-style replace (rename over the file) ends kproxy too', async () => {
  const { run, file } = await startKproxy('rename', await configText());
  const next = join(dir, 'rename.next');
  writeFileSync(next, await configText('clusterCIDR: 10.0.0.0/8'));
  renameSync(next, file);
  assert.equal(await exitWithin(run, 20_000), 1);
  // the last lines may still be in the pipe when the exit is seen
  await waitFor('upstream\'s message', () => run.out().includes(CONFIG_CHANGED_MESSAGE), 10_000).catch(() => assert.fail(run.out()));
});

test('watchConfigFile: fires once on a change, never on the same content, and stops', async () => {
  const f = join(dir, 'unit.conf');
  writeFileSync(f, 'a: 1\n');
  let fired = 0;
  const stop = watchConfigFile(f, () => fired++, 50);
  try {
    writeFileSync(f, 'a: 1\n');
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(fired, 0);
    writeFileSync(f, 'a: 2\n');
    await waitFor('the change is seen', () => fired === 1, 10_000, 20);
    writeFileSync(f, 'a: 3\n');
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(fired, 1, 'once');
  } finally {
    stop();
  }
});
