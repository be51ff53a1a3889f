// A source of Services, EndpointSlices and this node's Node object. It delivers (old, new)
// pairs: add = (null, obj), delete = (obj, null). The old object of an update or delete is
// only sure to carry the object's identity (kind, metadata.name, metadata.namespace): the
// Kubernetes source keeps each object's identity and resourceVersion (memory; k8s-informer.ts
// slimObject) and hands those over, the manifests source keeps only a digest of each object
// between scans (memory) and hands over its identity.
// The trackers use the old object for its identity only. It calls onSynced once both Services and
// EndpointSlices have been listed completely; nothing is written to the kernel before that.
import type { K8sEndpointSlice, K8sService, ObjectKind } from '../core/api.ts';
import type { AllocationReport } from './service-alloc.ts';

export interface K8sNode {
  metadata?: { name?: string; labels?: Record<string, string> };
  status?: { addresses?: Array<{ type?: string; address?: string }> };
}

export interface SourceHandler {
  onService(oldObj: K8sService | null, newObj: K8sService | null): void;
  onEndpointSlice(oldObj: K8sEndpointSlice | null, newObj: K8sEndpointSlice | null): void;
  onNode?(node: K8sNode | null): void;
  onSynced(): void;
  /**
   * An object the source itself refused and skipped, as the API server would have refused it
   * (the manifests source: a cluster IP or node port already held by another Service); the
   * source has logged why. Counted with the objects the trackers refuse
   * (kproxy_invalid_objects_total).
   */
  onInvalid?(kind: ObjectKind, object: string): void;
}

export interface SourceHealth {
  synced: boolean;
  /** false while the source cannot reach its origin (API server down, watch broken) */
  connected: boolean;
  /** ms since epoch of the last successful list or watch event, 0 if never */
  lastContactMs: number;
  /** human-readable problem, when any */
  problem?: string;
}

export interface Source {
  start(handler: SourceHandler): Promise<void>;
  stop(): Promise<void>;
  health(): SourceHealth;
  /** the manifests source: which Services got which allocated values, and which were refused */
  allocations?(): AllocationReport;
}
