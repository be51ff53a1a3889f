// The real CLI against the test API server on 127.0.0.1 (no kernel state: userspace mode, no
// Services, health and metrics servers off): a kubeconfig pointing at a wrong port plus
// --master pointing at the right one syncs; --logging-format=text writes klog-like lines.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { TestApiServer, tempDir } from '../support/apiserver.ts';
import { node } from '../sources/k8s-fixtures.ts';

const repoRoot = resolve(fileURLToPath(import.meta.url), '../../..');
const tmp = tempDir('kpt-master-cli-');
after(() => tmp.cleanup());

test('kproxy --kubeconfig (wrong port) --master (right one) --logging-format=text: synced, klog lines', async () => {
  const server = await TestApiServer.start();
  const dead = await TestApiServer.start();
  const deadPort = dead.port;
  await dead.close();
  server.create('nodes', node('node-m'));
  const kc = server.writeKubeconfig(join(tmp.dir, 'kubeconfig'));
  writeFileSync(kc, readFileSync(kc, 'utf8').replace(`127.0.0.1:${server.port}`, `127.0.0.1:${deadPort}`));
  const child = spawn(process.execPath, [join(repoRoot, 'bin/kproxy.js'), '--proxy-mode=userspace', `--kubeconfig=${kc}`, `--master=${server.url}`,
    '--hostname-override=node-m', '--healthz-port=0', '--metrics-port=0', '--logging-format=text', '--vmodule=x=1'], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  let exit: number | null = null;
  child.on('exit', (code) => (exit = code ?? 128));
  try {
    const deadline = Date.now() + 60_000;
    while (Date.now() < deadline && exit === null && !/\] "synced"/.test(out)) await new Promise((r) => setTimeout(r, 100));
    assert.equal(exit, null, `kproxy exited: ${out}`);
    assert.match(out, /\] "synced"/, out);
    assert.ok(server.requests.some((r) => r.path === '/api/v1/services'), 'listed through --master');
    const lines = out.split('\n').filter(Boolean);
    assert.ok(lines.length > 2);
    for (const l of lines) assert.match(l, /^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ [\w-]+\] "/, `klog-like: ${l}`);
    assert.match(out, /^W.* kproxy\] "--vmodule: ignored/m, 'a flag warning is a W line');
    assert.match(out, /^I.*\] "starting kproxy" mode="userspace" nodeName="node-m"/m);
    assert.doesNotMatch(out, /--master: not supported|ECONNREFUSED/, 'the kubeconfig\'s dead port is never tried');
  } finally {
    if (exit === null) {
      child.kill('SIGTERM');
      const t0 = Date.now();
      while (exit === null && Date.now() - t0 < 10_000) await new Promise((r) => setTimeout(r, 50));
      if (exit === null) child.kill('SIGKILL');
    }
    await server.close();
  }
});
