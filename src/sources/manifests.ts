// The manifests source: a directory of multi-document YAML (or JSON) files holding v1
// Services, discovery.k8s.io/v1 EndpointSlices and optionally this node's Node. It is the
// embedded default, so kproxy runs with no cluster at all. Edits apply without restart; a
// broken file is reported with file and line, and the last good content of that file stays
// in force.
import { readdirSync, readFileSync, statSync, watch, type FSWatcher } from 'node:fs';
import { join } from 'node:path';
import { parseAllDocuments, isMap, isSeq } from 'yaml';
import { isDeepStrictEqual } from 'node:util';
import type { K8sEndpointSlice, K8sService } from '../core/convert.ts';
import type { Logger } from '../log.ts';
import type { K8sNode, Source, SourceHandler, SourceHealth } from './types.ts';

type Obj = K8sService | K8sEndpointSlice | K8sNode;
type Kind = 'Service' | 'EndpointSlice' | 'Node';

export class ManifestError extends Error {
  readonly code = 'KPROXY_MANIFEST_INVALID';
  constructor(
    readonly file: string,
    readonly line: number,
    message: string,
  ) {
    super(`KPROXY_MANIFEST_INVALID: ${file}:${line}: ${message}`);
  }
}

interface FileState {
  sig: string;
  objects: Map<string, { kind: Kind; obj: Obj }>;
}

const FILE_RE = /\.(ya?ml|json)$/;

/** Parses one manifest file into objects keyed "Kind/ns/name". Throws ManifestError. */
export function parseManifestFile(file: string, text: string): Map<string, { kind: Kind; obj: Obj }> {
  const out = new Map<string, { kind: Kind; obj: Obj }>();
  const docs = parseAllDocuments(text, { prettyErrors: true });
  const lineOf = (offset: number) => text.slice(0, Math.max(0, offset)).split('\n').length;
  for (const doc of docs) {
    if (doc.errors.length) {
      const e = doc.errors[0];
      throw new ManifestError(file, e.linePos?.[0]?.line ?? lineOf(e.pos[0]), e.message.split('\n')[0]);
    }
    const value = doc.toJS() as unknown;
    if (value === null || value === undefined) continue;
    const isList = !!(value as { kind?: string }).kind?.endsWith('List');
    const items = isList ? ((value as { items?: unknown[] }).items ?? []) : [value];
    // Errors point at the object's own line (its `kind:` when there is one), not at the start
    // of the document: that may be a `---` or comment line, or the head of a List.
    const itemsNode = isList && isMap(doc.contents) ? doc.contents.get('items', true) : undefined;
    const nodes = isList ? (isSeq(itemsNode) ? itemsNode.items : []) : [doc.contents];
    const lineOfItem = (i: number): number => {
      const node = nodes[i];
      const kindNode = isMap(node) ? node.get('kind', true) : undefined;
      const range = (kindNode as { range?: number[] } | undefined)?.range ?? (node as { range?: number[] } | null)?.range;
      return lineOf(range?.[0] ?? doc.range?.[0] ?? 0);
    };
    for (const [i, item] of items.entries()) {
      const line = lineOfItem(i);
      if (typeof item !== 'object' || item === null || Array.isArray(item)) {
        throw new ManifestError(file, line, 'a document must be a Kubernetes object');
      }
      const o = item as { apiVersion?: string; kind?: string; metadata?: { name?: string; namespace?: string } };
      const kind = o.kind;
      if (kind !== 'Service' && kind !== 'EndpointSlice' && kind !== 'Node') {
        throw new ManifestError(file, line, `unsupported kind ${JSON.stringify(kind)} (want Service, EndpointSlice or Node)`);
      }
      if (!o.metadata?.name) throw new ManifestError(file, line, `${kind} without metadata.name`);
      if (kind !== 'Node') {
        o.metadata.namespace = o.metadata.namespace || 'default';
      }
      const key = `${kind}/${o.metadata.namespace ?? ''}/${o.metadata.name}`;
      if (out.has(key)) throw new ManifestError(file, line, `duplicate ${key}`);
      out.set(key, { kind, obj: item as Obj });
    }
  }
  return out;
}

export interface ManifestsSourceOptions {
  dir: string;
  nodeName: string;
  log: Logger;
  /** how often to rescan in addition to fs.watch events (editors replace files in ways watch misses) */
  pollMs?: number;
}

export class ManifestsSource implements Source {
  private readonly files = new Map<string, FileState>();
  /** what the handler has been told, by "Kind/ns/name" */
  private current = new Map<string, { kind: Kind; obj: Obj }>();
  private handler: SourceHandler | null = null;
  private watcher: FSWatcher | null = null;
  private poll: NodeJS.Timeout | null = null;
  private debounce: NodeJS.Timeout | null = null;
  private lastScanMs = 0;
  private errors = new Map<string, string>();
  private dirOk = false;

  constructor(private readonly opts: ManifestsSourceOptions) {}

  async start(handler: SourceHandler): Promise<void> {
    this.handler = handler;
    this.scan();
    handler.onSynced();
    try {
      this.watcher = watch(this.opts.dir, () => this.scheduleScan());
      this.watcher.on('error', () => {});
    } catch (e) {
      this.opts.log.warn({ dir: this.opts.dir, err: (e as Error).message }, 'cannot watch manifests directory; polling only');
    }
    this.poll = setInterval(() => this.scan(), this.opts.pollMs ?? 1000);
    this.poll.unref();
  }

  async stop(): Promise<void> {
    this.watcher?.close();
    if (this.poll) clearInterval(this.poll);
    if (this.debounce) clearTimeout(this.debounce);
    this.handler = null;
  }

  health(): SourceHealth {
    const problems = [...this.errors.values()];
    return {
      synced: true,
      connected: this.dirOk,
      lastContactMs: this.lastScanMs,
      problem: problems.length ? problems.join('; ') : undefined,
    };
  }

  private scheduleScan(): void {
    if (this.debounce) clearTimeout(this.debounce);
    this.debounce = setTimeout(() => this.scan(), 50);
    this.debounce.unref();
  }

  /** Re-reads changed files and tells the handler what changed. */
  scan(): void {
    let names: string[];
    try {
      names = readdirSync(this.opts.dir).filter((n) => FILE_RE.test(n) && !n.startsWith('.')).sort();
      this.dirOk = true;
    } catch (e) {
      this.dirOk = false;
      this.errors.set('<dir>', `cannot read ${this.opts.dir}: ${(e as Error).message}`);
      this.opts.log.error({ dir: this.opts.dir, err: (e as Error).message }, 'KPROXY_MANIFEST_DIR: cannot read manifests directory; keeping the last good content');
      return;
    }
    this.errors.delete('<dir>');
    this.lastScanMs = Date.now();
    const seen = new Set(names);
    for (const f of [...this.files.keys()]) {
      if (!seen.has(f)) {
        this.files.delete(f);
        this.errors.delete(f);
      }
    }
    for (const name of names) {
      const path = join(this.opts.dir, name);
      let sig: string;
      let text: string;
      try {
        const st = statSync(path);
        sig = `${st.mtimeMs}:${st.size}:${st.ino}`;
        if (this.files.get(name)?.sig === sig || this.errors.get(name)?.startsWith(`${sig}|`)) continue;
        text = readFileSync(path, 'utf8');
      } catch {
        continue; // vanished between readdir and read: the next scan sees it gone
      }
      try {
        const objects = parseManifestFile(path, text);
        this.files.set(name, { sig, objects });
        if (this.errors.delete(name)) this.opts.log.info({ file: path }, 'manifest file is valid again');
      } catch (e) {
        const msg = (e as Error).message;
        this.errors.set(name, `${sig}|${msg}`);
        this.opts.log.error({ file: path, err: msg }, 'broken manifest file; its last good content stays in force');
        const prev = this.files.get(name);
        if (prev) prev.sig = sig;
      }
    }
    this.publish();
  }

  private publish(): void {
    const next = new Map<string, { kind: Kind; obj: Obj }>();
    for (const [name, st] of [...this.files.entries()].sort(([a], [b]) => a.localeCompare(b))) {
      for (const [key, v] of st.objects) {
        if (next.has(key)) this.opts.log.warn({ key, file: name }, 'object defined in more than one file; the later file wins');
        next.set(key, v);
      }
    }
    const h = this.handler;
    if (!h) return;
    const deliver = (kind: Kind, oldObj: Obj | null, newObj: Obj | null) => {
      if (kind === 'Service') h.onService(oldObj as K8sService | null, newObj as K8sService | null);
      else if (kind === 'EndpointSlice') h.onEndpointSlice(oldObj as K8sEndpointSlice | null, newObj as K8sEndpointSlice | null);
      else if ((newObj ?? oldObj)?.metadata?.name === this.opts.nodeName) h.onNode?.(newObj as K8sNode | null);
    };
    for (const [key, v] of this.current) if (!next.has(key)) deliver(v.kind, v.obj, null);
    for (const [key, v] of next) {
      const old = this.current.get(key);
      if (!old) deliver(v.kind, null, v.obj);
      else if (!isDeepStrictEqual(old.obj, v.obj)) deliver(v.kind, old.obj, v.obj);
    }
    this.current = next;
  }
}
