// Builds a planned state once from a manifests directory (render, trace).
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ProxyStateTracker } from '../core/tracker.ts';
import { parseManifestFile } from '../sources/manifests.ts';
import type { ProxyConfig } from '../config/config.ts';
import type { PlanInput } from '../modes/types.ts';
import { validateOptionsForMode } from '../core/validate.ts';
import { discoverNodeIPs } from '../sync/controller.ts';
import { canonicalIP } from '../core/ip.ts';

export function planFromManifests(dir: string, cfg: ProxyConfig, nodeName: string, nodeIPsFlag?: string): PlanInput {
  // Objects are validated by the tracker exactly as in `run`, so render and trace show what
  // run would apply; boundary warnings already say the object is skipped.
  const warn = (msg: string, obj: string, detail?: unknown) =>
    process.stderr.write(detail ? `kproxy: warning: ${obj}: ${msg}\n` : `kproxy: warning: ${obj}: ${msg}; skipped\n`);
  const t = new ProxyStateTracker(4, nodeName, warn, validateOptionsForMode(cfg.mode));
  let labels: Record<string, string> = {};
  for (const f of readdirSync(dir).filter((n) => /\.(ya?ml|json)$/.test(n)).sort()) {
    const path = join(dir, f);
    for (const { kind, obj } of parseManifestFile(path, readFileSync(path, 'utf8')).values()) {
      if (kind === 'Service') t.services.update(null, obj);
      else if (kind === 'EndpointSlice') t.endpoints.update(null, obj);
      else if (obj.metadata?.name === nodeName) labels = t.boundary.node(obj)?.metadata?.labels ?? {};
    }
  }
  t.apply();
  const nodeIPs = nodeIPsFlag
    ? nodeIPsFlag.split(',').map((s) => canonicalIP(s.trim())).filter((s): s is string => !!s)
    : discoverNodeIPs(4);
  return { state: t.state, config: cfg, node: { nodeName, nodeIPs, nodeLabels: labels, family: 4 } };
}
