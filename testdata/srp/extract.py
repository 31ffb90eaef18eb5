#!/usr/bin/env python3
"""Extract every SRP IU from a RoCEv2 pcapng capture into a hex text file.

Usage: extract.py CAPTURE.pcapng OUT.txt

Reads pcapng directly (no dependencies). For each RoCEv2 frame (IPv4, UDP
port 4791):
  * CM REQ (UD SEND to QP1, MAD class 0x07, attribute 0x0010): the REQ private
    data is the last 92 bytes of the 232-byte attribute data; the first 36 of
    them are the RDMA CM (IP CM) header, the rest the 56-byte SRP_LOGIN_REQ
    (struct srp_login_req_rdma).
  * CM REP (attribute 0x0013): private data is the last 196 bytes of the
    attribute data; SRP_LOGIN_RSP / SRP_LOGIN_REJ sit at its start, the rest
    is zero padding (kept, the test checks it).
  * RC SEND FIRST/MIDDLE/LAST/ONLY (with or without ImmDt/IETH): the payload,
    reassembled per destination QP in PSN order; one IU per message.
RDMA WRITE payloads (data-in) are not IUs and are skipped.

Output lines: `<kind> <frame> <hex>` where kind is login_req_rdma, cm_rep
or send, and frame is the capture frame number (1-based) of the first packet
of the message.
"""
import struct
import sys


def frames(path):
    data = open(path, "rb").read()
    off = 0
    n = 0
    while off + 12 <= len(data):
        btype, blen = struct.unpack_from("<II", data, off)
        if btype == 0x0A0D0D0A:
            bom = data[off + 8:off + 12]
            assert bom == b"\x4d\x3c\x2b\x1a", "only little-endian pcapng"
        if btype == 6:  # enhanced packet block
            caplen = struct.unpack_from("<I", data, off + 20)[0]
            n += 1
            yield n, data[off + 28:off + 28 + caplen]
        elif btype == 3:  # simple packet block
            n += 1
            plen = struct.unpack_from("<I", data, off + 8)[0]
            yield n, data[off + 12:off + 12 + plen]
        off += blen


def roce(frame):
    """Return (bth, rest-after-bth-without-icrc) or None."""
    if len(frame) < 14 or frame[12:14] != b"\x08\x00":
        return None
    ip = frame[14:]
    ihl = (ip[0] & 0x0F) * 4
    total = struct.unpack_from(">H", ip, 2)[0]
    if ip[9] != 17:
        return None
    udp = ip[ihl:total]
    if struct.unpack_from(">H", udp, 2)[0] != 4791:
        return None
    ib = udp[8:]
    return ib[:12], ib[12:-4]  # strip the 4-byte ICRC


# RC opcodes carrying SEND payload: (first, middle, last, only), extra header bytes
SEND_OPS = {
    0x00: ("first", 0), 0x01: ("middle", 0), 0x02: ("last", 0),
    0x03: ("last", 4), 0x04: ("only", 0), 0x05: ("only", 4),
    0x16: ("last", 4), 0x17: ("only", 4),  # with invalidate (IETH)
}


def main():
    src, out = sys.argv[1], sys.argv[2]
    lines = []
    partial = {}  # dest QPN -> (first frame, bytes)
    for num, fr in frames(src):
        r = roce(fr)
        if r is None:
            continue
        bth, rest = r
        opcode = bth[0]
        pad = (bth[1] >> 4) & 3
        dqpn = struct.unpack_from(">I", bth, 4)[0] & 0xFFFFFF
        if opcode == 0x64 and dqpn == 1:  # UD SEND ONLY to QP1: a MAD
            mad = rest[8:]  # skip DETH
            mgmt_class = mad[1]
            attr = struct.unpack_from(">H", mad, 16)[0]
            body = mad[24:24 + 232]
            if mgmt_class != 0x07:
                continue
            if attr == 0x0010:
                priv = body[232 - 92:]
                assert priv[0] >> 4 == 0, "RDMA CM header major version 0"
                lines.append(("login_req_rdma", num, priv[36:]))
            elif attr == 0x0013:
                lines.append(("cm_rep", num, body[232 - 196:]))
            continue
        if opcode not in SEND_OPS:
            continue
        kind, extra = SEND_OPS[opcode]
        payload = rest[extra:len(rest) - pad]
        if kind in ("first", "only") and dqpn in partial:
            raise SystemExit(f"frame {num}: new message before the last one ended")
        if kind == "only":
            lines.append(("send", num, payload))
        elif kind == "first":
            partial[dqpn] = (num, bytearray(payload))
        else:
            first, buf = partial[dqpn]
            buf += payload
            if kind == "last":
                del partial[dqpn]
                lines.append(("send", first, bytes(buf)))
    with open(out, "w") as f:
        f.write("# SRP IUs extracted by testdata/srp/extract.py from\n")
        f.write("# shared/captures/linux-ib_srp-to-lio-srpt-over-rxe.pcapng\n")
        f.write("# (Linux ib_srp -> LIO ib_srpt over rxe, RDMA CM port 5555).\n")
        f.write("# Checked against tshark 4.x: each send equals data.data of its frame,\n")
        f.write("# login_req_rdma equals infiniband.cm.req.ip_cm.private, cm_rep equals\n")
        f.write("# infiniband.cm.rep.private.\n")
        f.write("# Format: <kind> <capture frame number> <hex bytes>\n")
        for kind, num, b in lines:
            f.write(f"{kind} {num} {b.hex()}\n")


if __name__ == "__main__":
    main()
