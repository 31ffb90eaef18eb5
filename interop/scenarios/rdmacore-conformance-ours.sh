# shellcheck shell=bash
# rdmacore-conformance-ours: the verbs conformance suite against our
# rdma-core provider (crates/rdmacore) on Linux rxe, inside one VM.
# - loopback: both CAs of the suite are rxe0 (on eth0), its QPs talking
#   through rxe's loopback path (source address = destination address).
# - pair (when the image has the veth module, interop/lib/build.sh
#   GUEST_MODULES): two rxe devices, rxe1 and rxe2, on the two ends of a
#   veth pair whose addresses (10.99.0.1, 10.99.0.2) reach each other
#   through the pair, not the local table (policy routing: rxe takes a
#   packet for the device it arrived on, and a locally routed one arrives
#   on lo). Linux's own ibv_rc_pingpong runs rxe1 to rxe2 first, so a
#   broken pair fails as such.
# Each case's result is printed as
# `CONFORMANCE <config> <case> ok|FAILED` (a declared gap's case passes and
# prints `SKIPPED <case>: provider lacks <feature>`); the scenario passes
# when no case fails.
#
# Needs the test binary: cargo test --release -p rdmacore --test
# rdmacore_conformance --no-run (RDMACORE_CONFORMANCE overrides the path;
# default: the newest one built).

SCENARIO_VMS=("a 11 suite")
SCENARIO_GUEST_TIMEOUT=1500

if [ -z "${RDMACORE_CONFORMANCE:-}" ] && [ -n "${INTEROP_DIR:-}" ]; then
  # shellcheck disable=SC2012
  RDMACORE_CONFORMANCE=$(ls -t "${CARGO_TARGET_DIR:-$INTEROP_DIR/../target}"/release/deps/rdmacore_conformance-* 2>/dev/null |
    grep -v '\.d$' | head -1)
fi
SCENARIO_GUEST_BINS="${RDMACORE_CONFORMANCE:-}"

host_main() {
  [ -n "$RDMACORE_CONFORMANCE" ] && [ -x "$RDMACORE_CONFORMANCE" ] || {
    echo "missing the rdmacore conformance binary: cargo test --release -p rdmacore --test rdmacore_conformance --no-run"
    return 1
  }
}

# The veth pair and its two rxe devices.
rdmacore_pair() {
  local i
  ip link add va type veth peer name vb
  ip addr add 10.99.0.1/24 dev va
  ip addr add 10.99.0.2/24 dev vb
  ip link set va up
  ip link set vb up
  # A packet from one local address to the other leaves by the pair and
  # is taken as local where it arrives.
  for i in all default va vb; do
    echo 1 >/proc/sys/net/ipv4/conf/$i/accept_local
    echo 0 >/proc/sys/net/ipv4/conf/$i/rp_filter
  done
  ip rule add pref 100 lookup local
  ip rule del pref 0 lookup local
  ip rule add pref 10 iif va lookup local
  ip rule add pref 11 iif vb lookup local
  ip route add 10.99.0.2/32 dev va src 10.99.0.1 table 101
  ip route add 10.99.0.1/32 dev vb src 10.99.0.2 table 102
  ip rule add pref 20 from 10.99.0.1 to 10.99.0.2 lookup 101
  ip rule add pref 21 from 10.99.0.2 to 10.99.0.1 lookup 102
  ip neigh replace 10.99.0.2 lladdr "$(cat /sys/class/net/vb/address)" dev va nud permanent
  ip neigh replace 10.99.0.1 lladdr "$(cat /sys/class/net/va/address)" dev vb nud permanent
  rdma link add rxe1 type rxe netdev va
  rdma link add rxe2 type rxe netdev vb
  for i in rxe1 rxe2; do
    wait_until 60 "$i port ACTIVE" grep -q ACTIVE /sys/class/infiniband/$i/ports/1/state
    wait_until 60 "$i GID index 1" grep -q ffff /sys/class/infiniband/$i/ports/1/gids/1
    step "$i GID1 $(cat /sys/class/infiniband/$i/ports/1/gids/1)"
  done
}

# run_suite CONFIG DEVICES: the suite on DEVICES; its per-case lines.
run_suite() {
  local config=$1 devices=$2 bin out rc=0
  bin=$(ls /interop/bin/rdmacore_conformance-* | head -1)
  out=/tmp/suite-$config.txt
  step "conformance suite on $devices"
  # One case at a time; --show-output keeps the SKIPPED lines of the
  # cases that pass.
  RDMACORE_TEST_DEVICES=$devices RUST_BACKTRACE=0 timeout 900 "$bin" --test-threads=1 --show-output >"$out" 2>&1 || rc=$?
  cat "$out"
  grep -E '^test .* \.\.\. (ok|FAILED)$' "$out" | sed -E "s/^test (.*) \.\.\. /CONFORMANCE $config \1 /"
  if [ "$rc" != 0 ]; then
    SUITE_FAILED="${SUITE_FAILED:+$SUITE_FAILED; }$config: $(grep -cE '\.\.\. FAILED$' "$out") case(s) failed (exit $rc)"
  fi
}

guest_suite() {
  SUITE_FAILED=
  # Something for the bridge capture: the suite's packets stay in the VM.
  busybox ping -c 3 -W 2 "$(host_ip host)" >/dev/null || true
  run_suite loopback rxe0
  if modprobe veth 2>/dev/null; then
    rdmacore_pair
    step "ibv_rc_pingpong rxe1 -> rxe2 (the pair works for Linux's tools)"
    timeout 120 ibv_rc_pingpong -d rxe1 -g 1 -n 20 >/tmp/pp-server.txt 2>&1 &
    sleep 1
    retry_if 60 "ibv_rc_pingpong client" "Couldn't connect to" \
      timeout 60 ibv_rc_pingpong -d rxe2 -g 1 -n 20 10.99.0.1
    wait || fail "ibv_rc_pingpong server: $(tail -1 /tmp/pp-server.txt)"
    run_suite pair rxe1,rxe2
  else
    step "no veth module in the image: the two-device run is left out (add veth to GUEST_MODULES)"
  fi
  [ -z "$SUITE_FAILED" ] || fail "conformance: $SUITE_FAILED"
}
