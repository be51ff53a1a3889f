// Builds a planned state once from a manifests directory (render, trace). It reads the
// directory exactly as `run` does (readManifestDir): a broken file is skipped with a warning
// naming file:line, the good files' objects are kept, and one summary line lists what was
// skipped. Services get their cluster IPs and node ports as `run` gives them: from the state
// file `run` keeps (read, never written), the rest allocated the same deterministic way.
// Warnings go to stderr so stdout stays the pure payload.
import { ProxyStateTracker } from '../core/tracker.ts';
import { mergeManifestObjects, readManifestDir, type ManifestObjects } from '../sources/manifests.ts';
import { ServiceAllocator, allocatorConfig, applyPatch, type AllocatorConfig } from '../sources/service-alloc.ts';
import { findStatePath, readStateFile } from '../sources/allocation-state.ts';
import type { K8sService } from '../core/api.ts';
import type { ProxyConfig } from '../config/config.ts';
import type { PlanInput } from '../core/nodeview.ts';
import { validateOptionsForMode } from '../core/validate.ts';
import { discoverNodeIPs } from '../sync/controller.ts';
import { canonicalIP, ipFamily } from '../core/ip.ts';
import { clusterIPForFamily } from '../core/convert.ts';

/** How render and trace allocate: the ranges (default kube-apiserver's), and the state file (default: where `run` keeps it; null: none). */
export interface ManifestsAllocation {
  config?: AllocatorConfig;
  statePath?: string | null;
}

/** One family's planned state from a manifests directory (trace picks the family from --to). */
export async function planFromManifests(
  dir: string,
  cfg: ProxyConfig,
  nodeName: string,
  nodeIPsFlag?: string,
  stderr: (s: string) => void = (s) => process.stderr.write(s),
  family: 4 | 6 = 4,
  alloc: ManifestsAllocation = {},
): Promise<PlanInput> {
  return (await plansFromManifests(dir, cfg, nodeName, nodeIPsFlag, stderr, [family], alloc))[0];
}

/**
 * The planned state of every IP family the manifests use, IPv4 first, as `run` would plan
 * it on a dual-stack node: one tracker per family fed the same objects. With `families`
 * given, exactly those; otherwise the families that have a Service port (IPv4 alone when
 * none has). The directory is read and warned about once.
 */
export async function plansFromManifests(
  dir: string,
  cfg: ProxyConfig,
  nodeName: string,
  nodeIPsFlag?: string,
  stderr: (s: string) => void = (s) => process.stderr.write(s),
  families?: Array<4 | 6>,
  alloc: ManifestsAllocation = {},
): Promise<PlanInput[]> {
  const skippedFiles: string[] = [];
  const skippedObjects = new Set<string>();
  // Objects are validated by the tracker exactly as in `run`, so render and trace show what
  // run would apply; boundary warnings already say the object is skipped.
  const warn = (msg: string, obj: string, detail?: unknown) => {
    skippedObjects.add(obj);
    stderr(detail ? `kproxy: warning: ${obj}: ${msg}\n` : `kproxy: warning: ${obj}: ${msg}; skipped\n`);
  };
  // Only the first tracker warns: the objects are the same for every family.
  const trackers = ([4, 6] as const).map((f, i) => ({ family: f, t: new ProxyStateTracker(f, nodeName, i === 0 ? warn : () => {}, validateOptionsForMode(cfg.mode)) }));
  const t = trackers[0].t;
  let labels: Record<string, string> = {};
  const { read } = await readManifestDir(dir);
  const good: Array<[string, ManifestObjects]> = [];
  for (const f of read) {
    if (f.objects) {
      good.push([f.name, f.objects]);
      for (const w of f.notes?.warnings ?? []) {
        skippedObjects.add(`${f.name}:${w.line}`);
        stderr(`kproxy: warning: ${w.message}\n`);
      }
      continue;
    }
    skippedFiles.push(f.error && f.error.line > 0 ? `${f.name}:${f.error.line}` : f.name);
    stderr(`kproxy: warning: ${f.error?.message ?? `${f.path}: unreadable`}; file skipped\n`);
  }
  const { objects, duplicates } = mergeManifestObjects(good);
  for (const d of duplicates) {
    const more = d.keys.length > 3 ? ` and ${d.keys.length - 3} more` : '';
    stderr(`kproxy: warning: ${d.keys.slice(0, 3).join(', ')}${more} defined in both ${d.loser} and ${d.winner}; ${d.winner} wins\n`);
  }
  const services = allocate(objects, dir, alloc, skippedFiles.length === 0, (key, why) => {
    skippedObjects.add(`Service ${key}`);
    stderr(`kproxy: warning: Service ${key}: ${why}; skipped\n`);
  }, stderr);
  // The IPv4 tracker takes every object (its warnings are the ones shown). The IPv6 tracker
  // takes the Services with an IPv6 cluster IP (clusterIPForFamily, by which servicePortsOf
  // keeps a family's ports), and the EndpointSlices only when its family is planned:
  // validating 10,000 objects once more for a family that has none of them is a third of
  // render's time at that size. Its endpoints tracker is independent of its
  // services tracker, so applying the Services first leaves the same state.
  const [v4, v6] = trackers;
  const slices: unknown[] = [];
  for (const [key, { kind, obj }] of objects) {
    if (kind === 'Service') {
      const svc = services.get(key.slice('Service/'.length));
      if (svc) {
        v4.t.services.update(null, svc);
        if (clusterIPForFamily(svc, 6)) v6.t.services.update(null, svc);
      }
    }
    else if (kind === 'EndpointSlice') {
      v4.t.endpoints.update(null, obj);
      slices.push(obj);
    }
    else if (obj.metadata?.name === nodeName) labels = t.boundary.node(obj)?.metadata?.labels ?? {};
  }
  v4.t.apply();
  v6.t.services.apply(v6.t.state);
  if (families ? families.includes(6) : v6.t.state.services.size > 0) for (const s of slices) v6.t.endpoints.update(null, s);
  v6.t.apply();
  if (skippedFiles.length || skippedObjects.size) {
    const plural = (n: number, w: string) => `${n} ${w}${n === 1 ? '' : 's'}`;
    const list = [...skippedFiles, ...skippedObjects];
    const shown = list.slice(0, 20).join(', ') + (list.length > 20 ? `, ... (${list.length - 20} more)` : '');
    stderr(`kproxy: skipped ${plural(skippedFiles.length, 'file')}, ${plural(skippedObjects.size, 'object')}: ${shown}\n`);
  }
  const flagIPs = nodeIPsFlag ? nodeIPsFlag.split(',').map((s) => canonicalIP(s.trim())).filter((s): s is string => !!s) : null;
  const nodeIPs = (family: 4 | 6) => (flagIPs ?? discoverNodeIPs(family)).filter((ip) => ipFamily(ip) === family);
  let chosen = families ?? trackers.filter((x) => x.t.state.services.size > 0).map((x) => x.family);
  if (!chosen.length) chosen = [4];
  return trackers
    .filter((x) => chosen.includes(x.family))
    .map((x) => ({ state: x.t.state, config: cfg, node: { nodeName, nodeIPs: nodeIPs(x.family), nodeLabels: labels, family: x.family } }));
}


/**
 * The Services as `run` delivers them, by "namespace/name": the state file's holdings first
 * (those of Services no longer in the directory released when no file is broken, as `run`'s
 * first complete scan does), then one batch of every Service. A refused one is left out.
 */
function allocate(
  objects: Map<string, { kind: string; obj: unknown }>,
  dir: string,
  alloc: ManifestsAllocation,
  complete: boolean,
  refused: (key: string, why: string) => void,
  stderr: (s: string) => void,
): Map<string, K8sService> {
  const raw = new Map<string, K8sService>();
  for (const [key, { kind, obj }] of objects) if (kind === 'Service') raw.set(key.slice('Service/'.length), obj as K8sService);
  const statePath = alloc.statePath === undefined ? findStatePath(dir) : alloc.statePath;
  const { state, problem } = statePath ? readStateFile(statePath) : {};
  if (problem) stderr(`kproxy: warning: ${problem}\n`);
  const allocator = new ServiceAllocator(alloc.config ?? allocatorConfig(), state, (key) => raw.get(key));
  const outcomes = [...(complete ? allocator.forgetAbsent(new Set(raw.keys())) : []), ...allocator.apply(raw)];
  const out = new Map<string, K8sService>();
  for (const o of outcomes) {
    const svc = raw.get(o.key);
    if (o.patch && svc) out.set(o.key, applyPatch(svc, o.patch));
    else out.delete(o.key);
  }
  for (const r of allocator.report().refused) refused(r.service, `${r.field}: ${r.reason}`);
  return out;
}
