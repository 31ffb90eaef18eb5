# shellcheck shell=bash
# host-peer-example: the pattern for tests whose one side is our own
# user-space stack running on the host. The host-side process runs inside
# the harness' namespace (ns_run / ns_bg) with its own address on the bridge
# (10.77.0.1 here, the bridge's address; a stack owning UDP 4791 would take
# another one with ns_add_ip 10.77.0.2). Today it proves reachability both
# ways: the VM pings the host and sends a UDP datagram to a python3 echo
# server on the host; the host pings the VM and exchanges UDP with a python3
# echo server in the VM. Later tests replace the python with our binaries.

SCENARIO_VMS=("a 11 peer")
SCENARIO_GUEST_TIMEOUT=300
SCENARIO_EXPECT_PROTOCOLS="icmp udp.port==7400 udp.port==7401"

HOST_PY=/usr/bin/python3

# Host side: runs while the VM runs, stdout/stderr in host.log. Every
# command is bounded (ns_run/ns_bg take a timeout in seconds).
host_main() {
  local vm=10.77.0.11
  # UDP echo server for the VM (port 7400), one datagram.
  ns_bg echo 300 "$HOST_PY" -c '
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("10.77.0.1", 7400))
data, peer = s.recvfrom(2048)
s.sendto(b"echo:" + data, peer)
print("host echoed", data, "to", peer)
'
  # Wait (bounded) until the VM answers ping: it is booting meanwhile.
  local i ok=0
  for i in $(seq 1 "$(tmo 240)"); do
    vms_alive || break
    if ns_run 5 ping -c 1 -W 1 "$vm" >/dev/null 2>&1; then ok=1; break; fi
    sleep 1
  done
  [ $ok = 1 ] || { echo "VM $vm never answered ping"; return 1; }
  ns_run 20 ping -c 3 "$vm"
  # Talk to the VM's UDP echo server (port 7401), retrying until it is up.
  ns_run 120 "$HOST_PY" -c '
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
end = time.monotonic() + 100
while time.monotonic() < end:
    s.sendto(b"hello-from-host", ("10.77.0.11", 7401))
    try:
        data, _ = s.recvfrom(2048)
    except socket.timeout:
        continue
    if data == b"echo:hello-from-host":
        print("host got", data)
        sys.exit(0)
sys.exit("no UDP echo from the VM")
'
  wait "$HOST_PID_echo" || { echo "host echo server failed"; return 1; }
}

guest_peer() {
  local host
  host=$(host_ip host)
  # Echo server for the host side, in the background, bounded.
  timeout 200 python3 -c '
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 7401))
data, peer = s.recvfrom(2048)
s.sendto(b"echo:" + data, peer)
' &
  local echo_pid=$!
  busybox ping -c 3 -W 2 "$host" || fail "host $host does not answer ping"
  python3 - "$host" <<'PY' || fail "no UDP echo from the host"
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
end = time.monotonic() + 60
while time.monotonic() < end:
    s.sendto(b"hello-from-vm", (sys.argv[1], 7400))
    try:
        data, _ = s.recvfrom(2048)
    except socket.timeout:
        continue
    if data == b"echo:hello-from-vm":
        print("vm got", data)
        sys.exit(0)
sys.exit(1)
PY
  wait $echo_pid || fail "the host never reached the VM's UDP echo server"
}
