# shellcheck shell=bash
# rxe-ud-pingpong-ours: our soft RoCE NIC against Linux rxe, UD SEND both
# ways (DETH, Q_Key 0x11111111, GRH in the receive buffer) through
# ibv_ud_pingpong's exchange. The VM runs rdma-core's ibv_ud_pingpong; the
# host runs our rpingpong --ud (crates/rdma-perf) at
# 10.77.0.2 inside the namespace. Round 1: the VM serves, we connect.
# Round 2: we serve, the VM connects. Passes when both tools exit 0 both
# times and the bridge capture decodes cleanly.
#
# Needs the binary: cargo build --release -p rdma-perf (RPINGPONG overrides
# the path).

SCENARIO_VMS=("a 11 peer")
SCENARIO_GUEST_TIMEOUT=900
# UD SEND Only with a DETH, both ways.
SCENARIO_EXPECT_PROTOCOLS="infiniband.bth.opcode==100 infiniband.deth"

RPINGPONG=${RPINGPONG:-${CARGO_TARGET_DIR:-$INTEROP_DIR/../target}/release/rpingpong}

host_main() {
  [ -x "$RPINGPONG" ] || { echo "missing $RPINGPONG: run cargo build --release -p rdma-perf"; return 1; }
  ns_add_ip 10.77.0.2
  local i ok=0
  # Round 1: the VM's ibv_ud_pingpong serves; retry while it boots.
  for i in $(seq 1 "$(tmo 200)"); do
    vms_alive || break
    if ns_run 90 "$RPINGPONG" 10.77.0.11 --bind 10.77.0.2 -g 1 -n 200 --ud -s 1000; then ok=1; break; fi
    sleep 3
  done
  [ $ok = 1 ] || { echo "our rpingpong client never completed against ibv_ud_pingpong"; return 1; }
  echo "round 1 passed: our client, Linux ibv_ud_pingpong server"
  # Round 2: we serve; the VM connects.
  ns_run 400 "$RPINGPONG" --bind 10.77.0.2 -g 1 -n 200 --ud -s 1000 || { echo "our rpingpong server failed"; return 1; }
  echo "round 2 passed: Linux ibv_ud_pingpong client, our server"
}

guest_peer() {
  step "ibv_ud_pingpong server for our client"
  timeout 600 ibv_ud_pingpong -d rxe0 -g 1 -n 200 -s 1000 || fail "ibv_ud_pingpong server exited $?"
  step "ibv_ud_pingpong client against our server"
  retry 300 "ibv_ud_pingpong client" timeout 120 ibv_ud_pingpong -d rxe0 -g 1 -n 200 -s 1000 10.77.0.2
}
