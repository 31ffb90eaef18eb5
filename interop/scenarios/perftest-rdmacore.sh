# shellcheck shell=bash
# perftest-rdmacore: our rperftest on our rdma-core provider (`--device
# rxe0`: Linux rxe through libibverbs) in VM b against perftest's
# ib_write_bw, ib_read_bw and ib_send_bw on rxe in VM a, RC, through
# perftest's own TCP exchange (port 18515), with perftest-ours' checks
# but no lossy round (its faults are our soft NIC's). Round 1: Linux
# serves each test and our client runs it (our READ client checks every
# READ of a slot brings back the same bytes). Round 2: we serve and
# Linux's client runs it (our WRITE server checks every slot was written
# and nothing outside; our READ server that its source was not written;
# our SEND server that every message had -s bytes). Every run must
# complete and print a bandwidth on both sides; 64 KiB messages, then
# WRITE and READ with 200-byte ones (perftest's address walk, 16 slots).
# Then rrping --device rxe0 against librdmacm's rping, both roles, its
# connections by the kernel's RDMA CM (-V: our client
# validates every ping); and rpingpong --device rxe0 against
# ibv_rc_pingpong, both roles (200 exchanges of 4 KiB).
# Needs the binaries: cargo build --release -p rdma-perf (RPERFTEST,
# RRPING, RPINGPONG override).

# shellcheck source=perftest-ours.sh
. "$(dirname "${BASH_SOURCE[0]}")/perftest-ours.sh"
unset -f host_main guest_peer

SCENARIO_VMS=("a 11 peer" "b 12 ours")
SCENARIO_GUEST_TIMEOUT=1500
# perftest-ours' opcodes, and CM MADs (rping's connections).
SCENARIO_EXPECT_PROTOCOLS="$SCENARIO_EXPECT_PROTOCOLS infiniband.mad.mgmtclass==0x07"
RRPING=${RRPING:-$(dirname "$RPERFTEST")/rrping}
RPINGPONG=${RPINGPONG:-$(dirname "$RPERFTEST")/rpingpong}
SCENARIO_GUEST_BINS="$RPERFTEST $RRPING $RPINGPONG"
PERFTEST_RUNS="write:65536:100 read:65536:100 send:65536:100 write:200:300 read:200:300"
# What our client gives while Linux's server is not listening yet.
OURS_NOT_UP='^rperftest: connect to .*: (No route to host|Connection refused|Connection timed out)'
RPING_OURS_NOT_UP='^rrping: connect to .*: connection (timed out|rejected)'
PP_OURS_NOT_UP='^rpingpong: out-of-band exchange on .*: (No route to host|Connection refused|Connection timed out)'
RPING_LINUX_NOT_UP='cma event RDMA_CM_EVENT_(REJECTED|UNREACHABLE|ADDR_ERROR|ROUTE_ERROR|CONNECT_ERROR)'

host_main() {
  local b
  for b in "$RPERFTEST" "$RRPING" "$RPINGPONG"; do
    [ -x "$b" ] || { echo "missing $b: run cargo build --release -p rdma-perf"; return 1; }
  done
}

# Linux's tools in VM a: servers for round 1, clients for round 2.
guest_peer() {
  local run op size n idx b rc
  b=$(host_ip b)
  wait_until 60 "an IPv4 RoCE v2 GID on rxe0" ipv4_gid_index
  idx=$(ipv4_gid_index)
  step "rxe0 IPv4 GID index $idx: $(cat "/sys/class/infiniband/rxe0/ports/1/gids/$idx")"
  for run in $PERFTEST_RUNS; do
    IFS=: read -r op size n <<< "$run"
    step "ib_${op}_bw -s $size server for our client"
    timeout 600 "ib_${op}_bw" -d rxe0 -x "$idx" -F --report_gbits -s "$size" -n "$n" \
        > /tmp/server.txt 2>&1 || { rc=$?; cat /tmp/server.txt; fail "ib_${op}_bw -s $size server exited $rc"; }
    cat /tmp/server.txt
    perftest_linux_server_ok "$op" "$size" "$n" /tmp/server.txt ||
      fail "ib_${op}_bw -s $size server printed no bandwidth"
    step "round 1 ib_${op}_bw -s $size server: $(perftest_bw_line /tmp/server.txt "$size" "$n")"
  done
  for run in $PERFTEST_RUNS; do
    IFS=: read -r op size n <<< "$run"
    step "ib_${op}_bw -s $size client against our server"
    perftest_linux_client fail "$size" "$n" "ib_${op}_bw -s $size client" "$LINUX_NOT_UP" \
      timeout 120 "ib_${op}_bw" -d rxe0 -x "$idx" -F --report_gbits -s "$size" -n "$n" "$b"
    step "round 2 ib_${op}_bw -s $size client: $(perftest_bw_line /tmp/client.txt "$size" "$n")"
  done
  step "rping server for our client"
  timeout 300 rping -s -a "$(my_ip)" -C 10 -v > /tmp/rping.txt 2>&1 ||
    { rc=$?; cat /tmp/rping.txt; fail "rping server exited $rc"; }
  cat /tmp/rping.txt
  step "rping client against our server"
  retry_if 300 "rping client" "$RPING_LINUX_NOT_UP" timeout 60 rping -c -a "$b" -C 10 -v -V
  step "ibv_rc_pingpong server for our client"
  timeout 300 ibv_rc_pingpong -d rxe0 -g "$idx" -n 200 || fail "ibv_rc_pingpong server exited $?"
  step "ibv_rc_pingpong client against our server"
  retry_if 300 "ibv_rc_pingpong client" "$LINUX_NOT_UP" timeout 120 ibv_rc_pingpong -d rxe0 -g "$idx" -n 200 "$b"
}

# Our tools on rxe0 in VM b: clients for round 1, servers for round 2.
guest_ours() {
  local run op size n outs out a
  a=$(host_ip a)
  wait_until 60 "rxe0 port ACTIVE" rxe_active
  wait_until 60 "an IPv4 RoCE v2 GID on rxe0" ipv4_gid_index
  for run in $PERFTEST_RUNS; do
    IFS=: read -r op size n <<< "$run"
    outs=()
    [ "$op" = read ] && outs=(-o "$PERFTEST_READ_OUTS")
    out=/tmp/ours-client-$op-$size.txt
    step "rperftest $op -s $size --device rxe0 client"
    retry_if 600 "rperftest $op -s $size client" "$OURS_NOT_UP" timeout 120 /interop/bin/rperftest "$op" "$a" \
        --device rxe0 -F --report_gbits --timeout 60 -s "$size" -n "$n" "${outs[@]}" > "$out" 2>&1 ||
      { cat "$out"; fail "rperftest $op -s $size client failed"; }
    cat "$out"
    perftest_bw_line "$out" "$size" "$n" > /dev/null || fail "our $op -s $size client printed no bandwidth"
    grep -q "Device *: rxe0" "$out" || fail "our $op client did not run on rxe0"
    step "round 1 $op -s $size passed: our client on rxe0, Linux ib_${op}_bw server: $(perftest_bw_line "$out" "$size" "$n")"
  done
  for run in $PERFTEST_RUNS; do
    IFS=: read -r op size n <<< "$run"
    out=/tmp/ours-server-$op-$size.txt
    step "rperftest $op -s $size --device rxe0 server"
    perftest_serve_ours retry_note "$out" "$size" "$n" timeout 400 /interop/bin/rperftest "$op" --device rxe0 \
        -F --report_gbits --timeout 300 -s "$size" -n "$n" || fail "our $op -s $size server failed"
    perftest_bw_line "$out" "$size" "$n" > /dev/null || fail "our $op -s $size server printed no bandwidth"
    step "round 2 $op -s $size passed: Linux ib_${op}_bw client, our server on rxe0: $(perftest_bw_line "$out" "$size" "$n")"
  done
  grep -q "all 16 slots were written; nothing outside them changed" /tmp/ours-server-write-200.txt ||
    fail "our WRITE server did not see all 16 slots of the walk written"
  step "rrping --device rxe0 client"
  retry_if 300 "rrping client" "$RPING_OURS_NOT_UP" timeout 90 /interop/bin/rrping -c -a "$a" --device rxe0 \
      -C 10 -v -V --timeout 5 > /tmp/rrping-client.txt 2>&1 ||
    { cat /tmp/rrping-client.txt; fail "rrping client failed"; }
  cat /tmp/rrping-client.txt
  grep -q "rrping: 10 pings, 10 validated" /tmp/rrping-client.txt || fail "our rping client did not validate 10 pings"
  step "rrping client passed: 10 pings validated against Linux rping"
  step "rrping --device rxe0 server"
  timeout 300 /interop/bin/rrping -s -a "$(my_ip)" --device rxe0 -C 10 -v --timeout 240 > /tmp/rrping-server.txt 2>&1 ||
    { cat /tmp/rrping-server.txt; fail "rrping server failed"; }
  cat /tmp/rrping-server.txt
  grep -q "rrping: 10 pings" /tmp/rrping-server.txt || fail "our rping server did not serve 10 pings"
  step "rrping server passed: Linux rping client validated 10 pings"
  step "rpingpong --device rxe0 client"
  retry_if 300 "rpingpong client" "$PP_OURS_NOT_UP" timeout 120 /interop/bin/rpingpong "$a" --device rxe0 -n 200 \
      > /tmp/rpingpong-client.txt 2>&1 || { cat /tmp/rpingpong-client.txt; fail "rpingpong client failed"; }
  cat /tmp/rpingpong-client.txt
  grep -q "^200 iters in .* usec/iter" /tmp/rpingpong-client.txt || fail "our rpingpong client did not finish 200 exchanges"
  step "rpingpong client passed: $(grep "usec/iter" /tmp/rpingpong-client.txt)"
  step "rpingpong --device rxe0 server"
  timeout 300 /interop/bin/rpingpong --device rxe0 -n 200 > /tmp/rpingpong-server.txt 2>&1 ||
    { cat /tmp/rpingpong-server.txt; fail "rpingpong server failed"; }
  cat /tmp/rpingpong-server.txt
  grep -q "^200 iters in .* usec/iter" /tmp/rpingpong-server.txt || fail "our rpingpong server did not finish 200 exchanges"
  step "rpingpong server passed: $(grep "usec/iter" /tmp/rpingpong-server.txt)"
}
