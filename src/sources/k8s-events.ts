// Events on this node's Node object, as upstream kube-proxy records them: newProxyServer
// (cmd/kube-proxy/app/server.go) builds an events.k8s.io/v1 broadcaster on the API client
// (`events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})`), a recorder
// for the reporting controller "kube-proxy", and a reference to its Node
// (`&v1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: nodeName}`). client-go's
// recorderImpl.makeEvent (staging/src/k8s.io/client-go/tools/events/event_recorder.go) names
// the event `<regarding name>.<UnixNano in hex>`, puts it in the regarding object's
// namespace or "default" (a Node has none), and reports as instance
// `<controller>-<hostname>` (eventBroadcasterImpl.NewRecorder).
//
// Only the Kubernetes source records Events; with the manifests source there is no API
// server and the log line alone carries the message.
import { hostname } from 'node:os';
import { EventsV1Api, V1MicroTime, type EventsV1Event, type KubeConfig } from '@kubernetes/client-node';
import type { Logger } from '../log.ts';

export const REPORTING_CONTROLLER = 'kube-proxy';

export type EventType = 'Normal' | 'Warning';

export interface NodeEventRecorder {
  /** upstream Recorder.Eventf(nodeRef, nil, type, reason, action, note); never throws, a failure is logged */
  eventf(type: EventType, reason: string, action: string, note: string): Promise<void>;
}

/** client-go's maxNoteLength for events.k8s.io/v1 notes (event_recorder.go) */
const MAX_NOTE_BYTES = 1024;

/** The events.k8s.io/v1 Event upstream's recorder builds for the Node `nodeName`. */
export function nodeEvent(nodeName: string, type: EventType, reason: string, action: string, note: string, now = new Date(), host = hostname()): EventsV1Event {
  // Date has millisecond precision: UnixNano is the millisecond count times 10^6
  const unixNano = BigInt(now.getTime()) * 1_000_000n;
  const bytes = Buffer.from(note, 'utf8');
  const clipped = bytes.length > MAX_NOTE_BYTES ? bytes.subarray(0, MAX_NOTE_BYTES - 3).toString('utf8') + '...' : note;
  return {
    apiVersion: 'events.k8s.io/v1',
    kind: 'Event',
    metadata: { name: `${nodeName}.${unixNano.toString(16)}`, namespace: 'default' },
    eventTime: new V1MicroTime(now.getTime()),
    reportingController: REPORTING_CONTROLLER,
    reportingInstance: `${REPORTING_CONTROLLER}-${host}`,
    action,
    reason,
    regarding: { apiVersion: 'v1', kind: 'Node', name: nodeName },
    note: clipped,
    type,
  };
}

/** A recorder that posts to the API server `kc` points at, as `kube-proxy`, about the Node `nodeName`. */
export function createNodeEventRecorder(kc: KubeConfig, nodeName: string, log: Logger): NodeEventRecorder {
  const api = kc.makeApiClient(EventsV1Api);
  return {
    async eventf(type, reason, action, note) {
      const body = nodeEvent(nodeName, type, reason, action, note);
      try {
        await api.createNamespacedEvent({ namespace: body.metadata!.namespace!, body });
      } catch (err) {
        // client-go's broadcaster (tools/events recordEvent) logs a refused write and drops the
        // event, without retrying: an event is advice, never a reason to stop proxying
        log.warn({ err: (err as Error).message, reason }, 'Server rejected event (will not retry!)');
      }
    },
  };
}
