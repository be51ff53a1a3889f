#!/usr/bin/env python3
# The nftables tables of a family, one name a line: one NFT_MSG_GETTABLE dump over netlink.
# `nft list tables` (nft 1.0.6, `-t` too) took 53-60 s with the sharded
# nftables mode's 16 tables at 10,000 Services here. Used by the benchmarks (bench/connect.ts,
# bench/kproxy-run.ts, bench/measure.ts: which kube-proxy tables are in the kernel) only;
# kproxy itself never runs it.
#
#   python3 bench/nft-tables.py FAMILY     # exit 0 and the names; 2: error
import socket
import struct
import sys

NETLINK_NETFILTER = 12
NFNL_SUBSYS_NFTABLES = 10
NFT_MSG_GETTABLE = 1
NLM_F_REQUEST, NLM_F_DUMP = 1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
NFTA_TABLE_NAME = 1
FAMILIES = {"ip": 2, "ip6": 10, "inet": 1}


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1] not in FAMILIES:
        print("usage: nft-tables.py ip|ip6|inet", file=sys.stderr)
        return 2
    body = struct.pack("=BBH", FAMILIES[sys.argv[1]], 0, 0)
    msg = struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETTABLE, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + body
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    s.settimeout(10)
    s.send(msg)
    names = []
    while True:
        data = s.recv(1 << 16)
        if not data:
            return 2
        off = 0
        while off + 16 <= len(data):
            length, kind, _flags, _seq, _pid = struct.unpack_from("=IHHII", data, off)
            if length < 16:
                return 2
            if kind == NLMSG_DONE:
                print("\n".join(names))
                return 0
            if kind == NLMSG_ERROR:
                (err,) = struct.unpack_from("=i", data, off + 16)
                print(f"nft-tables.py: netlink error {err}", file=sys.stderr)
                return 2
            # nfgenmsg (4 bytes), then attributes
            a = off + 20
            while a + 4 <= off + length:
                alen, atype = struct.unpack_from("=HH", data, a)
                if alen < 4:
                    break
                if atype & 0x7FFF == NFTA_TABLE_NAME:
                    names.append(data[a + 4 : a + alen].split(b"\0", 1)[0].decode())
                a += (alen + 3) & ~3
            off += (length + 3) & ~3


if __name__ == "__main__":
    sys.exit(main())
