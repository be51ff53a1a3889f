// The Kubernetes API source: list + watch of Services, EndpointSlices (discovery.k8s.io/v1)
// and this node's Node object, through @kubernetes/client-node informers wrapped so that
// handlers get (old, new) pairs and the watches survive API server restarts (see
// k8s-informer.ts). Only the list and watch verbs are used.
//
// As upstream kube-proxy, Services and EndpointSlices are listed with the label selector
// `!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless`: objects that
// belong to another proxy, and the slices of headless services, never reach us (the change
// trackers skip headless services anyway).
import { existsSync, readFileSync } from 'node:fs';
import { KubeConfig } from '@kubernetes/client-node';
import { parse as parseYaml } from 'yaml';
import type { K8sEndpointSlice, K8sService } from '../core/api.ts';
import type { Logger } from '../log.ts';
import type { K8sNode, Source, SourceHandler, SourceHealth } from './types.ts';
import { ResilientInformer, resolveBackoff, type BackoffOptions } from './k8s-informer.ts';
import { KproxyError } from '../errors.ts';

export type { BackoffOptions } from './k8s-informer.ts';

export const LABEL_HEADLESS = 'service.kubernetes.io/headless';
/** The selector upstream kube-proxy lists Services and EndpointSlices with. */
export const PROXY_LABEL_SELECTOR = '!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name';

const SERVICE_ACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';

export interface KubernetesSourceOptions {
  /** kubeconfig file; when absent, the in-cluster configuration is used */
  kubeconfig?: string;
  /**
   * --master: the API server URL; overrides the kubeconfig's cluster server, or alone (no
   * kubeconfig) is the whole client configuration, as upstream (no credentials, no in-cluster).
   */
  master?: string;
  /** this node's name: its Node object is watched (labels, addresses) */
  nodeName: string;
  log: Logger;
  /** retry back-off after a failed list or watch (default 200 ms doubling to 5 s) */
  backoff?: BackoffOptions;
  /** server-side watch timeout in seconds (default 300..600 s, randomised as client-go) */
  watchTimeoutSeconds?: number;
  /**
   * Prefix of the in-cluster service account files (token, ca.crt), for tests: client-node
   * reads `${prefix}/var/run/secrets/kubernetes.io/serviceaccount/...`.
   */
  inClusterPathPrefix?: string;
}

export class KubernetesSourceError extends KproxyError {}

/**
 * The client configuration: the kubeconfig file when given, else the in-cluster service
 * account (KUBERNETES_SERVICE_HOST/PORT + token + CA). Throws KubernetesSourceError.
 */
export function loadKubeConfig(opts: { kubeconfig?: string; master?: string; inClusterPathPrefix?: string }): KubeConfig {
  const kc = new KubeConfig();
  const master = opts.master ? masterURL(opts.master) : undefined;
  if (master && !opts.kubeconfig) {
    // upstream createClient: --master without --kubeconfig is a bare rest.Config{Host}: no
    // credentials, no TLS client certificate, system CAs for https
    kc.loadFromOptions({
      clusters: [{ name: 'master', server: master, skipTLSVerify: master.startsWith('http:') }],
      users: [{ name: 'master' }],
      contexts: [{ name: 'master', cluster: 'master', user: 'master' }],
      currentContext: 'master',
    });
    return kc;
  }
  if (opts.kubeconfig) {
    if (!existsSync(opts.kubeconfig)) {
      throw new KubernetesSourceError('KPROXY_SOURCE_KUBECONFIG', `kubeconfig ${opts.kubeconfig} does not exist; pass the path of a readable kubeconfig file`);
    }
    try {
      kc.loadFromFile(opts.kubeconfig);
      honourTokenFile(kc, readFileSync(opts.kubeconfig, 'utf8'));
    } catch (err) {
      throw new KubernetesSourceError('KPROXY_SOURCE_KUBECONFIG', `cannot load kubeconfig ${opts.kubeconfig}: ${(err as Error).message}; fix the file`);
    }
    let cluster = kc.getCurrentCluster();
    if (master && cluster) {
      // upstream ConfigOverrides{ClusterInfo: {Server: master}}: the flag wins over the file
      const name = cluster.name;
      const overridden = { ...cluster, server: master, skipTLSVerify: cluster.skipTLSVerify || master.startsWith('http:') };
      kc.clusters = kc.clusters.map((c) => (c.name === name ? overridden : c));
      cluster = kc.getCurrentCluster();
    }
    if (!cluster?.server) {
      throw new KubernetesSourceError('KPROXY_SOURCE_KUBECONFIG', `kubeconfig ${opts.kubeconfig} has no current context with a cluster server; set current-context`);
    }
    if (cluster.server.startsWith('http:') && !cluster.skipTLSVerify) {
      // client-node refuses plain HTTP unless the cluster is marked insecure.
      throw new KubernetesSourceError('KPROXY_SOURCE_KUBECONFIG', `kubeconfig ${opts.kubeconfig}: server ${cluster.server} is plain HTTP; set insecure-skip-tls-verify: true on the cluster or use https`);
    }
    return kc;
  }
  const host = process.env.KUBERNETES_SERVICE_HOST;
  const port = process.env.KUBERNETES_SERVICE_PORT;
  if (!host || !port) {
    throw new KubernetesSourceError('KPROXY_SOURCE_NO_CLUSTER', 'no --kubeconfig given and not running in a cluster (KUBERNETES_SERVICE_HOST/PORT unset); pass --kubeconfig FILE or --manifests DIR');
  }
  const prefix = opts.inClusterPathPrefix ?? '';
  const tokenFile = `${prefix}${SERVICE_ACCOUNT_DIR}/token`;
  if (!existsSync(tokenFile)) {
    throw new KubernetesSourceError('KPROXY_SOURCE_NO_CLUSTER', `in-cluster configuration: ${tokenFile} missing; mount the service account token (automountServiceAccountToken) or pass --kubeconfig FILE`);
  }
  kc.loadFromCluster(prefix);
  return kc;
}

/**
 * client-go spells a user's token file `tokenFile` (kubeadm's kube-proxy kubeconfig.conf
 * points it at the service account token); client-node only reads `token-file`, once. Such a
 * user gets client-node's file authenticator, which re-reads the file as the kubelet rotates
 * the token, as client-go does.
 */
function honourTokenFile(kc: KubeConfig, text: string): void {
  const raw = parseYaml(text) as { users?: Array<{ name?: string; user?: { tokenFile?: unknown; token?: unknown } }> } | null;
  for (const u of raw?.users ?? []) {
    const file = u?.user?.tokenFile;
    if (typeof file !== 'string' || !file || u.user?.token) continue;
    const user = kc.users.find((x) => x.name === u.name) as { token?: string; authProvider?: unknown } | undefined;
    if (user && !user.token && !user.authProvider) user.authProvider = { name: 'tokenFile', config: { tokenFile: file } };
  }
}

/**
 * --master as a URL: upstream accepts a bare host[:port] (http, as rest.DefaultServerURL) and
 * a URL. Throws KPROXY_SOURCE_KUBECONFIG on anything else.
 */
export function masterURL(master: string): string {
  const withScheme = /^[a-z][a-z0-9+.-]*:\/\//i.test(master) ? master : `http://${master}`;
  let u: URL;
  try {
    u = new URL(withScheme);
  } catch {
    throw new KubernetesSourceError('KPROXY_SOURCE_KUBECONFIG', `--master ${JSON.stringify(master)} is not a URL; pass the API server as https://HOST:PORT or http://HOST:PORT`);
  }
  if ((u.protocol !== 'http:' && u.protocol !== 'https:') || !u.hostname) {
    throw new KubernetesSourceError('KPROXY_SOURCE_KUBECONFIG', `--master ${JSON.stringify(master)} is not an http(s) URL; pass the API server as https://HOST:PORT or http://HOST:PORT`);
  }
  return withScheme.replace(/\/+$/, '');
}

export interface KubernetesSource extends Source {
  /** the client configuration in use (server URL for status output) */
  readonly server: string;
}

/** Creates the source; the configuration is loaded now (errors are thrown here), the watches start in start(). */
export function createKubernetesSource(opts: KubernetesSourceOptions): KubernetesSource {
  if (!opts.nodeName) throw new KubernetesSourceError('KPROXY_SOURCE_NODE_NAME', 'node name is empty; pass --hostname-override NAME');
  const kc = loadKubeConfig(opts);
  return new KubeSource(kc, opts);
}

class KubeSource implements KubernetesSource {
  private handler?: SourceHandler;
  private readonly services: ResilientInformer<K8sService & { metadata?: any }>; // eslint-disable-line @typescript-eslint/no-explicit-any
  private readonly slices: ResilientInformer<K8sEndpointSlice & { metadata?: any }>; // eslint-disable-line @typescript-eslint/no-explicit-any
  private readonly node: ResilientInformer<K8sNode & { metadata?: any }>; // eslint-disable-line @typescript-eslint/no-explicit-any
  private synced = false;
  readonly server: string;

  constructor(kc: KubeConfig, opts: KubernetesSourceOptions) {
    this.server = kc.getCurrentCluster()?.server ?? '';
    const log = opts.log.child({ component: 'source-kubernetes' });
    // When one informer gets through after an outage, the others retry at once instead of
    // sleeping out their back-off: convergence follows the first to reconnect.
    const onReconnect = () => {
      for (const i of [this.services, this.slices, this.node]) i?.retryNow();
    };
    const common = { kc, log, backoff: resolveBackoff(opts.backoff), watchTimeoutSeconds: opts.watchTimeoutSeconds, onReconnect };
    const onListed = () => this.maybeSynced();
    this.services = new ResilientInformer({
      ...common,
      path: '/api/v1/services',
      what: 'services',
      labelSelector: PROXY_LABEL_SELECTOR,
      onChange: (o, n) => this.handler?.onService(o, n),
      onListed,
    });
    this.slices = new ResilientInformer({
      ...common,
      path: '/apis/discovery.k8s.io/v1/endpointslices',
      what: 'endpointslices',
      labelSelector: PROXY_LABEL_SELECTOR,
      onChange: (o, n) => this.handler?.onEndpointSlice(o, n),
      onListed,
    });
    this.node = new ResilientInformer({
      ...common,
      path: '/api/v1/nodes',
      what: `node ${opts.nodeName}`,
      fieldSelector: `metadata.name=${opts.nodeName}`,
      onChange: (_o, n) => this.handler?.onNode?.(n),
      onListed: () => {},
    });
  }

  private maybeSynced(): void {
    if (this.synced || !this.services.status.listed || !this.slices.status.listed) return;
    this.synced = true;
    this.handler?.onSynced();
  }

  async start(handler: SourceHandler): Promise<void> {
    this.handler = handler;
    this.services.start();
    this.slices.start();
    this.node.start();
  }

  async stop(): Promise<void> {
    await Promise.all([this.services.stop(), this.slices.stop(), this.node.stop()]);
    this.handler = undefined;
  }

  health(): SourceHealth {
    const all = [this.services, this.slices, this.node].map((i) => i.status);
    const problems = all.map((s) => s.problem).filter((p): p is string => !!p);
    const h: SourceHealth = {
      synced: this.synced,
      connected: all.every((s) => s.connected),
      lastContactMs: Math.max(...all.map((s) => s.lastContactMs)),
    };
    if (problems.length) h.problem = problems.join('; ');
    return h;
  }
}
