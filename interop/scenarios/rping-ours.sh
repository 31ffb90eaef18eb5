# shellcheck shell=bash
# rping-ours: our rrping (at 10.77.0.2 inside the namespace, soft RoCE NIC,
# MTU 1024) against librdmacm's rping on Linux rxe in VM a, both roles,
# 10 pings each with the data validated: round 1 Linux serves and our
# client validates (-V) what the server read by RDMA READ and wrote back by
# RDMA WRITE; round 2 we serve and Linux's client validates.
# Needs the binary: cargo build --release -p rdma-perf (RRPING overrides).

SCENARIO_VMS=("a 11 peer")
SCENARIO_GUEST_TIMEOUT=900
# RDMA CM MADs, SEND ONLY, RDMA WRITE ONLY, RDMA READ request and response.
SCENARIO_EXPECT_PROTOCOLS="infiniband.mad.mgmtclass==0x07 infiniband.bth.opcode==4 infiniband.bth.opcode==10 infiniband.bth.opcode==12 infiniband.bth.opcode==16"

RRPING=${RRPING:-${CARGO_TARGET_DIR:-$INTEROP_DIR/../target}/release/rrping}

host_main() {
  [ -x "$RRPING" ] || { echo "missing $RRPING: run cargo build --release -p rdma-perf"; return 1; }
  ns_add_ip 10.77.0.2
  # Round 1: Linux rping serves; retry while the VM boots, only a connect
  # that got no answer or a REJ (no listener yet), never a validation.
  retry_if_not_up 600 "rrping client" '^rrping: (connect to .*: connection (timed out|rejected)|port [0-9]+ of .* is [A-Za-z]+, not ACTIVE)' \
    "$RUN_DIR/round1.txt" ns_run 90 "$RRPING" -c -a 10.77.0.11 -I 10.77.0.2 -C 10 -v -V --timeout 5 ||
    return 1
  grep -q "rrping: 10 pings, 10 validated" "$RUN_DIR/round1.txt" ||
    { host_fail "our client did not validate 10 pings"; return 1; }
  echo "round 1 passed: our client validated 10 pings from Linux rping"
  # Round 2: we serve; Linux's client connects and validates.
  ns_run 400 "$RRPING" -s -a 10.77.0.2 -C 10 -v --timeout 300 > "$RUN_DIR/round2.txt" 2>&1 ||
    { cat "$RUN_DIR/round2.txt"; host_fail "our rping server failed"; return 1; }
  cat "$RUN_DIR/round2.txt"
  grep -q "rrping: 10 pings" "$RUN_DIR/round2.txt" || { host_fail "our server did not serve 10 pings"; return 1; }
  echo "round 2 passed: Linux rping client, our server"
}

guest_peer() {
  step "rping server for our client"
  timeout 600 rping -s -a 10.77.0.11 -C 10 -v || fail "rping server exited $?"
  step "rping client against our server"
  # Retried only while our server is not listening (rdma_cm's connect
  # fails): a validation failure fails at once.
  retry_if 300 "rping client" 'cma event RDMA_CM_EVENT_(REJECTED|UNREACHABLE|ADDR_ERROR|ROUTE_ERROR|CONNECT_ERROR)' \
    rping_past_teardown timeout 60 rping -c -a 10.77.0.2 -C 10 -v -V
}
