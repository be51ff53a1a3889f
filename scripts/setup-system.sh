#!/usr/bin/env bash
# Installs the system packages the tests need (Debian). Idempotent: does nothing when
# every tool is present. The IPVS VM runner installs its own host packages (qemu, ...).
set -euo pipefail
need=()
for pair in iptables:iptables nft:nftables ipset:ipset conntrack:conntrack ip:iproute2 socat:socat \
            curl:curl ipvsadm:ipvsadm modprobe:kmod sysctl:procps openssl:openssl python3:python3; do
  cmd=${pair%%:*}; pkg=${pair##*:}
  command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
if [ "${#need[@]}" -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "setup-system: missing packages: ${need[*]}; run as root (apt-get install ${need[*]})" >&2
  exit 1
fi
echo "setup-system: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" ca-certificates >/dev/null
