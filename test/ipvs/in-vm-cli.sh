#!/bin/bash
# Runs INSIDE the IPVS test VM (test/ipvs/vm-cli.test.ts boots it): kproxy through its real
# command line (`kproxy run --config CFG --manifests DIR`, `kproxy cleanup`) on a tiny node
# with backend pods in network namespaces, on one kernel:
#   iptables → ipvs (scheduler rr) → ipvs (config edited to sh) → ipvs dual-stack → nftables
#   → userspace → cleanup
# The dual-stack step gives the node, one pod and the client IPv6 addresses and makes the
# Service dual-stack (clusterIPs 172.30.0.10 and fd00:172:30::10, one EndpointSlice per
# family): both ClusterIPs answer, IPv6 through IPv6 virtual servers and KUBE-6-* sets, and
# `kproxy trace --live` agrees for both families.
# Traffic through the ClusterIP (and NodePort, UDP) is checked after every restart, and every
# mode switch is checked to leave nothing of the previous mode behind.
# Prints one line per check, "PASS <name> [detail]" or "FAIL <name>: <detail>", and exits 1
# if any check failed. Every wait is bounded.
#
# Env: NODE (node binary). Every command is /project/bin/kproxy.js, which runs the esbuild
# bundle in dist/ (the test builds it first): 12-30 s per start under software emulation.
set -u
up() { cut -d' ' -f1 /proc/uptime; }
since() { awk -v a="$1" -v b="$(up)" 'BEGIN { printf "%.1f", b - a }'; }
echo "in-vm-cli: start at uptime $(up)s, kernel $(uname -r)"

FAILED=0
pass() { echo "PASS $1${2:+ $2} (t=$(up)s)" | tr '\n' ' '; echo; }
fail() { echo "FAIL $1: $2 (t=$(up)s)" | tr '\n' ' '; echo; FAILED=$((FAILED + 1)); }
# check NAME FUNC [ARGS...]: FUNC sets DETAIL and returns 0 (pass) or non-zero (fail)
check() {
  local name=$1; shift
  DETAIL=""
  if "$@"; then pass "$name" "$DETAIL"; else fail "$name" "$DETAIL"; fi
}

[ -n "${NODE:-}" ] && [ -x "$NODE" ] || { echo "FAIL setup: NODE not set or not executable"; exit 1; }
KP=/project/bin/kproxy.js

CLUSTER_IP=172.30.0.10
NODE_IP=192.168.0.2
WORK=/tmp/kpcli
CFG=$WORK/kube-proxy.yaml
MAN=$WORK/manifests
mkdir -p "$MAN"

# ---------------------------------------------------------------- the node and its pods
setup() {
  modprobe veth && modprobe dummy || { DETAIL="cannot load veth/dummy"; return 1; }
  # the node's own address (NodePort target) on a dummy uplink with a default route: locally
  # generated packets to a ClusterIP need a route before nat OUTPUT rewrites them
  ip link add eth0 type dummy && ip link set eth0 up && ip addr add $NODE_IP/24 dev eth0 &&
    ip route add default via 192.168.0.1 dev eth0 || { DETAIL="node uplink"; return 1; }
  echo 1 > /proc/sys/net/ipv4/ip_forward
  # three backend pods; each names itself (and the peer it saw) and closes
  local i
  for i in 1 2 3; do
    ip netns add be$i &&
      ip link add veth-be$i type veth peer name eth0 netns be$i &&
      ip addr add 10.180.$i.1/24 dev veth-be$i && ip link set veth-be$i up &&
      ip -n be$i addr add 10.180.$i.2/24 dev eth0 && ip -n be$i link set lo up && ip -n be$i link set eth0 up &&
      ip -n be$i route add default via 10.180.$i.1 || { DETAIL="backend pod be$i"; return 1; }
    ip netns exec be$i socat TCP4-LISTEN:8080,fork,reuseaddr SYSTEM:'echo be'$i' $SOCAT_PEERADDR' &
    ip netns exec be$i socat UDP4-RECVFROM:5353,fork SYSTEM:'echo be'$i &
  done
  # a client pod inside the cluster CIDR
  ip netns add client &&
    ip link add veth-cl type veth peer name eth0 netns client &&
    ip addr add 10.100.0.1/24 dev veth-cl && ip link set veth-cl up &&
    ip -n client addr add 10.100.0.2/24 dev eth0 && ip -n client link set lo up && ip -n client link set eth0 up &&
    ip -n client route add default via 10.100.0.1 || { DETAIL="client pod"; return 1; }
  # the backends answer directly before any proxy exists
  local b
  for i in 1 2 3; do
    b=$(tcp_req 10.180.$i.2 8080)
    [ "$b" = "be$i" ] || { DETAIL="backend be$i does not answer directly (got '$b')"; return 1; }
  done
  DETAIL="3 backend pods, 1 client pod"
}

CLUSTER_IP6=fd00:172:30::10
# setup_ipv6: IPv6 on the node, on backend be1 (answers "be1-v6") and on the client pod
setup_ipv6() {
  echo 0 > /proc/sys/net/ipv6/conf/all/disable_ipv6
  echo 1 > /proc/sys/net/ipv6/conf/all/forwarding
  ip -6 addr add fd00:192:168::2/64 dev eth0 nodad && ip -6 route add default via fd00:192:168::1 dev eth0 &&
    ip -6 addr add fd00:10:180:1::1/64 dev veth-be1 nodad &&
    ip -n be1 -6 addr add fd00:10:180:1::2/64 dev eth0 nodad && ip -n be1 -6 route add default via fd00:10:180:1::1 &&
    ip -6 addr add fd00:10:100::1/64 dev veth-cl nodad &&
    ip -n client -6 addr add fd00:10:100::2/64 dev eth0 nodad && ip -n client -6 route add default via fd00:10:100::1 ||
    { DETAIL="IPv6 addresses and routes"; return 1; }
  ip netns exec be1 socat TCP6-LISTEN:8080,ipv6only=1,fork,reuseaddr SYSTEM:'echo be1-v6' &
  local i b=""
  for i in $(seq 1 20); do
    b=$(ip netns exec client socat -T 3 -u "TCP6:[fd00:10:180:1::2]:8080,connect-timeout=3" STDOUT 2>/dev/null | head -n1)
    [ "$b" = be1-v6 ] && { DETAIL="be1 answers on [fd00:10:180:1::2]:8080"; return 0; }
    sleep 0.2
  done
  DETAIL="be1 does not answer over IPv6 (got '$b')"
  return 1
}

write_manifests_dual() {
  cat > "$MAN/web.yaml" <<EOF
apiVersion: v1
kind: Service
metadata: {name: web, namespace: t}
spec:
  clusterIP: $CLUSTER_IP
  clusterIPs: [$CLUSTER_IP, "$CLUSTER_IP6"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  ports:
  - {name: http, port: 80, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: t
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
endpoints:
- {addresses: [10.180.1.2], nodeName: other-node}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-v6
  namespace: t
  labels: {kubernetes.io/service-name: web}
addressType: IPv6
ports:
- {name: http, port: 8080, protocol: TCP}
endpoints:
- {addresses: ["fd00:10:180:1::2"], nodeName: other-node}
EOF
}

# both ClusterIPs answer from the client pod, each at its own family's endpoint
dual_traffic() {
  local a b
  a=$(tcp_req $CLUSTER_IP 80)
  b=$(ip netns exec client socat -T 3 -u "TCP6:[$CLUSTER_IP6]:80,connect-timeout=3" STDOUT 2>/dev/null | head -n1)
  DETAIL="$CLUSTER_IP:80 → $a; [$CLUSTER_IP6]:80 → $b"
  [ "$a" = be1 ] && [ "$b" = be1-v6 ]
}
# IPv6 virtual server with the IPv6 real server, the VIP on kube-ipvs0, the KUBE-6- sets
ipvs6_state() {
  local r s a
  r=$(ipvsadm -Ln -t "[$CLUSTER_IP6]:80" 2>/dev/null | awk '$1 == "->" && $2 ~ /^\[/ { print $2 }' | tr '\n' ' ')
  s=$(ipset list -n 2>/dev/null | grep -c '^KUBE-6-')
  a=$(ip -6 addr show dev kube-ipvs0 2>/dev/null | grep -c "$CLUSTER_IP6")
  DETAIL="[$CLUSTER_IP6]:80 → $r; $s KUBE-6- sets; VIP on kube-ipvs0: $a"
  [ "$r" = "[fd00:10:180:1::2]:8080 " ] && [ "$s" -gt 0 ] && [ "$a" = 1 ] || { DETAIL="$DETAIL; ipvsadm -Ln: $(ipvsadm -Ln | tr '\n' ' ')"; return 1; }
}
# trace_live FROM TO WANT: `kproxy trace --live` answers WANT (output field, exactly)
trace_live() {
  local out
  out=$("$NODE" "$KP" trace --mode ipvs --live --from "$1" --to "$2" --json 2>&1)
  DETAIL="$2 → $(echo "$out" | tr '\n' ' ' | cut -c1-300)"
  echo "$out" | grep -qF "\"output\":\"$3\""
}

write_manifests() {
  cat > "$MAN/web.yaml" <<EOF
apiVersion: v1
kind: Service
metadata: {name: web, namespace: t}
spec:
  clusterIP: $CLUSTER_IP
  type: NodePort
  ports:
  - {name: http, port: 80, protocol: TCP, nodePort: 30080}
  - {name: dns, port: 53, protocol: UDP, nodePort: 30053}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: t
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
- {name: dns, port: 5353, protocol: UDP}
endpoints:
- {addresses: [10.180.1.2], nodeName: other-node}
- {addresses: [10.180.2.2], nodeName: other-node}
- {addresses: [10.180.3.2], nodeName: other-node}
EOF
}

# write_config MODE SCHEDULER: the KubeProxyConfiguration the next start reads
write_config() {
  cat > "$CFG" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: $1
clusterCIDR: 10.0.0.0/8
ipvs:
  scheduler: $2
EOF
}

# ---------------------------------------------------------------- traffic
# one TCP request from the client pod: prints the answering backend's name
tcp_req() {
  ip netns exec client socat -T 3 -u "TCP4:$1:$2,connect-timeout=3" STDOUT 2>/dev/null | head -n1 | cut -d' ' -f1
}
# one UDP query, asked up to 3 times: the first datagram through a just-started userspace proxy
# in the software-emulated VM (a new session, code paths not yet compiled, socat forking the
# answer) can take over a second; a lost answer is not a wrong one, a wrong one still fails
udp_req() {
  local got i
  for i in 1 2 3; do
    got=$(echo q | ip netns exec client socat -T 3 - "UDP4:$1:$2" 2>/dev/null | head -n1 | cut -d' ' -f1)
    [ -n "$got" ] && break
  done
  echo "$got"
}
# tcp_reaches_all IP PORT: bounded requests until all three backends answered
tcp_reaches_all() {
  local seen="" got i
  for i in $(seq 1 30); do
    got=$(tcp_req "$1" "$2")
    [ -n "$got" ] || { DETAIL="request $i to $1:$2 got no answer (seen so far:$seen)"; return 1; }
    case " $seen " in *" $got "*) ;; *) seen="$seen $got";; esac
    [ "$(echo $seen | wc -w)" = 3 ] && { DETAIL="$1:$2 reached$seen in $i requests"; return 0; }
  done
  DETAIL="30 requests to $1:$2 reached only$seen"
  return 1
}
# traffic all|one: ClusterIP TCP reaches every endpoint (all) or answers (one: the sh scheduler
# keeps one client on one backend), then ClusterIP UDP and NodePort TCP answer
traffic() {
  local d u n t
  if [ "$1" = all ]; then
    tcp_reaches_all $CLUSTER_IP 80 || return 1
    d=$DETAIL
  else
    t=$(tcp_req $CLUSTER_IP 80)
    case "$t" in be[123]) ;; *) DETAIL="TCP $CLUSTER_IP:80 got '$t'"; return 1;; esac
    d="$CLUSTER_IP:80 → $t"
  fi
  u=$(udp_req $CLUSTER_IP 53)
  case "$u" in be[123]) ;; *) DETAIL="$d; UDP $CLUSTER_IP:53 got '$u'"; return 1;; esac
  n=$(tcp_req $NODE_IP 30080)
  case "$n" in be[123]) ;; *) DETAIL="$d; UDP → $u; NodePort $NODE_IP:30080 got '$n'"; return 1;; esac
  DETAIL="$d; UDP :53 → $u; NodePort :30080 → $n"
}

# ---------------------------------------------------------------- kproxy
KP_PID=""
KP_LOG=""
# start_kproxy NAME ENTRY DEADLINE_S: `kproxy run` in the background, then wait for /healthz 200
start_kproxy() {
  local name=$1 entry=$2 deadline=$3 t0 code=""
  KP_LOG=$WORK/kproxy-$name.log
  t0=$(up)
  "$NODE" "$entry" run --config "$CFG" --manifests "$MAN" --hostname-override vm-node \
    --healthz-bind-address 127.0.0.1:10256 --metrics-bind-address 127.0.0.1:10249 >"$KP_LOG" 2>&1 &
  KP_PID=$!
  while awk -v a="$t0" -v b="$(up)" -v d="$deadline" 'BEGIN { exit !(b - a < d) }'; do
    if ! kill -0 "$KP_PID" 2>/dev/null; then
      wait "$KP_PID"; DETAIL="kproxy exited ($?) before /healthz said 200: $(tail -c 1500 "$KP_LOG")"; KP_PID=""; return 1
    fi
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 http://127.0.0.1:10256/healthz 2>/dev/null)
    [ "$code" = 200 ] && { DETAIL="$(basename "$entry") healthy after $(since "$t0")s"; return 0; }
    sleep 0.5
  done
  DETAIL="no /healthz 200 within ${deadline}s (last: '$code'): $(tail -c 1500 "$KP_LOG")"
  return 1
}
stop_kproxy() {
  [ -n "$KP_PID" ] || return 0
  kill -TERM "$KP_PID" 2>/dev/null
  local i
  for i in $(seq 1 100); do kill -0 "$KP_PID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$KP_PID" 2>/dev/null
  wait "$KP_PID" 2>/dev/null
  KP_PID=""
}
trap 'stop_kproxy' EXIT

# ---------------------------------------------------------------- kernel state
ipvs_scheduler() { ipvsadm -Ln -t "$1" 2>/dev/null | awk '$1 == "TCP" { print $3 }'; }
ipvs_reals() { ipvsadm -Ln -t "$1" 2>/dev/null | awk '$1 == "->" && $2 ~ /^[0-9]/ { print $2 }' | sort | tr '\n' ' '; }
ipvs_shows() {   # ipvs_shows SCHEDULER
  local want="10.180.1.2:8080 10.180.2.2:8080 10.180.3.2:8080 " s r np
  s=$(ipvs_scheduler $CLUSTER_IP:80); r=$(ipvs_reals $CLUSTER_IP:80); np=$(ipvs_reals $NODE_IP:30080)
  DETAIL="$CLUSTER_IP:80 $s → $r; NodePort → $np"
  [ "$s" = "$1" ] && [ "$r" = "$want" ] && [ "$np" = "$want" ] || { DETAIL="$DETAIL; ipvsadm -Ln: $(ipvsadm -Ln)"; return 1; }
}
ipvs_residue() {   # prints what the ipvs mode left (empty = nothing)
  local vs sets chains
  vs=$(ipvsadm -Sn 2>/dev/null)
  sets=$(ipset list -n 2>/dev/null | grep '^KUBE-' | tr '\n' ' ')
  [ -n "$vs" ] && echo "virtual servers: $(echo "$vs" | tr '\n' ' ')"
  ip link show kube-ipvs0 >/dev/null 2>&1 && echo "kube-ipvs0 exists"
  [ -n "$sets" ] && echo "ipsets: $sets"
}
iptables_svc_chains() { iptables-save -t nat 2>/dev/null | grep -E '^:KUBE-(SVC|SEP)-' | tr '\n' ' '; }
# KUBE-FIREWALL is the kubelet's chain (the iptables mode duplicates it, as upstream): cleanup keeps it
kube_iptables() { iptables-save 2>/dev/null | grep -E 'KUBE-|KPROXY-' | grep -v 'KUBE-FIREWALL' | head -n 8 | tr '\n' ' '; }
nft_table() { nft list tables 2>/dev/null | grep -x 'table ip kube-proxy'; }

# ---------------------------------------------------------------- checks
no_iptables_chains_after_ipvs_start() {
  local c; c=$(iptables_svc_chains)
  DETAIL="no KUBE-SVC-/KUBE-SEP- chains"
  [ -z "$c" ] || { DETAIL="left: $c"; return 1; }
}
iptables_rules_present() {
  local c; c=$(iptables_svc_chains)
  DETAIL="$(echo $c | wc -w) KUBE-SVC-/KUBE-SEP- chains"
  [ -n "$c" ]
}
sh_one_backend() {
  local got="" b i
  for i in $(seq 1 8); do got="$got $(tcp_req $CLUSTER_IP 80)"; done
  b=$(echo $got | tr ' ' '\n' | sort -u | tr '\n' ' ')
  DETAIL="8 requests from one client →$got"
  case "$b" in "be1 "|"be2 "|"be3 ") return 0;; *) return 1;; esac
}
no_ipvs_residue() {
  local r c; r=$(ipvs_residue); c=$(kube_iptables)
  DETAIL="no virtual servers, no kube-ipvs0, no KUBE- ipsets, no KUBE- iptables rules"
  [ -z "$r" ] && [ -z "$c" ] || { DETAIL="left: $r ${c:+iptables: $c}"; return 1; }
}
nft_table_present() { DETAIL="table ip kube-proxy"; [ -n "$(nft_table)" ] || { DETAIL="no table ip kube-proxy: $(nft list tables 2>&1)"; return 1; }; }
no_nft_table() { DETAIL="no table ip kube-proxy"; [ -z "$(nft_table)" ] || { DETAIL="left: $(nft list tables)"; return 1; }; }
run_cleanup() {
  local out rc t0; t0=$(up)
  out=$("$NODE" "$1" cleanup 2>&1); rc=$?
  DETAIL="rc $rc after $(since "$t0")s"
  [ "$rc" = 0 ] || { DETAIL="$DETAIL: $(echo "$out" | tail -c 1500)"; return 1; }
}
nothing_left() {
  local r c t; r=$(ipvs_residue); c=$(kube_iptables); t=$(nft_table)
  DETAIL="no virtual servers, kube-ipvs0, KUBE- ipsets, KUBE-/KPROXY- iptables rules or nft table"
  [ -z "$r$c$t" ] || { DETAIL="left: $r ${c:+iptables: $c} $t"; return 1; }
}
traffic_stops() {
  local got; got=$(tcp_req $CLUSTER_IP 80)
  DETAIL="ClusterIP no longer answers"
  [ -z "$got" ] || { DETAIL="$CLUSTER_IP:80 still answered by $got after cleanup"; return 1; }
}

# KEP-5495: the ipvs mode's start logs upstream's deprecation warning (a warn line, level 40);
# no other mode does
IPVS_DEPRECATION="The ipvs proxier has been deprecated and will be disabled by default in Kubernetes 1.40"
ipvs_deprecation_logged() {
  DETAIL="warning in $(basename "$KP_LOG")"
  grep -q "\"level\":40.*$IPVS_DEPRECATION" "$KP_LOG" || { DETAIL="no deprecation warning: $(head -c 1200 "$KP_LOG" | tr '\n' ' ')"; return 1; }
}
no_ipvs_deprecation_logged() {
  DETAIL="no ipvs warning in $(basename "$KP_LOG")"
  ! grep -q "$IPVS_DEPRECATION" "$KP_LOG" || { DETAIL="logged outside ipvs mode"; return 1; }
}

# run_mode NAME ENTRY DEADLINE all|one: start + traffic (fails too when the start failed)
run_mode() {
  check "$1-healthz" start_kproxy "$1" "$2" "$3"
  check "$1-traffic" traffic "$4"
  [ "$FAILED" = 0 ] || [ -z "$KP_LOG" ] || echo "in-vm-cli: $1 kproxy log tail: $(tail -c 1200 "$KP_LOG" | tr '\n' ' ')"
}

check setup setup || true
if [ "$FAILED" != 0 ]; then echo "in-vm-cli: setup failed"; exit 1; fi
write_manifests
echo "in-vm-cli: pods ready at uptime $(up)s; kproxy entry: $KP"

# 1. iptables
write_config iptables rr
run_mode iptables "$KP" 90 all
check iptables-rules-in-place iptables_rules_present
check iptables-no-ipvs-deprecation no_ipvs_deprecation_logged
stop_kproxy

# 2. ipvs, scheduler rr
write_config ipvs rr
run_mode ipvs-rr "$KP" 90 all
check ipvs-rr-deprecation-warning ipvs_deprecation_logged
check iptables-to-ipvs-no-svc-sep-chains no_iptables_chains_after_ipvs_start
check ipvs-rr-ipvsadm ipvs_shows rr
stop_kproxy

# 3. the config edited to scheduler sh, restart
sed -i 's/^  scheduler: rr$/  scheduler: sh/' "$CFG"
run_mode ipvs-sh "$KP" 90 one
check ipvs-sh-ipvsadm ipvs_shows sh
check ipvs-sh-one-client-one-backend sh_one_backend
stop_kproxy

# 3b. ipvs dual-stack: IPv4 and IPv6 ClusterIPs, one proxier per family
check ipv6-setup setup_ipv6
write_manifests_dual
sed -i 's/^  scheduler: sh$/  scheduler: rr/' "$CFG"
check ipvs-ds-healthz start_kproxy ipvs-ds "$KP" 90
check ipvs-ds-traffic dual_traffic
check ipvs-ds-ipv6-virtual-server ipvs6_state
check ipvs-ds-trace-live-v4 trace_live 10.100.0.2 $CLUSTER_IP:80 10.180.1.2:8080
check ipvs-ds-trace-live-v6 trace_live fd00:10:100::2 "[$CLUSTER_IP6]:80" '[fd00:10:180:1::2]:8080'
[ "$FAILED" = 0 ] || [ -z "$KP_LOG" ] || echo "in-vm-cli: ipvs-ds kproxy log tail: $(tail -c 1500 "$KP_LOG" | tr '\n' ' ')"
stop_kproxy
write_manifests

# 4. nftables
sed -i 's/^mode: ipvs$/mode: nftables/' "$CFG"
run_mode nftables "$KP" 90 all
check ipvs-to-nftables-no-ipvs-residue no_ipvs_residue
check nftables-table-in-place nft_table_present
stop_kproxy

# 5. userspace
sed -i 's/^mode: nftables$/mode: userspace/' "$CFG"
run_mode userspace "$KP" 90 all
check nftables-to-userspace-no-nft-table no_nft_table
stop_kproxy

# 6. cleanup
check cleanup-exits-0 run_cleanup "$KP"
check cleanup-leaves-nothing nothing_left
check cleanup-traffic-stops traffic_stops

echo "in-vm-cli: done at uptime $(up)s, $FAILED failed"
[ "$FAILED" = 0 ]
