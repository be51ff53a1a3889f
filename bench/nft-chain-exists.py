#!/usr/bin/env python3
# Does an nftables chain exist? One NFT_MSG_GETCHAIN request (get, not dump) over netlink:
# O(1) in the size of the table, where `nft list chain` (nft 1.0.6) first fetches every set
# element of the table (~0.4 s at 10,000 Services). Used by the benchmarks' kernel polls
# (bench/kproxy-run.ts endpointCheck) only; kproxy itself never runs it.
#
#   python3 bench/nft-chain-exists.py FAMILY TABLE CHAIN   # exit 0: exists, 1: absent, 2: error
import os
import socket
import struct
import sys

NETLINK_NETFILTER = 12
NFNL_SUBSYS_NFTABLES = 10
NFT_MSG_GETCHAIN = 4
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
NFTA_CHAIN_TABLE, NFTA_CHAIN_NAME = 1, 3
FAMILIES = {"ip": 2, "ip6": 10, "inet": 1}


def attr(kind: int, value: str) -> bytes:
    data = value.encode() + b"\0"
    a = struct.pack("=HH", 4 + len(data), kind) + data
    return a + b"\0" * ((4 - len(a) % 4) % 4)


def main() -> int:
    if len(sys.argv) != 4 or sys.argv[1] not in FAMILIES:
        print("usage: nft-chain-exists.py ip|ip6|inet TABLE CHAIN", file=sys.stderr)
        return 2
    family, table, chain = FAMILIES[sys.argv[1]], sys.argv[2], sys.argv[3]
    body = struct.pack("=BBH", family, 0, 0) + attr(NFTA_CHAIN_TABLE, table) + attr(NFTA_CHAIN_NAME, chain)
    msg = struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETCHAIN, NLM_F_REQUEST | NLM_F_ACK, 1, 0) + body
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    s.settimeout(10)
    s.send(msg)
    found = False
    while True:
        data = s.recv(1 << 16)
        off = 0
        while off + 16 <= len(data):
            length, kind, _flags, _seq, _pid = struct.unpack_from("=IHHII", data, off)
            if kind == NLMSG_ERROR:
                (err,) = struct.unpack_from("=i", data, off + 16)
                if err == 0:
                    return 0 if found else 1
                return 1 if -err == 2 else 2  # ENOENT: no such chain (or table)
            found = True
            off += (length + 3) & ~3
        if not data:
            return 2


if __name__ == "__main__":
    sys.exit(main())
