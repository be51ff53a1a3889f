// The start-up notices about the proxy mode (src/config/mode-notices.ts): a warning line in
// the log, and with the Kubernetes source a Warning Event on this node's Node object.
// Upstream logs the IPVS notice with logger.Error because logr has no warning level; kproxy's
// logger has one, and a deprecation is a warning.
import type { Logger } from '../log.ts';
import type { ProxyConfig } from '../config/config.ts';
import { modeNotices } from '../config/mode-notices.ts';
import type { NodeEventRecorder } from '../sources/k8s-events.ts';

export async function announceModeNotices(cfg: Pick<ProxyConfig, 'mode' | 'modeDefaulted'>, log: Logger, recorder?: NodeEventRecorder): Promise<void> {
  for (const n of modeNotices(cfg)) {
    log.warn({ mode: cfg.mode, reason: n.reason }, n.message);
    if (recorder) await recorder.eventf('Warning', n.reason, n.action, n.message);
  }
}
