// kproxy is never stricter than the API server, proven on upstream's own validation tables:
// every Service and EndpointSlice that upstream's tests (pkg/apis/core/validation,
// pkg/apis/discovery/validation) accept is accepted by validateService / validateEndpointSlice in
// the kernel modes' options, and crosses the Boundary and a ProxyStateTracker without counting as
// invalid (kproxy_invalid_objects_total). An object upstream rejects may be accepted only when
// the data says why that cannot hurt (kproxyAccepts), and that list must be exact.
// The data is test/core/upstream-validation/*.json, written by transcribe.ts next to it.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { Boundary, validateEndpointSlice, validateService, type Validated } from '../../src/core/validate.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import type { ObjectKind } from '../../src/core/api.ts';
import { render, serviceCases, sliceCases, SERVICES_FILE, SLICES_FILE, type UpstreamCase, type UpstreamFile } from './upstream-validation/transcribe.ts';

/* eslint-disable @typescript-eslint/no-explicit-any */
type Obj = any;

const KERNEL_MODE_OPTIONS = {}; // no allowLoopback: the iptables, ipvs and nftables modes

/** Expands the lists upstream's test helpers generate (generatePorts and friends), as they do. */
function expand(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(expand);
  if (v === null || typeof v !== 'object') return v;
  const o = v as Record<string, unknown>;
  const n = (k: string) => o[k] as number;
  const times = <T>(count: number, f: (i: number) => T): T[] => Array.from({ length: count }, (_, i) => f(i));
  if ('$generatePorts' in o) return times(n('$generatePorts'), (i) => ({ name: `http-${i}`, protocol: 'TCP' }));
  if ('$generateEndpoints' in o) return times(n('$generateEndpoints'), (i) => ({ addresses: [`10.1.2.${i % 255}`], conditions: {} }));
  if ('$generateIPAddresses' in o) return times(n('$generateIPAddresses'), (i) => `10.1.2.${i % 255}`);
  if ('$generateTopology' in o) return Object.fromEntries(times(n('$generateTopology'), (i) => [`topology-${i}`, 'example']));
  return Object.fromEntries(Object.entries(o).map(([k, e]) => [k, expand(e)]));
}

function load(file: string): UpstreamFile {
  return JSON.parse(readFileSync(file, 'utf8')) as UpstreamFile;
}

const label = (c: UpstreamCase) => `${c.test}[${c.index}] ${JSON.stringify(c.name)}`;

interface Outcome {
  c: UpstreamCase;
  object: Obj;
  result: Validated<unknown>;
}

function run(file: UpstreamFile, validate: (o: unknown) => Validated<unknown>): Outcome[] {
  return file.cases.map((c) => {
    const object = expand(c.object);
    return { c, object, result: validate(structuredClone(object)) };
  });
}

function summary(kind: string, outcomes: Outcome[]): string {
  const accepted = outcomes.filter((o) => o.c.upstream === 'accept');
  const rejected = outcomes.filter((o) => o.c.upstream === 'reject');
  const kproxyAccepted = outcomes.filter((o) => o.result.ok).length;
  const bothAccept = accepted.filter((o) => o.result.ok).length;
  const rejectedButAccepted = rejected.filter((o) => o.result.ok);
  const listed = rejectedButAccepted.filter((o) => o.c.kproxyAccepts !== undefined).length;
  const among = bothAccept === accepted.length ? `all ${accepted.length}` : `only ${bothAccept} of ${accepted.length}`;
  const list = listed === rejectedButAccepted.length ? 'listed' : `${listed} of them listed`;
  return (
    `${kind}: ${outcomes.length} cases: ${accepted.length} accepted by upstream, ${kproxyAccepted} accepted by kproxy ` +
    `(${among} among them); ${rejected.length} rejected by upstream, of which ${rejectedButAccepted.length} accepted by kproxy (${list})`
  );
}

function checkTables(kind: 'Service' | 'EndpointSlice', file: UpstreamFile, generated: UpstreamFile, validate: (o: unknown) => Validated<unknown>): void {
  const outcomes = run(file, validate);

  test('the data file is what transcribe.ts writes', () => {
    assert.equal(render(file), render(generated), 'run: node --import tsx test/core/upstream-validation/transcribe.ts');
  });

  test('every case is well formed, and only rejected cases carry kproxyAccepts', () => {
    assert.ok(file.cases.length > 0);
    for (const c of file.cases) {
      assert.ok(c.upstream === 'accept' || c.upstream === 'reject', label(c));
      assert.ok(c.object && typeof c.object === 'object', label(c));
      if (c.kproxyAccepts !== undefined) {
        assert.equal(c.upstream, 'reject', `${label(c)}: kproxyAccepts on a case upstream accepts`);
        assert.ok(c.kproxyAccepts.length > 20, `${label(c)}: say why it cannot hurt`);
      }
    }
  });

  test('every object upstream accepts, kproxy accepts', () => {
    const refused = outcomes
      .filter((o) => o.c.upstream === 'accept' && !o.result.ok)
      .map((o) => `${label(o.c)}: ${JSON.stringify(!o.result.ok && o.result.issues)}`);
    assert.deepEqual(refused, []);
  });

  test('the rejected objects kproxy accepts are exactly the listed ones', () => {
    const accepted = outcomes.filter((o) => o.c.upstream === 'reject' && o.result.ok).map((o) => label(o.c));
    const listed = file.cases.filter((c) => c.kproxyAccepts !== undefined).map(label);
    assert.deepEqual(accepted, listed);
  });

  test('every object upstream accepts crosses the Boundary and the trackers without counting as invalid', () => {
    const invalid: string[] = [];
    const onInvalid = (k: ObjectKind, who: string) => invalid.push(`${k} ${who}`);
    const warnings: string[] = [];
    const report = (msg: string, obj: string) => warnings.push(`${obj}: ${msg}`);
    const boundary = new Boundary(report, { ...KERNEL_MODE_OPTIONS, onInvalid });
    const trackers = ([4, 6] as const).map((f) => new ProxyStateTracker(f, 'node-a', report, { ...KERNEL_MODE_OPTIONS, onInvalid }));
    for (const o of outcomes.filter((x) => x.c.upstream === 'accept')) {
      const before = invalid.length;
      const kept = kind === 'Service' ? boundary.service(structuredClone(o.object)) : boundary.endpointSlice(structuredClone(o.object));
      assert.ok(kept, `${label(o.c)}: the Boundary skipped it`);
      for (const t of trackers) {
        if (kind === 'Service') t.services.update(null, structuredClone(o.object));
        else t.endpoints.update(null, structuredClone(o.object));
        t.apply();
      }
      assert.equal(invalid.length, before, `${label(o.c)}: counted as invalid: ${invalid.slice(before).join('; ')}`);
      // and used: a Service with a cluster IP has service ports in the state (nothing valid is
      // dropped after validation; without a cluster IP, as before the allocator, it is headless)
      const cip = kind === 'Service' ? o.object.spec?.clusterIP : undefined;
      if (cip && cip !== 'None') {
        const prefix = `${o.object.metadata.namespace}/${o.object.metadata.name}:`;
        const ports = trackers.flatMap((t) => [...t.state.services.keys()].filter((k) => k.startsWith(prefix)));
        assert.ok(ports.length > 0, `${label(o.c)}: accepted but no service port in the state`);
      }
    }
    assert.deepEqual(invalid, []);
    assert.deepEqual(warnings, [], 'no part of an accepted object is dropped with a warning');
  });

  test('summary', () => {
    console.log(summary(kind, outcomes));
  });
}

describe('upstream Service validation tables (pkg/apis/core/validation)', () => {
  checkTables('Service', load(SERVICES_FILE), serviceCases(), (o) => validateService(o, KERNEL_MODE_OPTIONS));
});

describe('upstream EndpointSlice validation tables (pkg/apis/discovery/validation)', () => {
  checkTables('EndpointSlice', load(SLICES_FILE), sliceCases(), (o) => validateEndpointSlice(o, KERNEL_MODE_OPTIONS));
});

test('one summary line for both tables', () => {
  const s = run(load(SERVICES_FILE), (o) => validateService(o, KERNEL_MODE_OPTIONS));
  const e = run(load(SLICES_FILE), (o) => validateEndpointSlice(o, KERNEL_MODE_OPTIONS));
  console.log(summary('Services and EndpointSlices', [...s, ...e]));
});
