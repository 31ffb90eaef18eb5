# shellcheck shell=bash
# Shared body of the rxe-*-pingpong-ours scenarios: our rpingpong (at
# 10.77.0.2 inside the namespace) against rdma-core's ibv_*_pingpong in VM a,
# both roles. The scenario file sets PP_TOOL (the VM's tool), PP_ARGS (its
# extra arguments) and OUR_ARGS (rpingpong's), then sources this file.
# Needs the binary: cargo build --release -p rdma-perf (RPINGPONG overrides
# the path).

SCENARIO_VMS=("a 11 peer")
SCENARIO_GUEST_TIMEOUT=900

RPINGPONG=${RPINGPONG:-${CARGO_TARGET_DIR:-$INTEROP_DIR/../target}/release/rpingpong}
# What the TCP exchange says while the peer's tool is not listening yet;
# nothing else is retried (a failure after the exchange is ours to explain).
# Our port is Down until the VM's tap gives the bridge a carrier.
PP_NOT_UP='^rpingpong: (out-of-band exchange on .*: (No route to host|Connection refused|Connection timed out)|port [0-9]+ of .* is [A-Za-z]+, not ACTIVE)'

host_main() {
  [ -x "$RPINGPONG" ] || { echo "missing $RPINGPONG: run cargo build --release -p rdma-perf"; return 1; }
  ns_add_ip 10.77.0.2
  # Round 1: the VM's tool serves; retry while the VM boots.
  # shellcheck disable=SC2086
  retry_if_not_up 600 "rpingpong client" "$PP_NOT_UP" "$RUN_DIR/round1.txt" \
    ns_run 90 "$RPINGPONG" 10.77.0.11 --bind 10.77.0.2 -g 1 -n 200 $OUR_ARGS || return 1
  echo "round 1 passed: our client, Linux $PP_TOOL server"
  # Round 2: we serve; the VM connects.
  # shellcheck disable=SC2086
  ns_run 400 "$RPINGPONG" --bind 10.77.0.2 -g 1 -n 200 $OUR_ARGS || { host_fail "our rpingpong server failed"; return 1; }
  echo "round 2 passed: Linux $PP_TOOL client, our server"
}

guest_peer() {
  step "$PP_TOOL server for our client"
  # shellcheck disable=SC2086
  timeout 600 "$PP_TOOL" -d rxe0 -g 1 -n 200 $PP_ARGS || fail "$PP_TOOL server exited $?"
  step "$PP_TOOL client against our server"
  # Retried only while our server does not listen yet.
  # shellcheck disable=SC2086
  retry_if 300 "$PP_TOOL client" "Couldn't connect to" timeout 120 "$PP_TOOL" -d rxe0 -g 1 -n 200 $PP_ARGS 10.77.0.2
}
