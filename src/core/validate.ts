// Validation at the boundary: every Service, EndpointSlice and Node from every source (the
// manifests directory, the Kubernetes API, `render`/`trace`) is checked here before it reaches
// the change trackers. Shape and types with zod; values with upstream's rules, each check naming
// the upstream function it mirrors (pkg/apis/core/validation ValidateService,
// validateServicePort, ValidateLoadBalancerStatus, ValidateEndpointIP; pkg/apis/discovery/
// validation ValidateEndpointSlice; apimachinery's name and label rules). Pure: no I/O.
//
// kproxy is never stricter than the API server: an object the API server accepts passes here.
// Where kproxy needs less than upstream checks, it checks less. Its own refusals, which exist
// only against crashes, bad rules or injection, are the EXTRA_REFUSALS below, in one place.
//
// Policy, one rule for all: an object with ANY invalid field is skipped as a whole, as the API
// server would have refused the whole object. A partly applied object is worse than none: a
// Service without the port whose name was bad, or a slice missing the endpoint whose address
// was bad, silently forwards somewhere the user did not ask for.
//
// Addresses the API server accepts but no kernel mode can use safely never make an object
// invalid: a loopback, unspecified, link-local, multicast or broadcast ClusterIP or
// load-balancer IP, a global-multicast or broadcast external IP (src/core/vip.ts leaves that one
// address out of every rule and logs KPROXY_SERVICE_IP_SKIPPED), and a global-multicast or
// broadcast endpoint address (convert.ts leaves that endpoint out). `allowLoopback`, for the
// userspace mode, also accepts loopback external IPs and endpoints, which upstream refuses:
// there kproxy itself listens on the Service IP, and the standalone demo runs on 127.0.0.0/8.
//
// IPv4 addresses with leading zeros ("010.001.002.003") are accepted as upstream accepts them in
// existing objects (ParseIPSloppy, decimal) and canonicalised before anything renders them.
// The namespace import lets the bundler (scripts/build.mjs) keep only the parts of zod used here.
import * as z from 'zod/v4';
import { flat } from './flat.ts';
import { canonicalIP, ipFamily, parseCIDR } from './ip.ts';
import { ANNOTATION_LAST_CHANGE_TRIGGER_TIME, type K8sEndpointSlice, type K8sService, type ObjectKind, type Report } from './api.ts';

export interface Issue {
  /** field path, e.g. `spec.ports[0].port` */
  path: string;
  message: string;
  /** the offending value as JSON, truncated to about 100 characters */
  value: string;
}

export type Validated<T> = { ok: true; value: T } | { ok: false; issues: Issue[] };

/**
 * Everything kproxy refuses that the API server accepts, with its reason: the one list. None
 * refuses a whole object the API server accepts; each leaves out one address or one port.
 * test/core/upstream-validation.test.ts runs upstream's own validation tables through this file.
 */
export const EXTRA_REFUSALS: ReadonlyArray<{ what: string; scope: 'address' | 'port'; where: string; why: string }> = [
  {
    what: 'a ClusterIP or load-balancer ingress IP that is unspecified, loopback, link-local, multicast or broadcast',
    scope: 'address',
    where: 'src/core/vip.ts (KPROXY_SERVICE_IP_SKIPPED)',
    why: 'upstream validates these with IsValidIP only; as a rule they would capture the node\'s own traffic (a loopback ClusterIP\'s reject rule matches all of localhost) or fail in the kernel',
  },
  {
    what: 'an external IP that is a global multicast address or the IPv4 broadcast address',
    scope: 'address',
    where: 'src/core/vip.ts (KPROXY_SERVICE_IP_SKIPPED)',
    why: 'ValidateEndpointIP lets them through (upstream calls that a bug); no mode can serve a Service on them',
  },
  {
    what: 'an endpoint address that is a global multicast address or the IPv4 broadcast address',
    scope: 'address',
    where: 'src/core/convert.ts (the endpoint is left out, logged)',
    why: 'ValidateEndpointIP lets them through; a DNAT to them forwards nowhere and IPVS refuses them as real servers (EINVAL), failing the whole restore',
  },
  {
    what: 'an EndpointSlice port whose number is outside 1-65535',
    scope: 'port',
    where: 'src/core/convert.ts (the port is left out, logged)',
    why: 'ValidateEndpointSlice checks no port number; no rule can name such a port',
  },
];

export interface ValidateOptions {
  /** accept loopback Service IPs and endpoint addresses (userspace mode only; see above) */
  allowLoopback?: boolean;
}

/**
 * What a proxy mode may accept: loopback Service IPs and endpoints only in the userspace mode,
 * where kproxy itself listens on them (the kernel modes would capture localhost traffic).
 */
export function validateOptionsForMode(mode: string): ValidateOptions {
  return { allowLoopback: mode === 'userspace' };
}

/** The parts of a Node kproxy reads (structurally the sources' K8sNode). */
export interface NodeObject {
  metadata?: { name?: string; labels?: Record<string, string>; deletionTimestamp?: string | null };
  spec?: { podCIDRs?: string[] | null; taints?: Array<{ key: string; value?: string | null; effect?: string | null }> | null } | null;
  status?: { addresses?: Array<{ type: string; address: string }> | null } | null;
}

// ---- name and label rules (apimachinery pkg/util/validation) --------------------------------
// Length is checked before any pattern, so no pattern ever runs on a long string.

const DNS1123_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS1123_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;
const QUALIFIED_NAME_PART = /^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$/;

type Check = (s: string) => string | null;

export const dns1123Label: Check = (s) =>
  s.length === 0 ? 'must not be empty'
  : s.length > 63 ? 'must be no more than 63 characters'
  : DNS1123_LABEL.test(s) ? null
  : "must be a DNS-1123 label: lower case alphanumerics or '-', starting and ending with an alphanumeric";

export const dns1123Subdomain: Check = (s) =>
  s.length === 0 ? 'must not be empty'
  : s.length > 253 ? 'must be no more than 253 characters'
  : DNS1123_SUBDOMAIN.test(s) ? null
  : "must be a DNS-1123 subdomain: lower case alphanumerics, '-' or '.', starting and ending with an alphanumeric";

/**
 * A fully qualified domain name, as apimachinery's IsFullyQualifiedDomainName (what
 * ValidateEndpointSlice checks an FQDN slice's addresses with): one trailing dot allowed, then a
 * DNS-1123 subdomain of at least two labels.
 */
export const fullyQualifiedDomainName: Check = (s) => {
  if (s.length === 0) return 'must not be empty';
  const name = s.endsWith('.') ? s.slice(0, -1) : s;
  const bad = dns1123Subdomain(name);
  if (bad) return bad;
  return name.split('.').length < 2 ? 'must be a domain with at least two segments separated by dots' : null;
};

/**
 * IANA_SVC_NAME, as upstream's IsValidPortName: what a named targetPort (and a container port's
 * name) must be. Not a Service port's own name: that is a DNS-1123 label (validateServicePort).
 */
export const ianaSvcName: Check = (s) => {
  if (s.length === 0) return 'must not be empty';
  if (s.length > 15) return 'must be no more than 15 characters';
  if (!/^[-a-z0-9]+$/.test(s)) return "must contain only lower case alphanumerics or '-'";
  if (!/[a-z]/.test(s)) return 'must contain at least one letter';
  if (s.includes('--')) return "must not contain consecutive '-'";
  if (s.startsWith('-') || s.endsWith('-')) return "must not begin or end with '-'";
  return null;
};

export const labelValue: Check = (s) =>
  s.length > 63 ? 'must be no more than 63 characters'
  : LABEL_VALUE.test(s) ? null
  : "must be a label value: empty, or alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric";

export const labelKey: Check = (s) => {
  const slash = s.indexOf('/');
  const name = slash < 0 ? s : s.slice(slash + 1);
  if (slash >= 0) {
    const prefix = s.slice(0, slash);
    const bad = dns1123Subdomain(prefix);
    if (bad) return `prefix ${bad}`;
  }
  if (name.length === 0) return 'name part must not be empty';
  if (name.length > 63) return 'name part must be no more than 63 characters';
  return QUALIFIED_NAME_PART.test(name) ? null : "name part must be alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric";
};

// ---- special addresses ------------------------------------------------------------------------

/**
 * A dotted quad as canonicalIP prints it: four decimal octets 0-255 without leading zeros. An
 * address written so (nearly every one) is its own canonical form and IPv4, so the rules below
 * skip canonicalIP's parse for it and read its first octets as text prefixes.
 */
const CANONICAL_IPV4 = /^(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$/;

/**
 * Why an address cannot be an endpoint address or external IP, or null: upstream's
 * ValidateEndpointIP (pkg/apis/core/validation), which refuses the unspecified, loopback,
 * link-local unicast and link-local multicast ranges (Go's net.IP IsUnspecified, IsLoopback,
 * IsLinkLocalUnicast, IsLinkLocalMulticast) and nothing else. `ip` must be canonical
 * (canonicalIP: IPv4-mapped IPv6 is already plain IPv4; IPv4 text that is not a canonical dotted
 * quad is no address here). Plain text tests: this runs for every endpoint of every slice.
 */
export function endpointIPReason(ip: string, allowLoopback = false): string | null {
  if (!ip.includes(':')) {
    if (!CANONICAL_IPV4.test(ip)) return 'must be a valid IP address';
    if (ip === '0.0.0.0') return 'may not be unspecified';
    if (ip.startsWith('127.')) return allowLoopback ? null : 'may not be in the loopback range (127.0.0.0/8, ::1/128)';
    if (ip.startsWith('169.254.')) return 'may not be in the link-local range (169.254.0.0/16, fe80::/10)';
    if (ip.startsWith('224.0.0.')) return 'may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)';
    return null;
  }
  if (ip === '::') return 'may not be unspecified';
  if (ip === '::1') return allowLoopback ? null : 'may not be in the loopback range (127.0.0.0/8, ::1/128)';
  const first = ip.startsWith('::') ? 0 : parseInt(ip.slice(0, ip.indexOf(':')), 16);
  if (first >= 0xfe80 && first <= 0xfebf) return 'may not be in the link-local range (169.254.0.0/16, fe80::/10)';
  // Go's IsLinkLocalMulticast: ff00::/8 with scope 2 (ffX2::/16)
  if (first >= 0xff00 && (first & 0x0f) === 0x02) return 'may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)';
  return null;
}

/** canonicalIP, without a parse for an address that is a canonical dotted quad already. */
const canonicalAddress = (raw: string): string | null => (CANONICAL_IPV4.test(raw) ? raw : canonicalIP(raw));

/**
 * An endpoint address the API server accepts but no mode can forward to (kproxy's own refusal,
 * EXTRA_REFUSALS): a global multicast address or the IPv4 broadcast address. `ip` canonical.
 */
export function unusableEndpointReason(ip: string): string | null {
  if (!ip.includes(':')) {
    const first = parseInt(ip, 10);
    if (first >= 224 && first <= 239) return 'a multicast address';
    return ip === '255.255.255.255' ? 'the broadcast address' : null;
  }
  return ip.toLowerCase().startsWith('ff') && ip.indexOf(':') === 4 ? 'a multicast address' : null;
}

// ---- zod building blocks ------------------------------------------------------------------------
// zod 4 (zod/v4): its parsers allocate far less per object than zod 3's, which matters when a
// render or a start-up validates every Service and EndpointSlice of a cluster. A check pushes
// its issue onto the parse payload directly (Schema.check), with the message kproxy prints.

/** The issue a check adds: the message is the one kproxy prints. */
const customIssue = (input: unknown, message: string) => ({ code: 'custom' as const, message, input });

const str = (check: Check) =>
  z.string().check((ctx) => {
    const bad = check(ctx.value);
    if (bad) ctx.issues.push(customIssue(ctx.value, bad));
  });

/** Absent or null means "not set", as in the API's JSON. */
const opt = <T extends z.ZodType>(t: T) => t.nullish();

/**
 * What kind of value `v` is, in the words of the messages (`must be a string, not number`): the
 * names of zod 3's getParsedType (`nan`, `null`, `array`, `date`, ...), which kproxy's logs use.
 */
function receivedKind(v: unknown): string {
  switch (typeof v) {
    case 'number':
      return Number.isNaN(v) ? 'nan' : 'number';
    case 'object':
      if (v === null) return 'null';
      if (Array.isArray(v)) return 'array';
      if (typeof (v as { then?: unknown }).then === 'function' && typeof (v as { catch?: unknown }).catch === 'function') return 'promise';
      if (v instanceof Map) return 'map';
      if (v instanceof Set) return 'set';
      if (v instanceof Date) return 'date';
      return 'object';
    default:
      return typeof v;
  }
}

/** The message for a value of the wrong type: `required` when it is missing. */
const wrongType = (expected: string, v: unknown) => (v === undefined ? 'required' : `must be ${expected}, not ${receivedKind(v)}`);

/**
 * An integer from `min` to `max`. Any number passes the type check, ±Infinity included (YAML's
 * `.inf`), and is then refused as not an integer; a number that breaks both rules (-0.5) gets
 * both messages. zod's own number type refuses ±Infinity as a wrong type and its int() check
 * stops at the first rule broken, hence this one check.
 */
const int = (min: number, max: number) =>
  z.any().check((ctx) => {
    const v: unknown = ctx.value;
    if (typeof v !== 'number' || Number.isNaN(v)) {
      ctx.issues.push(customIssue(v, wrongType('a number', v)));
      return;
    }
    if (!Number.isInteger(v)) ctx.issues.push(customIssue(v, 'must be a integer, not float'));
    if (v < min || v > max) ctx.issues.push(customIssue(v, `must be between ${min} and ${max}`));
  }) as unknown as z.ZodNumber;

/**
 * An array of at most `max` items: the length is checked before any item, so a huge array
 * costs one pass and one issue, not one issue per item. Limits are upstream's where it has one
 * (ValidateEndpointSlice: maxEndpoints 1000, maxPorts 20000, maxAddresses 100, 8 hints;
 * clusterIPs, ipFamilies and podCIDRs: 2) and otherwise API_ARRAY_MAX, which no object the API
 * server accepts can exceed.
 */
/**
 * The API server refuses a request body over 3 MiB (apiserver's MaxRequestBodyBytes), and a JSON
 * array item takes at least 2 bytes ("0,"): no accepted object holds a longer array.
 */
const API_ARRAY_MAX = (3 * 1024 * 1024) / 2;

const boundedArray = <T extends z.ZodType>(item: T, max: number, min = 0) =>
  z
    .any()
    .check((ctx) => {
      const v: unknown = ctx.value;
      const bad =
        !Array.isArray(v) ? `must be an array, not ${kindOf(v)}`
        : v.length > max ? `must have at most ${max} items`
        : v.length < min ? (min === 1 ? 'must not be empty' : `must have at least ${min} items`)
        : null;
      if (bad) ctx.issues.push(customIssue(v, bad));
    })
    .pipe(z.array(item));

function kindOf(v: unknown): string {
  return v === null ? 'null' : Array.isArray(v) ? 'array' : typeof v;
}

/**
 * A label map (ValidateLabels): each key a qualified name, each value a label value. The entries
 * are checked in the map's order, a key before its value, every own key included (a
 * `__proto__` key from JSON too); the record then copies the map.
 */
const labels = z
  .any()
  .check((ctx) => {
    const v: unknown = ctx.value;
    if (receivedKind(v) !== 'object') {
      ctx.issues.push(customIssue(v, wrongType('an object', v)));
      return;
    }
    const map = v as Record<string, unknown>;
    for (const key in map) {
      const badKey = labelKey(key);
      if (badKey) ctx.issues.push({ ...customIssue(key, badKey), path: [key] });
      const value = map[key];
      const badValue = typeof value === 'string' ? labelValue(value) : wrongType('a string', value);
      if (badValue) ctx.issues.push({ ...customIssue(value, badValue), path: [key] });
    }
  })
  .pipe(z.record(z.string(), z.string()));

// '' is read as TCP, as convert.ts does (the API server defaults it)
const protocol = z.enum(['TCP', 'UDP', 'SCTP', '']);

// validateServicePort: the name is a DNS-1123 label (ValidateDNS1123Label: up to 63 characters,
// all digits allowed); a named targetPort is an IANA_SVC_NAME (ValidatePortNumOrName).
const servicePort = z.object({
  name: opt(str((s) => (s === '' ? null : dns1123Label(s)))),
  protocol: opt(protocol),
  // ValidatePortNumOrName for port (a number) and targetPort (a number, 0 meaning not set
  // before defaulting, or an IANA_SVC_NAME); validateServicePort's nodePort 0 (not set) to 65535
  port: int(1, 65535),
  targetPort: opt(
    z.any().check((ctx) => {
      const v: unknown = ctx.value;
      const bad =
        typeof v === 'number' ? (Number.isInteger(v) && v >= 0 && v <= 65535 ? null : 'must be between 1 and 65535')
        : typeof v === 'string' ? ianaSvcName(v)
        : `must be a number or a port name, not ${kindOf(v)}`;
      if (bad) ctx.issues.push(customIssue(v, bad));
    }),
  ),
  nodePort: opt(int(0, 65535)),
  appProtocol: opt(z.string()),
});

// apiVersion and kind are kept when present (list items from the API server lack them); any
// other field kproxy does not read is dropped, so trackers hold no more than they need.
const typeMeta = { apiVersion: opt(z.string()), kind: opt(z.string()) };

const serviceSchema = z.object({
  ...typeMeta,
  // ValidateServiceName is NameIsDNS1035Label, or NameIsDNSLabel with the
  // RelaxedServiceNameValidation gate (KEP-5311): an API server with the gate on accepts a name
  // that starts with a digit, so kproxy accepts the DNS-1123 label.
  metadata: z.object({
    name: str(dns1123Label),
    namespace: str(dns1123Label),
    labels: opt(labels),
  }),
  // ValidateService: type in supportedServiceType; clusterIPs and ipFamilies at most 2, families
  // IPv4 or IPv6 (validateServiceClusterIPsRelatedFields, validateIPFamilies); sessionAffinity in
  // supportedSessionAffinityType and timeoutSeconds 1..86400 (validateClientIPAffinityConfig);
  // the traffic policies (validateServiceExternalTrafficPolicy,
  // validateServiceInternalTrafficFieldsValue); ingress ipMode VIP or Proxy
  // (ValidateLoadBalancerStatus). An empty enum value is what an unset field defaults to.
  // trafficDistribution (each value upstream allows is far under its 253-character bound) and
  // externalName are checked no further: kproxy needs no more.
  spec: opt(
    z.object({
      type: opt(z.enum(['ClusterIP', 'NodePort', 'LoadBalancer', 'ExternalName', ''])),
      clusterIP: opt(z.string()),
      clusterIPs: opt(boundedArray(z.string(), 2)),
      ipFamilies: opt(boundedArray(z.enum(['IPv4', 'IPv6']), 2)),
      ports: opt(boundedArray(servicePort, API_ARRAY_MAX)),
      externalIPs: opt(boundedArray(z.string(), API_ARRAY_MAX)),
      loadBalancerSourceRanges: opt(boundedArray(z.string(), API_ARRAY_MAX)),
      sessionAffinity: opt(z.enum(['None', 'ClientIP', ''])),
      sessionAffinityConfig: opt(z.object({ clientIP: opt(z.object({ timeoutSeconds: opt(int(1, 86400)) })) })),
      externalTrafficPolicy: opt(z.enum(['Cluster', 'Local', ''])),
      internalTrafficPolicy: opt(z.enum(['Cluster', 'Local', ''])),
      healthCheckNodePort: opt(int(0, 65535)),
      trafficDistribution: opt(z.string().max(253, 'String must contain at most 253 character(s)')),
      externalName: opt(z.string()),
    }),
  ),
  status: opt(
    z.object({
      loadBalancer: opt(
        z.object({
          ingress: opt(
            boundedArray(
              z.object({ ip: opt(z.string()), hostname: opt(z.string()), ipMode: opt(z.enum(['VIP', 'Proxy'])) }),
              API_ARRAY_MAX,
            ),
          ),
        }),
      ),
    }),
  ),
});

const endpointSchema = z.object({
  addresses: boundedArray(z.string(), 100, 1),
  conditions: opt(z.object({ ready: opt(z.boolean()), serving: opt(z.boolean()), terminating: opt(z.boolean()) })),
  // ValidateEndpointSlice: nodeName ValidateNodeName, hostname ValidateDNS1123Label; the zone
  // is not validated upstream, so any string
  nodeName: opt(str(dns1123Subdomain)),
  zone: opt(z.string()),
  hostname: opt(str(dns1123Label)),
  hints: opt(
    z.object({
      forZones: opt(boundedArray(z.object({ name: str(labelValue) }), 8)),
      forNodes: opt(boundedArray(z.object({ name: str(dns1123Subdomain) }), 8)),
    }),
  ),
});

/**
 * Of a slice's annotations only upstream's `endpoints.kubernetes.io/last-change-trigger-time`
 * is kept (network_programming_duration_seconds is measured from it). Any other annotation,
 * or one that is not a short string, is dropped: annotations never make a slice invalid.
 */
const sliceAnnotations = z
  .unknown()
  .transform((v): Record<string, string> | undefined => {
    if (v === null || typeof v !== 'object' || Array.isArray(v)) return undefined;
    const t = (v as Record<string, unknown>)[ANNOTATION_LAST_CHANGE_TRIGGER_TIME];
    return typeof t === 'string' && t.length <= 64 ? { [ANNOTATION_LAST_CHANGE_TRIGGER_TIME]: t } : undefined;
  })
  // absent stays absent (no `annotations: undefined` key in the slice kept)
  .optional();

const sliceSchema = z.object({
  ...typeMeta,
  metadata: z.object({
    name: str(dns1123Subdomain),
    namespace: str(dns1123Label),
    annotations: sliceAnnotations,
    // ValidateObjectMeta: labels are optional. The kubernetes.io/service-name label says which
    // Service the slice belongs to; a slice without it, or with a value that names no Service,
    // is valid and belongs to none: the tracker files it nowhere, as upstream kube-proxy's
    // EndpointSliceCache ignores it (endpointSliceCacheKeys).
    labels: opt(labels),
  }),
  addressType: z.enum(['IPv4', 'IPv6', 'FQDN']),
  endpoints: opt(boundedArray(endpointSchema, 1000)),
  ports: opt(
    boundedArray(
      z.object({
        // validatePorts: a name is empty or a DNS-1123 label, and unique (sliceRules)
        name: opt(str((s) => (s === '' ? null : dns1123Label(s)))),
        // validatePorts checks no port number: any int32 is stored (convert.ts leaves out a
        // port outside 1-65535, EXTRA_REFUSALS)
        port: opt(int(-2147483648, 2147483647)),
        protocol: opt(protocol),
        appProtocol: opt(z.string()),
      }),
      20000,
    ),
  ),
});

// The Node's parts kproxy reads: labels (topology), deletion and taints (healthz's
// nodeEligible), podCIDRs (detectLocalMode NodeCIDR) and addresses (the primary node IP).
const nodeSchema = z.object({
  ...typeMeta,
  metadata: z.object({ name: str(dns1123Subdomain), labels: opt(labels), deletionTimestamp: opt(z.string()) }),
  spec: opt(
    z.object({
      podCIDRs: opt(boundedArray(z.string(), 2)),
      taints: opt(boundedArray(z.object({ key: z.string(), value: opt(z.string()), effect: opt(z.string()) }), API_ARRAY_MAX)),
    }),
  ),
  status: opt(z.object({ addresses: opt(boundedArray(z.object({ type: z.string(), address: z.string() }), API_ARRAY_MAX)) })),
});

// ---- issue formatting ---------------------------------------------------------------------------

export function formatPath(path: ReadonlyArray<string | number>): string {
  let out = '';
  for (const p of path) {
    if (typeof p === 'number') out += `[${p}]`;
    else if (/^[A-Za-z_][A-Za-z0-9_]*$/.test(p)) out += out ? `.${p}` : p;
    else out += `[${JSON.stringify(p.length > 80 ? `${p.slice(0, 80)}…` : p)}]`;
  }
  return out || '(object)';
}

const VALUE_MAX = 100;

/** A short JSON rendering of any value; never throws, never walks more than a little of it. */
export function shortValue(v: unknown): string {
  const seen = new Set<unknown>();
  let budget = VALUE_MAX + 20;
  const walk = (x: unknown, depth: number): string => {
    if (budget <= 0) return '…';
    let s: string;
    if (x === undefined) s = 'undefined';
    else if (x === null || typeof x === 'boolean' || typeof x === 'number') s = String(x);
    else if (typeof x === 'string') s = JSON.stringify(x.length > VALUE_MAX ? `${x.slice(0, VALUE_MAX)}…` : x);
    else if (typeof x === 'bigint') s = `${x}n`;
    else if (typeof x !== 'object' || seen.has(x) || depth > 4) s = typeof x === 'object' ? '{…}' : typeof x;
    else {
      seen.add(x);
      const parts: string[] = [];
      const entries = Array.isArray(x) ? x.slice(0, 10).map((e) => ['', e] as const) : Object.entries(x as object).slice(0, 10);
      for (const [k, e] of entries) {
        if (budget <= 0) { parts.push('…'); break; }
        parts.push(Array.isArray(x) ? walk(e, depth + 1) : `${JSON.stringify(k)}:${walk(e, depth + 1)}`);
      }
      const total = Array.isArray(x) ? x.length : Object.keys(x as object).length;
      if (total > entries.length && parts[parts.length - 1] !== '…') parts.push(`…(${total} items)`);
      s = Array.isArray(x) ? `[${parts.join(',')}]` : `{${parts.join(',')}}`;
    }
    budget -= s.length;
    return s;
  };
  try {
    const s = walk(v, 0);
    return s.length > VALUE_MAX ? `${s.slice(0, VALUE_MAX)}…` : s;
  } catch {
    return '?';
  }
}

function valueAt(root: unknown, path: ReadonlyArray<string | number>): unknown {
  let cur = root;
  for (const p of path) {
    if (cur === null || typeof cur !== 'object') return undefined;
    try {
      cur = (cur as Record<string | number, unknown>)[p];
    } catch {
      return undefined;
    }
  }
  return cur;
}

/**
 * kproxy's message for each issue zod reports: a check's own message, or for a wrong type
 * `required` / `must be a string, not number`, and for an enum `must be one of "TCP", "UDP"`
 * (a value that is not even a string: `must be a 'TCP' | 'UDP', not number`).
 */
function zodIssues(raw: unknown, err: z.ZodError): Issue[] {
  return err.issues.slice(0, 20).map((i) => {
    const value = valueAt(raw, i.path as Array<string | number>);
    let message = i.message;
    if (i.code === 'invalid_type') message = wrongType(i.expected === 'object' || i.expected === 'record' ? 'an object' : i.expected === 'array' ? 'an array' : `a ${i.expected}`, value);
    if (i.code === 'invalid_value') {
      message = typeof value === 'string'
        ? `must be one of ${i.values.map((o) => JSON.stringify(o)).join(', ')}`
        : wrongType(`a ${i.values.map((o) => (typeof o === 'string' ? `'${o}'` : String(o))).join(' | ')}`, value);
    }
    return { path: formatPath(i.path as Array<string | number>), message, value: shortValue(value) };
  });
}

const issue = (path: ReadonlyArray<string | number>, message: string, value: unknown): Issue => ({ path: formatPath(path), message, value: shortValue(value) });

// ---- value rules that need more than one field ----------------------------------------------

type ServiceOut = z.output<typeof serviceSchema>;
type SliceOut = z.output<typeof sliceSchema>;

/**
 * A Service IP, canonical, or null with an issue. ClusterIPs and load-balancer ingress IPs are
 * checked with IsValidIP only, as upstream (validateClusterIPs, ValidateLoadBalancerStatus);
 * external IPs also with ValidateEndpointIP (`endpointRules`).
 */
function checkServiceIP(out: Issue[], path: ReadonlyArray<string | number>, raw: string, opts: ValidateOptions, endpointRules = false): string | null {
  const ip = canonicalAddress(raw);
  if (!ip) {
    out.push(issue(path, 'must be a valid IP address', raw));
    return null;
  }
  const special = endpointRules ? endpointIPReason(ip, opts.allowLoopback) : null;
  if (special) {
    out.push(issue(path, special, raw));
    return null;
  }
  return ip;
}

function serviceRules(svc: ServiceOut, opts: ValidateOptions): Issue[] {
  const out: Issue[] = [];
  const spec = svc.spec;
  if (!spec) return out;
  const cip = spec.clusterIP ?? '';
  let cipCanon: string | null = null;
  if (cip !== '' && cip !== 'None') cipCanon = checkServiceIP(out, ['spec', 'clusterIP'], cip, opts);
  const cips = spec.clusterIPs ?? [];
  const families: number[] = [];
  for (const [i, c] of cips.entries()) {
    if (i === 0 && c === 'None') {
      if (cip !== '' && cip !== 'None') out.push(issue(['spec', 'clusterIPs', 0], 'must match spec.clusterIP', c));
      continue;
    }
    const ip = checkServiceIP(out, ['spec', 'clusterIPs', i], c, opts);
    if (!ip) continue;
    if (i === 0 && cip !== '' && cipCanon && ip !== cipCanon) out.push(issue(['spec', 'clusterIPs', 0], 'must match spec.clusterIP', c));
    if (i === 0 && cip === 'None') out.push(issue(['spec', 'clusterIPs', 0], 'must match spec.clusterIP', c));
    const fam = ipFamily(ip)!;
    if (families.includes(fam)) out.push(issue(['spec', 'clusterIPs', i], 'a dual-stack Service needs one IP of each family', c));
    families.push(fam);
  }
  for (const [i, e] of (spec.externalIPs ?? []).entries()) checkServiceIP(out, ['spec', 'externalIPs', i], e, opts, true);
  for (const [i, ing] of (svc.status?.loadBalancer?.ingress ?? []).entries()) {
    if (ing.ip) checkServiceIP(out, ['status', 'loadBalancer', 'ingress', i, 'ip'], ing.ip, opts);
  }
  for (const [i, r] of (spec.loadBalancerSourceRanges ?? []).entries()) {
    if (!parseCIDR(r)) out.push(issue(['spec', 'loadBalancerSourceRanges', i], 'must be a CIDR such as 203.0.113.0/24', r));
  }
  // validateServicePort and ValidateService's duplicate checks. A protocol left empty is TCP, as
  // the v1 defaulting makes it.
  const names = new Set<string>();
  const portProtos = new Set<string>();
  const nodePortProtos = new Set<string>();
  const ports = spec.ports ?? [];
  for (const [i, p] of ports.entries()) {
    const name = p.name ?? '';
    if (name === '' && ports.length > 1) out.push(issue(['spec', 'ports', i, 'name'], 'required when a Service has more than one port', name));
    else if (names.has(name)) out.push(issue(['spec', 'ports', i, 'name'], 'duplicate port name', name));
    names.add(name);
    const pp = `${p.port}/${p.protocol || 'TCP'}`;
    if (portProtos.has(pp)) out.push(issue(['spec', 'ports', i], 'duplicate port and protocol', pp));
    portProtos.add(pp);
    // ValidateService: no two ports share a (nodePort, protocol); kernel rules for one node port
    // cannot lead to two service ports
    if (p.nodePort) {
      const np = `${p.nodePort}/${p.protocol || 'TCP'}`;
      if (nodePortProtos.has(np)) out.push(issue(['spec', 'ports', i, 'nodePort'], 'duplicate node port and protocol', np));
      nodePortProtos.add(np);
    }
  }
  return out;
}

function sliceRules(slice: SliceOut, opts: ValidateOptions): Issue[] {
  const out: Issue[] = [];
  // validatePorts: port names are unique within a slice (two ports of one name would make the
  // slice's endpoints ambiguous for that service port)
  const portNames = new Set<string>();
  for (const [i, p] of (slice.ports ?? []).entries()) {
    const name = p.name ?? '';
    if (portNames.has(name)) out.push(issue(['ports', i, 'name'], 'duplicate port name', name));
    portNames.add(name);
  }
  if (slice.addressType === 'FQDN') {
    for (const [i, ep] of (slice.endpoints ?? []).entries()) {
      for (const [j, a] of ep.addresses.entries()) {
        const bad = fullyQualifiedDomainName(a);
        if (bad) out.push(issue(['endpoints', i, 'addresses', j], bad, a));
      }
    }
    return out;
  }
  const want = slice.addressType === 'IPv4' ? 4 : 6;
  const endpoints = slice.endpoints ?? [];
  for (let i = 0; i < endpoints.length; i++) {
    const addresses = endpoints[i].addresses;
    for (let j = 0; j < addresses.length; j++) {
      const a = addresses[j];
      const quad = CANONICAL_IPV4.test(a);
      const ip = quad ? a : canonicalIP(a);
      const bad =
        !ip || (quad ? 4 : ipFamily(ip)) !== want ? `must be a valid ${slice.addressType} address`
        : endpointIPReason(ip, opts.allowLoopback);
      if (bad) out.push(issue(['endpoints', i, 'addresses', j], bad, a));
    }
  }
  return out;
}

// ---- entry points ------------------------------------------------------------------------------

function run<S extends z.ZodType, T>(schema: S, raw: unknown, rules: (v: z.output<S>) => Issue[]): Validated<T> {
  let r: z.ZodSafeParseResult<z.output<S>>;
  try {
    r = schema.safeParse(raw);
  } catch (e) {
    // zod does not throw on data, but a hostile getter or a proxy could: still an invalid object
    return { ok: false, issues: [{ path: '(object)', message: `cannot be read: ${(e as Error)?.message ?? e}`, value: '?' }] };
  }
  if (!r.success) return { ok: false, issues: zodIssues(raw, r.error) };
  const issues = rules(r.data);
  return issues.length ? { ok: false, issues } : { ok: true, value: r.data as T };
}

/** A Service checked for shape, types and values; the value returned holds only known fields. */
export function validateService(raw: unknown, opts: ValidateOptions = {}): Validated<K8sService> {
  return run<typeof serviceSchema, K8sService>(serviceSchema, raw, (v) => serviceRules(v, opts));
}

export function validateEndpointSlice(raw: unknown, opts: ValidateOptions = {}): Validated<K8sEndpointSlice> {
  return run<typeof sliceSchema, K8sEndpointSlice>(sliceSchema, raw, (v) => sliceRules(v, opts));
}

export function validateNode(raw: unknown): Validated<NodeObject> {
  return run<typeof nodeSchema, NodeObject>(nodeSchema, raw, () => []);
}

const SAFE_NAME = /^[A-Za-z0-9._-]{1,253}$/;

/** "ns/name" of any object, printable whatever it holds (names are quoted when odd). */
export function describeObject(raw: unknown, namespaced = true): string {
  const meta = raw !== null && typeof raw === 'object' ? valueAt(raw, ['metadata']) : undefined;
  const part = (v: unknown): string => (typeof v === 'string' && SAFE_NAME.test(v) ? v : v === undefined ? '?' : shortValue(v));
  const name = part(valueAt(meta, ['name']));
  return namespaced ? `${part(valueAt(meta, ['namespace']))}/${name}` : name;
}

/** Identity ("ns/name") of an object when its metadata holds plain strings, else null. */
export function objectIdentity(raw: unknown, namespaced = true): string | null {
  const meta = raw !== null && typeof raw === 'object' ? valueAt(raw, ['metadata']) : undefined;
  const ns = valueAt(meta, ['namespace']);
  const name = valueAt(meta, ['name']);
  if (typeof name !== 'string' || name === '') return null;
  if (!namespaced) return name;
  if (typeof ns !== 'string' || ns === '') return null;
  return flat`${ns}/${name}`;
}

// ---- reporting: one warning per object and field, rate-limited --------------------------------


export interface BoundaryOptions extends ValidateOptions {
  /** called once per skipped object version (for the kproxy_invalid_objects_total counter) */
  onInvalid?: (kind: ObjectKind, object: string) => void;
  /** a warning for the same object and field is repeated at most this often (default 5 min) */
  warnIntervalMs?: number;
  /** how many (object, field) pairs are remembered for rate limiting (default 10,000) */
  maxRemembered?: number;
  now?: () => number;
}

/** At most this many issues of one object are warned about; the rest add nothing a user needs. */
const ISSUES_PER_OBJECT = 5;

/**
 * The boundary every object crosses: validates, and for an invalid one warns (rate-limited per
 * object and field, memory bounded by evicting the oldest entries) and counts.
 */
export class Boundary {
  private readonly lastWarned = new Map<string, number>();
  private readonly intervalMs: number;
  private readonly maxRemembered: number;
  private readonly now: () => number;

  constructor(
    private readonly report: Report = () => {},
    readonly opts: BoundaryOptions = {},
  ) {
    this.intervalMs = opts.warnIntervalMs ?? 5 * 60_000;
    this.maxRemembered = Math.max(1, opts.maxRemembered ?? 10_000);
    this.now = opts.now ?? Date.now;
  }

  service(raw: unknown): K8sService | null {
    return this.accept('Service', raw, validateService(raw, this.opts));
  }

  endpointSlice(raw: unknown): K8sEndpointSlice | null {
    return this.accept('EndpointSlice', raw, validateEndpointSlice(raw, this.opts));
  }

  node(raw: unknown): NodeObject | null {
    return this.accept('Node', raw, validateNode(raw));
  }

  /** number of (object, field) pairs remembered for rate limiting (tests) */
  rememberedCount(): number {
    return this.lastWarned.size;
  }

  private accept<T>(kind: ObjectKind, raw: unknown, r: Validated<T>): T | null {
    if (r.ok) return r.value;
    const who = describeObject(raw, kind !== 'Node');
    this.opts.onInvalid?.(kind, who);
    const t = this.now();
    for (const i of r.issues.slice(0, ISSUES_PER_OBJECT)) {
      const key = `${kind}\u0000${who}\u0000${i.path}`;
      const last = this.lastWarned.get(key);
      if (last !== undefined && t - last < this.intervalMs) continue;
      this.lastWarned.delete(key); // re-insert: the Map's order is the eviction order
      this.lastWarned.set(key, t);
      while (this.lastWarned.size > this.maxRemembered) this.lastWarned.delete(this.lastWarned.keys().next().value as string);
      this.report(`invalid ${kind}: ${i.path} ${i.message} (value ${i.value}); the object is skipped`, `${kind} ${who}`, { kind, field: i.path, value: i.value });
    }
    return null;
  }
}
