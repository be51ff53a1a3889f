// The deployment artefacts are checked as text, since no cluster or Docker engine is at hand:
// every document of deploy/kproxy.yaml against the Kubernetes OpenAPI schemas
// (kubernetes-models), plus what the schemas cannot see (unknown fields, references between
// documents, the RBAC policy, the config kproxy will load), and the Dockerfile's facts.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { builtinModules } from 'node:module';
import { dirname, join, posix, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse as parseYaml, parseAllDocuments } from 'yaml';
import * as k8s from '@kubernetes/client-node';
import { ConfigMap, ServiceAccount } from 'kubernetes-models/v1';
import { ClusterRole, ClusterRoleBinding } from 'kubernetes-models/rbac.authorization.k8s.io/v1';
import { DaemonSet } from 'kubernetes-models/apps/v1';
import { IPVS_SCHEDULERS, MODES, parseConfigText, resolveConfig } from '../../src/config/config.ts';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const MANIFEST = join(ROOT, 'deploy/kproxy.yaml');
const CONFIGMAP = join(ROOT, 'deploy/kube-proxy-configmap.yaml');
const DOCKERFILE = join(ROOT, 'deploy/Dockerfile');
const DOCKERIGNORE = join(ROOT, 'deploy/Dockerfile.dockerignore');

type Obj = Record<string, any>;

// ---------------------------------------------------------------------------------------------
// Loading and schema validation

function loadManifest(path = MANIFEST): Obj[] {
  const docs = parseAllDocuments(readFileSync(path, 'utf8'));
  assert.ok(Array.isArray(docs), 'manifest is not a YAML stream');
  return docs.map((d, i) => {
    assert.deepEqual(d.errors.map((e) => e.message), [], `document ${i} has YAML errors`);
    const obj = d.toJS() as Obj;
    assert.ok(obj && typeof obj === 'object', `document ${i} is empty`);
    return obj;
  });
}

function find(docs: Obj[], kind: string, name: string): Obj {
  const matches = docs.filter((d) => d.kind === kind && d.metadata?.name === name);
  assert.equal(matches.length, 1, `want exactly one ${kind}/${name}, found ${matches.length}`);
  return matches[0];
}

// Each kind the manifest may hold, with its kubernetes-models class (the OpenAPI validator)
// and its @kubernetes/client-node model (the field list, for the unknown-field check).
const KINDS: Record<string, { validate(obj: Obj): void; model: string }> = {
  'v1/ServiceAccount': { validate: (o) => new ServiceAccount(o as any).validate(), model: 'V1ServiceAccount' },
  'v1/ConfigMap': { validate: (o) => new ConfigMap(o as any).validate(), model: 'V1ConfigMap' },
  'rbac.authorization.k8s.io/v1/ClusterRole': { validate: (o) => new ClusterRole(o as any).validate(), model: 'V1ClusterRole' },
  'rbac.authorization.k8s.io/v1/ClusterRoleBinding': {
    validate: (o) => new ClusterRoleBinding(o as any).validate(),
    model: 'V1ClusterRoleBinding',
  },
  'apps/v1/DaemonSet': { validate: (o) => new DaemonSet(o as any).validate(), model: 'V1DaemonSet' },
};

function kindKey(obj: Obj): string {
  return `${obj.apiVersion}/${obj.kind}`;
}

type AttributeMap = { name: string; baseName: string; type: string }[];

function attributesOf(type: string): AttributeMap | undefined {
  const cls = (k8s as Record<string, unknown>)[type] as { getAttributeTypeMap?: () => AttributeMap } | undefined;
  return typeof cls?.getAttributeTypeMap === 'function' ? cls.getAttributeTypeMap() : undefined;
}

// kubernetes-models' schemas allow any extra property, so a misspelt field ("hostNetwrok")
// would pass them while `kubectl apply` (strict field validation) rejects it, or worse, an
// older server drops it silently. client-node's models list every field of every type.
function unknownFields(value: unknown, type: string, path: string): string[] {
  if (value === null || value === undefined) return [];
  const arr = /^Array<(.+)>$/.exec(type);
  if (arr) return Array.isArray(value) ? value.flatMap((v, i) => unknownFields(v, arr[1], `${path}[${i}]`)) : [];
  const map = /^\{ \[key: string\]: (.+); \}$/.exec(type);
  if (map) return Object.entries(value as Obj).flatMap(([k, v]) => unknownFields(v, map[1], `${path}.${k}`));
  const attrs = attributesOf(type);
  if (!attrs || typeof value !== 'object' || Array.isArray(value)) return [];
  return Object.entries(value as Obj).flatMap(([k, v]) => {
    const attr = attrs.find((a) => a.baseName === k);
    return attr ? unknownFields(v, attr.type, `${path}.${k}`) : [`${path}.${k}`];
  });
}

function validateDocument(obj: Obj): void {
  const entry = KINDS[kindKey(obj)];
  if (!entry) throw new Error(`no validator for ${kindKey(obj)}; add it to KINDS`);
  entry.validate(obj);
  const unknown = unknownFields(obj, entry.model, obj.kind);
  if (unknown.length) throw new Error(`unknown field(s): ${unknown.join(', ')}`);
}

// ---------------------------------------------------------------------------------------------
// Policy: what the ClusterRole may grant

// What a kube-proxy does (upstream's system:node-proxier, less Endpoints and event updates).
const WANTED_GRANTS = ['/nodes:get', '/nodes:list', '/nodes:watch', '/services:list', '/services:watch',
  'discovery.k8s.io/endpointslices:list', 'discovery.k8s.io/endpointslices:watch',
  '/events:create', '/events:patch', 'events.k8s.io/events:create', 'events.k8s.io/events:patch'];

/** Every (group, resource, verb) the role grants, or a problem for anything not expressible so. */
function grantsOf(role: Obj): { grants: string[]; problems: string[] } {
  const grants = new Set<string>();
  const problems: string[] = [];
  if (role.aggregationRule) problems.push('aggregationRule grants whatever other roles grant');
  for (const [i, rule] of ((role.rules ?? []) as Obj[]).entries()) {
    if (rule.nonResourceURLs) problems.push(`rules[${i}] grants nonResourceURLs`);
    if (rule.resourceNames) problems.push(`rules[${i}] narrows to resourceNames (informers need all)`);
    for (const g of rule.apiGroups ?? []) for (const r of rule.resources ?? []) for (const v of rule.verbs ?? []) {
      if ([g, r, v].includes('*')) problems.push(`rules[${i}] uses a wildcard`);
      grants.add(`${g}/${r}:${v}`);
    }
  }
  return { grants: [...grants].sort(), problems };
}

function assertLeastPrivilege(role: Obj): void {
  const { grants, problems } = grantsOf(role);
  assert.deepEqual(problems, []);
  assert.deepEqual(grants, [...WANTED_GRANTS].sort());
}

// ---------------------------------------------------------------------------------------------
// Dockerfile parsing: instructions with continuation lines joined and comments dropped

interface Instruction { op: string; args: string }

function parseDockerfile(text: string): Instruction[] {
  const logical: string[] = [];
  let current = '';
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line.startsWith('#') || (line === '' && current === '')) continue;
    if (line.endsWith('\\')) {
      current += line.slice(0, -1) + ' ';
      continue;
    }
    logical.push((current + line).trim());
    current = '';
  }
  if (current.trim()) logical.push(current.trim());
  return logical.filter(Boolean).map((l) => {
    const m = /^(\S+)\s*(.*)$/.exec(l)!;
    return { op: m[1].toUpperCase(), args: m[2].replace(/\s+/g, ' ') };
  });
}

function execForm(ins: Instruction | undefined): string[] {
  assert.ok(ins, 'instruction missing');
  const v = JSON.parse(ins.args) as unknown;
  assert.ok(Array.isArray(v), `${ins.op} must use the exec (JSON array) form`);
  return v as string[];
}

/** Package names after `apt-get install`, flags skipped, up to the end of that command. */
function aptPackages(run: string): { packages: string[]; flags: string[] } {
  const m = /apt-get install ([^&;|]*)/.exec(run);
  if (!m) return { packages: [], flags: [] };
  const words = m[1].trim().split(' ');
  return { packages: words.filter((w) => !w.startsWith('-')), flags: words.filter((w) => w.startsWith('-')) };
}

// ---------------------------------------------------------------------------------------------
// Runtime imports: the image runs `npm ci --omit=dev`, so whatever src/ and bin/ import at
// run time must be a production dependency.

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) return sourceFiles(p);
    return /\.(ts|js|mjs)$/.test(name) && !name.endsWith('.d.ts') ? [p] : [];
  });
}

function runtimePackages(file: string): string[] {
  const text = readFileSync(file, 'utf8').replace(/^\s*\/\/.*$/gm, '');
  const specs: string[] = [];
  const staticRe = /^\s*(import|export)\s+(type\s+)?(?:[^'"]*?\s+from\s+)?['"]([^'"]+)['"]/gm;
  for (const m of text.matchAll(staticRe)) if (!m[2]) specs.push(m[3]);
  for (const m of text.matchAll(/\bimport\(\s*['"]([^'"]+)['"]\s*\)/g)) specs.push(m[1]);
  return specs
    .filter((s) => !s.startsWith('.') && !s.startsWith('/') && !s.startsWith('node:') && !builtinModules.includes(s))
    .map((s) => (s.startsWith('@') ? s.split('/').slice(0, 2).join('/') : s.split('/')[0]));
}

// ---------------------------------------------------------------------------------------------

// kubeadm's kube-proxy DaemonSet (cmd/kubeadm/app/phases/addons/proxy/manifests.go): the
// command, and the pod facts a drop-in must share with it.
const KUBEADM_COMMAND = ['/usr/local/bin/kube-proxy', '--config=/var/lib/kube-proxy/config.conf', '--hostname-override=$(NODE_NAME)'];
/** the top-level fields kubeadm writes into config.conf (v1alpha1, every one, zero values included) */
const KUBEADM_CONFIG_FIELDS = ['apiVersion', 'bindAddress', 'bindAddressHardFail', 'clientConnection', 'clusterCIDR', 'configSyncPeriod',
  'conntrack', 'detectLocal', 'detectLocalMode', 'enableProfiling', 'healthzBindAddress', 'hostnameOverride', 'iptables', 'ipvs', 'kind',
  'logging', 'metricsBindAddress', 'mode', 'nftables', 'nodePortAddresses', 'oomScoreAdj', 'portRange', 'showHiddenMetricsForVersion', 'winkernel'];

describe('deploy/kproxy.yaml and deploy/kube-proxy-configmap.yaml', () => {
  const docs = loadManifest();
  const cmDocs = loadManifest(CONFIGMAP);
  const all = [...docs, ...cmDocs];
  const cm = find(cmDocs, 'ConfigMap', 'kube-proxy');

  test('kproxy.yaml holds the ServiceAccount, ClusterRole, ClusterRoleBinding and DaemonSet; the ConfigMap is apart', () => {
    assert.deepEqual(docs.map(kindKey).sort(), Object.keys(KINDS).filter((k) => k !== 'v1/ConfigMap').sort());
    // applying kproxy.yaml on a kubeadm cluster must not overwrite kubeadm's ConfigMap kube-proxy
    assert.deepEqual(cmDocs.map(kindKey), ['v1/ConfigMap']);
    for (const d of all) {
      if (d.kind.startsWith('Cluster')) assert.equal(d.metadata.namespace, undefined, `${d.kind} is cluster-scoped`);
      else assert.equal(d.metadata.namespace, 'kube-system', `${d.kind} namespace`);
    }
  });

  for (const [i, d] of all.entries()) {
    test(`document ${i} (${d.kind}/${d.metadata?.name}) passes the Kubernetes schema and has no unknown field`, () => {
      validateDocument(d);
    });
  }

  test('the ClusterRole grants what a kube-proxy needs and nothing else', () => {
    assertLeastPrivilege(find(docs, 'ClusterRole', 'kproxy:node-proxier'));
  });

  test('the binding ties that ClusterRole to kube-proxy\'s ServiceAccount, which the DaemonSet runs as', () => {
    const binding = find(docs, 'ClusterRoleBinding', 'kproxy:node-proxier');
    const sa = find(docs, 'ServiceAccount', 'kube-proxy');
    const ds = find(docs, 'DaemonSet', 'kproxy');
    assert.deepEqual(binding.roleRef, { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'kproxy:node-proxier' });
    assert.deepEqual(binding.subjects, [{ kind: 'ServiceAccount', name: sa.metadata.name, namespace: sa.metadata.namespace }]);
    assert.equal(ds.spec.template.spec.serviceAccountName, 'kube-proxy');
  });

  describe('DaemonSet', () => {
    const ds = find(docs, 'DaemonSet', 'kproxy');
    const pod = ds.spec.template.spec;
    const [container] = pod.containers;

    test('starts kproxy with kubeadm\'s kube-proxy command, word for word', () => {
      assert.deepEqual(container.command, KUBEADM_COMMAND);
      assert.equal(container.args, undefined);
    });

    test('runs one privileged container in the host network, on every Linux node, as node-critical (as kubeadm\'s)', () => {
      assert.equal(pod.containers.length, 1);
      assert.equal(container.name, 'kube-proxy');
      assert.equal(pod.hostNetwork, true);
      // no cluster DNS: the proxy that makes the DNS Service reachable cannot depend on it
      assert.equal(pod.dnsPolicy, undefined);
      assert.equal(pod.priorityClassName, 'system-node-critical');
      assert.deepEqual(pod.tolerations, [{ operator: 'Exists' }]);
      assert.deepEqual(pod.nodeSelector, { 'kubernetes.io/os': 'linux' });
      assert.equal(container.securityContext.privileged, true);
      assert.equal(container.image, 'kproxy:0.1.0');
      assert.deepEqual(container.resources.requests, { cpu: '100m', memory: '64Mi' });
      assert.deepEqual(ds.spec.updateStrategy, { type: 'RollingUpdate', rollingUpdate: { maxUnavailable: '10%' } });
    });

    test('the selector matches the pod template (the API rejects it otherwise)', () => {
      for (const [k, v] of Object.entries(ds.spec.selector.matchLabels as Record<string, string>)) {
        assert.equal(ds.spec.template.metadata.labels[k], v, `template label ${k}`);
      }
    });

    test('gets its node name from spec.nodeName for --hostname-override', () => {
      const env = (container.env as Obj[]).find((e) => e.name === 'NODE_NAME');
      assert.deepEqual(env?.valueFrom, { fieldRef: { apiVersion: 'v1', fieldPath: 'spec.nodeName' } });
      assert.ok(container.command.includes('--hostname-override=$(NODE_NAME)'));
    });

    test('mounts kubeadm\'s volumes: the ConfigMap kube-proxy, /run/xtables.lock and /lib/modules read-only', () => {
      const volumes = new Map((pod.volumes as Obj[]).map((v) => [v.name, v]));
      const mountOf = (path: string) => (container.volumeMounts as Obj[]).find((m) => m.mountPath === path);
      assert.deepEqual(volumes.get(mountOf('/var/lib/kube-proxy')!.name)?.configMap, { name: 'kube-proxy' });
      const modules = mountOf('/lib/modules');
      assert.equal(modules?.readOnly, true);
      assert.deepEqual(volumes.get(modules!.name)?.hostPath, { path: '/lib/modules' });
      const lock = mountOf('/run/xtables.lock');
      assert.ok(lock && !lock.readOnly, 'xtables.lock must be writable: iptables takes a lock on it');
      assert.deepEqual(volumes.get(lock.name)?.hostPath, { path: '/run/xtables.lock', type: 'FileOrCreate' });
      assert.deepEqual([...volumes.keys()].sort(), ['kube-proxy', 'lib-modules', 'xtables-lock']);
      for (const m of container.volumeMounts as Obj[]) assert.ok(volumes.has(m.name), `mount ${m.name} has no volume`);
    });

    test('--config and the config\'s kubeconfig are keys of the ConfigMap, at the mounted path; the image CMD agrees', () => {
      const configArg = (container.command as string[]).find((a) => a.startsWith('--config='))!.slice('--config='.length);
      const mount = (container.volumeMounts as Obj[]).find((m) => configArg.startsWith(m.mountPath + '/'));
      assert.ok(mount, `no volume mounted over ${configArg}`);
      const volume = (pod.volumes as Obj[]).find((v) => v.name === mount.name);
      assert.equal(volume?.configMap?.name, cm.metadata.name);
      assert.ok(posix.basename(configArg) in cm.data, `ConfigMap has no key ${posix.basename(configArg)}`);
      const cfg = resolveConfig(parseConfigText(cm.data[posix.basename(configArg)]));
      assert.equal(posix.dirname(cfg.kubeconfig), mount.mountPath);
      assert.ok(posix.basename(cfg.kubeconfig) in cm.data, `ConfigMap has no key ${posix.basename(cfg.kubeconfig)}`);
      const cmd = execForm(parseDockerfile(readFileSync(DOCKERFILE, 'utf8')).find((i) => i.op === 'CMD'));
      assert.deepEqual(cmd, [`--config=${configArg}`], 'image CMD and DaemonSet command disagree');
    });

    test('probes /livez (liveness) and /healthz (readiness) on the healthz port the config binds', () => {
      assert.deepEqual(container.livenessProbe.httpGet, { path: '/livez', port: 10256 });
      assert.deepEqual(container.readinessProbe.httpGet, { path: '/healthz', port: 10256 });
      const cfg = resolveConfig(parseConfigText(cm.data['config.conf']));
      assert.equal(Number(cfg.healthzBindAddress.split(':').pop()), 10256);
    });
  });

  describe('ConfigMap kube-proxy', () => {
    const text: string = cm.data['config.conf'];

    test('config.conf is a kubeadm-generated KubeProxyConfiguration: every field kubeadm writes, and only those', () => {
      const raw = parseConfigText(text);
      assert.equal(raw.apiVersion, 'kubeproxy.config.k8s.io/v1alpha1');
      assert.equal(raw.kind, 'KubeProxyConfiguration');
      assert.deepEqual(Object.keys(raw).sort(), [...KUBEADM_CONFIG_FIELDS].sort());
    });

    test('config.conf resolves to upstream\'s defaults from kubeadm\'s zero values, in iptables mode', () => {
      const cfg = resolveConfig(parseConfigText(text));
      assert.equal(cfg.mode, 'iptables');
      assert.deepEqual(cfg.clusterCIDRs, ['10.244.0.0/16']);
      assert.equal(cfg.metricsBindAddress, '127.0.0.1:10249');
      assert.equal(cfg.healthzBindAddress, '0.0.0.0:10256');
      assert.equal(cfg.syncPeriodMs, 30_000);
      assert.equal(cfg.minSyncPeriodMs, 1_000);
      assert.equal(cfg.masqueradeBit, 14);
      assert.equal(cfg.kubeconfig, '/var/lib/kube-proxy/kubeconfig.conf');
    });

    test('kubeconfig.conf is kubeadm\'s: the service account\'s CA and token files', () => {
      const kc = parseYaml(cm.data['kubeconfig.conf']) as Obj;
      assert.equal(kc.kind, 'Config');
      const ctx = (kc.contexts as Obj[]).find((c) => c.name === kc['current-context'])!.context;
      const cluster = (kc.clusters as Obj[]).find((c) => c.name === ctx.cluster)!.cluster;
      const user = (kc.users as Obj[]).find((u) => u.name === ctx.user)!.user;
      assert.equal(cluster['certificate-authority'], '/var/run/secrets/kubernetes.io/serviceaccount/ca.crt');
      assert.match(cluster.server, /^https:\/\//);
      assert.deepEqual(user, { tokenFile: '/var/run/secrets/kubernetes.io/serviceaccount/token' });
    });

    test('switching mode or IPVS scheduler by editing it stays valid (docs/deploy.md)', () => {
      for (const mode of MODES) {
        const edited = text.replace(/^mode: iptables$/m, `mode: ${mode}`);
        assert.equal(resolveConfig(parseConfigText(edited)).mode, mode);
      }
      for (const scheduler of IPVS_SCHEDULERS) {
        const edited = text.replace(/^mode: iptables$/m, 'mode: ipvs').replace(/^( +)scheduler: ""$/m, `$1scheduler: ${scheduler}`);
        const cfg = resolveConfig(parseConfigText(edited));
        assert.deepEqual([cfg.mode, cfg.ipvs.scheduler], ['ipvs', scheduler]);
      }
    });

    test('a mistyped mode is rejected with a stable code, before anything touches the host', () => {
      const edited = text.replace(/^mode: iptables$/m, 'mode: ipvsadm');
      assert.throws(() => resolveConfig(parseConfigText(edited)), /^Error: KPROXY_CONFIG_INVALID: mode: unknown mode "ipvsadm"/);
    });
  });

  describe('validation can fail', () => {
    const pristine = () => structuredClone(find(docs, 'DaemonSet', 'kproxy'));

    test('kubernetes-models rejects a DaemonSet with a wrongly typed or out-of-enum field', () => {
      const bad = pristine();
      bad.spec.template.spec.hostNetwork = 'yes';
      bad.spec.template.spec.containers[0].imagePullPolicy = 'Sometimes';
      assert.throws(() => validateDocument(bad), (e: Error) =>
        /spec\/template\/spec\/hostNetwork must be boolean/.test(e.message) && /imagePullPolicy must be equal to one of the allowed values/.test(e.message));
    });

    test('kubernetes-models rejects a container without its required name', () => {
      const bad = pristine();
      delete bad.spec.template.spec.containers[0].name;
      assert.throws(() => validateDocument(bad), /containers\/0 must have required property name/);
    });

    test('a misspelt field, which the OpenAPI schema lets through, is rejected as unknown', () => {
      const bad = pristine();
      bad.spec.template.spec.hostNetwrok = true;
      bad.spec.template.spec.containers[0].livenessProbe.httpGet.paht = '/livez';
      assert.doesNotThrow(() => new DaemonSet(bad).validate(), 'kubernetes-models alone accepts it');
      assert.throws(() => validateDocument(bad), (e: Error) =>
        e.message.includes('DaemonSet.spec.template.spec.hostNetwrok') &&
        e.message.includes('DaemonSet.spec.template.spec.containers[0].livenessProbe.httpGet.paht'));
    });

    test('the RBAC policy check rejects a role that also grants more: update, delete, a wildcard, endpoints', () => {
      const role = find(docs, 'ClusterRole', 'kproxy:node-proxier');
      const withUpdate = structuredClone(role);
      withUpdate.rules[3].verbs.push('update');
      assert.throws(() => assertLeastPrivilege(withUpdate));
      const withDelete = structuredClone(role);
      withDelete.rules[0].verbs.push('delete');
      assert.throws(() => assertLeastPrivilege(withDelete));
      const withEndpoints = structuredClone(role);
      withEndpoints.rules.push({ apiGroups: [''], resources: ['endpoints'], verbs: ['list', 'watch'] });
      assert.throws(() => assertLeastPrivilege(withEndpoints));
      const wildcard = structuredClone(role);
      wildcard.rules[1].resources = ['*'];
      assert.throws(() => assertLeastPrivilege(wildcard), /wildcard/);
    });
  });
});

describe('deploy/Dockerfile', () => {
  const ins = parseDockerfile(readFileSync(DOCKERFILE, 'utf8'));
  const runs = ins.filter((i) => i.op === 'RUN').map((i) => i.args);

  test('is FROM node:20-slim, and only that', () => {
    assert.deepEqual(ins.filter((i) => i.op === 'FROM').map((i) => i.args), ['node:20-slim']);
    assert.equal(ins[0].op, 'FROM');
  });

  test('installs the kernel tools every mode drives, without recommends, and drops apt lists in the same layer', () => {
    const apt = runs.find((r) => r.includes('apt-get install'));
    assert.ok(apt, 'no apt-get install');
    const { packages, flags } = aptPackages(apt);
    for (const p of ['iptables', 'nftables', 'ipset', 'ipvsadm', 'conntrack', 'kmod', 'iproute2']) {
      assert.ok(packages.includes(p), `${p} not installed (have ${packages.join(' ')})`);
    }
    assert.ok(flags.includes('--no-install-recommends'));
    assert.ok(flags.includes('-y'));
    assert.ok(apt.indexOf('apt-get update') < apt.indexOf('apt-get install'), 'update before install, same layer');
    assert.match(apt, /rm -rf \/var\/lib\/apt\/lists\/\*/);
  });

  test('installs production dependencies from the lockfile before copying the sources', () => {
    const idx = (pred: (i: Instruction) => boolean) => ins.findIndex(pred);
    const copyManifests = idx((i) => i.op === 'COPY' && /\bpackage\.json\b/.test(i.args) && /\bpackage-lock\.json\b/.test(i.args));
    const npmCi = idx((i) => i.op === 'RUN' && /\bnpm ci --omit=dev\b/.test(i.args));
    const copySrc = idx((i) => i.op === 'COPY' && /^src\/? /.test(i.args));
    const copyBin = idx((i) => i.op === 'COPY' && /^bin\/? /.test(i.args));
    assert.ok(copyManifests >= 0 && npmCi > copyManifests, 'COPY package*.json, then npm ci --omit=dev');
    assert.ok(copySrc > npmCi && copyBin > npmCi, 'sources are copied after npm ci (layer caching)');
  });

  test('the image\'s /usr/local/bin/kube-proxy (the ENTRYPOINT) is bin/kube-proxy, which runs bin/kproxy.js', () => {
    assert.deepEqual(execForm(ins.find((i) => i.op === 'ENTRYPOINT')), ['/usr/local/bin/kube-proxy']);
    assert.deepEqual(execForm(ins.find((i) => i.op === 'CMD')), ['--config=/var/lib/kube-proxy/config.conf']);
    const workdir = ins.filter((i) => i.op === 'WORKDIR').at(-1)?.args;
    const copyBin = ins.find((i) => i.op === 'COPY' && /^bin\/? /.test(i.args))!;
    const dest = posix.resolve(workdir ?? '/', copyBin.args.split(' ')[1]);
    assert.equal(dest, '/app/bin');
    const link = runs.find((r) => r.includes('/usr/local/bin/kube-proxy'));
    assert.ok(link?.includes(`ln -s ${dest}/kube-proxy /usr/local/bin/kube-proxy`), `no kube-proxy link: ${link}`);
    assert.ok(link?.includes(`ln -s ${dest}/kube-proxy /usr/local/bin/kproxy`));
    // tini first when PID 1: it must reap the orphans of a process group killed at its time limit
    assert.match(ins.find((i) => i.op === 'RUN' && /apt-get install/.test(i.args))!.args, /\btini\b/);
    const wrapper = readFileSync(join(ROOT, 'bin/kube-proxy'), 'utf8');
    assert.match(wrapper, /exec \/usr\/bin\/tini -- node "\$here\/kproxy\.js" "\$@"/);
    assert.ok((statSync(join(ROOT, 'bin/kube-proxy')).mode & 0o111) !== 0, 'bin/kube-proxy is executable');
  });

  test('the image\'s iptables commands are bin/iptables-wrapper, which picks the host\'s backend (test/deploy/iptables-wrapper.test.ts)', () => {
    const link = runs.find((r) => r.includes('/app/bin/iptables-wrapper'));
    assert.ok(link, 'no RUN links the iptables commands to the wrapper');
    assert.match(link, /for cmd in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do ln -sf \/app\/bin\/iptables-wrapper "\/usr\/sbin\/\$cmd"; done/);
    const copyBin = ins.findIndex((i) => i.op === 'COPY' && /^bin\/? /.test(i.args));
    assert.ok(ins.findIndex((i) => i.op === 'RUN' && i.args === link) > copyBin, 'linked after bin/ is copied');
    assert.ok((statSync(join(ROOT, 'bin/iptables-wrapper')).mode & 0o111) !== 0, 'bin/iptables-wrapper is executable');
  });

  test('bin/kube-proxy, reached through a symlink as in the image, runs kproxy with its arguments', () => {
    const dir = mkdtempSync(join(tmpdir(), 'kp-link-'));
    try {
      symlinkSync(join(ROOT, 'bin/kube-proxy'), join(dir, 'kube-proxy'));
      const help = execFileSync(join(dir, 'kube-proxy'), ['--help'], { encoding: 'utf8' });
      assert.match(help, /^Usage:\n  kproxy \[flags\] /m);
      const r = spawnSync(join(dir, 'kube-proxy'), ['render', '--mode', 'bogus', '--manifests', join(ROOT, 'examples/manifests')], { encoding: 'utf8' });
      assert.equal(r.status, 2);
      assert.match(r.stderr, /KPROXY_CONFIG_INVALID: mode: unknown mode "bogus"/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('every COPY source exists and is not excluded by the ignore file', () => {
    const ignored = readFileSync(DOCKERIGNORE, 'utf8').split('\n').map((l) => l.trim()).filter((l) => l && !l.startsWith('#'));
    for (const p of ['node_modules', 'test', 'bench', '.git']) assert.ok(ignored.includes(p), `${p} not ignored`);
    for (const copy of ins.filter((i) => i.op === 'COPY')) {
      const sources = copy.args.split(' ').filter((w) => !w.startsWith('--')).slice(0, -1);
      for (const s of sources) {
        assert.ok(existsSync(join(ROOT, s)), `COPY source ${s} does not exist`);
        const top = s.replace(/\/$/, '').split('/')[0];
        assert.ok(!ignored.includes(top), `COPY source ${s} is excluded by ${DOCKERIGNORE}`);
      }
    }
  });

  test('what src/ and bin/ import at run time is a production dependency (the image omits dev ones)', () => {
    const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { dependencies: Record<string, string> };
    const missing = new Set<string>();
    for (const f of [...sourceFiles(join(ROOT, 'src')), ...sourceFiles(join(ROOT, 'bin'))]) {
      for (const p of runtimePackages(f)) if (!(p in pkg.dependencies)) missing.add(`${p} (${f.slice(ROOT.length + 1)})`);
    }
    assert.deepEqual([...missing], []);
    assert.ok('tsx' in pkg.dependencies, 'tsx runs the TypeScript sources in the image');
  });
});
