#!/bin/sh
# Installs the peers and load tools of bench/userspace.ts (for the benchmark only; the test
# suite does not need them): nginx with its stream module, haproxy, iperf3, wrk.
# Debian/Ubuntu, as root. The services are not started: the bench runs them itself.
set -eu
export DEBIAN_FRONTEND=noninteractive
if ! command -v nginx >/dev/null || ! command -v haproxy >/dev/null || ! command -v iperf3 >/dev/null || ! command -v wrk >/dev/null; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends nginx-light libnginx-mod-stream haproxy iperf3 wrk >/dev/null \
    || apt-get install -y -qq --no-install-recommends nginx libnginx-mod-stream haproxy iperf3 wrk >/dev/null
fi
# Debian's packages start their daemons on install; the bench runs its own instances.
for s in nginx haproxy; do
  if command -v systemctl >/dev/null 2>&1; then systemctl stop "$s" 2>/dev/null || true; systemctl disable "$s" 2>/dev/null || true; fi
  if [ -x "/etc/init.d/$s" ]; then "/etc/init.d/$s" stop >/dev/null 2>&1 || true; fi
done
nginx -V 2>&1 | head -1; haproxy -v | head -1; iperf3 --version | head -1; wrk --version 2>&1 | head -1 || true
