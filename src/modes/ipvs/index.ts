// ipvs mode: virtual servers + real servers in the kernel's IPVS table, VIPs on the
// kube-ipvs0 dummy device, ipsets and iptables rules for masquerade and filtering
// (upstream kube-proxy's pkg/proxy/ipvs, re-planned as pure functions + a diffing proxier).
import type { ModeModule } from '../types.ts';
import type { TraceRequest, TraceResult } from '../trace-types.ts';
import type { ConformanceAdapter } from '../../conformance/case.ts';
import type { CommandRunner } from '../../kernel/runner.ts';
import { Ipvsadm } from '../../kernel/ipvs/exec.ts';
import { IPSetExec } from '../../kernel/ipset/exec.ts';
import { ipFamily } from '../../core/ip.ts';
import { plan } from './planner.ts';
import { renderPlan } from './render.ts';
import { createIpvsProxier } from './proxier.ts';
import { cleanupIpvs } from './cleanup.ts';
import { masqConfigFromIptables, traceIpvs } from './trace.ts';
import { DUMMY_DEVICE } from './names.ts';
import { Links } from '../../kernel/links.ts';
import { IptablesExecutor } from '../../kernel/iptables/exec.ts';

async function traceLive(req: TraceRequest, runner: CommandRunner): Promise<TraceResult> {
  const family = ipFamily(req.to) === 6 ? 6 : 4;
  const table = await new Ipvsadm(runner).save();
  const sets = await new IPSetExec(runner).save();
  let natText = '';
  try {
    natText = await new IptablesExecutor(runner, family).save('nat');
  } catch {
    // no iptables: masquerade cannot be judged beyond the ipsets
  }
  const vips = await new Links(runner).addresses(DUMMY_DEVICE);
  const pkt = { from: req.from, to: req.to, port: req.port, protocol: req.protocol };
  const res = traceIpvs({ family, table, sets, masq: masqConfigFromIptables(natText, family), nodeIPs: vips }, pkt);
  return res;
}

export const mode: ModeModule = {
  name: 'ipvs',
  render: (input) => renderPlan(plan(input)),
  createProxier: (deps) => createIpvsProxier(deps),
  cleanup: (runner, log) => cleanupIpvs(runner, log),
  async trace(req, deps) {
    if (req.live || !req.input) return traceLive(req, deps.runner);
    const p = plan(req.input);
    return traceIpvs(
      { family: p.family, table: p.table, sets: p.sets, masq: p.masq, nodeIPs: req.input.node.nodeIPs },
      { from: req.from, to: req.to, port: req.port, protocol: req.protocol },
    );
  },
};

export const conformance: ConformanceAdapter | undefined = undefined;
