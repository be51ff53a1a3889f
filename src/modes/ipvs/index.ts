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
import { masqConfigFromIptables, setQuestions, traceIpvs, type SetQuestion } from './trace.ts';
import { DUMMY_DEVICE } from './names.ts';
import { Links } from '../../kernel/links.ts';
import { IptablesExecutor } from '../../kernel/iptables/exec.ts';

/** most rounds of ipset questions a live trace asks (each one `ipset -` process; the first usually answers all) */
const MAX_SET_ROUNDS = 4;

/**
 * A packet through the live kernel, reading only what its walk uses: the one virtual server
 * (`ipvsadm -Ln -t|-u|--sctp-service VIP:PORT`), whether the destination is on kube-ipvs0
 * (`ip -o addr show dev kube-ipvs0 to IP/32`), the nat table's masquerade rules, all three at
 * once, then the ipset entries the walk tests (`ipset -`, one process). The whole table
 * (`ipvsadm -Sn`), every set (`ipset save`) and every VIP grow with the Services; these do not.
 */
async function traceLive(req: TraceRequest, runner: CommandRunner): Promise<TraceResult> {
  const family: 4 | 6 = ipFamily(req.to) === 6 ? 6 : 4;
  const pkt = { from: req.from, to: req.to, port: req.port, protocol: req.protocol };
  const [table, natText, onDummy] = await Promise.all([
    new Ipvsadm(runner).listService({ protocol: req.protocol, address: req.to, port: req.port }),
    // no iptables: masquerade cannot be judged beyond the ipsets
    new IptablesExecutor(runner, family).save('nat').catch(() => ''),
    new Links(runner).addressesTo(DUMMY_DEVICE, req.to),
  ]);
  const known = { family, table, masq: masqConfigFromIptables(natText, family), nodeIPs: onDummy };
  const ipset = new IPSetExec(runner);
  const answers = new Map<string, boolean>();
  const ask = async (qs: SetQuestion[]) => {
    const got = await ipset.test(qs);
    qs.forEach((q, i) => answers.set(`${q.set} ${q.entry}`, got[i]));
  };
  await ask(setQuestions(known, pkt));
  for (let round = 1; ; round++) {
    const unasked = new Map<string, SetQuestion>();
    const setLookup = {
      has(set: string, entry: string): boolean {
        const a = answers.get(`${set} ${entry}`);
        if (a === undefined) unasked.set(`${set} ${entry}`, { set, entry });
        return a ?? false;
      },
    };
    const res = traceIpvs({ ...known, sets: new Map(), setLookup }, pkt);
    if (unasked.size === 0) return res;
    // a walk still asking after that many rounds gets every set at once
    if (round >= MAX_SET_ROUNDS) return traceIpvs({ ...known, sets: await ipset.save() }, pkt);
    await ask([...unasked.values()]);
  }
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
