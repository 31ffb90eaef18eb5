#!/usr/bin/env python3
"""Lets a guest run a few srptadm commands on the host side, so a scenario
can change our target's LUN maps at a moment the guest chooses.

usage: adm_relay.py LISTEN_IP PORT SRPTADM CONTROL_SOCKET

One request per connection: a line of srptadm arguments. The answer is
"OK" or "ERR" on the first line, then srptadm's output. Only LUN, device and
ALUA target port group commands are relayed; the relay exits after 15 idle minutes.
"""
import socket
import subprocess
import sys

ALLOWED = {"add-device", "remove-device", "add-lun", "remove-lun",
           "show", "sessions", "devices", "luns",
           "target-groups", "set-group-state"}


def main():
    host, port, adm, ctl = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    srv = socket.create_server((host, port))
    srv.settimeout(900)
    print(f"relay listening on {host}:{port}", flush=True)
    while True:
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            return
        with conn:
            conn.settimeout(30)
            try:
                args = conn.makefile().readline().split()
            except OSError:
                continue
            if not args or args[0] not in ALLOWED:
                conn.sendall(b"ERR not relayed\n")
                continue
            r = subprocess.run([adm, "--socket", ctl, *args],
                               capture_output=True, text=True, timeout=30)
            head = "OK" if r.returncode == 0 else "ERR"
            print(f"relay: {' '.join(args)} -> {head}", flush=True)
            conn.sendall(f"{head}\n{r.stdout}{r.stderr}".encode())


if __name__ == "__main__":
    main()
