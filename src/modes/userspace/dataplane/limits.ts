// The process-wide bounds of the userspace data plane: one TCP connection budget and one UDP
// session budget per process (both IP families' proxiers share them), sized from the
// config and, for an automatic maxConnections, from this process's fd limit.
import { readFileSync } from 'node:fs';
import type { UserspaceSettings } from '../../../config/config.ts';
import { newBudget, type ConnectionBudget } from './tcp.ts';
import { UdpSessionBudget } from './udp.ts';

/** fds kept for everything but proxied connections: listeners, UDP sessions' share, the API client, tools */
export const FD_RESERVE = 512;

/** The soft RLIMIT_NOFILE of this process (from /proc/self/limits), or null when unreadable. */
export function fdLimit(limitsText?: string): number | null {
  let text = limitsText;
  if (text === undefined) {
    try {
      text = readFileSync('/proc/self/limits', 'utf8');
    } catch {
      return null;
    }
  }
  const m = /^Max open files\s+(\d+|unlimited)\s/m.exec(text);
  if (!m) return null;
  return m[1] === 'unlimited' ? Number.MAX_SAFE_INTEGER : Number(m[1]);
}

/**
 * maxConnections as configured, or (0) automatic: each proxied connection holds two fds, so
 * half of what the fd limit leaves after the reserve; at least 64. The automatic cap is per
 * process (fds are); a configured one is node-wide, and with workers kproxy's process lends
 * it out (worker-cap.ts).
 */
export function effectiveMaxConnections(configured: number, limit: number | null): number {
  if (configured > 0) return configured;
  if (limit === null) return 0;
  return Math.max(64, Math.floor((limit - FD_RESERVE) / 2));
}

export interface ProcessBudgets {
  tcp: ConnectionBudget;
  udp: UdpSessionBudget;
}

let shared: ProcessBudgets | null = null;

/** This process's budgets, (re)sized from the settings; the same objects on every call. */
export function processBudgets(s: UserspaceSettings): ProcessBudgets {
  const max = effectiveMaxConnections(s.maxConnections, fdLimit());
  if (!shared) shared = { tcp: newBudget(max), udp: new UdpSessionBudget(s.udpMaxSessions, s.udpMaxSessionsPerClient) };
  shared.tcp.max = max;
  shared.udp.max = s.udpMaxSessions;
  shared.udp.perClient = s.udpMaxSessionsPerClient;
  return shared;
}
