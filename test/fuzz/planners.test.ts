// Property: no object, however hostile, makes the trackers or any mode's planner throw, and
// the good Services are planned whatever comes with them. Objects go in as the sources hand
// them over (add, update to another hostile version, delete), in both IP families.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { parseAllDocuments } from 'yaml';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import { resolveConfig } from '../../src/config/config.ts';
import { modes } from '../../src/modes/registry.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import type { ModeName } from '../../src/config/config.ts';
import { GOOD, goodManifests, hostileObject } from '../support/hostile.ts';

const MODES: ModeName[] = ['iptables', 'nftables', 'ipvs', 'userspace'];
const goodObjects = parseAllDocuments(goodManifests()).map((d) => d.toJS() as Record<string, unknown>);

function feed(t: ProxyStateTracker, o: Record<string, unknown>, old: Record<string, unknown> | null): void {
  if (o.kind === 'EndpointSlice') t.endpoints.update(old as K8sEndpointSlice | null, o as K8sEndpointSlice);
  else t.services.update(old as K8sService | null, o as K8sService);
}

const seed = Number(process.env.KPROXY_FUZZ_SEED ?? 20261203);

for (const family of [4, 6] as const) {
  test(`IPv${family}: hostile objects never make a tracker or a planner throw; good Services stay planned`, () => {
    const cfg = resolveConfig({}, {});
    const arb = fc.array(fc.tuple(fc.nat(50), fc.boolean()), { minLength: 1, maxLength: 12 }).chain((picks) =>
      fc.tuple(...picks.map(([i, del]) => fc.tuple(hostileObject(i), hostileObject(i), fc.constant(del)))),
    );
    fc.assert(
      fc.property(arb, (changes) => {
        const t = new ProxyStateTracker(family, 'fuzz-node');
        for (const o of goodObjects) feed(t, o, null);
        for (const [a, b, del] of changes) {
          feed(t, a, null);
          feed(t, b, a);
          if (del) {
            if (b.kind === 'EndpointSlice') t.endpoints.update(b as K8sEndpointSlice, null);
            else t.services.update(b as K8sService, null);
          }
        }
        t.apply();
        const input = { state: t.state, config: cfg, node: { nodeName: 'fuzz-node', nodeIPs: family === 4 ? ['192.168.0.2'] : ['fd00::2'], nodeLabels: {}, family } };
        for (const m of MODES) {
          const out = modes[m].render(input);
          assert.equal(typeof out, 'string');
          if (family === 4) for (const g of GOOD) assert.ok(out.includes(g.ip), `${m}: good Service ${g.name} (${g.ip}) missing from the plan`);
        }
      }),
      { seed, numRuns: 150 },
    );
  });
}
