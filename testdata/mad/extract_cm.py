#!/usr/bin/env python3
"""Extract the CM MADs (class 0x07) of the shared rxe captures into cm_mads.hex.

Each RoCEv2 UD SEND to QP1 carries BTH (12 B) + DETH (8 B) + MAD (256 B) +
ICRC (4 B) as UDP payload; we keep the 256 MAD bytes. Uses tshark only to get
the UDP payload. Output: one line per MAD, "capture frame attr_id hex".
Run: python3 extract_cm.py /work/shared/captures > cm_mads.hex
"""
import subprocess, sys, os

CAPTURES = [
    "linux-rxe-rc-pingpong-and-rping.pcapng",
    "linux-ib_srp-to-lio-srpt-over-rxe.pcapng",
    "userspace-cm-req-to-linux-rxe.pcapng",
]

def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "/work/shared/captures"
    print("# CM MADs extracted by extract_cm.py: capture frame-number attribute-id mad-hex(256 B)")
    for cap in CAPTURES:
        out = subprocess.run(
            ["tshark", "-r", os.path.join(d, cap), "-Y", "udp.dstport == 4791",
             "-T", "fields", "-e", "frame.number", "-e", "udp.payload"],
            check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            num, payload = line.split("\t")
            b = bytes.fromhex(payload.replace(":", ""))
            if len(b) < 280 or b[0] != 0x64:  # BTH opcode 0x64 = UD SEND ONLY
                continue
            mad = b[20:276]
            if mad[1] != 0x07:  # management class CM
                continue
            attr = int.from_bytes(mad[16:18], "big")
            print(f"{cap} {num} 0x{attr:04x} {mad.hex()}")

main()
