// A test API server that speaks the kube-apiserver protocol for the few resources kproxy
// reads (Services, EndpointSlices, Nodes), so the real @kubernetes/client-node code talks
// to it unchanged, over HTTP or HTTPS (a self-signed certificate made with openssl at test
// time).
//
// What it models, after kube-apiserver's watch cache (staging/src/k8s.io/apiserver/pkg/
// storage/cacher):
// - one global, monotonically increasing resourceVersion shared by all resources;
// - list: {kind: XList, apiVersion, metadata: {resourceVersion}, items} (items without
//   kind/apiVersion), labelSelector (`k`, `!k`, `k=v`, `k==v`, `k!=v`, `k in (..)`,
//   `k notin (..)`), fieldSelector on metadata.name / metadata.namespace,
//   resourceVersion + resourceVersionMatch (NotOlderThan / Exact, 410 Expired for an Exact
//   version older than the retained history, 504 for one from the future);
// - watch=true: HTTP 200, chunked, one JSON event per line {type, object} with
//   kind/apiVersion set on objects; resourceVersion ""/"0" starts with synthetic ADDED
//   events for the current state; a version older than the retained window gets one
//   ERROR event carrying a Status (410, reason Expired, "too old resource version: X (Y)")
//   and the stream ends; selector transitions become ADDED / DELETED as in the cacher;
//   allowWatchBookmarks → periodic BOOKMARK events; sendInitialEvents=true → initial ADDED
//   events and a BOOKMARK annotated k8s.io/initial-events-end; timeoutSeconds ends the
//   stream cleanly;
// - bearer token check (401 Status), 404/405 Status for anything else, discovery documents.
// Test controls: create/update/apply/remove (bump the version and notify watchers),
// compact() (drop history → 410 for older watchers), dropWatches(), stop()/start() on the
// same port (state kept, or reset), request counters.
import http from 'node:http';
import https from 'node:https';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { AddressInfo, Socket } from 'node:net';
import { randomUUID } from 'node:crypto';
import { hostRunner, runChecked } from '../../src/kernel/runner.ts';

export type ResourceName = 'services' | 'endpointslices' | 'nodes';

interface ResourceDef {
  group: string;
  apiVersion: string;
  kind: string;
  namespaced: boolean;
}

const RESOURCES: Record<ResourceName, ResourceDef> = {
  services: { group: '', apiVersion: 'v1', kind: 'Service', namespaced: true },
  endpointslices: { group: 'discovery.k8s.io', apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', namespaced: true },
  nodes: { group: '', apiVersion: 'v1', kind: 'Node', namespaced: false },
};

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type KObject = { metadata?: { name?: string; namespace?: string; labels?: Record<string, string>; resourceVersion?: string; [k: string]: unknown }; [k: string]: any };

type EventType = 'ADDED' | 'MODIFIED' | 'DELETED';

interface HistoryEvent {
  rv: number;
  resource: ResourceName;
  type: EventType;
  /** the object after the change (for DELETED: the last state, with the deletion's version) */
  object: KObject;
  /** the object before the change (MODIFIED / DELETED) */
  prev?: KObject;
}

interface Watcher {
  resource: ResourceName;
  namespace?: string;
  filter: (o: KObject) => boolean;
  res: http.ServerResponse;
  timers: NodeJS.Timeout[];
  bookmarks: boolean;
}

export interface TestApiServerOptions {
  tls?: boolean;
  /** when set, every request must carry `Authorization: Bearer <token>` */
  token?: string;
  /** fixed port (default: an ephemeral one, kept across stop/start) */
  port?: number;
  /** interval of BOOKMARK events for watches that allow them (default 1000 ms) */
  bookmarkIntervalMs?: number;
  /** server-side watch timeout when the client gives no timeoutSeconds (default 1800 s) */
  defaultWatchTimeoutSeconds?: number;
}

export interface RequestRecord {
  method: string;
  path: string;
  query: Record<string, string>;
  watch: boolean;
  status?: number;
  /** arrival time (Date.now()) */
  at: number;
}

class HttpStatusError extends Error {
  constructor(
    readonly code: number,
    readonly reason: string,
    message: string,
  ) {
    super(message);
  }
}

function status(code: number, reason: string, message: string): Record<string, unknown> {
  return { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, code };
}

function clone<T>(o: T): T {
  return structuredClone(o);
}

function objKey(o: KObject, namespaced: boolean): string {
  const name = o.metadata?.name ?? '';
  return namespaced ? `${o.metadata?.namespace ?? ''}/${name}` : name;
}

// ---------- selectors ----------

type LabelReq = (labels: Record<string, string>) => boolean;

function splitTopLevel(s: string): string[] {
  const out: string[] = [];
  let depth = 0;
  let cur = '';
  for (const ch of s) {
    if (ch === '(') depth++;
    if (ch === ')') depth--;
    if (ch === ',' && depth === 0) {
      out.push(cur);
      cur = '';
    } else cur += ch;
  }
  out.push(cur);
  return out.map((x) => x.trim()).filter((x) => x !== '');
}

const LABEL_KEY_RE = /^([a-z0-9A-Z.\-/_]+)$/;

function parseLabelTerm(term: string): LabelReq {
  let m: RegExpMatchArray | null;
  if ((m = term.match(/^!\s*([^\s=!(),]+)$/))) {
    const k = m[1];
    return (l) => !(k in l);
  }
  if ((m = term.match(/^([^\s=!(),]+)\s+(in|notin)\s+\(([^)]*)\)$/))) {
    const [, k, op, list] = m;
    const values = list.split(',').map((v) => v.trim());
    return op === 'in' ? (l) => k in l && values.includes(l[k]) : (l) => !(k in l) || !values.includes(l[k]);
  }
  if ((m = term.match(/^([^\s=!(),]+)\s*(==|=|!=)\s*([^\s=!(),]*)$/))) {
    const [, k, op, v] = m;
    return op === '!=' ? (l) => l[k] !== v : (l) => l[k] === v;
  }
  if (LABEL_KEY_RE.test(term)) return (l) => term in l;
  throw new HttpStatusError(400, 'BadRequest', `unable to parse requirement: ${JSON.stringify(term)}`);
}

export function parseLabelSelector(sel: string | undefined): (o: KObject) => boolean {
  if (!sel) return () => true;
  const reqs = splitTopLevel(sel).map(parseLabelTerm);
  return (o) => {
    const labels = o.metadata?.labels ?? {};
    return reqs.every((r) => r(labels));
  };
}

const FIELD_GETTERS: Record<string, (o: KObject) => string> = {
  'metadata.name': (o) => o.metadata?.name ?? '',
  'metadata.namespace': (o) => o.metadata?.namespace ?? '',
};

export function parseFieldSelector(sel: string | undefined): (o: KObject) => boolean {
  if (!sel) return () => true;
  const reqs = splitTopLevel(sel).map((term) => {
    const m = term.match(/^([^=!]+?)\s*(==|=|!=)\s*(.*)$/);
    if (!m) throw new HttpStatusError(400, 'BadRequest', `invalid field selector: ${JSON.stringify(term)}`);
    const [, field, op, value] = m;
    const get = FIELD_GETTERS[field];
    if (!get) throw new HttpStatusError(400, 'BadRequest', `"${field}" is not a known field selector: only "metadata.name", "metadata.namespace"`);
    return op === '!=' ? (o: KObject) => get(o) !== value : (o: KObject) => get(o) === value;
  });
  return (o) => reqs.every((r) => r(o));
}

// ---------- certificates ----------

export interface TestCert {
  certPem: string;
  keyPem: string;
  certFile: string;
  dir: string;
}

let certPromise: Promise<TestCert> | undefined;

/** A self-signed certificate for 127.0.0.1 / localhost, made once per process with openssl. */
export function testCertificate(): Promise<TestCert> {
  certPromise ??= (async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kpt-apiserver-cert-'));
    const keyFile = join(dir, 'key.pem');
    const certFile = join(dir, 'cert.pem');
    await runChecked(
      hostRunner,
      'openssl',
      [
        'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
        '-days', '2', '-subj', '/CN=kproxy-test-apiserver',
        '-addext', 'subjectAltName=IP:127.0.0.1,DNS:localhost',
        '-keyout', keyFile, '-out', certFile,
      ],
      { timeoutMs: 20_000 },
    );
    process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
    return { certPem: readFileSync(certFile, 'utf8'), keyPem: readFileSync(keyFile, 'utf8'), certFile, dir };
  })();
  return certPromise;
}

// ---------- the server ----------

export class TestApiServer {
  private server?: http.Server | https.Server;
  private readonly sockets = new Set<Socket>();
  private readonly watchers = new Set<Watcher>();
  private objects = new Map<ResourceName, Map<string, KObject>>();
  private history: HistoryEvent[] = [];
  private rv = 1;
  /** watches from a version older than this get 410 */
  private compactedRV = 1;
  private portNum = 0;
  private cert?: TestCert;
  readonly requests: RequestRecord[] = [];
  /** when set, list requests for these resources fail with this HTTP status (for error tests) */
  failLists = new Map<ResourceName, number>();

  private constructor(private readonly opts: TestApiServerOptions) {
    for (const r of Object.keys(RESOURCES) as ResourceName[]) this.objects.set(r, new Map());
    this.portNum = opts.port ?? 0;
  }

  static async start(opts: TestApiServerOptions = {}): Promise<TestApiServer> {
    const s = new TestApiServer(opts);
    if (opts.tls) s.cert = await testCertificate();
    await s.start();
    return s;
  }

  get port(): number {
    return this.portNum;
  }
  get url(): string {
    return `${this.opts.tls ? 'https' : 'http'}://127.0.0.1:${this.portNum}`;
  }
  get caPem(): string | undefined {
    return this.cert?.certPem;
  }
  get caFile(): string | undefined {
    return this.cert?.certFile;
  }
  get resourceVersion(): number {
    return this.rv;
  }
  get running(): boolean {
    return !!this.server;
  }
  /** number of open watch streams (optionally for one resource) */
  watchCount(resource?: ResourceName): number {
    return [...this.watchers].filter((w) => !resource || w.resource === resource).length;
  }
  count(resource: ResourceName, kind: 'list' | 'watch'): number {
    const seg = `/${resource}`;
    return this.requests.filter((r) => r.path.endsWith(seg) && r.watch === (kind === 'watch')).length;
  }

  /** Listens (again) on the same port. `reset` empties the store; versions stay monotonic. */
  async start(opts: { reset?: boolean; rewind?: boolean } = {}): Promise<void> {
    if (this.server) return;
    if (opts.reset || opts.rewind) this.resetState(!!opts.rewind);
    const handler = (req: http.IncomingMessage, res: http.ServerResponse) => this.handle(req, res);
    const server = this.cert ? https.createServer({ key: this.cert.keyPem, cert: this.cert.certPem }, handler) : http.createServer(handler);
    server.on('connection', (sock: Socket) => {
      this.sockets.add(sock);
      sock.on('close', () => this.sockets.delete(sock));
    });
    server.on('tlsClientError', () => {});
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen({ port: this.portNum, host: '127.0.0.1' }, () => {
        server.off('error', reject);
        resolve();
      });
    });
    this.portNum = (server.address() as AddressInfo).port;
    this.server = server;
  }

  /** Stops listening and cuts every connection (watch streams break mid-stream). */
  async stop(): Promise<void> {
    const server = this.server;
    if (!server) return;
    this.server = undefined;
    for (const w of this.watchers) this.closeWatcher(w, true);
    const closed = new Promise<void>((resolve) => server.close(() => resolve()));
    for (const s of this.sockets) s.destroy();
    this.sockets.clear();
    await closed;
  }

  async restart(opts: { reset?: boolean; rewind?: boolean; downMs?: number } = {}): Promise<void> {
    await this.stop();
    if (opts.downMs) await new Promise((r) => setTimeout(r, opts.downMs));
    await this.start(opts);
  }

  /** Final cleanup. */
  async close(): Promise<void> {
    await this.stop();
  }

  /**
   * Empties the store. Versions stay monotonic (clients resuming get 410), unless `rewind`:
   * then they restart from 1, as after restoring etcd from an old backup (clients resuming
   * from a newer version get 504 Too large resource version).
   */
  private resetState(rewind: boolean): void {
    for (const m of this.objects.values()) m.clear();
    this.history = [];
    this.rv = rewind ? 1 : this.rv + 1;
    this.compactedRV = this.rv;
  }

  // ---------- mutations (what controllers would do) ----------

  get(resource: ResourceName, namespace: string | undefined, name: string): KObject | undefined {
    const def = RESOURCES[resource];
    const o = this.objects.get(resource)!.get(def.namespaced ? `${namespace}/${name}` : name);
    return o ? clone(o) : undefined;
  }

  list(resource: ResourceName): KObject[] {
    return [...this.objects.get(resource)!.values()].map(clone);
  }

  create(resource: ResourceName, obj: KObject): KObject {
    const def = RESOURCES[resource];
    const o = this.normalize(resource, obj);
    const key = objKey(o, def.namespaced);
    if (this.objects.get(resource)!.has(key)) throw new Error(`${resource} ${key} already exists`);
    o.metadata!.uid = randomUUID();
    o.metadata!.creationTimestamp = new Date().toISOString().replace(/\.\d+Z$/, 'Z');
    return this.commit(resource, 'ADDED', o, undefined);
  }

  update(resource: ResourceName, obj: KObject): KObject {
    const def = RESOURCES[resource];
    const o = this.normalize(resource, obj);
    const key = objKey(o, def.namespaced);
    const prev = this.objects.get(resource)!.get(key);
    if (!prev) throw new Error(`${resource} ${key} not found`);
    o.metadata!.uid = prev.metadata?.uid;
    o.metadata!.creationTimestamp = prev.metadata?.creationTimestamp;
    return this.commit(resource, 'MODIFIED', o, prev);
  }

  /** create or update */
  apply(resource: ResourceName, obj: KObject): KObject {
    const def = RESOURCES[resource];
    const key = objKey(this.normalize(resource, obj), def.namespaced);
    return this.objects.get(resource)!.has(key) ? this.update(resource, obj) : this.create(resource, obj);
  }

  remove(resource: ResourceName, namespace: string | undefined, name: string): void {
    const def = RESOURCES[resource];
    const key = def.namespaced ? `${namespace ?? 'default'}/${name}` : name;
    const prev = this.objects.get(resource)!.get(key);
    if (!prev) throw new Error(`${resource} ${key} not found`);
    this.commit(resource, 'DELETED', clone(prev), prev);
  }

  /** Forgets all history: watches resuming from any older version get 410 Gone. */
  compact(): void {
    this.history = [];
    this.compactedRV = this.rv;
  }

  /** Cuts every open watch stream: abruptly (socket destroyed) or cleanly (stream ended). */
  dropWatches(opts: { graceful?: boolean } = {}): number {
    const n = this.watchers.size;
    for (const w of [...this.watchers]) this.closeWatcher(w, !opts.graceful);
    return n;
  }

  /** Sends a BOOKMARK now to every watch that allows them. */
  sendBookmarks(): void {
    for (const w of this.watchers) if (w.bookmarks) this.writeBookmark(w, false);
  }

  private normalize(resource: ResourceName, obj: KObject): KObject {
    const def = RESOURCES[resource];
    const o = clone(obj);
    o.metadata = { ...(o.metadata ?? {}) };
    if (!o.metadata.name) throw new Error(`${resource}: metadata.name is required`);
    if (def.namespaced) o.metadata.namespace ??= 'default';
    else delete o.metadata.namespace;
    delete o.kind;
    delete o.apiVersion;
    return o;
  }

  private commit(resource: ResourceName, type: EventType, obj: KObject, prev: KObject | undefined): KObject {
    const def = RESOURCES[resource];
    const rv = ++this.rv;
    obj.metadata = { ...(obj.metadata ?? {}), resourceVersion: String(rv) };
    const store = this.objects.get(resource)!;
    const key = objKey(obj, def.namespaced);
    if (type === 'DELETED') store.delete(key);
    else store.set(key, obj);
    const ev: HistoryEvent = { rv, resource, type, object: clone(obj), prev: prev ? clone(prev) : undefined };
    this.history.push(ev);
    for (const w of this.watchers) if (w.resource === resource) this.deliver(w, ev);
    return clone(obj);
  }

  // ---------- HTTP ----------

  private handle(req: http.IncomingMessage, res: http.ServerResponse): void {
    const url = new URL(req.url ?? '/', 'http://x');
    const query = Object.fromEntries(url.searchParams.entries());
    const isWatch = query.watch === 'true' || query.watch === '1';
    const rec: RequestRecord = { method: req.method ?? 'GET', path: url.pathname, query, watch: isWatch, at: Date.now() };
    this.requests.push(rec);
    try {
      if (this.opts.token !== undefined) {
        const auth = req.headers.authorization ?? '';
        if (auth.trim() !== `Bearer ${this.opts.token}`) throw new HttpStatusError(401, 'Unauthorized', 'Unauthorized');
      }
      if (req.method !== 'GET') throw new HttpStatusError(405, 'MethodNotAllowed', `the server does not allow this method on the requested resource`);
      if (this.discovery(url.pathname, res)) {
        rec.status = 200;
        return;
      }
      const route = this.route(url.pathname);
      if (!route) throw new HttpStatusError(404, 'NotFound', 'the server could not find the requested resource');
      if (route.name !== undefined) {
        this.serveGet(route.resource, route.namespace, route.name, res);
      } else if (isWatch) {
        this.serveWatch(route.resource, route.namespace, query, res);
      } else {
        if (this.failLists.has(route.resource)) {
          const code = this.failLists.get(route.resource)!;
          throw new HttpStatusError(code, 'InternalError', `injected list failure ${code}`);
        }
        this.serveList(route.resource, route.namespace, query, res);
      }
      rec.status = res.statusCode;
    } catch (e) {
      const err = e instanceof HttpStatusError ? e : new HttpStatusError(500, 'InternalError', String(e));
      rec.status = err.code;
      this.sendJSON(res, err.code, status(err.code, err.reason, err.message));
    }
  }

  private sendJSON(res: http.ServerResponse, code: number, body: unknown): void {
    const text = JSON.stringify(body);
    res.writeHead(code, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text) });
    res.end(text);
  }

  private discovery(path: string, res: http.ServerResponse): boolean {
    const docs: Record<string, unknown> = {
      '/api': {
        kind: 'APIVersions',
        versions: ['v1'],
        serverAddressByClientCIDRs: [{ clientCIDR: '0.0.0.0/0', serverAddress: `127.0.0.1:${this.portNum}` }],
      },
      '/apis': {
        kind: 'APIGroupList',
        apiVersion: 'v1',
        groups: [
          {
            name: 'discovery.k8s.io',
            versions: [{ groupVersion: 'discovery.k8s.io/v1', version: 'v1' }],
            preferredVersion: { groupVersion: 'discovery.k8s.io/v1', version: 'v1' },
          },
        ],
      },
      '/api/v1': {
        kind: 'APIResourceList',
        groupVersion: 'v1',
        resources: [
          { name: 'services', singularName: 'service', namespaced: true, kind: 'Service', verbs: ['get', 'list', 'watch'], shortNames: ['svc'] },
          { name: 'nodes', singularName: 'node', namespaced: false, kind: 'Node', verbs: ['get', 'list', 'watch'], shortNames: ['no'] },
        ],
      },
      '/apis/discovery.k8s.io': {
        kind: 'APIGroup',
        apiVersion: 'v1',
        name: 'discovery.k8s.io',
        versions: [{ groupVersion: 'discovery.k8s.io/v1', version: 'v1' }],
        preferredVersion: { groupVersion: 'discovery.k8s.io/v1', version: 'v1' },
      },
      '/apis/discovery.k8s.io/v1': {
        kind: 'APIResourceList',
        apiVersion: 'v1',
        groupVersion: 'discovery.k8s.io/v1',
        resources: [{ name: 'endpointslices', singularName: 'endpointslice', namespaced: true, kind: 'EndpointSlice', verbs: ['get', 'list', 'watch'] }],
      },
      '/version': { major: '1', minor: '31', gitVersion: 'v1.31.0-kproxy-test', platform: 'linux/amd64' },
    };
    if (path === '/healthz' || path === '/livez' || path === '/readyz') {
      res.writeHead(200, { 'Content-Type': 'text/plain' });
      res.end('ok');
      return true;
    }
    const doc = docs[path.replace(/\/$/, '')];
    if (!doc) return false;
    this.sendJSON(res, 200, doc);
    return true;
  }

  private route(path: string): { resource: ResourceName; namespace?: string; name?: string } | null {
    const parts = path.split('/').filter(Boolean);
    let rest: string[];
    let group: string;
    if (parts[0] === 'api' && parts[1] === 'v1') {
      group = '';
      rest = parts.slice(2);
    } else if (parts[0] === 'apis' && parts[1] === 'discovery.k8s.io' && parts[2] === 'v1') {
      group = 'discovery.k8s.io';
      rest = parts.slice(3);
    } else return null;
    let namespace: string | undefined;
    if (rest[0] === 'namespaces' && rest.length >= 3) {
      namespace = rest[1];
      rest = rest.slice(2);
    }
    const resource = rest[0] as ResourceName;
    const def = RESOURCES[resource];
    if (!def || def.group !== group || rest.length > 2) return null;
    if (namespace !== undefined && !def.namespaced) return null;
    return { resource, namespace, name: rest[1] };
  }

  private withType(resource: ResourceName, o: KObject): KObject {
    const def = RESOURCES[resource];
    return { apiVersion: def.apiVersion, kind: def.kind, ...clone(o) };
  }

  private serveGet(resource: ResourceName, namespace: string | undefined, name: string, res: http.ServerResponse): void {
    const o = this.get(resource, namespace, name);
    if (!o) throw new HttpStatusError(404, 'NotFound', `${resource} "${name}" not found`);
    this.sendJSON(res, 200, this.withType(resource, o));
  }

  private filterFor(resource: ResourceName, namespace: string | undefined, query: Record<string, string>): (o: KObject) => boolean {
    const labels = parseLabelSelector(query.labelSelector);
    const fields = parseFieldSelector(query.fieldSelector);
    const def = RESOURCES[resource];
    return (o) => (!def.namespaced || namespace === undefined || o.metadata?.namespace === namespace) && labels(o) && fields(o);
  }

  private parseRV(s: string): number {
    if (!/^\d+$/.test(s)) throw new HttpStatusError(400, 'BadRequest', `invalid resource version: ${JSON.stringify(s)}`);
    return Number(s);
  }

  private tooLarge(rv: number): HttpStatusError {
    return new HttpStatusError(504, 'Timeout', `Timeout: Too large resource version: ${rv}, current: ${this.rv}`);
  }

  /** The store as it was at version `at`, rebuilt by undoing later history. */
  private snapshotAt(resource: ResourceName, at: number): KObject[] {
    const def = RESOURCES[resource];
    const m = new Map(this.objects.get(resource)!);
    for (let i = this.history.length - 1; i >= 0 && this.history[i].rv > at; i--) {
      const ev = this.history[i];
      if (ev.resource !== resource) continue;
      const key = objKey(ev.object, def.namespaced);
      if (ev.type === 'ADDED') m.delete(key);
      else m.set(key, ev.prev!);
    }
    return [...m.values()];
  }

  private serveList(resource: ResourceName, namespace: string | undefined, query: Record<string, string>, res: http.ServerResponse): void {
    const def = RESOURCES[resource];
    const filter = this.filterFor(resource, namespace, query);
    const rvParam = query.resourceVersion ?? '';
    const match = query.resourceVersionMatch ?? '';
    if (match && !['Exact', 'NotOlderThan'].includes(match)) {
      throw new HttpStatusError(400, 'BadRequest', `resourceVersionMatch: Unsupported value: "${match}"`);
    }
    if (match && rvParam === '') throw new HttpStatusError(400, 'BadRequest', 'resourceVersionMatch is forbidden unless resourceVersion is provided');
    let items: KObject[];
    let listRV = this.rv;
    if (rvParam === '' || rvParam === '0') {
      items = [...this.objects.get(resource)!.values()];
    } else {
      const at = this.parseRV(rvParam);
      if (at > this.rv) throw this.tooLarge(at);
      if (match === 'Exact') {
        if (at < this.compactedRV) {
          throw new HttpStatusError(410, 'Expired', `The resourceVersion for the provided list is too old.`);
        }
        items = this.snapshotAt(resource, at);
        listRV = at;
      } else {
        items = [...this.objects.get(resource)!.values()];
      }
    }
    items = items
      .filter(filter)
      .sort((a, b) => objKey(a, def.namespaced).localeCompare(objKey(b, def.namespaced)))
      .map(clone);
    this.sendJSON(res, 200, { kind: `${def.kind}List`, apiVersion: def.apiVersion, metadata: { resourceVersion: String(listRV) }, items });
  }

  private writeEvent(w: Watcher, type: string, object: unknown): void {
    if (w.res.writableEnded || w.res.destroyed) return;
    w.res.write(JSON.stringify({ type, object }) + '\n');
  }

  private writeBookmark(w: Watcher, initialEventsEnd: boolean): void {
    const def = RESOURCES[w.resource];
    const metadata: Record<string, unknown> = { resourceVersion: String(this.rv) };
    if (initialEventsEnd) metadata.annotations = { 'k8s.io/initial-events-end': 'true' };
    this.writeEvent(w, 'BOOKMARK', { kind: def.kind, apiVersion: def.apiVersion, metadata });
  }

  /** One history event to one watcher, with the cacher's selector-transition rules. */
  private deliver(w: Watcher, ev: HistoryEvent): void {
    const now = ev.type !== 'DELETED' && w.filter(ev.object);
    const before = !!ev.prev && w.filter(ev.prev);
    const withRV = (o: KObject) => ({ ...this.withType(ev.resource, o), metadata: { ...o.metadata, resourceVersion: String(ev.rv) } });
    if (ev.type === 'DELETED') {
      if (before) this.writeEvent(w, 'DELETED', withRV(ev.object));
    } else if (now && before) this.writeEvent(w, 'MODIFIED', withRV(ev.object));
    else if (now) this.writeEvent(w, 'ADDED', withRV(ev.object));
    else if (before) this.writeEvent(w, 'DELETED', withRV(ev.prev!));
  }

  private serveWatch(resource: ResourceName, namespace: string | undefined, query: Record<string, string>, res: http.ServerResponse): void {
    const filter = this.filterFor(resource, namespace, query);
    const rvParam = query.resourceVersion ?? '';
    const sendInitial = query.sendInitialEvents === 'true';
    let from: number | null = null; // null: start from "now" with the current state as ADDED events
    if (rvParam !== '' && rvParam !== '0') {
      from = this.parseRV(rvParam);
      if (from > this.rv) throw this.tooLarge(from);
    }
    if (sendInitial && query.resourceVersionMatch !== 'NotOlderThan') {
      throw new HttpStatusError(400, 'BadRequest', 'sendInitialEvents requires resourceVersionMatch=NotOlderThan');
    }
    const timeoutSec = query.timeoutSeconds ? Number(query.timeoutSeconds) : (this.opts.defaultWatchTimeoutSeconds ?? 1800);
    res.writeHead(200, { 'Content-Type': 'application/json', 'Cache-Control': 'no-cache, private', 'Transfer-Encoding': 'chunked' });
    res.flushHeaders();
    const w: Watcher = { resource, namespace, filter, res, timers: [], bookmarks: query.allowWatchBookmarks === 'true' };
    if (from !== null && from < this.compactedRV && !sendInitial) {
      // kube-apiserver answers 200, then one ERROR event, then ends the stream.
      this.writeEvent(w, 'ERROR', status(410, 'Expired', `too old resource version: ${from} (${this.compactedRV})`));
      res.end();
      return;
    }
    if (from === null || sendInitial) {
      const def = RESOURCES[resource];
      const current = [...this.objects.get(resource)!.values()]
        .filter(filter)
        .sort((a, b) => objKey(a, def.namespaced).localeCompare(objKey(b, def.namespaced)));
      for (const o of current) this.writeEvent(w, 'ADDED', this.withType(resource, o));
      if (sendInitial) this.writeBookmark(w, true);
    } else {
      for (const ev of this.history) if (ev.rv > from && ev.resource === resource) this.deliver(w, ev);
    }
    this.watchers.add(w);
    if (timeoutSec > 0) w.timers.push(setTimeout(() => this.closeWatcher(w, false), timeoutSec * 1000));
    if (w.bookmarks) {
      const t = setInterval(() => this.writeBookmark(w, false), this.opts.bookmarkIntervalMs ?? 1000);
      w.timers.push(t);
    }
    res.on('close', () => this.closeWatcher(w, false));
  }

  private closeWatcher(w: Watcher, abrupt: boolean): void {
    if (!this.watchers.delete(w)) return;
    for (const t of w.timers) clearTimeout(t);
    if (abrupt) w.res.socket?.destroy();
    else if (!w.res.writableEnded) w.res.end();
  }

  // ---------- client configuration ----------

  /** Writes a kubeconfig for this server to `file`; returns the path. */
  writeKubeconfig(file: string, opts: { token?: string } = {}): string {
    const cluster: Record<string, unknown> = { server: this.url };
    if (this.cert) cluster['certificate-authority-data'] = Buffer.from(this.cert.certPem).toString('base64');
    else cluster['insecure-skip-tls-verify'] = true;
    const user: Record<string, unknown> = {};
    const token = opts.token ?? this.opts.token;
    if (token !== undefined) user.token = token;
    const cfg = {
      apiVersion: 'v1',
      kind: 'Config',
      clusters: [{ name: 'test', cluster }],
      users: [{ name: 'test', user }],
      contexts: [{ name: 'test', context: { cluster: 'test', user: 'test' } }],
      'current-context': 'test',
    };
    writeFileSync(file, JSON.stringify(cfg, null, 2));
    return file;
  }
}

/** A temporary directory removed by the returned cleanup function. */
export function tempDir(prefix: string): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}
