// Hostile input in iptables mode: a Service whose line iptables-restore refuses
// is left out and reported, every other Service is programmed in the same sync; a loopback
// or other special address never becomes a VIP rule. Unit tests on the stateful fake
// kernel, made to refuse marked lines the way iptables-restore reports them.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import pino from 'pino';
import type { RunOptions, RunResult } from '../../src/kernel/runner.ts';
import { optionsFromConfig, DEFAULT_FACTS } from '../../src/modes/iptables/options.ts';
import { planFull } from '../../src/modes/iptables/full.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { IptablesProxier } from '../../src/modes/iptables/proxier.ts';
import { endpoint, label63, port, stateOf } from '../support/ports.ts';
import { FakeIptables } from '../../src/kernel/iptables/fake.ts';
import { testConfig } from './helpers.ts';
import { inputText } from '../../src/kernel/runner.ts';

const NODE = { nodeName: 'test-node', nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4 as const };
const config = testConfig();
const input = (state: PlanInput['state']): PlanInput => ({ state, config, node: NODE });

/** The fake kernel, refusing (as iptables-restore v1.8.9 does: first error only) lines containing `poison`. */
class RefusingKernel extends FakeIptables {
  restores = 0;
  refused = 0;
  constructor(
    public poison: string,
    private readonly transient = false,
  ) {
    super(4);
  }
  override async run(cmd: string, args: string[], opts: RunOptions = {}): Promise<RunResult> {
    if (cmd === 'iptables-restore') {
      this.restores++;
      const n = inputText(opts.input).split('\n').findIndex((l) => l.includes(this.poison));
      if (n >= 0) {
        this.refused++;
        const host = this.poison;
        if (this.transient) return { code: 1, stdout: '', stderr: `iptables-restore: line ${n + 1} failed: Resource temporarily unavailable\n` };
        return { code: 2, stdout: '', stderr: `iptables-restore v1.8.9 (nf_tables): host/network \`${host}' not found\nError occurred at line: ${n + 1}\nTry \`iptables-restore -h' or 'iptables-restore --help' for more information.\n` };
      }
    }
    return super.run(cmd, args, opts);
  }
}

function capture() {
  const lines: Array<{ msg: string; service?: string }> = [];
  const log = pino({ level: 'debug' }, new Writable({ write(chunk, _e, cb) { for (const l of String(chunk).split('\n')) if (l) lines.push(JSON.parse(l)); cb(); } }));
  return { log, lines };
}

function threeServices(badEndpointIP: string) {
  return stateOf([
    [port('ns', 'good1', 'http', { clusterIP: '172.30.0.1' }), [endpoint('10.180.0.1')]],
    [port('ns', 'bad', 'http', { clusterIP: '172.30.0.2' }), [endpoint(badEndpointIP)]],
    [port('ns', 'bad', 'dns', { clusterIP: '172.30.0.2', port: 53 }), [endpoint('10.180.1.2', 5353)]],
    [port('ns', 'good2', 'http', { clusterIP: '172.30.0.3' }), [endpoint('10.180.0.3')]],
  ]);
}

test('iptables-restore refusing one Service: it is left out and reported, the others are programmed in the same sync', async () => {
  const k = new RefusingKernel('fd00::66');
  const { log, lines } = capture();
  const p = new IptablesProxier({ runner: k, log, config });
  const state = threeServices('fd00::66');
  const stats = await p.sync(input(state), new Set(), true);
  assert.deepEqual(stats.excludedServices, ['ns/bad']);
  const services = k.rules('nat', 'KUBE-SERVICES').join('\n');
  assert.match(services, /ns\/good1:http cluster IP.* -d 172\.30\.0\.1 /);
  assert.match(services, /ns\/good2:http cluster IP.* -d 172\.30\.0\.3 /);
  assert.ok(!services.includes('172.30.0.2'), 'no port of the refused Service is left in');
  const warn = lines.filter((l) => l.msg.startsWith('KPROXY_SYNC_SERVICE_EXCLUDED'));
  assert.equal(warn.length, 1);
  assert.equal(warn[0].service, 'ns/bad');
  assert.match(warn[0].msg, /iptables-restore refused the rules of Service ns\/bad \(line \d+: host\/network `fd00::66' not found: -A KUBE-/);

  // A later partial sync keeps it out without reporting it again; once fixed it is programmed.
  const again = await p.sync(input(state), new Set(['ns/good1']), false);
  assert.deepEqual(again.excludedServices, ['ns/bad']);
  assert.equal(lines.filter((l) => l.msg.startsWith('KPROXY_SYNC_SERVICE_EXCLUDED')).length, 1);
  const fixed = await p.sync(input(threeServices('10.180.0.2')), new Set(['ns/bad']), false);
  assert.equal(fixed.excludedServices, undefined);
  assert.match(k.rules('nat', 'KUBE-SERVICES').join('\n'), /ns\/bad:dns cluster IP.* -d 172\.30\.0\.2 /);
});

test('a refused fixed rule still fails the sync, without retries', async () => {
  const k = new RefusingKernel('MASQUERADE');
  const p = new IptablesProxier({ runner: k, log: pino({ level: 'silent' }), config });
  await assert.rejects(p.sync(input(threeServices('10.180.0.2')), new Set(), true), /KPROXY_IPTABLES_RESTORE_FAILED/);
  // ensureJumps' restore, then the one refused service restore
  assert.equal(k.restores, 2);
});

test('a transient refusal (the kernel busy, short of memory) excludes nobody: the sync fails and is retried later', async () => {
  const k = new RefusingKernel('fd00::66', true);
  const p = new IptablesProxier({ runner: k, log: pino({ level: 'silent' }), config });
  await assert.rejects(p.sync(input(threeServices('fd00::66')), new Set(), true), /Resource temporarily unavailable/);
  assert.equal(k.refused, 1);
});

test('retries per sync are bounded (iptables-restore names one line per attempt)', async () => {
  const k = new RefusingKernel('fd00::');
  const p = new IptablesProxier({ runner: k, log: pino({ level: 'silent' }), config });
  const ports = Array.from({ length: 10 }, (_, i) => port('ns', `bad${i}`, 'http', { clusterIP: `172.30.1.${i + 1}` }));
  const state = stateOf(ports.map((sp, i) => [sp, [endpoint(`fd00::${i + 1}`)]]));
  await assert.rejects(p.sync(input(state), new Set(), true), /KPROXY_IPTABLES_RESTORE_FAILED/);
  assert.equal(k.refused, 5, 'one attempt and four retries');
});

test('a loopback or other special VIP never gets an iptables rule', () => {
  const opts = optionsFromConfig(config, NODE, DEFAULT_FACTS);
  const lo = port('ns', 'lo', 'http', { clusterIP: '127.0.0.1', externalIPs: ['0.0.0.0', '1.2.3.4'], loadBalancerVIPs: ['224.0.0.1'] });
  const state = stateOf([[lo, []]]);
  const { payload } = planFull({ state, opts });
  for (const bad of ['127.0.0.1', '0.0.0.0', '224.0.0.1']) assert.ok(!payload.includes(`-d ${bad} `), `${bad}: ${payload}`);
  assert.match(payload, /-d 1\.2\.3\.4 --dport 80 -j REJECT/);
});

test('iptables comments stay within the kernel limit (XT_MAX_COMMENT_LEN 256) for the longest valid names', () => {
  const opts = optionsFromConfig(config, NODE, DEFAULT_FACTS);
  const sp = port(label63('n'), label63('s'), 'abcdefghijklmno', { nodePort: 30080, loadBalancerVIPs: ['1.2.3.5'], loadBalancerSourceRanges: ['203.0.113.0/24'], externalPolicyLocal: true, healthCheckNodePort: 30081 });
  const { payload } = planFull({ state: stateOf([[sp, [endpoint('fd00:1234:5678:9abc:def0:1234:5678:9abc', 65535)]]]), opts });
  for (const m of payload.matchAll(/--comment "([^"]*)"/g)) assert.ok(Buffer.byteLength(m[1]) <= 255, m[1]);
});
