#!/usr/bin/env python3
"""Copy every RoCEv2 frame of a pcapng capture into a hex text file.

Usage: extract.py CAPTURE.pcapng OUT.hex

A RoCEv2 frame here is an Ethernet frame carrying IPv4 or IPv6 whose
next protocol is UDP with destination port 4791 (IBA Annex A17). ICMP
errors that quote a RoCEv2 datagram, ARP, neighbour discovery and other
UDP traffic are not RoCEv2 frames and are left out; the header of the
output says how many frames of each kind were skipped.

Output: comment lines starting with '#', then one line per frame:
`<frame number in the capture, 1-based> <hex of the whole Ethernet frame>`.
No dependencies; reads little-endian pcapng only.
"""
import struct
import sys


def blocks(data):
    off = 0
    n = 0
    while off + 12 <= len(data):
        btype, blen = struct.unpack_from("<II", data, off)
        if btype == 0x0A0D0D0A:
            assert data[off + 8:off + 12] == b"\x4d\x3c\x2b\x1a", "big-endian pcapng"
        elif btype == 6:  # enhanced packet block
            caplen, origlen = struct.unpack_from("<II", data, off + 20)
            assert caplen == origlen, "truncated frame in capture"
            n += 1
            yield n, data[off + 28:off + 28 + caplen]
        elif btype == 3:  # simple packet block
            n += 1
            plen = struct.unpack_from("<I", data, off + 8)[0]
            yield n, data[off + 12:off + 12 + plen]
        off += blen


def classify(frame):
    """'roce' for a RoCEv2 frame, otherwise a word saying what it is."""
    ethertype = struct.unpack_from(">H", frame, 12)[0]
    if ethertype == 0x0800:
        ip = frame[14:]
        proto, l4 = ip[9], ip[(ip[0] & 0x0F) * 4:]
    elif ethertype == 0x86DD:
        ip = frame[14:]
        proto, l4 = ip[6], ip[40:]
    else:
        return "ethertype-%04x" % ethertype
    if proto != 17:
        return "ip-proto-%d" % proto
    if struct.unpack_from(">H", l4, 2)[0] != 4791:
        return "udp-not-4791"
    return "roce"


def main():
    src, out = sys.argv[1], sys.argv[2]
    data = open(src, "rb").read()
    kept, skipped = [], {}
    total = 0
    for n, frame in blocks(data):
        total += 1
        kind = classify(frame)
        if kind == "roce":
            kept.append((n, frame))
        else:
            skipped[kind] = skipped.get(kind, 0) + 1
    name = src.rsplit("/", 1)[-1]
    with open(out, "w") as f:
        f.write("# RoCEv2 frames (Ethernet included) copied by testdata/roce/extract.py\n")
        f.write("# from shared/captures/%s\n" % name)
        f.write("# %d of %d frames kept; skipped: %s\n" % (
            len(kept), total,
            ", ".join("%s %d" % kv for kv in sorted(skipped.items())) or "none"))
        f.write("# Format: <frame number in the capture> <hex of the Ethernet frame>\n")
        for n, frame in kept:
            f.write("%d %s\n" % (n, frame.hex()))


if __name__ == "__main__":
    main()
