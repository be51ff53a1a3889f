// Modes register by name. The CLI, the conformance runner and cleanup look them up here.
import type { ModeName } from '../config/config.ts';
import type { ConformanceAdapter } from '../conformance/case.ts';
import type { ModeModule } from './types.ts';
import * as userspace from './userspace/index.ts';
import * as iptables from './iptables/index.ts';
import * as ipvs from './ipvs/index.ts';
import * as nftables from './nftables/index.ts';

export const modes: Record<ModeName, ModeModule> = {
  userspace: userspace.mode,
  iptables: iptables.mode,
  ipvs: ipvs.mode,
  nftables: nftables.mode,
};

export const conformanceAdapters: Record<string, ConformanceAdapter | undefined> = {
  userspace: userspace.conformance,
  iptables: iptables.conformance,
  ipvs: ipvs.conformance,
  nftables: nftables.conformance,
};

export function getMode(name: ModeName): ModeModule {
  return modes[name];
}
