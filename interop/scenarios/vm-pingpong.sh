# shellcheck shell=bash
# vm-pingpong: two VMs with Linux rxe; ibv_rc_pingpong (RC SEND over verbs,
# connection data exchanged over TCP) and rping (RDMA CM, RDMA READ/WRITE)
# from VM b (client) to VM a (server). Passes when both tools exit 0 on both
# sides and the bridge capture decodes cleanly.
#
# Sourced by the host harness (SCENARIO_* and host_*) and inside the guests
# (guest_<role>, run under set -e with guest/lib.sh loaded).

# name, last octet of 10.77.0.x, role
SCENARIO_VMS=("a 11 server" "b 12 client")
SCENARIO_GUEST_TIMEOUT=900
# Display filters that must match at least one frame of the capture:
# RC SEND First (ibv_rc_pingpong, 4096 bytes at MTU 1024), RDMA WRITE Only and
# RDMA READ Request (rping), CM MADs (rping's connection setup).
SCENARIO_EXPECT_PROTOCOLS="infiniband.bth.opcode==0 infiniband.bth.opcode==10 infiniband.bth.opcode==12 infiniband.mad"

guest_server() {
  step "ibv_rc_pingpong server"
  timeout 300 ibv_rc_pingpong -d rxe0 -g 1 || fail "ibv_rc_pingpong server exited $?"
  step "rping server"
  timeout 300 rping -s -a "$(my_ip)" -C 10 -v || fail "rping server exited $?"
}

guest_client() {
  local srv
  srv=$(host_ip a)
  ibv_devinfo -d rxe0 | sed -n '1,25p'
  # The server may still be booting: retry until it answers.
  retry 400 "ibv_rc_pingpong client" timeout 120 ibv_rc_pingpong -d rxe0 -g 1 "$srv"
  retry 300 "rping client" timeout 120 rping -c -a "$srv" -C 10 -v
}
