#!/bin/bash
# Runs INSIDE the IPVS test VM (test/ipvs/vm.test.ts boots it): builds a tiny "node" with
# backend pods in network namespaces, then runs test/ipvs/fixtures/vm-checks.ts, which
# drives the real ipvs proxier and prints one "RESULT ok|fail <check> <detail>" line per
# check. Exit status: 0 only if every check passed.
set -u
up() { cut -d' ' -f1 /proc/uptime; }
echo "in-vm: start at uptime $(up)s, kernel $(uname -r)"
[ -n "${NODE:-}" ] && [ -x "$NODE" ] || { echo "RESULT fail setup NODE not set or not executable"; exit 1; }
modprobe veth && modprobe dummy || { echo "RESULT fail setup cannot load veth/dummy"; exit 1; }
# the node's own address (NodePort target) on a dummy uplink with a default route
ip link add eth0 type dummy && ip link set eth0 up && ip addr add 192.168.0.2/24 dev eth0
ip route add default via 192.168.0.1 dev eth0
# three backend pods; each TCP server names itself and the peer it saw, then echoes
for i in 1 2 3; do
  ip netns add be$i
  ip link add veth-be$i type veth peer name eth0 netns be$i
  ip addr add 10.180.$i.1/24 dev veth-be$i; ip link set veth-be$i up
  ip -n be$i addr add 10.180.$i.2/24 dev eth0; ip -n be$i link set lo up; ip -n be$i link set eth0 up
  ip -n be$i route add default via 10.180.$i.1
  ip netns exec be$i socat TCP4-LISTEN:8080,fork,reuseaddr SYSTEM:'echo be'$i' $SOCAT_PEERADDR; cat' &
  ip netns exec be$i socat UDP4-RECVFROM:5353,fork SYSTEM:'echo be'$i &
done
# a client pod inside the cluster CIDR
ip netns add client
ip link add veth-cl type veth peer name eth0 netns client
ip addr add 10.100.0.1/24 dev veth-cl; ip link set veth-cl up
ip -n client addr add 10.100.0.2/24 dev eth0; ip -n client link set lo up; ip -n client link set eth0 up
ip -n client route add default via 10.100.0.1
sleep 0.5
echo "in-vm: pods ready at uptime $(up)s; loaded ip_vs modules: $(grep -c '^ip_vs' /proc/modules)"
"$NODE" --import tsx test/ipvs/fixtures/vm-checks.ts
rc=$?
echo "in-vm: checks exited $rc at uptime $(up)s"
exit $rc
