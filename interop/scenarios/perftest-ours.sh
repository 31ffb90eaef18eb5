# shellcheck shell=bash
# perftest-ours: our rperftest (at 10.77.0.2 inside the namespace, soft
# RoCE NIC, MTU 1024) against perftest's ib_write_bw, ib_read_bw and
# ib_send_bw on Linux rxe in VM a, RC, through perftest's own TCP exchange
# (port 18515). Round 1: Linux serves each test and our client runs it
# (our READ client checks every READ of a slot brings back the same bytes).
# Round 2: we serve and Linux's client runs it (our WRITE server checks
# every slot was written and nothing outside; our READ server that its
# source was not written; our SEND server that every message had -s bytes).
# Every run must complete and print a bandwidth on both sides. The three
# tests run with 64 KiB messages, then WRITE and READ again with 200-byte
# ones, which walk the peer's buffer in 256-byte steps (16 slots,
# wrapping), so both sides must agree on perftest's address walk: our
# WRITE server then checks all 16 slots were written and nothing else.
# Last, WRITE and READ again with 1 % of our NIC's datagrams dropped
# (SOFTROCE_FAULTS): our requester recovers its WRITEs and READ requests,
# rxe's requester our lost ACKs and READ responses. Where our side sends
# the data (our WRITE client, our READ server) our NIC's counters must show
# the recovery (retransmissions, or READs asked again).
#
# perftest turns clock ticks into seconds with a frequency it measures at
# the end of each run (a straight-line fit of ticks against wall time);
# under TCG on a busy host that fit can fail ("Correlation coefficient
# r^2: ... < 0.9"), and with -F the tool then prints a bandwidth of 0
# after a transfer that completed. A Linux client that says so runs again
# (at most PERFTEST_CLOCK_TRIES times, each a retry in the verdict), and
# our server, which prints that client's report, serves again while the
# report it got is all zeros. A Linux SEND server in round 1 (it times its
# own receives) that says so passes with a note: our client has finished
# by then, and the server exits 0 only after every message arrived. A
# zero without that message still fails.
#
# Our READ client keeps 16 READs in flight (-o, PERFTEST_READ_OUTS), as
# ib_read_bw does by default. Until e33eb0b this had to be 1: one READ
# response packet rxe dropped under TCG made our requester rewind to the
# start of the unfinished READ and re-send every READ in flight for each
# later response packet until the retry count ran out.
# Needs the binary: cargo build --release -p rdma-perf (RPERFTEST overrides).

SCENARIO_VMS=("a 11 peer")
SCENARIO_GUEST_TIMEOUT=900
# RDMA WRITE First/Last/Only, READ Request and Response First/Last/Only,
# SEND First/Last (64 KiB messages at MTU 1024) and ACKs.
SCENARIO_EXPECT_PROTOCOLS="infiniband.bth.opcode==6 infiniband.bth.opcode==8 infiniband.bth.opcode==10 infiniband.bth.opcode==12 infiniband.bth.opcode==13 infiniband.bth.opcode==15 infiniband.bth.opcode==16 infiniband.bth.opcode==0 infiniband.bth.opcode==2 infiniband.bth.opcode==17"

RPERFTEST=${RPERFTEST:-${CARGO_TARGET_DIR:-$INTEROP_DIR/../target}/release/rperftest}
# Runs as test:size:iterations[:lossy], in this order in both rounds
# (perftest wants the same size and count on both sides).
PERFTEST_RUNS="write:65536:100 read:65536:100 send:65536:100 write:200:300 read:200:300
  write:65536:100:lossy read:65536:100:lossy"
LOSS_SPEC=loss=0.01,seed=11
PERFTEST_READ_OUTS=${PERFTEST_READ_OUTS:-16}
# What perftest's TCP exchange gives while the peer's tool is not listening
# yet (ours, then Linux's); nothing else is retried.
# Our port is Down until the VM's tap gives the bridge a carrier
# (rperftest checks its port is ACTIVE before it starts).
OURS_NOT_UP='^rperftest: (connect to .*: (No route to host|Connection refused|Connection timed out)|port [0-9]+ of .* is [A-Za-z]+, not ACTIVE)'
LINUX_NOT_UP="Couldn't connect to"
# perftest's words when its clock calibration failed (see above).
PERFTEST_CLOCK_FAILED='Correlation coefficient r\^2'
PERFTEST_CLOCK_TRIES=3

# perftest_recovered FILE: our NIC retransmitted or saw requests again.
perftest_recovered() {
  awk -F', ' '/^ NIC: / { r = $2 + 0; d = $5 + 0 } END { exit !(r + d > 0) }' "$1"
}

# perftest_bw_line FILE SIZE ITERS: the result line, with a non-zero average.
perftest_bw_line() {
  awk -v s="$2" -v n="$3" '$1 == s && $2 == n && $4 + 0 > 0 { found = 1; print } END { exit !found }' "$1"
}

# perftest_zero_report FILE SIZE ITERS: the last result line is all zeros
# (peak, average and message rate): a peer that could not time its run.
perftest_zero_report() {
  awk -v s="$2" -v n="$3" '$1 == s && $2 == n { z = ($3 + 0 == 0 && $4 + 0 == 0 && $5 + 0 == 0) }
    END { exit !z }' "$1"
}

# perftest_serve_ours NOTE OUT SIZE ITERS CMD...: our server CMD (its
# output to OUT, then shown), run again while the last report it printed
# is all zeros (the Linux client could not time its run and runs again),
# at most PERFTEST_CLOCK_TRIES times; NOTE MSG ("DESC: REASON") records
# each rerun (host_retry_note or retry_note). Fails as CMD fails.
perftest_serve_ours() {
  local note=$1 out=$2 size=$3 n=$4 try
  shift 4
  for try in $(seq "$PERFTEST_CLOCK_TRIES"); do
    "$@" > "$out" 2>&1 || { cat "$out"; return 1; }
    cat "$out"
    [ "$try" -lt "$PERFTEST_CLOCK_TRIES" ] && perftest_zero_report "$out" "$size" "$n" || return 0
    "$note" "our server -s $size: the Linux client's report was all zeros (its clock calibration failed)"
  done
}

# perftest_linux_client FAIL SIZE ITERS DESC NOT_UP CMD...: in a guest, a
# Linux perftest client CMD, retried while our server is not up (output
# NOT_UP) and run again while it prints a bandwidth of 0 because its clock
# calibration failed, at most PERFTEST_CLOCK_TRIES times; its output in
# /tmp/client.txt. FAIL MSG ends the scenario when CMD fails.
perftest_linux_client() {
  local failfn=$1 size=$2 n=$3 desc=$4 not_up=$5 try
  shift 5
  for try in $(seq "$PERFTEST_CLOCK_TRIES"); do
    retry_if 300 "$desc" "$not_up" "$@" > /tmp/client.txt 2>&1 ||
      { cat /tmp/client.txt; "$failfn" "$desc failed"; }
    cat /tmp/client.txt
    perftest_bw_line /tmp/client.txt "$size" "$n" > /dev/null && return 0
    grep -q -E "$PERFTEST_CLOCK_FAILED" /tmp/client.txt && [ "$try" -lt "$PERFTEST_CLOCK_TRIES" ] ||
      fail "$desc printed no bandwidth"
    retry_note "$desc: bandwidth 0, as perftest's clock calibration failed ($(grep -E -m1 "$PERFTEST_CLOCK_FAILED" /tmp/client.txt))"
  done
}

# perftest_linux_server_ok OP SIZE ITERS FILE: a Linux server's output
# has a bandwidth, or it is a SEND server (which times its own run) whose
# clock calibration failed: that passes with a note.
perftest_linux_server_ok() {
  perftest_bw_line "$4" "$2" "$3" > /dev/null && return 0
  [ "$1" = send ] && grep -q -E "$PERFTEST_CLOCK_FAILED" "$4" || return 1
  retry_note "ib_$1_bw -s $2 server: all $3 messages arrived; bandwidth 0, as perftest's clock calibration failed ($(grep -E -m1 "$PERFTEST_CLOCK_FAILED" "$4"))"
}

host_main() {
  [ -x "$RPERFTEST" ] || { echo "missing $RPERFTEST: run cargo build --release -p rdma-perf"; return 1; }
  ns_add_ip 10.77.0.2
  local run op size n lossy out outs
  # Round 1: Linux serves; retry while the VM boots and between its servers.
  for run in $PERFTEST_RUNS; do
    IFS=: read -r op size n lossy <<< "$run"
    outs=()
    [ "$op" = read ] && outs=(-o "$PERFTEST_READ_OUTS")
    out=$RUN_DIR/ours-client-$op-$size${lossy:+-$lossy}.txt
    retry_if_not_up 600 "rperftest $op -s $size${lossy:+ $lossy} client" "$OURS_NOT_UP" "$out" \
      ns_run 120 env SOFTROCE_FAULTS="${lossy:+$LOSS_SPEC}" "$RPERFTEST" "$op" 10.77.0.11 --bind 10.77.0.2 -x 0 -d softroce0 -F \
        --report_gbits --timeout 60 -s "$size" -n "$n" "${outs[@]}" || return 1
    perftest_bw_line "$out" "$size" "$n" > /dev/null || { host_fail "our $op client printed no bandwidth"; return 1; }
    if [ -n "$lossy" ] && [ "$op" = write ]; then
      perftest_recovered "$out" || { host_fail "our lossy $op client shows no recovery"; return 1; }
    fi
    echo "round 1 $op -s $size${lossy:+ $lossy} passed: our client, Linux ib_${op}_bw server: $(perftest_bw_line "$out" "$size" "$n")"
  done
  # Round 2: we serve; the VM's clients connect (they retry until we listen).
  for run in $PERFTEST_RUNS; do
    IFS=: read -r op size n lossy <<< "$run"
    out=$RUN_DIR/ours-server-$op-$size${lossy:+-$lossy}.txt
    perftest_serve_ours host_retry_note "$out" "$size" "$n" \
      ns_run 400 env SOFTROCE_FAULTS="${lossy:+$LOSS_SPEC}" "$RPERFTEST" "$op" --bind 10.77.0.2 -x 0 -F --report_gbits \
        --timeout 300 -s "$size" -n "$n" || { host_fail "our $op server failed"; return 1; }
    perftest_bw_line "$out" "$size" "$n" > /dev/null || { host_fail "our $op server printed no bandwidth"; return 1; }
    if [ -n "$lossy" ] && [ "$op" = read ]; then
      perftest_recovered "$out" || { host_fail "our lossy $op server shows no recovery"; return 1; }
    fi
    echo "round 2 $op -s $size${lossy:+ $lossy} passed: Linux ib_${op}_bw client, our server: $(perftest_bw_line "$out" "$size" "$n")"
  done
  grep -q "all 16 slots were written; nothing outside them changed" "$RUN_DIR/ours-server-write-200.txt" ||
    { host_fail "our WRITE server did not see all 16 slots of the walk written"; return 1; }
}

guest_peer() {
  local run op size n _lossy idx
  wait_until 60 "an IPv4 RoCE v2 GID on rxe0" ipv4_gid_index
  idx=$(ipv4_gid_index)
  step "rxe0 IPv4 GID index $idx: $(cat "/sys/class/infiniband/rxe0/ports/1/gids/$idx")"
  step "perftest $(ib_write_bw --version 2>&1 | tr '\n' ' ')"
  for run in $PERFTEST_RUNS; do
    IFS=: read -r op size n _lossy <<< "$run"
    step "ib_${op}_bw -s $size server for our client"
    timeout 600 "ib_${op}_bw" -d rxe0 -x "$idx" -F --report_gbits -s "$size" -n "$n" \
        > "/tmp/server.txt" 2>&1 || { cat /tmp/server.txt; fail "ib_${op}_bw -s $size server exited $?"; }
    cat /tmp/server.txt
    perftest_linux_server_ok "$op" "$size" "$n" /tmp/server.txt ||
      fail "ib_${op}_bw -s $size server printed no bandwidth"
  done
  for run in $PERFTEST_RUNS; do
    IFS=: read -r op size n _lossy <<< "$run"
    step "ib_${op}_bw -s $size client against our server"
    perftest_linux_client fail "$size" "$n" "ib_${op}_bw -s $size client" "$LINUX_NOT_UP" \
      timeout 120 "ib_${op}_bw" -d rxe0 -x "$idx" -F --report_gbits -s "$size" -n "$n" 10.77.0.2
  done
}
