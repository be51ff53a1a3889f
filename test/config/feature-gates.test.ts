// featureGates / --feature-gates: upstream refuses an unknown gate at start
// ("unrecognized feature gate"); a known gate kproxy does not act on gets one warning.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError, parseConfigText, resolveConfig } from '../../src/config/config.ts';
import { KNOWN_FEATURE_GATES, KUBE_PROXY_GATES } from '../../src/config/feature-gates.ts';

const HEAD = 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n';

test('a config file with an unknown gate is refused with KPROXY_CONFIG_INVALID naming it', () => {
  const raw = parseConfigText(`${HEAD}featureGates:\n  TopologyAwareHints: true\n  NoSuchGate: false\n`);
  assert.throws(() => resolveConfig(raw), (e: unknown) => {
    assert.ok(e instanceof ConfigError);
    assert.equal(e.code, 'KPROXY_CONFIG_INVALID');
    assert.match(e.message, /^KPROXY_CONFIG_INVALID: featureGates: unrecognized feature gate: NoSuchGate; remove it/);
    assert.doesNotMatch(e.message, /TopologyAwareHints: true/);
    return true;
  });
});

test('known gates: accepted, one warning for all of them; names are case-sensitive as in Go', () => {
  const warnings: string[] = [];
  const cfg = resolveConfig(parseConfigText(`${HEAD}featureGates:\n  ServiceTrafficDistribution: true\n  AllBeta: false\n  ContextualLogging: true\n`), {}, (w) => warnings.push(w));
  assert.deepEqual(cfg.featureGates, { ServiceTrafficDistribution: true, AllBeta: false, ContextualLogging: true });
  const gateWarnings = warnings.filter((w) => w.startsWith('featureGates:'));
  assert.equal(gateWarnings.length, 1, JSON.stringify(warnings));
  assert.match(gateWarnings[0], /ServiceTrafficDistribution, AllBeta, ContextualLogging ignored/);
  assert.throws(() => resolveConfig({ featureGates: { servicetrafficdistribution: true } }), /unrecognized feature gate: servicetrafficdistribution/);
  // no gates: no warning
  const none: string[] = [];
  resolveConfig({}, {}, (w) => none.push(w));
  assert.ok(!none.some((w) => w.startsWith('featureGates')));
});

test('the known list holds every gate kube-proxy reads', () => {
  for (const g of KUBE_PROXY_GATES) assert.ok(KNOWN_FEATURE_GATES.has(g), g);
  assert.ok(KNOWN_FEATURE_GATES.size > 100);
});
