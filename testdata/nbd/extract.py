#!/usr/bin/env python3
"""Splits qemu-clients-to-qemu-nbd.pcapng into one hex file per TCP
connection: `C <hex>` for client-to-server bytes, `S <hex>` for
server-to-client bytes, each preceded by a comment naming the frame.
Run from testdata/nbd: python3 extract.py (needs tshark)."""
import subprocess

CAPTURE = "qemu-clients-to-qemu-nbd.pcapng"
NAMES = ["qemu-img-info", "qemu-io-write-read-flush", "nbdinfo"]
SERVER_PORT = "10899"

rows = subprocess.run(
    ["tshark", "-r", CAPTURE, "-Y", "tcp.len>0", "-T", "fields",
     "-e", "frame.number", "-e", "tcp.srcport", "-e", "tcp.dstport", "-e", "tcp.payload"],
    check=True, capture_output=True, text=True).stdout.splitlines()
conns = {}
for row in rows:
    frame, src, dst, payload = row.split("\t")
    client = dst if src == SERVER_PORT else src
    conns.setdefault(client, []).append((frame, "S" if src == SERVER_PORT else "C", payload.replace(":", "")))
for name, (port, frames) in zip(NAMES, sorted(conns.items(), key=lambda kv: int(kv[1][0][0]))):
    with open(name + ".hex", "w") as f:
        f.write(f"# {CAPTURE}: {name} (client port {port}) against qemu-nbd 7.2\n")
        for frame, side, payload in frames:
            f.write(f"# frame {frame}\n{side} {payload}\n")
