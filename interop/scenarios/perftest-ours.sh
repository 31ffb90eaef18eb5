# shellcheck shell=bash
# perftest-ours: our rperftest (at 10.77.0.2 inside the namespace, soft
# RoCE NIC, MTU 1024) against perftest's ib_write_bw, ib_read_bw and
# ib_send_bw on Linux rxe in VM a, RC, through perftest's own TCP exchange
# (port 18515). Round 1: Linux serves each test and our client runs it
# (our READ client checks every READ of a slot brings back the same bytes).
# Round 2: we serve and Linux's client runs it (our WRITE server checks
# every slot was written and nothing outside; our READ server that its
# source was not written; our SEND server that every message had -s bytes).
# Every run must complete and print a bandwidth on both sides.
# Needs the binary: cargo build --release -p rdma-perf (RPERFTEST overrides).

SCENARIO_VMS=("a 11 peer")
SCENARIO_GUEST_TIMEOUT=900
# RDMA WRITE First/Last, READ Request and Response First/Last, SEND
# First/Last (64 KiB messages at MTU 1024) and ACKs.
SCENARIO_EXPECT_PROTOCOLS="infiniband.bth.opcode==6 infiniband.bth.opcode==8 infiniband.bth.opcode==12 infiniband.bth.opcode==13 infiniband.bth.opcode==15 infiniband.bth.opcode==0 infiniband.bth.opcode==2 infiniband.bth.opcode==17"

RPERFTEST=${RPERFTEST:-${CARGO_TARGET_DIR:-$INTEROP_DIR/../target}/release/rperftest}
# Same size and count on both sides, as perftest wants.
PERFTEST_ARGS="-s 65536 -n 100"

# A result line: " 65536      100   <peak>   <average>   <rate>" with a
# non-zero average.
perftest_bw_line() {
  awk '$1 == 65536 && $2 == 100 && $4 + 0 > 0 { found = 1; print } END { exit !found }' "$1"
}

host_main() {
  [ -x "$RPERFTEST" ] || { echo "missing $RPERFTEST: run cargo build --release -p rdma-perf"; return 1; }
  ns_add_ip 10.77.0.2
  local op i ok out
  # Round 1: Linux serves; retry while the VM boots and between its servers.
  for op in write read send; do
    ok=0
    out=$RUN_DIR/ours-client-$op.txt
    for i in $(seq 1 "$(tmo 200)"); do
      vms_alive || break
      # shellcheck disable=SC2086
      if ns_run 120 "$RPERFTEST" "$op" 10.77.0.11 --bind 10.77.0.2 -x 0 -d softroce0 -F \
          --report_gbits --timeout 60 $PERFTEST_ARGS > "$out" 2>&1; then ok=1; break; fi
      cat "$out" >> "$RUN_DIR/ours-client-$op-attempts.txt"
      sleep 2
    done
    cat "$out"
    [ $ok = 1 ] || { echo "our $op client never completed against Linux ib_${op}_bw"; return 1; }
    perftest_bw_line "$out" > /dev/null || { echo "our $op client printed no bandwidth"; return 1; }
    echo "round 1 $op passed: our client, Linux ib_${op}_bw server: $(perftest_bw_line "$out")"
  done
  # Round 2: we serve; the VM's clients connect (they retry until we listen).
  for op in write read send; do
    out=$RUN_DIR/ours-server-$op.txt
    # shellcheck disable=SC2086
    ns_run 400 "$RPERFTEST" "$op" --bind 10.77.0.2 -x 0 -F --report_gbits --timeout 300 \
        $PERFTEST_ARGS > "$out" 2>&1 || { cat "$out"; echo "our $op server failed"; return 1; }
    cat "$out"
    perftest_bw_line "$out" > /dev/null || { echo "our $op server printed no bandwidth"; return 1; }
    echo "round 2 $op passed: Linux ib_${op}_bw client, our server: $(perftest_bw_line "$out")"
  done
}

# The index of rxe0's IPv4-mapped (RoCE v2) GID, as show_gids would list it.
ipv4_gid_index() {
  local f n g
  for f in /sys/class/infiniband/rxe0/ports/1/gids/*; do
    n=${f##*/}
    g=$(cat "$f" 2>/dev/null) || continue
    case $g in
      0000:0000:0000:0000:0000:ffff:*)
        [ "$(cat "/sys/class/infiniband/rxe0/ports/1/gid_attrs/types/$n" 2>/dev/null)" = "RoCE v2" ] &&
          { echo "$n"; return 0; } ;;
    esac
  done
  return 1
}

guest_peer() {
  local op idx
  wait_until 60 "an IPv4 RoCE v2 GID on rxe0" ipv4_gid_index
  idx=$(ipv4_gid_index)
  step "rxe0 IPv4 GID index $idx: $(cat "/sys/class/infiniband/rxe0/ports/1/gids/$idx")"
  step "perftest $(ib_write_bw --version 2>&1 | tr '\n' ' ')"
  for op in write read send; do
    step "ib_${op}_bw server for our client"
    # shellcheck disable=SC2086
    timeout 600 "ib_${op}_bw" -d rxe0 -x "$idx" -F --report_gbits $PERFTEST_ARGS \
        > "/tmp/server-$op.txt" 2>&1 || { cat "/tmp/server-$op.txt"; fail "ib_${op}_bw server exited $?"; }
    cat "/tmp/server-$op.txt"
    perftest_bw_line "/tmp/server-$op.txt" > /dev/null || fail "ib_${op}_bw server printed no bandwidth"
  done
  for op in write read send; do
    step "ib_${op}_bw client against our server"
    # shellcheck disable=SC2086
    retry 300 "ib_${op}_bw client" timeout 120 "ib_${op}_bw" -d rxe0 -x "$idx" -F --report_gbits \
        $PERFTEST_ARGS 10.77.0.2 > "/tmp/client-$op.txt" 2>&1 ||
      { cat "/tmp/client-$op.txt"; fail "ib_${op}_bw client failed"; }
    cat "/tmp/client-$op.txt"
    perftest_bw_line "/tmp/client-$op.txt" > /dev/null || fail "ib_${op}_bw client printed no bandwidth"
  done
}
