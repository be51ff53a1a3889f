// What kube-proxy tells the operator about the proxy mode at start, in its log and as a
// Warning Event on the Node (the Kubernetes source only).
import type { ProxyConfig } from './config.ts';

export interface ModeNotice {
  /** the Event's reason */
  reason: string;
  /** the Event's action */
  action: string;
  message: string;
}

/**
 * KEP-5495 (kubernetes#134539 in 1.35, the wording of kubernetes#139397 in 1.37): createProxier
 * (cmd/kube-proxy/app/server_linux.go), in the ipvs branch right after "Using ipvs Proxier",
 * logs this message and records it with `Recorder.Eventf(s.NodeRef, nil,
 * v1.EventTypeWarning, "IPVSDeprecation", "StartKubeProxy", message)`.
 */
export const IPVS_DEPRECATION: ModeNotice = {
  reason: 'IPVSDeprecation',
  action: 'StartKubeProxy',
  message: "The ipvs proxier has been deprecated and will be disabled by default in Kubernetes 1.40 and removed in Kubernetes 1.43. Migrate to the 'nftables' proxier instead.",
};

/**
 * KEP-5343 (kubernetes#139957, 1.37): platformApplyDefaults
 * (cmd/kube-proxy/app/server_linux.go) fills an unset mode (`config.Mode == ""`, after the
 * flags and the --config file) with iptables, and warns, in the log and as an Event, that the
 * default changes to nftables in 1.40, so the mode should be set explicitly.
 */
export const DEFAULT_MODE_CHANGE: ModeNotice = {
  reason: 'ProxyModeDefaulted',
  action: 'StartKubeProxy',
  message: "No proxy mode was specified, so kube-proxy is using the default mode 'iptables'. The default will change to 'nftables' in Kubernetes 1.40; set the mode explicitly ('iptables' to keep the current behaviour, or 'nftables').",
};

/** The notices a start with `cfg` gives, in upstream's order (defaulting comes before the proxier). */
export function modeNotices(cfg: Pick<ProxyConfig, 'mode' | 'modeDefaulted'>): ModeNotice[] {
  const out: ModeNotice[] = [];
  if (cfg.modeDefaulted) out.push(DEFAULT_MODE_CHANGE);
  if (cfg.mode === 'ipvs') out.push(IPVS_DEPRECATION);
  return out;
}
