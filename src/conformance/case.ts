// Loading a conformance case (format: ../shared/conformance/README.md). Generic: the mode
// adapters (src/modes/<mode>/conformance.ts) interpret config.json and compare output.
import { parseAllDocuments } from 'yaml';
import { ProxyStateTracker } from '../core/tracker.ts';
import { validateOptionsForMode } from '../core/validate.ts';
import type { K8sEndpointSlice, K8sService } from '../core/api.ts';
import type { ProxyState } from '../core/model.ts';

export interface CaseConfig {
  mode: string;
  ipFamily?: string;
  nodeName?: string;
  [key: string]: unknown;
}

export interface Flow {
  name: string;
  sourceIP: string;
  protocol: string;
  destIP: string;
  destPort: number;
  output: string;
  masq: boolean;
}

export interface CaseEvent {
  op: 'add' | 'update' | 'delete';
  object: K8sService | K8sEndpointSlice;
}

export interface CaseStep {
  name: string;
  dir: string;
  /** step 1: the objects; later steps: [] */
  objects: Array<K8sService | K8sEndpointSlice>;
  events: CaseEvent[];
  expected?: string;
  metrics?: { natRulesWritten?: number; natRulesTotal?: number; [k: string]: unknown };
}

export interface ConformanceCase {
  name: string;
  dir: string;
  kind: 'golden' | 'flows' | 'steps';
  config: CaseConfig;
  objects: Array<K8sService | K8sEndpointSlice>;
  expected?: string;
  flows?: Flow[];
  steps?: CaseStep[];
  /**
   * A flows case's static ruleset (`rules.iptables-save` / `rules.nft`), traced instead of
   * rendering `input.yaml`: the tracer's own test, as upstream's TestTracePacket.
   */
  rules?: StaticRules;
}

export interface StaticRules {
  file: string;
  format: 'iptables-save' | 'nft';
  text: string;
}

export function readYAMLDocs(text: string, file: string): unknown[] {
  const docs = parseAllDocuments(text);
  const out: unknown[] = [];
  for (const d of docs) {
    if (d.errors.length) throw new Error(`${file}: ${d.errors[0].message}`);
    const v = d.toJS();
    if (v === null || v === undefined) continue;
    if (Array.isArray(v)) out.push(...v);
    else out.push(v);
  }
  return out;
}

export function caseFamily(config: CaseConfig): 4 | 6 {
  return config.ipFamily === 'IPv6' ? 6 : 4;
}

/** A tracker fed with objects as upstream's tests do: OnServiceAdd / OnEndpointSliceAdd, no defaulting. */
export function trackerFor(config: CaseConfig): ProxyStateTracker {
  return new ProxyStateTracker(caseFamily(config), config.nodeName ?? 'test-node', () => {}, validateOptionsForMode(config.mode));
}

export function applyObject(t: ProxyStateTracker, op: 'add' | 'update' | 'delete', obj: K8sService | K8sEndpointSlice, old?: K8sService | K8sEndpointSlice | null): void {
  const isSlice = (obj as { kind?: string }).kind === 'EndpointSlice';
  if (isSlice) {
    t.endpoints.update(op === 'add' ? null : ((old ?? obj) as K8sEndpointSlice), op === 'delete' ? null : (obj as K8sEndpointSlice));
  } else {
    t.services.update(op === 'add' ? null : ((old ?? obj) as K8sService), op === 'delete' ? null : (obj as K8sService));
  }
}

export function stateOf(config: CaseConfig, objects: Array<K8sService | K8sEndpointSlice>): ProxyState {
  const t = trackerFor(config);
  for (const o of objects) applyObject(t, 'add', o);
  t.apply();
  return t.state;
}

export interface CaseOutcome {
  ok: boolean;
  /** what went wrong, first lines */
  detail?: string;
  /** how the case was judged when not by its own kind's rule (counted in the runner's output) */
  judgedBy?: string;
}

/** What a mode plugs into the generic runner. */
export interface ConformanceAdapter {
  run(c: ConformanceCase): Promise<CaseOutcome> | CaseOutcome;
}
