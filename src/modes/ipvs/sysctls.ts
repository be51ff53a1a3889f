// Kernel settings the ipvs mode needs (upstream's NewProxier). Pure: the proxier applies them.

export interface IPVSSysctl {
  /** dotted name, e.g. net.ipv4.vs.conntrack */
  name: string;
  value: string;
  /** applied only on kernels in [minKernel, belowKernel) */
  minKernel?: string;
  belowKernel?: string;
  why: string;
}

export function plannedSysctls(strictARP: boolean): IPVSSysctl[] {
  const out: IPVSSysctl[] = [
    { name: 'net.ipv4.vs.conntrack', value: '1', why: 'IPVS keeps conntrack entries so iptables masquerade works' },
    {
      name: 'net.ipv4.vs.conn_reuse_mode',
      value: '0',
      minKernel: '4.1',
      // kernels >= 5.9 fixed the 1 s stall of mode 1 (kubernetes#93297): left as-is there, as upstream
      belowKernel: '5.9',
      why: 'avoid 1 s stalls when a source port is reused (kernels 4.1-5.8)',
    },
    { name: 'net.ipv4.vs.expire_nodest_conn', value: '1', why: 'drop connections to removed real servers at once' },
    { name: 'net.ipv4.vs.expire_quiescent_template', value: '1', why: 'persistence templates of weight-0 servers expire' },
    { name: 'net.ipv4.ip_forward', value: '1', why: 'NAT forwarding to real servers' },
  ];
  if (strictARP) {
    out.push(
      { name: 'net.ipv4.conf.all.arp_ignore', value: '1', why: 'strictARP: do not answer ARP for VIPs on kube-ipvs0' },
      { name: 'net.ipv4.conf.all.arp_announce', value: '2', why: 'strictARP: never announce VIPs as ARP source' },
    );
  }
  return out;
}

/** "6.1.0-57-amd64" → [6, 1, 0] */
export function parseKernelVersion(release: string): number[] {
  const m = /^(\d+)\.(\d+)(?:\.(\d+))?/.exec(release);
  return m ? [Number(m[1]), Number(m[2]), Number(m[3] ?? 0)] : [0, 0, 0];
}

function cmp(a: number[], b: number[]): number {
  for (let i = 0; i < 3; i++) if ((a[i] ?? 0) !== (b[i] ?? 0)) return (a[i] ?? 0) - (b[i] ?? 0);
  return 0;
}

/** whether a sysctl applies on a kernel release */
export function sysctlApplies(s: IPVSSysctl, release: string): boolean {
  const k = parseKernelVersion(release);
  if (s.minKernel && cmp(k, parseKernelVersion(s.minKernel)) < 0) return false;
  if (s.belowKernel && cmp(k, parseKernelVersion(s.belowKernel)) >= 0) return false;
  return true;
}
