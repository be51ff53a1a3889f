// Reads conformance cases from disk (the host side of src/conformance/case.ts, which stays
// pure so that the modes' conformance adapters can import it).
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import type { K8sEndpointSlice, K8sService } from '../core/api.ts';
import { readYAMLDocs, type CaseConfig, type CaseEvent, type CaseStep, type ConformanceCase, type StaticRules } from './case.ts';

/** The static ruleset files of a flows case, by format. */
const STATIC_RULES: Array<[string, StaticRules['format']]> = [
  ['rules.iptables-save', 'iptables-save'],
  ['rules.nft', 'nft'],
];

function staticRules(dir: string): StaticRules | undefined {
  const found = STATIC_RULES.filter(([f]) => existsSync(join(dir, f)));
  if (found.length > 1) throw new Error(`${dir}: both ${found.map(([f]) => f).join(' and ')}; a case holds one static ruleset`);
  const [hit] = found;
  return hit && { file: join(dir, hit[0]), format: hit[1], text: readFileSync(join(dir, hit[0]), 'utf8') };
}

function readObjects(file: string): Array<K8sService | K8sEndpointSlice> {
  return readYAMLDocs(readFileSync(file, 'utf8'), file) as Array<K8sService | K8sEndpointSlice>;
}

export function isCaseDir(dir: string): boolean {
  return existsSync(join(dir, 'config.json'));
}

/** Every case directory under the given roots (a root may itself be a case). */
export function findCases(roots: string[]): string[] {
  const out: string[] = [];
  const walk = (d: string) => {
    if (isCaseDir(d)) {
      out.push(d);
      return;
    }
    let entries: string[];
    try {
      entries = readdirSync(d).sort();
    } catch {
      return;
    }
    for (const e of entries) {
      const p = join(d, e);
      if (statSync(p).isDirectory()) walk(p);
    }
  };
  for (const r of roots) walk(r);
  return out;
}

export function loadCase(dir: string): ConformanceCase {
  const config = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as CaseConfig;
  const name = dir.replace(/\/+$/, '').split('/').slice(-1)[0];
  if (existsSync(join(dir, 'steps'))) {
    const steps: CaseStep[] = readdirSync(join(dir, 'steps'))
      .sort()
      .map((s) => {
        const sd = join(dir, 'steps', s);
        const objects = existsSync(join(sd, 'input.yaml')) ? readObjects(join(sd, 'input.yaml')) : [];
        const events = existsSync(join(sd, 'events.yaml'))
          ? (readYAMLDocs(readFileSync(join(sd, 'events.yaml'), 'utf8'), join(sd, 'events.yaml')) as CaseEvent[])
          : [];
        return {
          name: s,
          dir: sd,
          objects,
          events,
          expected: existsSync(join(sd, 'expected.txt')) ? readFileSync(join(sd, 'expected.txt'), 'utf8') : undefined,
          metrics: existsSync(join(sd, 'metrics.json')) ? JSON.parse(readFileSync(join(sd, 'metrics.json'), 'utf8')) : undefined,
        };
      });
    return { name, dir, kind: 'steps', config, objects: [], steps };
  }
  const objects = existsSync(join(dir, 'input.yaml')) ? readObjects(join(dir, 'input.yaml')) : [];
  if (existsSync(join(dir, 'flows.json'))) {
    const rules = staticRules(dir);
    return { name, dir, kind: 'flows', config, objects, flows: JSON.parse(readFileSync(join(dir, 'flows.json'), 'utf8')), ...(rules ? { rules } : {}) };
  }
  return { name, dir, kind: 'golden', config, objects, expected: readFileSync(join(dir, 'expected.txt'), 'utf8') };
}
