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
# Each case's result is printed as `CONFORMANCE <config> <case> ok|FAILED`
# (a declared gap's case passes and prints `SKIPPED <case>: provider lacks
# <feature>`). The scenario passes when exactly the cases of RXE_DEVIATIONS
# fail: what Linux 6.1's rxe does differently from the suite, each seen in
# this scenario's output (a case of the list that passes fails the
# scenario too, so the list stays true).
#
# Last, rdmacore_events on the pair's rxe2 (rxe0 without a pair): its
# interface down and up (PortDown, PortActive), then `rdma link delete`
# under open objects (CaRemoval, every destroy after it succeeds).
#
# Needs the test binaries: cargo test --release -p rdmacore --test
# rdmacore_conformance --test rdmacore_events --no-run
# (RDMACORE_CONFORMANCE and RDMACORE_EVENTS override the paths; default:
# the newest of each built).

SCENARIO_VMS=("a 11 suite")

# Linux 6.1 rxe, as the suite meets it (the device's answers, passed on
# unchanged by the provider):
# - cq_notify_wait_overflow: a CQ asked for 2 entries holds 3 (rxe rounds
#   to a power of two less one), so 3 completions raise no CQ error;
# - local_protection_error, sqe_and_resume: a SEND with a bad L_Key
#   completes LOC_QP_OP_ERR, not LOC_PROT_ERR;
# - receive_too_small: the responder's too-small receive completes
#   LOC_QP_OP_ERR, not LOC_LEN_ERR;
# - remote_operational_error: a receive with a bad L_Key completes
#   LOC_QP_OP_ERR, not LOC_PROT_ERR;
# - rc_atomics: an atomic to an address not 8-aligned is refused at post
#   (EINVAL from librxe), not NAKed by the responder (REM_INV_REQ_ERR);
# - rc_send: no COMM_EST event when the first message reaches a QP in RTR;
# - remote_access_errors_and_flush: no affiliated error event at the
#   responder that refused an R_Key (its QP goes to ERR silently);
# - mw_type1: an RDMA WRITE through a type 1 window, past the window's
#   end but inside its MR, succeeds (rxe checks the range of the MR, not
#   the window's);
# - mw_refusals: a SEND with invalidate of an MR's R_Key completes
#   successfully at the sender (rxe refuses the invalidation at the
#   responder only: "rxe_invalidate_mr: mr->type (3) is wrong type");
# - mw_type2_and_invalidate: a second local invalidate of a type 2 window
#   is refused at post by the provider instead of completing MW_BIND_ERR
#   (rxe would invalidate the free window again and dereference its
#   cleared QP pointer in the kernel);
# - skip_list_matches_gaps: runs every case, so fails with the first above.
RXE_DEVIATIONS="cq_notify_wait_overflow local_protection_error sqe_and_resume receive_too_small
  remote_operational_error rc_atomics rc_send remote_access_errors_and_flush mw_type1 mw_refusals
  mw_type2_and_invalidate skip_list_matches_gaps"
SCENARIO_GUEST_TIMEOUT=1500

# newest_test NAME: the newest release build of test binary NAME.
newest_test() {
  # shellcheck disable=SC2012
  ls -t "${CARGO_TARGET_DIR:-$INTEROP_DIR/../target}"/release/deps/"$1"-* 2>/dev/null | grep -v '\.d$' | head -1
}
if [ -n "${INTEROP_DIR:-}" ]; then
  RDMACORE_CONFORMANCE=${RDMACORE_CONFORMANCE:-$(newest_test rdmacore_conformance)}
  RDMACORE_EVENTS=${RDMACORE_EVENTS:-$(newest_test rdmacore_events)}
fi
SCENARIO_GUEST_BINS="${RDMACORE_CONFORMANCE:-} ${RDMACORE_EVENTS:-}"

host_main() {
  local b
  for b in "$RDMACORE_CONFORMANCE" "$RDMACORE_EVENTS"; do
    [ -n "$b" ] && [ -x "$b" ] || {
      echo "missing the rdmacore test binaries: cargo test --release -p rdmacore --test rdmacore_conformance --test rdmacore_events --no-run"
      return 1
    }
  done
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
  bin=$(ls /interop/bin/rdmacore_conformance-*)
  out=/tmp/suite-$config.txt
  step "conformance suite on $devices"
  # One case at a time; --show-output keeps the SKIPPED lines of the
  # cases that pass.
  RDMACORE_TEST_DEVICES=$devices RUST_BACKTRACE=0 timeout 900 "$bin" --test-threads=1 --show-output >"$out" 2>&1 || rc=$?
  cat "$out"
  local name verdict expected unexpected= n=0 known why
  # shellcheck disable=SC2086
  known=" $(echo $RXE_DEVIATIONS) "
  # (No process substitution: the guest has no /dev/fd.)
  sed -nE 's/^test (.*) \.\.\. (ok|FAILED)$/\1 \2/p' "$out" >"$out.cases"
  while read -r name verdict; do
    n=$((n + 1))
    case $known in
      *" $name "*) expected=FAILED ;;
      *) expected=ok ;;
    esac
    if [ "$verdict" = ok ] && [ "$expected" = ok ]; then
      why=$(sed -n "s/^SKIPPED $name: //p" "$out" | head -1)
      echo "CONFORMANCE $config $name ok${why:+ (skipped: $why)}"
    elif [ "$verdict" = FAILED ] && [ "$expected" = FAILED ]; then
      echo "CONFORMANCE $config $name FAILED (a known rxe deviation)"
    else
      echo "CONFORMANCE $config $name $verdict (expected $expected)"
      unexpected="${unexpected:+$unexpected, }$name $verdict"
    fi
  done <"$out.cases"
  [ "$n" -gt 0 ] || unexpected="no case ran (exit $rc)"
  [ -z "$unexpected" ] || SUITE_FAILED="${SUITE_FAILED:+$SUITE_FAILED; }$config: $unexpected"
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
    events=rxe2:vb
  else
    step "no veth module in the image: the two-device run is left out (add veth to GUEST_MODULES)"
    events=rxe0:eth0
  fi
  step "rdmacore_events on $events"
  RDMACORE_TEST_EVENTS=$events RUST_BACKTRACE=0 timeout 300 /interop/bin/rdmacore_events-* --test-threads=1 ||
    SUITE_FAILED="${SUITE_FAILED:+$SUITE_FAILED; }rdmacore_events on $events failed"
  [ -z "$SUITE_FAILED" ] || fail "conformance: $SUITE_FAILED"
}
