// Generates one big multi-document manifest file of realistic Services (labels, annotations,
// several ports), about 800 bytes each: 10,000 of them make the 8 MB file that the
// manifests-source load test and bench/manifests-load.ts measure.

/** One Service as a YAML document (no leading ---). i picks a unique name and ClusterIP. */
export function bigService(i: number): string {
  const ip = `172.30.${(i >> 8) & 255}.${i & 255}`;
  return [
    'apiVersion: v1',
    'kind: Service',
    'metadata:',
    `  name: service-number-${i}`,
    `  namespace: team-${i % 50}`,
    '  labels:',
    `    app.kubernetes.io/name: service-number-${i}`,
    `    app.kubernetes.io/instance: release-${i % 97}`,
    '    app.kubernetes.io/part-of: generated-load-test',
    '    app.kubernetes.io/managed-by: kproxy-tests',
    '  annotations:',
    `    description: "generated service ${i}, big enough to look like a real one with a few annotations"`,
    '    owner: platform-team@example.com',
    'spec:',
    '  type: ClusterIP',
    `  clusterIP: ${ip}`,
    `  clusterIPs: ["${ip}"]`,
    '  ipFamilies: [IPv4]',
    '  ipFamilyPolicy: SingleStack',
    '  sessionAffinity: None',
    '  internalTrafficPolicy: Cluster',
    '  selector:',
    `    app.kubernetes.io/name: service-number-${i}`,
    '  ports:',
    '  - name: http',
    '    protocol: TCP',
    '    port: 80',
    '    targetPort: 8080',
    '  - name: https',
    '    protocol: TCP',
    '    port: 443',
    '    targetPort: 8443',
    '  - name: metrics',
    '    protocol: TCP',
    '    port: 9090',
    '    targetPort: 9090',
    '',
  ].join('\n');
}

/** A file of services 0..n-1, separated by ---. */
export function bigManifest(n: number, first = 0): string {
  const docs: string[] = [];
  for (let i = first; i < first + n; i++) docs.push(bigService(i));
  return docs.join('---\n');
}
