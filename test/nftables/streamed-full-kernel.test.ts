// Real kernel, both families: a full sync over several tables is prepared a table at a time
// as nft reads the transaction (NftProxier.applyAll), so kproxy plans a table while nft
// parses the one before. Checked: when nft takes the transaction's first part, not every
// table is prepared yet; the time limit covers the transaction's real length; and the
// kernel ends as `nft -f` of render's text leaves an empty namespace (both read back with
// `nft -j list ruleset`, elements sorted, handles dropped). Namespaces come from uniqueName()
// and are removed in `after`, also on failure.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import { hostRunner, inputText, runChecked, type CommandRunner, type RunOptions } from '../../src/kernel/runner.ts';
import { applyTimeoutMs } from '../../src/kernel/nft/exec.ts';
import { silentLogger } from '../../src/log.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { NftProxier } from '../../src/modes/nftables/proxier.ts';
import { TableWriter } from '../../src/modes/nftables/table.ts';
import { mode } from '../../src/modes/nftables/index.ts';
import { uniqueName } from '../support/netns.ts';
import { makeService, makeSlice } from '../support/builders.ts';
import { nsRunner } from './objects.ts';

const NS = { proxier: uniqueName('kpt-nft-str-a'), render: uniqueName('kpt-nft-str-b') };
const SERVICES = 40;
const TABLES = 4;

before(async () => {
  for (const ns of Object.values(NS)) await runChecked(hostRunner, 'ip', ['netns', 'add', ns], { timeoutMs: 10_000 });
});

after(async () => {
  for (const ns of Object.values(NS)) await hostRunner.run('ip', ['netns', 'del', ns], { timeoutMs: 10_000 });
});

function addr(family: 4 | 6, kind: 'vip' | 'ep', i: number, k = 0): string {
  if (family === 4) return kind === 'vip' ? `172.30.0.${i + 1}` : `10.180.${i}.${k + 1}`;
  return kind === 'vip' ? `fd00:172:30::${(i + 1).toString(16)}` : `fd00:10:180::${i.toString(16)}:${(k + 1).toString(16)}`;
}

/** The namespace's ruleset as nft prints it in JSON: handles dropped, set elements sorted. */
async function ruleset(ns: string): Promise<unknown[]> {
  const r = await runChecked(nsRunner(ns), 'nft', ['-j', 'list', 'ruleset'], { timeoutMs: 30_000 });
  const items = (JSON.parse(r.stdout) as { nftables: Array<Record<string, Record<string, unknown>>> }).nftables.filter((x) => !('metainfo' in x));
  const canonical = (v: unknown): unknown => {
    if (Array.isArray(v)) return v.map(canonical);
    if (v === null || typeof v !== 'object') return v;
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) {
      if (k === 'handle') continue;
      out[k] = k === 'elem' && Array.isArray(x) ? x.map(canonical).sort((a, b) => (JSON.stringify(a) < JSON.stringify(b) ? -1 : 1)) : canonical(x);
    }
    return out;
  };
  return items.map(canonical).sort((a, b) => (JSON.stringify(a) < JSON.stringify(b) ? -1 : 1));
}

for (const family of [4, 6] as const) {
  test(`IPv${family}: a full sync prepares its tables as nft reads them, and the kernel ends as render's text leaves it`, async () => {
    const node = { nodeName: 'node-a', nodeIPs: [family === 6 ? 'fd00::2' : '192.168.0.2'], nodeLabels: {}, family };
    const config = resolveConfig({ nftables: { tables: TABLES } }, { mode: 'nftables', clusterCidr: family === 6 ? 'fd00:10::/32' : '10.0.0.0/8' });
    const tracker = new ProxyStateTracker(family, node.nodeName);
    for (let i = 0; i < SERVICES; i++) {
      tracker.services.update(null, makeService('ns', `svc${i}`, {
        type: 'NodePort',
        clusterIP: addr(family, 'vip', i),
        ipFamilies: [family === 6 ? 'IPv6' : 'IPv4'],
        ports: [{ name: 'http', protocol: 'TCP', port: 80, nodePort: 30000 + i }],
      }));
      tracker.endpoints.update(null, makeSlice('ns', `svc${i}`, {
        name: `svc${i}-x`,
        family,
        endpoints: [0, 1, 2].map((k) => ({ ip: addr(family, 'ep', i, k), node: k === 0 ? 'node-a' : 'node-b', ready: true })),
        ports: [{ name: 'http', port: 8080 }],
      }));
    }
    const changed = tracker.apply();
    const input: PlanInput = { state: tracker.state, config, node };

    // Tables prepared so far, counted where TableWriter.prepare runs.
    let preparedTables = 0;
    const prepare = TableWriter.prototype.prepare;
    TableWriter.prototype.prepare = function (this: TableWriter, ...args: Parameters<typeof prepare>) {
      preparedTables++;
      return prepare.apply(this, args);
    };
    const seen: Array<{ atFirstPart: number; text: string; timeoutMs: number }> = [];
    const runner: CommandRunner = {
      run: (cmd: string, args: string[], opts: RunOptions = {}) => {
        const input = opts.input;
        if (cmd === 'nft' && args.join(' ') === '-f -' && typeof input === 'function') {
          // the first part, taken as the runner takes it; then the rest
          const it = input()[Symbol.iterator]();
          const first = it.next();
          const atFirstPart = preparedTables;
          let text = first.done ? '' : first.value;
          for (let r = it.next(); !r.done; r = it.next()) text += r.value;
          seen.push({ atFirstPart, text, timeoutMs: opts.timeoutMs ?? 0 });
          return nsRunner(NS.proxier).run(cmd, args, { ...opts, input: text });
        }
        return nsRunner(NS.proxier).run(cmd, args, opts);
      },
    };
    try {
      const proxier = new NftProxier({ runner, log: silentLogger(), shards: { tables: TABLES } });
      await proxier.sync(input, changed, true);
    } finally {
      TableWriter.prototype.prepare = prepare;
    }
    assert.equal(seen.length, 1, 'one transaction');
    assert.ok(seen[0].atFirstPart < TABLES, `${seen[0].atFirstPart} of ${TABLES} tables prepared when nft took the first part`);
    assert.equal(preparedTables, TABLES);
    const lines = seen[0].text.split('\n').length - 1;
    assert.ok(seen[0].timeoutMs >= applyTimeoutMs(lines), `time limit ${seen[0].timeoutMs} ms for ${lines} lines`);

    await runChecked(nsRunner(NS.render), 'nft', ['-f', '-'], { input: inputText(mode.render(input)), timeoutMs: 30_000 });
    const got = await ruleset(NS.proxier);
    assert.ok(got.length > TABLES * 10, `${got.length} objects`);
    assert.deepEqual(got, await ruleset(NS.render));
    for (const ns of Object.values(NS)) await runChecked(nsRunner(ns), 'nft', ['flush', 'ruleset'], { timeoutMs: 30_000 });
  });
}
