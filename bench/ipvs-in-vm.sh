#!/bin/bash
# Runs INSIDE the IPVS VM for the scale bench (bench/ipvs-vm.ts boots it): makes a namespace
# `srv` holding every pod address (10.0.0.0/8 local, one TCP listener on :8080), then runs
# bench/ipvs-in-vm.ts with this script's arguments. Exit status: that of the bench.
set -u
up() { cut -d' ' -f1 /proc/uptime; }
echo "ipvs-bench: start at uptime $(up)s, kernel $(uname -r), $(grep -c ^processor /proc/cpuinfo) vCPU, $(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo) MiB"
[ -n "${NODE:-}" ] && [ -x "$NODE" ] || { echo "ipvs-bench: NODE not set or not executable"; exit 1; }
modprobe veth || { echo "ipvs-bench: cannot load veth"; exit 1; }
modprobe dummy
ip link set lo up
# the pods' namespace: every pod address is local there; each measurement's node namespace is
# joined to it by a veth pair (bench/ipvs-in-vm.ts)
ip netns add srv
ip -n srv link set lo up
ip -n srv route add local 10.0.0.0/8 dev lo
# the pods: accept and close (the SYN-ACK is the kernel's; the listener only has to exist)
ip netns exec srv "$NODE" -e "require('net').createServer((c)=>c.destroy()).listen(8080,'0.0.0.0',()=>console.log('ipvs-bench: pods listening'))" &
srv=$!
for i in $(seq 1 300); do
  ip netns exec srv bash -c 'exec 3<>/dev/tcp/10.180.0.1/8080' 2>/dev/null && break
  sleep 0.2
done
echo "ipvs-bench: node and pods ready at uptime $(up)s"
# BUNDLE: the same script bundled into one file on the host (bench/ipvs-vm.ts does): much
# faster to start under emulation than tsx compiling every module
if [ -n "${BUNDLE:-}" ] && [ -f "$BUNDLE" ]; then "$NODE" "$BUNDLE" "$@"; else "$NODE" --import tsx bench/ipvs-in-vm.ts "$@"; fi
rc=$?
kill "$srv" 2>/dev/null
echo "ipvs-bench: exited $rc at uptime $(up)s"
exit $rc
