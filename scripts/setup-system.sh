#!/usr/bin/env bash
# Installs the system packages the tests and the benchmarks need (Debian). Idempotent: does
# nothing when every tool is present. The IPVS VM runner installs its own host packages (qemu, ...).
# The benchmarks' peers and load tools (bench/userspace.ts): nginx with its stream module,
# haproxy, iperf3, wrk, and perf for the flame graphs (bench/userspace-flame.ts); their daemons are stopped after the install (the bench runs its own).
set -euo pipefail
need=()
for pair in iptables:iptables nft:nftables ipset:ipset conntrack:conntrack ip:iproute2 socat:socat \
            curl:curl ipvsadm:ipvsadm modprobe:kmod sysctl:procps openssl:openssl python3:python3 \
            nginx:nginx haproxy:haproxy iperf3:iperf3 wrk:wrk perf:linux-perf; do
  cmd=${pair%%:*}; pkg=${pair##*:}
  command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
[ -f /usr/lib/nginx/modules/ngx_stream_module.so ] || need+=(libnginx-mod-stream)
if [ "${#need[@]}" -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "setup-system: missing packages: ${need[*]}; run as root (apt-get install ${need[*]})" >&2
  exit 1
fi
echo "setup-system: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" ca-certificates >/dev/null
# Debian's nginx and haproxy packages start their daemons on install; nothing here uses them.
for s in nginx haproxy; do
  if command -v systemctl >/dev/null 2>&1; then systemctl stop "$s" 2>/dev/null || true; systemctl disable "$s" 2>/dev/null || true; fi
  if [ -x "/etc/init.d/$s" ]; then "/etc/init.d/$s" stop >/dev/null 2>&1 || true; fi
done
