// kubeadm's kube-proxy kubeconfig.conf names the service account token with client-go's
// `tokenFile` (and the CA with `certificate-authority`, a path): kproxy must send that token,
// or a drop-in kproxy gets 401 on every list and watch.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadKubeConfig } from '../../src/sources/kubernetes.ts';

const kubeadmKubeconfig = (dir: string) => `apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority: ${dir}/ca.crt
    server: https://192.168.0.10:6443
  name: default
contexts:
- context:
    cluster: default
    namespace: default
    user: default
  name: default
current-context: default
users:
- name: default
  user:
    tokenFile: ${dir}/token
`;

/** The Authorization header of client-node's request options (node-fetch Headers). */
function authorization(headers: unknown): string | null | undefined {
  return (headers as { get?: (k: string) => string | null } | undefined)?.get?.('Authorization');
}

test('a kubeadm kube-proxy kubeconfig (tokenFile, certificate-authority path) authenticates with the token file', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kp-kc-'));
  try {
    writeFileSync(join(dir, 'token'), 'sa-token-1');
    writeFileSync(join(dir, 'ca.crt'), '-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n');
    writeFileSync(join(dir, 'kubeconfig.conf'), kubeadmKubeconfig(dir));
    const kc = loadKubeConfig({ kubeconfig: join(dir, 'kubeconfig.conf') });
    assert.equal(kc.getCurrentCluster()?.server, 'https://192.168.0.10:6443');
    const opts = await kc.applyToFetchOptions({});
    const auth = authorization(opts.headers);
    assert.equal(auth, 'Bearer sa-token-1');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('an inline token wins over tokenFile, as in client-go', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kp-kc-'));
  try {
    writeFileSync(join(dir, 'token'), 'from-file');
    writeFileSync(join(dir, 'ca.crt'), '-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n');
    writeFileSync(join(dir, 'kubeconfig.conf'), kubeadmKubeconfig(dir).replace('    tokenFile:', '    token: inline\n    tokenFile:'));
    const opts = await loadKubeConfig({ kubeconfig: join(dir, 'kubeconfig.conf') }).applyToFetchOptions({});
    const auth = authorization(opts.headers);
    assert.equal(auth, 'Bearer inline');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
