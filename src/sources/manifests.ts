// The manifests source: a directory of multi-document YAML (or JSON) files holding v1
// Services, discovery.k8s.io/v1 EndpointSlices and optionally this node's Node. It is the
// embedded default, so kproxy runs with no cluster at all. Edits apply without restart; a
// broken file is reported with file and line, and the last good content of that file stays
// in force. `kproxy render` and `kproxy trace` read the same directory through the same
// readManifestDir, so a dry run sees exactly what `run` would load.
//
// Parsing is linear in the file size (line numbers come from one LineCounter, not from
// re-splitting the text per object) and yields to the event loop between documents, so a
// big file never stalls health checks or the sync loop for long.
import { watch, type FSWatcher } from 'node:fs';
import { readdir, readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { setImmediate as yieldToEventLoop } from 'node:timers/promises';
import { Composer, LineCounter, Parser, isMap, isSeq, type Document } from 'yaml';
import { load as loadYaml, CORE_SCHEMA } from 'js-yaml';
import { isDeepStrictEqual } from 'node:util';
import { hash } from 'node:crypto';
import type { K8sEndpointSlice, K8sService } from '../core/api.ts';
import type { Logger } from '../log.ts';
import type { K8sNode, Source, SourceHandler, SourceHealth } from './types.ts';
import { KproxyError, coded } from '../errors.ts';
import { ServiceAllocator, allocatorConfig, applyPatch, type AllocationReport, type AllocatorConfig, type Outcome } from './service-alloc.ts';
import { StateFileWriter, readStateFile, stateFileContent } from './allocation-state.ts';

type Obj = K8sService | K8sEndpointSlice | K8sNode;
type Kind = 'Service' | 'EndpointSlice' | 'Node';
export type ManifestObjects = Map<string, { kind: Kind; obj: Obj }>;

export class ManifestError extends KproxyError {
  declare readonly code: 'KPROXY_MANIFEST_INVALID';
  constructor(
    readonly file: string,
    /** 1-based; 0 when the problem is the file as a whole (unreadable, too big) */
    readonly line: number,
    /** what is wrong, without the file */
    readonly reason: string,
  ) {
    super('KPROXY_MANIFEST_INVALID', `${file}${line > 0 ? `:${line}` : ''}: ${reason}`);
  }
}

export class ManifestDirError extends KproxyError {
  declare readonly code: 'KPROXY_MANIFEST_DIR';
  constructor(
    readonly dir: string,
    cause: string,
  ) {
    super('KPROXY_MANIFEST_DIR', `cannot read manifests directory ${dir}: ${cause}; check --manifests`);
  }
}

const FILE_RE = /\.(ya?ml|json)$/;
/** Bigger files are refused rather than risk the process's memory: 10,000 Services take about 8 MiB. */
export const MAX_MANIFEST_FILE_BYTES = 64 * 1024 * 1024;

/**
 * What a file holds besides its objects: the kinds kproxy does not use (ignored; logged at
 * debug level), and the objects skipped with a warning naming file:line (a misspelt core kind,
 * a document without a kind). Neither is a reason to refuse the file.
 */
export interface ManifestNotes {
  /** "apiVersion kind" of each kind ignored, once */
  ignored: Set<string>;
  warnings: ManifestError[];
}

export interface ParsedManifest {
  objects: ManifestObjects;
  notes: ManifestNotes;
}

const emptyNotes = (): ManifestNotes => ({ ignored: new Set(), warnings: [] });

/**
 * Parses one file into objects keyed "Kind/ns/name", one document per step, so callers can
 * yield between steps; returns the objects and the notes. Throws ManifestError naming
 * file:line when the file as a whole cannot be used.
 *
 * Two parsers: js-yaml is several times faster than the yaml package (10,000 Services: about
 * 0.5 s against 3-6 s here) but tells no line numbers, so it only ever decides the good case.
 * Whenever it fails or finds a problem (also one that only skips an object: its warning names
 * the line), the yaml package parses the file again: it decides, and names the line. Both use
 * the YAML 1.2 core schema, so they read good files alike.
 */
function* parseSteps(file: string, text: string): Generator<void, ParsedManifest, undefined> {
  const fast: ParsedManifest = { objects: new Map(), notes: emptyNotes() };
  if (yield* fastSteps(text, fast)) return fast;
  const exact: ParsedManifest = { objects: new Map(), notes: emptyNotes() };
  yield* exactSteps(file, text, exact);
  return exact;
}

/** js-yaml would expand an alias bomb without the yaml package's alias limit: anchors go the exact way. */
const ANCHOR_RE = /(?:^|[\s[{,:-])&[^\s]/;
/** A document marker: at the start of a line, it ends any document (YAML 1.2, c-forbidden). */
const DOC_MARKER_RE = /^---(?=[ \t\r\n]|$)/gm;

/** Thrown by the fast parser where a warning needs a line number: the exact parser takes over. */
const NEEDS_LINES = new Error('needs the exact parser');

/** Parses document by document with js-yaml; false when the exact parser must decide. */
function* fastSteps(text: string, out: ParsedManifest): Generator<void, boolean, undefined> {
  if (ANCHOR_RE.test(text)) return false;
  const warn = () => {
    throw NEEDS_LINES;
  };
  try {
    let start = 0;
    for (const m of text.matchAll(DOC_MARKER_RE)) {
      if (m.index > start) {
        addValue('', loadDocument(text.slice(start, m.index)), () => 0, out, warn);
        yield;
      }
      start = m.index;
    }
    addValue('', loadDocument(text.slice(start)), () => 0, out, warn);
    return true;
  } catch {
    return false;
  }
}

/** One document of a stream, by the fast parser: JSON.parse when jsonDocument takes it, else js-yaml. */
function loadDocument(doc: string): unknown {
  const v = jsonDocument(doc);
  return v === NOT_JSON ? loadYaml(doc, { schema: CORE_SCHEMA }) : v;
}

export const NOT_JSON: unique symbol = Symbol('not JSON');

/** What js-yaml refuses outside double quotes (its PATTERN_NON_PRINTABLE): declined whole, to be safe. */
const NON_PRINTABLE_RE = /[\x00-\x08\x0B\x0C\x0E-\x1F\x7F-\x84\x86-\x9F\uFFFE\uFFFF]|[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?:[^\uD800-\uDBFF]|^)[\uDC00-\uDFFF]/;
/** A key whose `:` is on a later line: JSON, but not YAML (an implicit key is one line). */
const KEY_THEN_NEWLINE_RE = /"[ \t]*[\r\n][ \t\r\n]*:/;
/** Deeper JSON goes to js-yaml, which decides as it does for YAML (it overflows its stack at some depth). */
const MAX_JSON_DEPTH = 100;

/**
 * A document that is plain JSON (`kubectl get -o json`, generated manifests), parsed by
 * JSON.parse: about ten times faster than js-yaml, and its strings are not slices of the
 * file's text. JSON is YAML 1.2, and a JSON document that js-yaml reads with the core schema
 * gives the same value from both, except where this declines (NOT_JSON), leaving the
 * document to js-yaml: not JSON at all; a duplicate key (JSON.parse keeps the last, YAML
 * refuses the document); an integer -0 (YAML's is 0); a key with its `:` on a later line
 * (YAML refuses it); a tab, or a character js-yaml refuses in any stream; nesting deeper than
 * MAX_JSON_DEPTH. Duplicates are found by counting: every key is a closing quote followed
 * by `:`, so the quotes followed by `:` are at least the keys written; when they are as many
 * as the keys the parsed objects hold, no key was written twice (an escaped quote followed
 * by `:` inside a string counts too, and only sends the document to js-yaml).
 */
export function jsonDocument(doc: string): unknown {
  let i = /^---(?=[ \t\r\n]|$)/.test(doc) ? 3 : 0;
  while (i < doc.length && (doc.charCodeAt(i) === 0x20 || doc.charCodeAt(i) === 0x0a || doc.charCodeAt(i) === 0x0d)) i++;
  const first = doc.charCodeAt(i);
  if (first !== 0x7b /* { */ && first !== 0x5b /* [ */) return NOT_JSON;
  if (doc.includes('\t') || NON_PRINTABLE_RE.test(doc) || KEY_THEN_NEWLINE_RE.test(doc)) return NOT_JSON;
  let value: unknown;
  try {
    value = JSON.parse(i === 0 ? doc : doc.slice(i));
  } catch {
    return NOT_JSON;
  }
  const keys = countKeys(value, 0);
  return keys >= 0 && keys === quotesBeforeColon(doc, i) ? value : NOT_JSON;
}

/** The own keys of every object in v; -1 for an integer -0 or nesting deeper than MAX_JSON_DEPTH. */
function countKeys(v: unknown, depth: number): number {
  if (typeof v !== 'object' || v === null) return Object.is(v, -0) ? -1 : 0;
  if (depth >= MAX_JSON_DEPTH) return -1;
  let n = 0;
  if (Array.isArray(v)) {
    for (const x of v) {
      const k = countKeys(x, depth + 1);
      if (k < 0) return -1;
      n += k;
    }
    return n;
  }
  for (const key in v) {
    const k = countKeys((v as Record<string, unknown>)[key], depth + 1);
    if (k < 0) return -1;
    n += k + 1;
  }
  return n;
}

/** How many `"` in text (from `from`) are followed by spaces and a `:`. */
function quotesBeforeColon(text: string, from: number): number {
  let n = 0;
  for (let q = text.indexOf('"', from); q >= 0; q = text.indexOf('"', q + 1)) {
    let j = q + 1;
    while (text.charCodeAt(j) === 0x20) j++;
    if (text.charCodeAt(j) === 0x3a /* : */) n++;
  }
  return n;
}

/** Parses with the yaml package: every error with its line. */
function* exactSteps(file: string, text: string, out: ParsedManifest): Generator<void, void, undefined> {
  const lines = new LineCounter();
  const lineOf = (offset: number) => Math.max(1, lines.linePos(Math.max(0, offset)).line);
  const composer = new Composer();
  const parser = new Parser(lines.addNewLine);
  const docs = composer.compose(parser.parse(text));
  for (;;) {
    let next: IteratorResult<Document.Parsed>;
    try {
      next = docs.next();
    } catch (e) {
      // the parser itself gave up (e.g. "Maximum call stack size exceeded"): name the last line it reached
      throw new ManifestError(file, Math.max(1, lines.lineStarts.length), (e as Error).message);
    }
    if (next.done) return;
    addDocument(file, next.value, lineOf, out);
    yield;
  }
}

function addDocument(file: string, doc: Document.Parsed, lineOf: (offset: number) => number, out: ParsedManifest): void {
  if (doc.errors.length) {
    const e = doc.errors[0];
    throw new ManifestError(file, lineOf(e.pos[0]), e.message.split('\n')[0]);
  }
  // Errors point at the object's own line (its `kind:` when there is one), not at the start
  // of the document: that may be a `---` or comment line, or the head of a List.
  const itemsNode = isMap(doc.contents) ? doc.contents.get('items', true) : undefined;
  const lineOfItem = (i: number): number => {
    if (i < 0) return lineOf(doc.range[0]);
    const node = isSeq(itemsNode) && isMap(doc.contents) && /List$/.test(String(doc.contents.get('kind'))) ? itemsNode.items[i] : doc.contents;
    const kindNode = isMap(node) ? node.get('kind', true) : undefined;
    const range = (kindNode as { range?: number[] } | undefined)?.range ?? (node as { range?: number[] } | null)?.range;
    return lineOf(range?.[0] ?? doc.range?.[0] ?? 0);
  };
  let value: unknown;
  try {
    value = doc.toJS(); // refuses an alias bomb ("Excessive alias count")
  } catch (e) {
    throw new ManifestError(file, lineOf(doc.range[0]), (e as Error).message);
  }
  addValue(file, value, lineOfItem, out, (line, reason) => out.notes.warnings.push(new ManifestError(file, line, reason)));
}

/**
 * The kinds of the core API group's v1 (k8s.io/api/core/v1 register.go addKnownTypes) and the
 * meta kinds every group version has (metav1.AddToGroupVersion): `apiVersion: v1` with any other
 * kind is a misspelt kind, not another project's.
 */
const CORE_V1_KINDS = new Set([
  'Pod', 'PodList', 'PodStatusResult', 'PodTemplate', 'PodTemplateList', 'ReplicationController', 'ReplicationControllerList',
  'Service', 'ServiceProxyOptions', 'ServiceList', 'Endpoints', 'EndpointsList', 'Node', 'NodeConfigSource', 'NodeList',
  'NodeProxyOptions', 'Binding', 'Event', 'EventList', 'List', 'LimitRange', 'LimitRangeList', 'ResourceQuota',
  'ResourceQuotaList', 'Namespace', 'NamespaceList', 'Secret', 'SecretList', 'ServiceAccount', 'ServiceAccountList',
  'PersistentVolume', 'PersistentVolumeList', 'PersistentVolumeClaim', 'PersistentVolumeClaimList', 'PodAttachOptions',
  'PodLogOptions', 'PodExecOptions', 'PodPortForwardOptions', 'PodProxyOptions', 'ComponentStatus', 'ComponentStatusList',
  'SerializedReference', 'RangeAllocation', 'ConfigMap', 'ConfigMapList', 'EphemeralContainers',
  'Status', 'WatchEvent', 'ListOptions', 'GetOptions', 'CreateOptions', 'UpdateOptions', 'PatchOptions', 'DeleteOptions',
]);
/** discovery.k8s.io's kinds (k8s.io/api/discovery/v1 register.go) */
const DISCOVERY_KINDS = new Set(['EndpointSlice', 'EndpointSliceList']);

type Classified = Kind | { ignore: string } | { warn: string };

/**
 * What kproxy does with an object of this apiVersion and kind: take it (Service and Node of the
 * core group, discovery.k8s.io's EndpointSlice; no apiVersion is taken as theirs), ignore it
 * (every other group's kinds, the core kinds kproxy does not use), or skip it with a warning (a
 * kind the core or discovery group does not have: misspelt).
 */
function classify(apiVersion: unknown, kind: string): Classified {
  const av = typeof apiVersion === 'string' ? apiVersion : '';
  const group = av.includes('/') ? av.slice(0, av.lastIndexOf('/')) : '';
  const ignore = { ignore: `${av || '(no apiVersion)'} ${kind}` };
  if (av === '') return kind === 'Service' || kind === 'EndpointSlice' || kind === 'Node' ? kind : ignore;
  if (av === 'v1') {
    if (kind === 'Service' || kind === 'Node') return kind;
    if (CORE_V1_KINDS.has(kind)) return ignore;
    return { warn: `apiVersion v1 has no kind ${JSON.stringify(kind)} (misspelt?${DISCOVERY_KINDS.has(kind) ? ' EndpointSlice is discovery.k8s.io/v1' : ''}); object skipped` };
  }
  if (group === 'discovery.k8s.io') {
    if (kind === 'EndpointSlice') return kind;
    return { warn: `apiVersion ${av} has no kind ${JSON.stringify(kind)} (misspelt?); object skipped` };
  }
  return ignore;
}

/**
 * Checks one document's value (an object or a List of them) and adds its objects.
 * lineOfItem(-1) is the document's line; warn() reports an object skipped (file:line).
 */
function addValue(file: string, value: unknown, lineOfItem: (i: number) => number, out: ParsedManifest, warn: (line: number, reason: string) => void): void {
  if (value === null || value === undefined) return;
  const field = (v: unknown, f: string) => (typeof v === 'object' && v !== null ? (v as Record<string, unknown>)[f] : undefined);
  const listKind = field(value, 'kind');
  const rawItems = field(value, 'items');
  const isList = typeof listKind === 'string' && listKind.endsWith('List') && !Array.isArray(value);
  if (isList && !Array.isArray(rawItems) && rawItems !== undefined && rawItems !== null) {
    const av = field(value, 'apiVersion');
    // another group's *List kind is that group's business; a core List must hold a list
    if (av === undefined || av === 'v1') throw new ManifestError(file, lineOfItem(-1), `${String(listKind)}.items must be a list`);
    out.notes.ignored.add(`${String(av)} ${listKind}`);
    return;
  }
  const items = isList ? ((rawItems as unknown[] | null | undefined) ?? []) : [value];
  for (const [i, item] of items.entries()) {
    if (typeof item !== 'object' || item === null || Array.isArray(item)) {
      // not a manifest at all (a scalar, a binary file): the file is refused
      throw new ManifestError(file, lineOfItem(i), 'a document must be a Kubernetes object');
    }
    const o = item as { apiVersion?: unknown; kind?: unknown; metadata?: unknown };
    if (typeof o.kind !== 'string' || o.kind === '') {
      warn(lineOfItem(i), o.kind === undefined || o.kind === null || o.kind === '' ? 'object without kind; skipped' : `kind must be a string, got ${JSON.stringify(o.kind)}; object skipped`);
      continue;
    }
    const c = classify(o.apiVersion, o.kind);
    if (typeof c === 'object') {
      if ('warn' in c) warn(lineOfItem(i), c.warn);
      else out.notes.ignored.add(c.ignore);
      continue;
    }
    const kind = c;
    const line = lineOfItem(i);
    const meta = o.metadata as { name?: unknown; namespace?: unknown } | undefined;
    if (typeof meta !== 'object' || meta === null || Array.isArray(meta)) throw new ManifestError(file, line, `${kind} without metadata.name`);
    if (typeof meta.name !== 'string' || !meta.name) throw new ManifestError(file, line, `${kind} without metadata.name`);
    if (meta.namespace !== undefined && meta.namespace !== null && typeof meta.namespace !== 'string') {
      throw new ManifestError(file, line, `${kind} ${meta.name}: metadata.namespace must be a string`);
    }
    if (kind !== 'Node') meta.namespace = meta.namespace || 'default';
    const key = `${kind}/${(meta.namespace as string | undefined) ?? ''}/${meta.name}`;
    if (out.objects.has(key)) throw new ManifestError(file, line, `duplicate ${key}`);
    out.objects.set(key, { kind, obj: item as Obj });
  }
}

/** Parses one manifest file into its objects and notes. Throws ManifestError. Blocks: use parseManifestText for big input. */
export function parseManifest(file: string, text: string): ParsedManifest {
  const steps = parseSteps(file, text);
  for (;;) {
    const r = steps.next();
    if (r.done) return r.value;
  }
}

/** Parses one manifest file into objects keyed "Kind/ns/name". Throws ManifestError. Blocks: use parseManifestText for big input. */
export function parseManifestFile(file: string, text: string): ManifestObjects {
  return parseManifest(file, text).objects;
}

/** parseManifest with the exact parser only: for tests that both parsers read files alike. */
export function parseManifestFileExact(file: string, text: string): ParsedManifest {
  const out: ParsedManifest = { objects: new Map(), notes: emptyNotes() };
  for (const _ of exactSteps(file, text, out));
  return out;
}

/**
 * As parseManifestFile, but gives the event loop a turn whenever a slice of parsing has run
 * for sliceMs, so health checks and timers keep answering while a big file loads.
 */
export async function parseManifestText(file: string, text: string, sliceMs = 10): Promise<ParsedManifest> {
  const steps = parseSteps(file, text);
  let sliceStart = performance.now();
  for (;;) {
    const r = steps.next();
    if (r.done) return r.value;
    if (performance.now() - sliceStart >= sliceMs) {
      await yieldToEventLoop();
      sliceStart = performance.now();
    }
  }
}

/** One file of a manifests directory: its objects, or why it was refused. */
export interface ManifestFile {
  name: string;
  path: string;
  /** changes whenever the file's content may have changed */
  sig: string;
  objects?: ManifestObjects;
  /** what was ignored or skipped in a good file */
  notes?: ManifestNotes;
  error?: ManifestError;
  /** the file could not be read (EMFILE, EIO, ...): read it again at the next scan */
  unreadable?: boolean;
}

export interface ReadManifestDirOptions {
  /**
   * only these file names (the watcher's events), not a listing of the directory: a change
   * of one file among 10,000 stats one; names that are not manifest files are ignored
   */
  only?: Iterable<string>;
  /** files whose signature is unchanged are not read again (the watcher's cache) */
  unchanged?: (name: string, sig: string) => boolean;
  /** checked between files: stop early (the source was stopped) */
  cancelled?: () => boolean;
  sliceMs?: number;
}

const isManifestFileName = (n: string) => FILE_RE.test(n) && !n.startsWith('.') && !n.includes('/');

/** A scan of named files only: a missing file is a deletion only while the directory is there. Throws ManifestDirError. */
async function requireDirectory(dir: string): Promise<void> {
  try {
    if ((await stat(dir)).isDirectory()) return;
  } catch {
    /* reported below, with the message a full scan gives (warnings are logged once per message) */
  }
  await listManifestFiles(dir);
}

/** The manifest file names of dir, sorted. Throws ManifestDirError. */
export async function listManifestFiles(dir: string): Promise<string[]> {
  try {
    return (await readdir(dir)).filter(isManifestFileName).sort();
  } catch (e) {
    throw new ManifestDirError(dir, (e as Error).message);
  }
}

/**
 * Reads a manifests directory into objects and problems, file by file: the one reader `run`,
 * `render` and `trace` share. A broken file is returned with its error, never thrown; a file
 * that vanished between listing and reading is left out. Throws ManifestDirError only when
 * the directory itself cannot be read.
 */
export async function readManifestDir(dir: string, opts: ReadManifestDirOptions = {}): Promise<{ names: string[]; read: ManifestFile[]; missing: string[]; statted: number }> {
  if (opts.only) await requireDirectory(dir);
  const names = opts.only ? [...new Set(opts.only)].filter(isManifestFileName).sort() : await listManifestFiles(dir);
  const read: ManifestFile[] = [];
  /** names that vanished between the listing (or the event) and the read */
  const missing: string[] = [];
  let statted = 0;
  for (const name of names) {
    if (opts.cancelled?.()) break;
    const path = join(dir, name);
    let sig = 'unknown';
    let text: string;
    try {
      statted++;
      const st = await stat(path);
      sig = `${st.mtimeMs}:${st.size}:${st.ino}`;
      if (opts.unchanged?.(name, sig)) continue;
      // a FIFO or device named *.yaml would block the read forever
      if (!st.isFile()) {
        read.push({ name, path, sig, error: new ManifestError(path, 0, 'not a regular file') });
        continue;
      }
      if (st.size > MAX_MANIFEST_FILE_BYTES) {
        read.push({ name, path, sig, error: new ManifestError(path, 0, `${st.size} bytes is over the ${MAX_MANIFEST_FILE_BYTES}-byte limit; split the file`) });
        continue;
      }
      text = await readFile(path, 'utf8');
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code === 'ENOENT') {
        missing.push(name); // vanished between readdir and read: the next scan sees it gone
        continue;
      }
      read.push({ name, path, sig, unreadable: true, error: new ManifestError(path, 0, `cannot read: ${(e as Error).message}`) });
      continue;
    }
    try {
      const parsed = await parseManifestText(path, text, opts.sliceMs);
      read.push({ name, path, sig, objects: parsed.objects, notes: parsed.notes });
    } catch (e) {
      const err = e instanceof ManifestError ? e : new ManifestError(path, 0, (e as Error).message);
      read.push({ name, path, sig, error: err });
    }
  }
  return { names, read, missing, statted };
}

const byName = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);

/** Objects defined in more than one file: the later file (in name order) wins. */
export interface ManifestDuplicate {
  /** the file whose definition is overridden, and the one that wins */
  loser: string;
  winner: string;
  keys: string[];
}

/** Merges files' objects in name order; later files win, and each overridden pair of files is reported once. */
export function mergeManifestObjects<V = { kind: Kind; obj: Obj }>(files: Iterable<[name: string, objects: Map<string, V>]>): { objects: Map<string, V>; duplicates: ManifestDuplicate[] } {
  const objects = new Map<string, V>();
  const owner = new Map<string, string>();
  const dups = new Map<string, ManifestDuplicate>();
  for (const [name, objs] of [...files].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) {
    for (const [key, v] of objs) {
      const prev = owner.get(key);
      if (prev !== undefined) {
        const pair = `${prev}\0${name}`;
        let d = dups.get(pair);
        if (!d) dups.set(pair, (d = { loser: prev, winner: name, keys: [] }));
        d.keys.push(key);
      }
      owner.set(key, name);
      objects.set(key, v);
    }
  }
  return { objects, duplicates: [...dups.values()] };
}

/**
 * Remembers which warnings have been logged, so a situation that persists across polls is
 * logged once, and again only when it changes (its signature, e.g. the files' sigs, differs)
 * or after it went away and came back.
 */
export class WarnOnce {
  private readonly seen = new Map<string, string>();
  /** Runs log() unless key was already reported with the same signature. */
  report(key: string, sig: string, log: () => void): void {
    if (this.seen.get(key) === sig) return;
    this.seen.set(key, sig);
    log();
  }
  /** Forgets the keys not in keep that start with prefix: those situations are over. */
  retain(prefix: string, keep: Set<string>): void {
    for (const k of this.seen.keys()) if (k.startsWith(prefix) && !keep.has(k)) this.seen.delete(k);
  }
  forget(key: string): boolean {
    return this.seen.delete(key);
  }
}

export interface ManifestsSourceOptions {
  dir: string;
  nodeName: string;
  log: Logger;
  /** how often to rescan in addition to fs.watch events (editors replace files in ways watch misses) */
  pollMs?: number;
  /** the ranges Services get cluster IPs and node ports from (default: kube-apiserver's defaults) */
  allocation?: AllocatorConfig;
  /** the state file of the allocations: read at start, written when they change; none: not kept */
  statePath?: string;
}

/** "Service/ns/name" → "ns/name" (the allocator's keys) */
const serviceName = (key: string) => key.slice('Service/'.length);

/**
 * How the source remembers an object between scans: a digest of its JSON text, not the object
 * nor its text. At 10,000 Services × 5 endpoints the parsed objects took 62 MiB of heap and
 * their texts 25 MiB; the source needs neither: it tells what changed by comparing digests,
 * and the old object of an update or delete it hands over carries the object's identity
 * (kind, metadata.name, metadata.namespace) only, which is all a handler may rely on (see
 * SourceHandler). The text is kept from the read until the object is delivered (objects are
 * delivered parsed from it: see publish), and for an object another file overrides (it may
 * win again). An object JSON cannot carry exactly (a non-finite number from `.inf` / `.nan`)
 * is kept as parsed.
 */
export interface StoredObject {
  kind: Kind;
  /** the JSON text's digest (digestOf) */
  digest?: string;
  /** the JSON text, until the object is delivered */
  text?: string;
  obj?: Obj;
}

function exactInJSON(_k: string, v: unknown): unknown {
  if (typeof v === 'number' && !Number.isFinite(v)) throw new RangeError('not representable in JSON');
  return v;
}

/** The kind as a literal: the parser's is a slice of the document's text, and keeps all of it alive. */
function literalKind(kind: Kind): Kind {
  return kind === 'Service' ? 'Service' : kind === 'EndpointSlice' ? 'EndpointSlice' : 'Node';
}

export function storeObject(parsedKind: Kind, obj: Obj): StoredObject {
  const kind = literalKind(parsedKind);
  try {
    const text = JSON.stringify(obj, exactInJSON);
    // V8 builds a long JSON.stringify result as a tree of pieces; reading a character
    // flattens it into one string in place, so the pieces' overhead is not kept.
    text.charCodeAt(0);
    return { kind, text, digest: digestOf(text) };
  } catch {
    return { kind, obj };
  }
}

/**
 * The first 128 bits of the text's sha256, one character per byte (Latin-1): a 32-byte string
 * kept per object, where base64 of the whole hash took 64 (20,000 objects at 10,000 Services).
 * It only ever tells whether an object changed between scans; 128 bits leave no chance of two
 * versions colliding.
 */
function digestOf(text: string): string {
  return (hash('sha256', text, 'buffer') as Buffer).toString('latin1', 0, 16);
}

/** The object, while its text is kept (or it is kept as parsed); undefined once only its digest is. */
export function restoreObject(s: StoredObject): Obj | undefined {
  return s.obj ?? (s.text === undefined ? undefined : (JSON.parse(s.text) as Obj));
}

/** What a handler gets as the old object of an update or delete: the object's identity. */
export function identityObject(key: string, kind: Kind): Obj {
  const [, namespace, ...name] = key.split('/');
  return { kind, metadata: kind === 'Node' ? { name: name.join('/') } : { name: name.join('/'), namespace } } as Obj;
}

function sameStored(a: StoredObject, b: StoredObject): boolean {
  if (a.digest !== undefined && b.digest !== undefined) return a.digest === b.digest;
  if (a.obj !== undefined && b.obj !== undefined) return isDeepStrictEqual(a.obj, b.obj);
  return false;
}

/** Yields to the event loop once a slice of synchronous work has run for sliceMs. */
class TimeSlicer {
  private start = performance.now();
  constructor(private readonly sliceMs: number) {}

  /** true when it yielded */
  async maybeYield(): Promise<boolean> {
    if (performance.now() - this.start < this.sliceMs) return false;
    await yieldToEventLoop();
    this.start = performance.now();
    return true;
  }
}

export class ManifestsSource implements Source {
  /** the last good content of each file, compact (see StoredObject) */
  private readonly files = new Map<string, { sig: string; objects: Map<string, StoredObject> }>();
  /** files whose current content is broken: why, and the signature it was refused at */
  private readonly broken = new Map<string, { sig: string; summary: string }>();
  /** what the handler has been told, by "Kind/ns/name" */
  private current = new Map<string, StoredObject>();
  /**
   * "Kind/ns/name" → the files that define it, in name order (one name when it is defined
   * once, the common case): the last one wins. Kept up to date file by file, so a change to
   * one file costs that file's objects, not the whole directory's.
   */
  private readonly definers = new Map<string, string | string[]>();
  /** the keys defined in more than one file (the duplicate warnings are computed from these) */
  private readonly multiDefined = new Set<string>();
  /** file names the watcher reported since the last scan; 'all' when a full scan is due */
  private dirty: Set<string> | 'all' = 'all';
  /** work done, for tests and benches: a one-file change must cost O(that file) */
  readonly work = { scans: 0, filesStatted: 0, filesRead: 0, objectsConsidered: 0, delivered: 0 };
  private handler: SourceHandler | null = null;
  private watcher: FSWatcher | null = null;
  private poll: NodeJS.Timeout | null = null;
  private debounce: NodeJS.Timeout | null = null;
  private lastScanMs = 0;
  private dirProblem: string | null = null;
  private dirOk = false;
  private scanning: Promise<void> | null = null;
  private rescan = false;
  private stopped = false;
  /** gives the event loop a turn every 10 ms of storing or delivering objects */
  private readonly slice = new TimeSlicer(10);
  /** per-poll warnings (duplicates, an unreadable directory) are logged once per change of the situation */
  private readonly once = new WarnOnce();
  /** what the API server would allocate: cluster IPs, node ports (src/sources/service-alloc.ts) */
  private allocator: ServiceAllocator;
  private readonly stateWriter: StateFileWriter | null;
  /** the state file is kept once it existed or something was allocated (no file for manifests that give every value) */
  private persist = false;
  private savedVersion = -1;
  private saveTimer: NodeJS.Timeout | null = null;
  /** "Service/ns/name" of the Services the handler has (a refused one is not among them) */
  private readonly delivered = new Set<string>();
  /** "apiVersion kind" of the kinds ignored so far (each logged once, at debug level) */
  private readonly ignoredKinds = new Set<string>();

  constructor(private readonly opts: ManifestsSourceOptions) {
    this.allocator = this.newAllocator();
    this.stateWriter = opts.statePath ? new StateFileWriter(opts.statePath, opts.log) : null;
  }

  private newAllocator(state?: ConstructorParameters<typeof ServiceAllocator>[1]): ServiceAllocator {
    // a refused Service is tried again from its kept text (dropText keeps the text of refused Services)
    const load = (name: string) => {
      const v = this.current.get(`Service/${name}`);
      return v ? (restoreObject(v) as K8sService | undefined) : undefined;
    };
    return new ServiceAllocator(this.opts.allocation ?? allocatorConfig(), state, load);
  }

  /** Which Services got which allocated values, and which were refused. */
  allocations(): AllocationReport {
    return this.allocator.report();
  }

  async start(handler: SourceHandler): Promise<void> {
    this.handler = handler;
    this.stopped = false;
    if (this.opts.statePath) {
      const { state, problem } = readStateFile(this.opts.statePath);
      if (problem) this.opts.log.warn({ file: this.opts.statePath }, problem);
      this.persist = !!state || !!problem;
      this.allocator = this.newAllocator(state);
      if (state) this.opts.log.info({ file: this.opts.statePath, services: Object.keys(state.services).length }, 'manifests state file read');
    }
    const cfg = this.allocator.config;
    this.opts.log.info(
      { serviceClusterIPRange: cfg.ipRanges.map((r) => r.cidr).join(','), serviceNodePortRange: cfg.nodePorts.text, stateFile: this.opts.statePath ?? null },
      'Services without cluster IPs or node ports get them as kube-apiserver allocates them',
    );
    await this.scan();
    if (this.stopped) return; // stopped while the first scan ran
    handler.onSynced();
    try {
      this.watcher = watch(this.opts.dir, (_event, name) => this.scheduleScan(typeof name === 'string' ? name : null));
      this.watcher.on('error', () => {});
    } catch (e) {
      this.opts.log.warn({ dir: this.opts.dir, err: (e as Error).message }, 'cannot watch manifests directory; polling only');
    }
    this.poll = setInterval(() => void this.scan(), this.opts.pollMs ?? 1000);
    this.poll.unref();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.watcher?.close();
    if (this.poll) clearInterval(this.poll);
    if (this.debounce) clearTimeout(this.debounce);
    this.handler = null;
    await this.scanning;
    if (this.saveTimer) {
      clearTimeout(this.saveTimer);
      this.saveTimer = null;
      this.saveState();
    }
    await this.stateWriter?.flush();
  }

  /**
   * Writes the state file soon after the allocations changed: a burst of changes is one write,
   * and the holdings are serialised only then (O(Services) per write, not per change).
   */
  private scheduleSave(): void {
    if (!this.stateWriter || this.saveTimer || this.allocator.version === this.savedVersion) return;
    if (!this.persist && !this.allocator.matters) return;
    this.saveTimer = setTimeout(() => {
      this.saveTimer = null;
      this.saveState();
    }, 100);
    this.saveTimer.unref();
  }

  private saveState(): void {
    if (!this.stateWriter || this.allocator.version === this.savedVersion) return;
    if (!this.persist && !this.allocator.matters) return;
    this.persist = true;
    this.savedVersion = this.allocator.version;
    this.stateWriter.save(stateFileContent(this.opts.dir, this.allocator.config, this.allocator.snapshot()));
  }

  /** Logs what a good file ignored (each kind once, debug) and skipped (warnings naming file:line, once per content). */
  private reportNotes(f: ManifestFile): void {
    for (const k of f.notes?.ignored ?? []) {
      if (this.ignoredKinds.has(k)) continue;
      const kind = JSON.parse(JSON.stringify(k)) as string; // a fresh string: the parsed one may keep the file's text alive
      this.ignoredKinds.add(kind);
      this.opts.log.debug({ kind, file: f.path }, 'kind not used by kproxy; its objects are ignored');
    }
    const warnings = f.notes?.warnings ?? [];
    if (!warnings.length) {
      this.once.forget(`skip:${f.name}`);
      return;
    }
    this.once.report(`skip:${f.name}`, f.sig, () => {
      for (const w of warnings.slice(0, 10)) this.opts.log.warn({ file: f.path, line: w.line, err: w.message }, 'manifest object skipped; the rest of the file is used');
      if (warnings.length > 10) this.opts.log.warn({ file: f.path, more: warnings.length - 10 }, 'more manifest objects skipped in this file');
    });
  }

  /**
   * The problems, short: file names relative to the directory (health is served on every
   * address, and need not tell the paths), a bounded list of bounded reasons.
   */
  health(): SourceHealth {
    const clip = (s: string) => (s.length > 160 ? `${s.slice(0, 157)}...` : s);
    const broken = [...this.broken.values()].map((b) => clip(b.summary));
    const problems = [
      ...(this.dirProblem ? ['cannot read the manifests directory'] : []),
      ...broken.slice(0, 10),
      ...(broken.length > 10 ? [`and ${broken.length - 10} more broken files`] : []),
    ];
    return {
      synced: true,
      connected: this.dirOk,
      lastContactMs: this.lastScanMs,
      problem: problems.length ? problems.join('; ') : undefined,
    };
  }

  /** A watch event: scan the file it names soon (all files when it names none). */
  private scheduleScan(name: string | null): void {
    if (name === null) this.dirty = 'all';
    else if (this.dirty !== 'all') this.dirty.add(name);
    if (this.debounce) clearTimeout(this.debounce);
    this.debounce = setTimeout(() => void this.runScans(), 50);
    this.debounce.unref();
  }

  /**
   * Re-reads changed files (every file's signature is checked) and tells the handler what
   * changed. One scan runs at a time: a request during a scan makes it run once more. Never
   * rejects.
   */
  scan(): Promise<void> {
    this.dirty = 'all';
    return this.runScans();
  }

  /** Scans what is dirty: the files the watcher named, or all. */
  private runScans(): Promise<void> {
    if (this.scanning) {
      this.rescan = true;
      return this.scanning;
    }
    this.scanning = (async () => {
      try {
        do {
          this.rescan = false;
          const dirty = this.dirty;
          this.dirty = new Set();
          try {
            await this.scanOnce(dirty === 'all' ? undefined : dirty);
          } catch (e) {
            this.dirty = 'all'; // what it was to look at is not done: look at everything next time
            throw e;
          }
          this.once.forget('scan');
        } while (this.rescan && !this.stopped);
      } catch (e) {
        const msg = (e as Error).message;
        this.once.report('scan', msg, () => this.opts.log.error({ dir: this.opts.dir, err: msg }, 'manifests scan failed; retrying on the next poll'));
      } finally {
        this.scanning = null;
      }
    })();
    return this.scanning;
  }

  /** One scan: of the named files only, or (none given) of the whole directory. */
  private async scanOnce(only?: Set<string>): Promise<void> {
    let result: Awaited<ReturnType<typeof readManifestDir>>;
    this.work.scans++;
    try {
      result = await readManifestDir(this.opts.dir, {
        only,
        unchanged: (name, sig) => this.files.get(name)?.sig === sig || this.broken.get(name)?.sig === sig,
        cancelled: () => this.stopped,
      });
    } catch (e) {
      const msg = (e as Error).message;
      this.dirOk = false;
      this.dirProblem = msg;
      this.once.report('dir', msg, () =>
        this.opts.log.error({ dir: this.opts.dir, err: msg }, 'cannot read manifests directory; keeping the last good content'),
      );
      return;
    }
    if (this.stopped) return;
    if (this.dirProblem) this.opts.log.info({ dir: this.opts.dir }, 'manifests directory is readable again');
    this.dirOk = true;
    this.dirProblem = null;
    this.once.forget('dir');
    this.lastScanMs = Date.now();
    this.work.filesStatted += result.statted;
    this.work.filesRead += result.read.length;
    /** files whose objects changed: what they held before (undefined: nothing) */
    const changed = new Map<string, Map<string, StoredObject> | undefined>();
    const listed = new Set(result.names);
    const removed = only ? result.missing : [...this.files.keys(), ...this.broken.keys()].filter((f) => !listed.has(f));
    for (const f of removed) {
      const before = this.files.get(f);
      if (before && !changed.has(f)) changed.set(f, before.objects);
      this.files.delete(f);
      this.broken.delete(f);
      this.once.forget(`skip:${f}`);
    }
    for (const f of result.read) {
      if (f.objects) {
        if (!changed.has(f.name)) changed.set(f.name, this.files.get(f.name)?.objects);
        const stored = new Map<string, StoredObject>();
        // A fresh copy of the key: the parsed one is built from slices of the file's text,
        // and one slice kept alive keeps the whole text (8.7 MiB at 10,000 Services) alive.
        for (const [key, v] of f.objects) {
          stored.set(JSON.parse(JSON.stringify(key)) as string, storeObject(v.kind, v.obj));
          await this.slice.maybeYield();
        }
        this.files.set(f.name, { sig: f.sig, objects: stored });
        if (this.broken.delete(f.name)) this.opts.log.info({ file: f.path }, 'manifest file is valid again');
        this.reportNotes(f);
      } else {
        // logged once per content: an unchanged broken file is not read again
        // A file that could not be read (out of fds, I/O error) is read again at the next scan
        // (no signature matches ''), logged again only when the reason changes.
        const e = f.error ?? new ManifestError(f.path, 0, 'unknown error');
        const summary = `${f.name}${e.line > 0 ? `:${e.line}` : ''}: ${e.reason}`;
        const again = f.unreadable && this.broken.get(f.name)?.summary === summary;
        this.broken.set(f.name, { sig: f.unreadable ? '' : f.sig, summary });
        if (!again) this.opts.log.error({ file: f.path, err: e.message }, 'broken manifest file; its last good content stays in force');
      }
    }
    // A complete listing with no broken file tells which Services exist: the state file's
    // holdings of the others (deleted while kproxy was down) are released.
    await this.publish(changed, !only && this.broken.size === 0);
    this.scheduleSave();
  }

  /**
   * Tells the handler what changed: only the objects of the files that changed are looked
   * at (their definitions before and after, and which file wins each). Services go through the
   * allocator first, as one batch, and are delivered with the values it filled in; one it
   * refuses is reported and counted as invalid, and acts as a delete. Yields to the event
   * loop every few ms (the handler validates each object: 20,000 of them take seconds on a
   * loaded node), so health and timers keep answering; a stop meanwhile ends the delivery.
   * `complete`: the scan listed the whole directory and no file is broken.
   */
  private async publish(changed: Map<string, Map<string, StoredObject> | undefined>, complete = false): Promise<void> {
    const affected = this.affectedKeys(changed);
    this.work.objectsConsidered += affected.length;
    if (changed.size) this.reportDuplicates();
    const h = this.handler;
    if (!h) return;
    const { deletes, updates } = this.takeWinners(affected);
    const outcomes = await this.allocateBatch(deletes, updates, complete);
    /** Services a freed address or port let in: not in this batch, delivered as adds */
    const inBatch = new Set(updates.map(([k]) => k));
    const admitted = [...outcomes.keys()].filter((key) => outcomes.get(key)!.patch && !inBatch.has(key) && this.current.has(key));
    try {
      await this.deliverBatch(h, deletes, updates, admitted, outcomes);
    } finally {
      this.dropText([...affected, ...admitted]);
    }
  }

  /**
   * Records which files define each key of the changed files (define/undefine) and returns
   * those keys, each once, in file name order: the keys publish looks at.
   */
  private affectedKeys(changed: Map<string, Map<string, StoredObject> | undefined>): string[] {
    const affected: string[] = [];
    const seenKey = new Set<string>();
    const touch = (key: string) => {
      if (!seenKey.has(key)) {
        seenKey.add(key);
        affected.push(key);
      }
    };
    for (const name of [...changed.keys()].sort(byName)) {
      const before = changed.get(name);
      const after = this.files.get(name)?.objects;
      if (before) {
        for (const key of before.keys()) {
          if (!after?.has(key)) this.undefine(key, name);
          touch(key);
        }
      }
      if (after) {
        for (const key of after.keys()) {
          if (!before?.has(key)) this.define(key, name);
          touch(key);
        }
      }
    }
    return affected;
  }

  /**
   * Moves `current` to the winning definition of each affected key and returns what the
   * handler is to be told. What is delivered counts as told at once: a stop in the middle
   * of the delivery leaves nothing to redo. A winner whose text was dropped marks its file
   * to be read again.
   */
  private takeWinners(affected: string[]): {
    deletes: Array<[string, StoredObject]>;
    updates: Array<[string, StoredObject | undefined, StoredObject]>;
  } {
    const deletes: Array<[string, StoredObject]> = [];
    const updates: Array<[string, StoredObject | undefined, StoredObject]> = [];
    /** files to read again: the text of an object that wins again was dropped */
    const reread = new Set<string>();
    for (const key of affected) {
      const old = this.current.get(key);
      const [file, v] = this.winner(key) ?? [];
      if (!v) {
        if (old) {
          this.current.delete(key);
          deletes.push([key, old]);
        }
        continue;
      }
      if (old === v || (old && sameStored(old, v))) {
        this.current.set(key, v);
        continue;
      }
      if (v.text === undefined && v.obj === undefined) {
        // it lost to another file when its text was dropped, and wins again now: read its
        // file again (the current object stays what the handler has until then)
        reread.add(file!);
        continue;
      }
      this.current.set(key, v);
      updates.push([key, old, v]);
    }
    for (const f of reread) {
      const entry = this.files.get(f);
      if (entry) entry.sig = '';
      if (this.dirty !== 'all') this.dirty.add(f);
      this.rescan = true;
    }
    return { deletes, updates };
  }

  /**
   * The allocator's outcome for each Service it decided on. The state file's holdings of
   * Services that no longer exist are released first (they were deleted while kproxy was
   * down); then the Services of this batch are allocated together, each object parsed once
   * here and not kept. `render` does the same, in the same order (src/cli/state.ts).
   */
  private async allocateBatch(
    deletes: Array<[string, StoredObject]>,
    updates: Array<[string, StoredObject | undefined, StoredObject]>,
    complete: boolean,
  ): Promise<Map<string, Outcome>> {
    const outcomes = new Map<string, Outcome>();
    if (complete && this.allocator.hasDormant) {
      const present = new Set<string>();
      for (const key of this.definers.keys()) if (key.startsWith('Service/')) present.add(serviceName(key));
      for (const o of this.allocator.forgetAbsent(present)) outcomes.set(`Service/${o.key}`, o);
    }
    function* serviceChanges(): Generator<[string, K8sService | null]> {
      for (const [key, old] of deletes) if (old.kind === 'Service') yield [serviceName(key), null];
      for (const [key, , v] of updates) if (v.kind === 'Service') yield [serviceName(key), (restoreObject(v) as K8sService | undefined) ?? null];
    }
    const steps = this.allocator.applySteps(serviceChanges());
    for (;;) {
      const r = steps.next();
      if (r.done) {
        for (const o of r.value) outcomes.set(`Service/${o.key}`, o);
        break;
      }
      await this.slice.maybeYield();
    }
    return outcomes;
  }

  /**
   * Tells the handler the deletes, then the updates, then the admitted Services, yielding
   * between objects; a handler replaced meanwhile (a stop) ends the delivery.
   */
  private async deliverBatch(
    h: SourceHandler,
    deletes: Array<[string, StoredObject]>,
    updates: Array<[string, StoredObject | undefined, StoredObject]>,
    admitted: string[],
    outcomes: Map<string, Outcome>,
  ): Promise<void> {
    for (const [key, old] of deletes) {
      if (old.kind === 'Service') {
        this.once.forget(`refused:${key}`);
        if (!this.delivered.delete(key)) continue; // refused: the handler does not have it
      }
      this.deliver(h, key, old.kind, old.obj ?? identityObject(key, old.kind), null);
      if ((await this.slice.maybeYield()) && this.handler !== h) return;
    }
    for (const [key, old, v] of updates) {
      if (v.kind === 'Service') this.deliverService(h, outcomes, key, v);
      else this.deliver(h, key, v.kind, old ? (old.obj ?? identityObject(key, old.kind)) : null, restoreObject(v)!);
      if ((await this.slice.maybeYield()) && this.handler !== h) return;
    }
    for (const key of admitted) {
      this.deliverService(h, outcomes, key, this.current.get(key)!);
      if ((await this.slice.maybeYield()) && this.handler !== h) return;
    }
  }

  /** One object to the handler; one it cannot take must not keep the others from being delivered. */
  private deliver(h: SourceHandler, key: string, kind: Kind, oldObj: Obj | null, newObj: Obj | null): void {
    this.work.delivered++;
    try {
      if (kind === 'Service') h.onService(oldObj as K8sService | null, newObj as K8sService | null);
      else if (kind === 'EndpointSlice') h.onEndpointSlice(oldObj as K8sEndpointSlice | null, newObj as K8sEndpointSlice | null);
      else if ((newObj ?? oldObj)?.metadata?.name === this.opts.nodeName) h.onNode?.(newObj as K8sNode | null);
    } catch (e) {
      this.opts.log.error({ key, err: (e as Error).message }, 'object could not be applied; skipped');
    }
  }

  /** A Service as the allocator says: delivered with its values, or refused (reported; the handler's copy removed). */
  private deliverService(h: SourceHandler, outcomes: Map<string, Outcome>, key: string, v: StoredObject): void {
    const o = outcomes.get(key);
    const had = this.delivered.has(key);
    const oldObj = had ? identityObject(key, 'Service') : null;
    if (o?.patch) {
      this.once.forget(`refused:${key}`);
      this.delivered.add(key);
      this.deliver(h, key, 'Service', oldObj, applyPatch(restoreObject(v) as K8sService, o.patch));
      return;
    }
    const r = o?.refusal ?? { field: 'spec', reason: 'not allocated' };
    this.once.report(`refused:${key}`, `${r.field}: ${r.reason}`, () =>
      this.opts.log.warn({ object: serviceName(key), field: r.field }, coded('KPROXY_SERVICE_ALLOCATION', `Service ${serviceName(key)} refused: ${r.field}: ${r.reason}; skipped`)),
    );
    try {
      h.onInvalid?.('Service', serviceName(key));
    } catch {
      /* counting must not stop the delivery */
    }
    if (had) {
      this.delivered.delete(key);
      this.deliver(h, key, 'Service', oldObj, null);
    }
  }

  /**
   * Delivered objects are parsed again from their JSON text, not the YAML parser's objects:
   * those hold slices of the file's text, and the trackers keep strings of every slice.
   * Only winners drop their text: an overridden object keeps it, as it may win again, and so
   * does a refused Service (it is tried again whenever an address or port is freed).
   */
  private dropText(keys: string[]): void {
    for (const key of keys) {
      const v = this.current.get(key);
      if (v && !(v.kind === 'Service' && this.allocator.isRefused(serviceName(key)))) v.text = undefined;
    }
  }

  private define(key: string, file: string): void {
    const d = this.definers.get(key);
    if (d === undefined) {
      this.definers.set(key, file);
      return;
    }
    const list = typeof d === 'string' ? [d] : d;
    if (list.includes(file)) return;
    list.push(file);
    list.sort(byName);
    this.definers.set(key, list);
    this.multiDefined.add(key);
  }

  private undefine(key: string, file: string): void {
    const d = this.definers.get(key);
    if (d === undefined) return;
    if (typeof d === 'string') {
      if (d === file) this.definers.delete(key);
      return;
    }
    const list = d.filter((f) => f !== file);
    if (list.length > 1) this.definers.set(key, list);
    else {
      this.definers.set(key, list[0]);
      this.multiDefined.delete(key);
    }
  }

  /** The definition in force, and its file: the last file in name order that defines the key. */
  private winner(key: string): [string, StoredObject] | undefined {
    const d = this.definers.get(key);
    if (d === undefined) return undefined;
    const file = typeof d === 'string' ? d : d[d.length - 1];
    const v = this.files.get(file)?.objects.get(key);
    return v && [file, v];
  }

  /**
   * Warns once per pair of files where the later one overrides objects of the earlier one
   * (mergeManifestObjects' pairs), again only when one of the two files changes.
   */
  private reportDuplicates(): void {
    const sigOf = (name: string) => this.files.get(name)?.sig ?? '';
    const pairs = new Map<string, ManifestDuplicate>();
    for (const key of this.multiDefined) {
      const list = this.definers.get(key) as string[];
      for (let i = 1; i < list.length; i++) {
        const pair = `${list[i - 1]}\0${list[i]}`;
        let d = pairs.get(pair);
        if (!d) pairs.set(pair, (d = { loser: list[i - 1], winner: list[i], keys: [] }));
        d.keys.push(key);
      }
    }
    const dupKeys = new Set<string>();
    for (const d of pairs.values()) {
      const key = `dup:${d.loser}\0${d.winner}`;
      dupKeys.add(key);
      this.once.report(key, `${sigOf(d.loser)}|${sigOf(d.winner)}`, () =>
        this.opts.log.warn(
          { key: d.keys[0], file: d.winner, otherFile: d.loser, count: d.keys.length, keys: d.keys.slice(0, 10) },
          'object defined in more than one file; the later file wins',
        ),
      );
    }
    this.once.retain('dup:', dupKeys);
  }
}
