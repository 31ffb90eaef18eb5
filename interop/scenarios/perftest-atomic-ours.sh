# shellcheck shell=bash
# perftest-atomic-ours: our `rperftest atomic` (at 10.77.0.2 inside the
# namespace, soft RoCE NIC) against perftest's ib_atomic_bw and
# ib_atomic_lat on Linux rxe in VM a, RC, through perftest's own TCP
# exchange (port 18515), FETCH_AND_ADD and CMP_AND_SWAP each.
# Round 1: Linux serves and our client runs each test; it checks every
# value rxe's responder returns: a FETCH_AND_ADD slot's values count up by
# 1 from the first (perftest's buffers start random, so the first is the
# slot's initial value), so all are distinct and none is lost or applied
# twice; a CMP_AND_SWAP (perftest's compare 0, swap 0) returns the slot's
# first value every time. Round 2: we serve and Linux's client runs each
# test; our server checks each slot's final value (our pattern plus 1 per
# FETCH_AND_ADD the walk put on it; unchanged for CMP_AND_SWAP) and that
# nothing else in the buffer changed. Bandwidth walks perftest's 64 slots;
# latency hits one. Last, FETCH_AND_ADD bandwidth again in both rounds
# with 1 % of our NIC's datagrams dropped and 2 % duplicated
# (SOFTROCE_FAULTS): rxe as responder must answer our repeated atomics
# from its responder resources without executing them again (our client's
# count check sees any double add), and ours must do the same for rxe's
# (our server's final-value check). Every run prints a result line on the
# side that measures (bandwidth: both; latency: the client). Takes ~40 s
# under TCG on 2 shared cores (the VM's 31 s); first PASS 2026-11-28, rxe
# replaying our duplicated atomics and ours rxe's (115 repeats answered).
# Needs the binary: cargo build --release -p rdma-perf (RPERFTEST overrides).

# perftest_recovered, perftest_bw_line and RPERFTEST (ipv4_gid_index is in
# the guest library).
# shellcheck source=perftest-ours.sh
. "$(dirname "${BASH_SOURCE[0]}")/perftest-ours.sh"

SCENARIO_VMS=("a 11 peer")
SCENARIO_GUEST_TIMEOUT=900
# RC CompareSwap (19), FetchAdd (20), Atomic Acknowledge (18).
SCENARIO_EXPECT_PROTOCOLS="infiniband.bth.opcode==19 infiniband.bth.opcode==20 infiniband.bth.opcode==18"

# Runs as test:op:iterations[:lossy], in this order in both rounds
# (perftest wants the same count on both sides; our server checks -A).
ATOMIC_RUNS="bw:FETCH_AND_ADD:1000 bw:CMP_AND_SWAP:1000 lat:FETCH_AND_ADD:500 lat:CMP_AND_SWAP:500
  bw:FETCH_AND_ADD:1000:lossy"
ATOMIC_FAULTS=loss=0.01,dup=0.02,seed=13

# atomic_result FILE ITERS: the result line of 8 bytes x ITERS.
atomic_result() {
  awk -v n="$2" '$1 == 8 && $2 == n { found = 1; print } END { exit !found }' "$1"
}

# atomic_checked FILE OP ROLE: the line saying what our side verified.
atomic_checked() {
  local want
  case $3:$2 in
    client:FETCH_AND_ADD) want="every FETCH_AND_ADD returned the value before it on its slot plus 1" ;;
    client:CMP_AND_SWAP) want="every CMP_AND_SWAP (compare 0, swap 0) of a slot returned the same value as the first" ;;
    server:FETCH_AND_ADD) want="initial value plus 1 per FETCH_AND_ADD" ;;
    server:CMP_AND_SWAP) want="nonzero initial value" ;;
  esac
  grep -F " verified: " "$1" | grep -F "$want"
}

host_main() {
  [ -x "$RPERFTEST" ] || { echo "missing $RPERFTEST: run cargo build --release -p rdma-perf"; return 1; }
  ns_add_ip 10.77.0.2
  local run test op n lossy out lat
  # Round 1: Linux serves; retry while the VM boots and between its servers.
  for run in $ATOMIC_RUNS; do
    IFS=: read -r test op n lossy <<< "$run"
    lat=()
    [ "$test" = lat ] && lat=(--lat)
    out=$RUN_DIR/ours-client-$test-$op${lossy:+-$lossy}.txt
    retry_if_not_up 600 "rperftest atomic $test $op${lossy:+ $lossy} client" "$OURS_NOT_UP" "$out" \
      ns_run 120 env SOFTROCE_FAULTS="${lossy:+$ATOMIC_FAULTS}" "$RPERFTEST" atomic 10.77.0.11 --bind 10.77.0.2 -x 0 \
        -d softroce0 -F --report_gbits --timeout 60 -A "$op" "${lat[@]}" -n "$n" || return 1
    atomic_result "$out" "$n" > /dev/null || { host_fail "our atomic $op $test client printed no result"; return 1; }
    atomic_checked "$out" "$op" client > /dev/null || { host_fail "our atomic $op $test client verified nothing"; return 1; }
    if [ -n "$lossy" ]; then
      perftest_recovered "$out" || { host_fail "our lossy atomic client shows no recovery"; return 1; }
    fi
    echo "round 1 $test $op${lossy:+ $lossy} passed: our client, Linux ib_atomic_$test server: $(atomic_checked "$out" "$op" client)"
  done
  # Round 2: we serve; the VM's clients connect (they retry until we listen).
  for run in $ATOMIC_RUNS; do
    IFS=: read -r test op n lossy <<< "$run"
    lat=()
    [ "$test" = lat ] && lat=(--lat)
    out=$RUN_DIR/ours-server-$test-$op${lossy:+-$lossy}.txt
    ns_run 400 env SOFTROCE_FAULTS="${lossy:+$ATOMIC_FAULTS}" "$RPERFTEST" atomic --bind 10.77.0.2 -x 0 -F --report_gbits \
        --timeout 300 -A "$op" "${lat[@]}" -n "$n" > "$out" 2>&1 || { cat "$out"; host_fail "our atomic $op $test server failed"; return 1; }
    cat "$out"
    if [ "$test" = bw ]; then
      atomic_result "$out" "$n" > /dev/null || { host_fail "our atomic $op server printed no bandwidth"; return 1; }
    fi
    atomic_checked "$out" "$op" server > /dev/null || { host_fail "our atomic $op $test server verified nothing"; return 1; }
    if [ -n "$lossy" ]; then
      perftest_recovered "$out" || { host_fail "our lossy atomic server shows no recovery"; return 1; }
    fi
    echo "round 2 $test $op${lossy:+ $lossy} passed: Linux ib_atomic_$test client, our server: $(atomic_checked "$out" "$op" server)"
  done
}

guest_peer() {
  local run test op n _lossy idx
  wait_until 60 "an IPv4 RoCE v2 GID on rxe0" ipv4_gid_index
  idx=$(ipv4_gid_index)
  step "rxe0 IPv4 GID index $idx: $(cat "/sys/class/infiniband/rxe0/ports/1/gids/$idx")"
  step "perftest $(ib_atomic_bw --version 2>&1 | tr '\n' ' ')"
  for run in $ATOMIC_RUNS; do
    IFS=: read -r test op n _lossy <<< "$run"
    step "ib_atomic_$test -A $op server for our client"
    timeout 600 "ib_atomic_$test" -d rxe0 -x "$idx" -F -A "$op" -n "$n" \
        > /tmp/server.txt 2>&1 || { cat /tmp/server.txt; fail "ib_atomic_$test -A $op server exited $?"; }
    cat /tmp/server.txt
    if [ "$test" = bw ]; then
      atomic_result /tmp/server.txt "$n" > /dev/null || fail "ib_atomic_bw -A $op server printed no bandwidth"
    fi
  done
  for run in $ATOMIC_RUNS; do
    IFS=: read -r test op n _lossy <<< "$run"
    step "ib_atomic_$test -A $op client against our server"
    retry_if 300 "ib_atomic_$test -A $op client" "$LINUX_NOT_UP" timeout 120 "ib_atomic_$test" -d rxe0 -x "$idx" -F \
        -A "$op" -n "$n" 10.77.0.2 > /tmp/client.txt 2>&1 ||
      { cat /tmp/client.txt; fail "ib_atomic_$test -A $op client failed"; }
    cat /tmp/client.txt
    atomic_result /tmp/client.txt "$n" > /dev/null || fail "ib_atomic_$test -A $op client printed no result"
  done
}
