// A resilient informer on top of @kubernetes/client-node's ListWatch (list + watch).
//
// client-node's ListWatch lists, watches from the list's resourceVersion, re-watches when a
// stream ends cleanly, relists on 410 Gone (diffing the relist against its cache, so
// deletes missed while away are reported), but:
// - its update callback only gets the new object, and its cache already holds that one: the
//   old object is looked up in its cache just before each watch event or listed object
//   reaches it, and handed to the caller with the new one (old, new), as slimObject keeps it
//   (its identity and resourceVersion: the cache holds only that; one cache, not a second
//   one of our own: ~1.5 MiB at 10,000 Services and as many slices);
// - it stops for good after any error: we restart it with capped exponential back-off
//   (it resumes the watch from its last resourceVersion, or relists when it has none);
// - its Watch never times out and ignores ERROR events other than 410 (the server then
//   closes and ListWatch re-watches at once, a tight loop): our Watch subclass asks the
//   server for bookmarks and a watch timeout, aborts a stream that stays silent past
//   that timeout (a half-open connection), and turns other ERROR events into failures;
// - errors thrown by watch setup (e.g. an unreadable token file) reject a promise nobody
//   awaits: we turn them into failures too.
// The list goes through client-node's own auth/TLS setup (applyToFetchOptions) but returns
// the raw JSON, so listed objects have exactly the wire shape watched objects have.
import http from 'node:http';
import https from 'node:https';
import { ListWatch, Watch, type KubeConfig, type KubernetesListObject, type KubernetesObject } from '@kubernetes/client-node';
import type { Logger } from '../log.ts';
import { coded } from '../errors.ts';
import { Interner } from '../core/intern.ts';

export interface BackoffOptions {
  /** first retry delay (default 200 ms) */
  initialMs?: number;
  /** cap (default 2500 ms: with minSyncPeriod, convergence within 5 s after an outage) */
  maxMs?: number;
  /** growth factor (default 2) */
  factor?: number;
  /** fraction of the delay removed at random, 0..1 (default 0.1); never exceeds maxMs */
  jitter?: number;
}

export function resolveBackoff(b: BackoffOptions = {}): Required<BackoffOptions> {
  return { initialMs: b.initialMs ?? 200, maxMs: b.maxMs ?? 2500, factor: b.factor ?? 2, jitter: b.jitter ?? 0.1 };
}

/** Delay before retry number `attempt` (0-based): capped exponential, jitter only shortens. */
export function backoffDelay(b: Required<BackoffOptions>, attempt: number, rand: () => number = Math.random): number {
  const raw = Math.min(b.maxMs, b.initialMs * Math.pow(b.factor, Math.min(attempt, 64)));
  return Math.max(1, Math.round(raw * (1 - b.jitter * rand())));
}

export interface InformerStatus {
  /** the first complete list has been delivered */
  listed: boolean;
  connected: boolean;
  lastContactMs: number;
  problem?: string;
}

export interface ResilientInformerOptions<T extends KubernetesObject> {
  kc: KubeConfig;
  /** API path, e.g. /api/v1/services */
  path: string;
  /** short name for logs and problems, e.g. "services" */
  what: string;
  labelSelector?: string;
  fieldSelector?: string;
  log: Logger;
  backoff: Required<BackoffOptions>;
  /** server-side watch timeout asked for; the stream is re-opened after it (default 300..600 s) */
  watchTimeoutSeconds?: number;
  /** time allowed for one list request (default 60 s) */
  listTimeoutMs?: number;
  onChange(oldObj: T | null, newObj: T | null): void;
  /** after every complete list (first list and relists) has been delivered */
  onListed(): void;
  /** the API server answered again after a failure */
  onReconnect?(): void;
}

class ApiError extends Error {
  constructor(
    message: string,
    readonly statusCode?: number,
  ) {
    super(message);
  }
}

function keyOf(o: KubernetesObject): string {
  return `${o.metadata?.namespace ?? ''}/${o.metadata?.name ?? ''}`;
}

/** Namespaces repeat across objects: the kept identities share one string per namespace. */
const namespaces = new Interner();

/**
 * What the informer keeps of a delivered object: its identity (kind, name, namespace) and its
 * resourceVersion, which is all ListWatch reads of a cached object (its relist diff compares
 * names and resourceVersions) and all a handler may rely on in an old object (SourceHandler).
 * The whole objects of 10,000 Services and 10,000 EndpointSlices took tens of MB; the
 * trackers keep what they need of each as it is delivered.
 */
export function slimObject<T extends KubernetesObject>(o: T): T {
  const m = o.metadata ?? {};
  const metadata: NonNullable<KubernetesObject['metadata']> = {};
  if (m.name !== undefined) metadata.name = m.name;
  if (m.namespace !== undefined) metadata.namespace = typeof m.namespace === 'string' ? namespaces.get(m.namespace) : m.namespace;
  if (m.resourceVersion !== undefined) metadata.resourceVersion = m.resourceVersion;
  const out: KubernetesObject = { metadata };
  if (o.apiVersion !== undefined) out.apiVersion = o.apiVersion;
  if (o.kind !== undefined) out.kind = o.kind;
  return out as T;
}

/**
 * Transport-level failures: the API server cannot be reached or the connection to it broke.
 * Which one a client sees first depends on timing alone (a server that goes away cuts the open
 * watch streams, "Premature close", and refuses the next connect, ECONNREFUSED), so they
 * share one problem code.
 */
const TRANSPORT_CODES = new Set([
  'ECONNREFUSED', 'ECONNRESET', 'ECONNABORTED', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH', 'EHOSTDOWN',
  'ENETDOWN', 'ENOTFOUND', 'EAI_AGAIN', 'ERR_STREAM_PREMATURE_CLOSE', 'UND_ERR_SOCKET', 'UND_ERR_CONNECT_TIMEOUT',
]);
const TRANSPORT_MESSAGE = /Premature close|socket hang up|\b(ECONNREFUSED|ECONNRESET|ETIMEDOUT|EHOSTUNREACH|ENETUNREACH|ENOTFOUND|EAI_AGAIN)\b/;

export function isUnreachable(err: unknown): boolean {
  if (typeof (err as { statusCode?: unknown } | undefined)?.statusCode === 'number') return false;
  const code = (err as { code?: unknown } | undefined)?.code;
  if (typeof code === 'string' && TRANSPORT_CODES.has(code)) return true;
  const errno = (err as { errno?: unknown } | undefined)?.errno;
  if (typeof errno === 'string' && TRANSPORT_CODES.has(errno)) return true;
  return err instanceof Error && TRANSPORT_MESSAGE.test(err.message);
}

/** One line for logs and health: the error without the (long) query strings of URLs. */
function errText(err: unknown): string {
  return rawErrText(err).replace(/(https?:\/\/[^\s?]+)\?\S*/g, '$1');
}

function rawErrText(err: unknown): string {
  if (err instanceof Error) {
    const code = (err as { code?: unknown }).code;
    const sc = (err as { statusCode?: unknown }).statusCode;
    const extra = typeof sc === 'number' ? ` (HTTP ${sc})` : typeof code === 'string' && !err.message.includes(code) ? ` (${code})` : '';
    return `${err.message}${extra}`;
  }
  return String(err);
}

/** GET a list as raw JSON with the kubeconfig's server, TLS and credentials. */
async function listRaw<T extends KubernetesObject>(
  kc: KubeConfig,
  path: string,
  query: Record<string, string | undefined>,
  signal: AbortSignal,
): Promise<KubernetesListObject<T>> {
  const cluster = kc.getCurrentCluster();
  if (!cluster) throw new ApiError('no current cluster in the kubeconfig');
  const url = new URL(cluster.server + path);
  for (const [k, v] of Object.entries(query)) if (v !== undefined) url.searchParams.set(k, v);
  const init = await kc.applyToFetchOptions({});
  const headers: Record<string, string> = { Accept: 'application/json' };
  (init.headers as Headers | undefined)?.forEach((v, k) => (headers[k] = v));
  const mod = url.protocol === 'https:' ? https : http;
  return new Promise((resolve, reject) => {
    const req = mod.get(url, { agent: init.agent as http.Agent, headers, signal }, (res) => {
      // Decoded as it arrives: each read's buffer (native memory, outside the heap) is freed
      // at once instead of all of them being held, then copied whole, until the end (a list
      // of 10,000 EndpointSlices is tens of MB, and both lists arrive together at start).
      const parts: string[] = [];
      res.setEncoding('utf8');
      res.on('data', (s: string) => parts.push(s));
      res.on('error', reject);
      res.on('end', () => {
        const body = parts.join('');
        parts.length = 0;
        let parsed: unknown;
        try {
          parsed = JSON.parse(body);
        } catch {
          parsed = undefined;
        }
        if (res.statusCode !== 200) {
          const msg = (parsed as { message?: string } | undefined)?.message ?? (body.slice(0, 200) || res.statusMessage);
          reject(new ApiError(`list ${path}: ${msg}`, res.statusCode));
          return;
        }
        const list = parsed as KubernetesListObject<T> | undefined;
        if (!list || !Array.isArray(list.items)) {
          reject(new ApiError(`list ${path}: response is not a list`, res.statusCode));
          return;
        }
        resolve(list);
      });
    });
    req.on('error', reject);
  });
}

export class ResilientInformer<T extends KubernetesObject> {
  private readonly lw: ListWatch<T>;
  /**
   * What ListWatch's cache held for an object just before ListWatch took it in (a watch event,
   * a listed object), by the object: the old object of its update or delete.
   */
  private readonly previous = new Map<KubernetesObject, T>();
  private readonly liveStreams = new Set<AbortController>();
  private readonly listAborts = new Set<AbortController>();
  private stopped = true;
  private retryTimer?: NodeJS.Timeout;
  private attempt = 0;
  /** a list completed and has not yet been followed by a watch (i.e. its items are delivered) */
  private listPending = false;
  readonly status: InformerStatus = { listed: false, connected: false, lastContactMs: 0 };

  constructor(private readonly o: ResilientInformerOptions<T>) {
    const query = { labelSelector: o.labelSelector, fieldSelector: o.fieldSelector };
    const listFn = () => this.list(query);
    this.lw = new ListWatch<T>(o.path, new InstrumentedWatch(o.kc, this), listFn, false, o.labelSelector, o.fieldSelector);
    this.lw.on('add', (obj) => this.onAddOrUpdate(obj));
    this.lw.on('update', (obj) => this.onAddOrUpdate(obj, this.previous.get(obj) ?? null));
    this.lw.on('delete', (obj) => this.onDelete(obj));
    this.lw.on('error', (err) => this.fail(err));
  }

  /** Objects currently known, keyed "namespace/name" ("/name" for cluster-scoped), as slimObject keeps them. */
  snapshot(): ReadonlyMap<string, T> {
    const out = new Map<string, T>();
    for (const byName of this.listWatchCache().values()) for (const o of byName.values()) out.set(keyOf(o), o);
    return out;
  }

  /** What ListWatch's cache holds for the object's namespace and name (ListWatch's keys). */
  private cached(o: KubernetesObject): T | undefined {
    return this.listWatchCache().get(o.metadata?.namespace || '')?.get(o.metadata?.name || '');
  }

  /**
   * Before ListWatch takes in a watch event's object (InstrumentedWatch calls this): what its
   * cache holds for it now is the old object of the update or delete it is about to report.
   */
  beforeEvent(obj: KubernetesObject | undefined): void {
    this.previous.clear();
    const old = obj?.metadata ? this.cached(obj) : undefined;
    if (old && obj) this.previous.set(obj, old);
  }

  afterEvent(): void {
    this.previous.clear();
  }

  start(): void {
    if (!this.stopped) return;
    this.stopped = false;
    this.run();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.retryTimer);
    this.retryTimer = undefined;
    await this.lw.stop();
    for (const c of this.liveStreams) c.abort();
    for (const c of this.listAborts) c.abort();
    this.liveStreams.clear();
    this.listAborts.clear();
    this.status.connected = false;
  }

  get isStopped(): boolean {
    return this.stopped;
  }

  watchTimeoutSeconds(): number {
    // Spread re-watches like client-go's reflector (minWatchTimeout..2x).
    const base = this.o.watchTimeoutSeconds ?? 300;
    return Math.max(1, Math.round(base * (1 + (this.o.watchTimeoutSeconds ? 0 : Math.random()))));
  }

  private run(): void {
    this.lw.start().catch((err: unknown) => this.fail(err));
  }

  private async list(query: Record<string, string | undefined>): Promise<KubernetesListObject<T>> {
    const ctl = new AbortController();
    this.listAborts.add(ctl);
    const signal = AbortSignal.any([ctl.signal, AbortSignal.timeout(this.o.listTimeoutMs ?? 60_000)]);
    try {
      const list = await listRaw<T>(this.o.kc, this.o.path, query, signal);
      this.markContact();
      this.listPending = true;
      // ListWatch diffs the list against its cache as soon as this returns: an object it
      // already holds is an update (or no change), whose old object is the cached one
      this.previous.clear();
      for (const item of list.items) {
        const old = item?.metadata ? this.cached(item) : undefined;
        if (old) this.previous.set(item, old);
      }
      return list;
    } finally {
      this.listAborts.delete(ctl);
    }
  }

  private safeChange(oldObj: T | null, newObj: T | null): void {
    if (this.stopped) return;
    try {
      this.o.onChange(oldObj, newObj);
    } catch (err) {
      this.o.log.error({ resource: this.o.what, err: errText(err) }, coded('KPROXY_SOURCE_HANDLER_FAILED', 'event handler threw; event skipped'));
    }
  }

  private onAddOrUpdate(obj: T, old: T | null = null): void {
    this.keepSlimInListWatch(obj, slimObject(obj));
    this.safeChange(old, obj);
  }

  /**
   * ListWatch has just filed `obj` in its cache (it files before it calls back): the slim
   * copy takes its place. Its cache is private (`objects`: namespace → name → object), hence
   * the cast (pinned to client-node 1.x, as forceRelist; the "informer keeps" test catches a
   * rename); a cache of another shape is left as it is.
   */
  private keepSlimInListWatch(obj: T, slim: T): void {
    const objects = (this.lw as unknown as { objects?: unknown }).objects;
    if (!(objects instanceof Map)) return;
    const byName: unknown = objects.get(obj.metadata?.namespace || '');
    const name = obj.metadata?.name || '';
    if (byName instanceof Map && byName.get(name) === obj) byName.set(name, slim);
  }

  /** The objects ListWatch keeps, for tests: namespace → name → object (empty if its cache has another shape). */
  listWatchCache(): ReadonlyMap<string, ReadonlyMap<string, T>> {
    const objects = (this.lw as unknown as { objects?: unknown }).objects;
    return objects instanceof Map ? (objects as Map<string, Map<string, T>>) : new Map();
  }

  /** A watch event's object (its old one is what the cache held), or a relist's cached one. */
  private onDelete(obj: T): void {
    this.safeChange(this.previous.get(obj) ?? obj, null);
  }

  /**
   * Makes the next start list instead of resuming the watch. ListWatch only does that by
   * itself after a 410; its resourceVersion field is private, hence the cast (pinned to
   * client-node 1.x; the "server store rewound" test catches a rename).
   */
  private forceRelist(): void {
    const lw = this.lw as unknown as { resourceVersion?: string };
    if (typeof lw.resourceVersion === 'string') lw.resourceVersion = '';
  }

  // ---- called by InstrumentedWatch ----

  /** ListWatch opens a watch right after delivering a list: that is when a list is "done". */
  beforeWatch(): void {
    this.previous.clear();
    if (!this.listPending || this.stopped) return;
    this.listPending = false;
    const first = !this.status.listed;
    this.status.listed = true;
    let objects = 0;
    for (const byName of this.listWatchCache().values()) objects += byName.size;
    this.o.log.debug({ resource: this.o.what, objects, first }, 'listed');
    try {
      this.o.onListed();
    } catch (err) {
      this.o.log.error({ resource: this.o.what, err: errText(err) }, coded('KPROXY_SOURCE_HANDLER_FAILED', 'onListed threw'));
    }
  }

  watchConnected(): void {
    this.attempt = 0;
    this.markContact();
  }

  markContact(): void {
    const wasDown = !this.status.connected && this.status.problem !== undefined;
    this.status.connected = true;
    this.status.lastContactMs = Date.now();
    this.status.problem = undefined;
    if (wasDown) {
      this.o.log.info({ resource: this.o.what }, 'API server reachable again');
      this.o.onReconnect?.();
    }
  }

  /** The API server is back (another informer got through): skip the rest of the back-off. */
  retryNow(): void {
    if (this.stopped || !this.retryTimer) return;
    clearTimeout(this.retryTimer);
    this.retryTimer = undefined;
    this.attempt = 0;
    this.run();
  }

  track(ctl: AbortController): void {
    this.liveStreams.add(ctl);
  }
  untrack(ctl: AbortController): void {
    this.liveStreams.delete(ctl);
  }

  /** Any list/watch failure: mark disconnected and restart after a back-off delay. */
  fail(err: unknown): void {
    if (this.stopped) return;
    this.status.connected = false;
    const sc = (err as { statusCode?: number } | undefined)?.statusCode;
    const hint =
      sc === 401 || sc === 403
        ? 'check the credentials and RBAC (kproxy needs list and watch on services, endpointslices.discovery.k8s.io and nodes)'
        : 'check that the API server is reachable; retrying';
    this.status.problem = isUnreachable(err)
      ? coded(
          'KPROXY_SOURCE_UNREACHABLE',
          `${this.o.what}: cannot reach the API server (${errText(err)}); the last state stays in force; ` +
            'check that the API server is reachable from this node; retrying',
        )
      : coded('KPROXY_SOURCE_API_ERROR', `${this.o.what}: ${errText(err)}; ${hint}`);
    // 504 on a watch is kube-apiserver's "Too large resource version" (the server's store
    // is behind our version, e.g. restored from a backup): resuming can never work, so
    // relist, as client-go's reflector does.
    if (sc === 504) this.forceRelist();
    if (this.retryTimer) return; // a restart is already scheduled
    const delayMs = backoffDelay(this.o.backoff, this.attempt++);
    this.o.log.warn({ resource: this.o.what, err: errText(err), attempt: this.attempt, delayMs }, this.status.problem);
    this.retryTimer = setTimeout(() => {
      this.retryTimer = undefined;
      if (!this.stopped) this.run();
    }, delayMs);
  }
}

/**
 * client-node's Watch with bookmarks, a server-side timeout, a client-side silence timeout,
 * non-410 ERROR events treated as failures and setup errors reported through `done`.
 */
class InstrumentedWatch<T extends KubernetesObject> extends Watch {
  constructor(
    kc: KubeConfig,
    private readonly owner: ResilientInformer<T>,
  ) {
    super(kc);
  }

  override async watch(
    path: string,
    queryParams: Record<string, string | number | boolean | undefined>,
    callback: (phase: string, apiObj: any, watchObj?: any) => void, // eslint-disable-line @typescript-eslint/no-explicit-any
    done: (err: any) => void, // eslint-disable-line @typescript-eslint/no-explicit-any
  ): Promise<AbortController> {
    if (this.owner.isStopped) return new AbortController(); // ends ListWatch's chain
    this.owner.beforeWatch();
    const timeoutSeconds = this.owner.watchTimeoutSeconds();
    const params = { ...queryParams, allowWatchBookmarks: true, timeoutSeconds };
    let finished = false;
    let ctl: AbortController | undefined;
    let abortWhenKnown = false;
    let silence: NodeJS.Timeout | undefined;
    const abort = () => (ctl ? ctl.abort() : (abortWhenKnown = true));
    const armSilence = () => {
      clearTimeout(silence);
      // The server ends the stream after timeoutSeconds; silence well past that means the
      // connection is dead without a FIN (node crash, network partition).
      silence = setTimeout(() => {
        // a dead connection: reported as the transport failure it is
        finishOnce(Object.assign(new Error(`watch ${path}: no data for ${timeoutSeconds + 30}s`), { code: 'ETIMEDOUT' }));
        abort();
      }, (timeoutSeconds + 30) * 1000);
      silence.unref?.();
    };
    const finishOnce = (err: unknown) => {
      if (finished) return;
      finished = true;
      clearTimeout(silence);
      if (ctl) this.owner.untrack(ctl);
      done(err ?? null);
    };
    const onEvent = (phase: string, obj: any, raw?: any) => { // eslint-disable-line @typescript-eslint/no-explicit-any
      if (finished || this.owner.isStopped) return;
      armSilence();
      if (phase === 'ERROR' && obj?.code !== 410) {
        const e = new Error(`watch ${path}: ${obj?.message ?? 'error event'}`) as Error & { statusCode?: number };
        e.statusCode = typeof obj?.code === 'number' ? obj.code : undefined;
        finishOnce(e);
        abort();
        return;
      }
      this.owner.markContact();
      this.owner.beforeEvent(obj);
      try {
        callback(phase, obj, raw);
      } finally {
        this.owner.afterEvent();
      }
    };
    try {
      ctl = await super.watch(path, params, onEvent, finishOnce);
    } catch (err) {
      finishOnce(err);
      return new AbortController();
    }
    if (abortWhenKnown || finished) {
      ctl.abort();
      return ctl;
    }
    if (this.owner.isStopped) {
      ctl.abort();
      return ctl;
    }
    this.owner.track(ctl);
    this.owner.watchConnected();
    armSilence();
    return ctl;
  }
}
