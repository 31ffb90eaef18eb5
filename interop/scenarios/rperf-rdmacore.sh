# shellcheck shell=bash
# rperf-rdmacore: `rperf server` and `rperf client` on our rdma-core
# provider (`--device rxe0`: Linux rxe through libibverbs) in two VMs,
# meeting over rperf's own TCP exchange (port 18515). The client runs four
# tests of 64 KiB messages, each with --verify: RDMA WRITE (the server's
# buffer digest must match what was written), READ (every READ brings
# back the server's pattern), SEND (the server counted every one) and a
# bidirectional WRITE (the server writes back at the same time). Every
# report must say it ran on rxe0, verified, with a bandwidth; the server
# must serve the four clients and exit 0. Then the soft NIC's options are
# refused with --device on the guest too (--faults), in one line.
# Needs the binary: cargo build --release -p rdma-perf (RPERF overrides).

# shellcheck source=perftest-ours.sh
. "$(dirname "${BASH_SOURCE[0]}")/perftest-ours.sh"
unset -f host_main guest_peer

SCENARIO_VMS=("a 11 server" "b 12 client")
SCENARIO_GUEST_TIMEOUT=900
# WRITE First, READ Request and Response First, SEND First (64 KiB at MTU
# 1024), ACK.
SCENARIO_EXPECT_PROTOCOLS="infiniband.bth.opcode==6 infiniband.bth.opcode==12 infiniband.bth.opcode==13 infiniband.bth.opcode==0 infiniband.bth.opcode==17"
RPERF=${RPERF:-$(dirname "$RPERFTEST")/rperf}
SCENARIO_GUEST_BINS="$RPERF"
# The tests, in the order the client runs them: op and extra options.
RPERF_TESTS="write read send write:--bidir"
# What our client gives while the server is not listening yet.
RPERF_NOT_UP='^rperf: I/O error: (Connection refused|No route to host|Connection timed out)'

host_main() {
  [ -x "$RPERF" ] || { echo "missing $RPERF: run cargo build --release -p rdma-perf"; return 1; }
}

guest_server() {
  local n rc=0
  wait_until 60 "rxe0 port ACTIVE" rxe_active
  wait_until 60 "an IPv4 RoCE v2 GID on rxe0" ipv4_gid_index
  n=$(wc -w <<<"$RPERF_TESTS")
  step "rperf server --device rxe0 for $n clients"
  timeout 600 /interop/bin/rperf server --device rxe0 --oob "$(my_ip):18515" --clients "$n" --buffer 4M \
    >/tmp/server.txt 2>&1 || rc=$?
  cat /tmp/server.txt
  [ $rc = 0 ] || fail "rperf server --device rxe0 exited $rc: $(tail -1 /tmp/server.txt)"
  grep -q "^rperf server: listening on $(my_ip):18515, on rxe0" /tmp/server.txt ||
    fail "the server did not say it runs on rxe0"
  step "rperf server on rxe0 served $n clients and exited 0"
}

guest_client() {
  local a t op extra out row
  a=$(host_ip a)
  wait_until 60 "rxe0 port ACTIVE" rxe_active
  wait_until 60 "an IPv4 RoCE v2 GID on rxe0" ipv4_gid_index
  for t in $RPERF_TESTS; do
    op=${t%%:*}
    extra=()
    [ "$t" = "$op" ] || extra=("${t#*:}")
    out=/tmp/client-${t//[:-]/}.txt
    step "rperf client --device rxe0 --op $op ${extra[*]}"
    retry_if 300 "rperf client $op ${extra[*]}" "$RPERF_NOT_UP" timeout 300 /interop/bin/rperf client \
        --device rxe0 --server "$a:18515" --op "$op" --size 65536 --iters 200 --buffer 4M --verify "${extra[@]}" >"$out" 2>&1 ||
      { cat "$out"; fail "rperf client $op ${extra[*]} failed"; }
    cat "$out"
    # The result row: op, size, qd, iterations, a bandwidth above 0, ...,
    # verified.
    row=$(awk -v op="$op" '$1 == op && $2 == 65536 && $4 == 200 && $5 + 0 > 0 && $NF == "yes"' "$out")
    [ -n "$row" ] || fail "rperf client $op ${extra[*]}: no verified result row with a bandwidth"
    grep -q "^ on rdma-core device rxe0 port 1" "$out" || fail "rperf client $op did not run on rxe0"
    if [ "$t" = write:--bidir ]; then
      grep -q "reverse direction (server to client, at the same time): [0-9.]* Gb/s" "$out" ||
        fail "the bidirectional WRITE reported no reverse bandwidth"
    fi
    step "rperf $op ${extra[*]} on rxe0 verified:$row"
  done
  # A soft NIC option with a device: refused in one line, nothing sent.
  if /interop/bin/rperf client --device rxe0 --server "$a:18515" --faults loss=0.1 >/tmp/refused.txt 2>&1; then
    fail "rperf client took --faults with --device"
  fi
  grep -q "^rperf: --faults does not go with --device rxe0:1: .*drop --faults" /tmp/refused.txt ||
    { cat /tmp/refused.txt; fail "--faults with --device was not refused with its reason"; }
  step "refused: $(cat /tmp/refused.txt)"
}
