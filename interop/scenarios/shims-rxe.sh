# shellcheck shell=bash
# shims-rxe: Debian's own rdma-core programs, unmodified, on the host
# through our libibverbs.so.1 and librdmacm.so.1 (crates/ibverbs-abi,
# crates/rdmacm-abi) on our NIC daemon (nicd at 10.77.0.2 inside the
# namespace, MTU 1024), against the same programs on Linux rxe in VM a
# (issue 28). Round 1: the VM serves, the host's program connects; round
# 2: the host serves, the VM's program connects. Each run: ibv_rc_pingpong
# and ibv_ud_pingpong (every buffer validated, -c), rping (-V: every
# buffer verified), ib_write_bw, ib_read_bw, ib_send_bw and ib_write_lat
# (perftest's own TCP exchange), and ib_write_bw -R (connected by
# librdmacm). Every run must complete on both sides, and the daemon must
# still be running at the end.
# Needs: cargo build --release -p nicd -p ibverbs-abi -p rdmacm-abi
# (NICD, LIBIBVERBS_ABI, LIBRDMACM_ABI override), and on the host
# ibverbs-utils, rdmacm-utils and perftest.

SCENARIO_VMS=("a 11 peer")
SCENARIO_GUEST_TIMEOUT=900
# SEND Only (pingpong, rping), RDMA WRITE Only (ib_write_lat), READ
# Request and Response First (64 KiB READs at MTU 1024), UD SEND Only, the
# CM's REQ (rping, ib_write_bw -R).
SCENARIO_EXPECT_PROTOCOLS="infiniband.bth.opcode==4 infiniband.bth.opcode==10 infiniband.bth.opcode==12 infiniband.bth.opcode==13 infiniband.bth.opcode==100 infiniband.mad.attributeid==0x0010"
# The SENDs' payloads are the programs' own bytes, which the RPC-over-RDMA
# heuristic would take for malformed RPC messages.
SCENARIO_TSHARK_ARGS="--disable-heuristic rpcrdma_infiniband"

REL=${CARGO_TARGET_DIR:-$INTEROP_DIR/../target}/release
NICD=${NICD:-$REL/nicd}
LIBIBVERBS_ABI=${LIBIBVERBS_ABI:-$REL/libibverbs_abi.so}
LIBRDMACM_ABI=${LIBRDMACM_ABI:-$REL/librdmacm_abi.so}
HOST_IP=10.77.0.2
VM_IP=10.77.0.11
# The first port of ib_write_bw -R (see WBR_RACE below).
WBR_PORT=19308
# name:port:host-side args (the VM side adds its own device and GID).
# perftest runs move 64 KiB messages (ib_write_lat: 64 bytes).
SHIM_RUNS="ibv_rc_pingpong:19301 ibv_ud_pingpong:19302 rping:19303 ib_write_bw:19304
  ib_read_bw:19305 ib_send_bw:19306 ib_write_lat:19307 ib_write_bw-R:$WBR_PORT"
# What a client prints while the VM's server is not up yet (retried).
NOT_UP="Couldn't connect|Couldn't read remote address|rdma_connect|REJECTED|UNREACHABLE|ADDR_ERROR|ROUTE_ERROR|Unable to perform rdma_client|Connection refused|No route to host"

# perftest's -R has a race of its own (Debian's 4.5-0.17, host and
# image): after the first exchange on the control connection the server
# binds and listens for the data connection while the client resolves
# and connects it. A client that comes first is REJECTED; 0.17's retry
# then uses the CM ids it has just destroyed (the client dies: it
# printed WBR_RACE) while the server waits for a data connection on the
# port the next client's control REQ would reach. So the client's side
# asks the server's (WBR_MSG_PORT) to start a new server 100 ports up,
# and retries: the host the VM in round 1, the VM the host in round 2.
WBR_RACE="Failed to connect RDMA CM events"
WBR_MSG_PORT=7008
WBR_RESTARTS=3

# shim_args TOOL PORT SIDE [SERVER]: the arguments of TOOL on SIDE (host
# or vm), as a client of SERVER when given.
shim_args() {
  local tool=$1 port=$2 side=$3 server=${4:-} dev gid
  if [ "$side" = host ]; then dev=nicd0 gid=0; else dev=rxe0 gid=$GID_INDEX; fi
  case $tool in
    ibv_rc_pingpong) echo "-d $dev -g $gid -p $port -m 1024 -c -n 100 $server" ;;
    ibv_ud_pingpong) echo "-d $dev -g $gid -p $port -s 512 -c -n 100 $server" ;;
    rping)
      if [ -n "$server" ]; then echo "-c -a $server -p $port -C 20 -S 4096 -V"
      elif [ "$side" = host ]; then echo "-s -a $HOST_IP -p $port -C 20 -S 4096 -V"
      else echo "-s -a $VM_IP -p $port -C 20 -S 4096 -V"; fi ;;
    ib_write_lat) echo "-d $dev -x $gid -F -p $port -s 64 -n 200 $server" ;;
    ib_write_bw-R) echo "-d $dev -R -F -p $port -s 65536 -n 100 --report_gbits $server" ;;
    *) echo "-d $dev -x $gid -F -p $port -s 65536 -n 100 --report_gbits $server" ;;
  esac
}

# shim_done TOOL FILE: TOOL's output says it finished its iterations.
shim_done() {
  case $1 in
    ibv_*_pingpong) grep -q "100 iters in" "$2" ;;
    rping) ! grep -qiE "error|fail|miscompare" "$2" ;;
    ib_write_lat) grep -qE "^ *64 +200 " "$2" ;;
    *) grep -qE "^ *65536 +100 " "$2" ;;
  esac
}

# wbr_client: the host's ib_write_bw -R client against the VM's server
# on the port in $RUN_DIR/wbr-port.
wbr_client() {
  # shellcheck disable=SC2046
  ns_run 180 "${shim[@]}" ib_write_bw $(shim_args ib_write_bw-R "$(cat "$RUN_DIR/wbr-port")" host "$VM_IP")
}

# wbr_next PORTFILE OUT TELL...: a RETRY_HOOK's work on either side:
# when the failed client in OUT lost perftest's data-connection race (and
# the server has been restarted fewer than WBR_RESTARTS times), TELL asks
# the server's side for a new server, the port in PORTFILE moves on, and
# the reason is printed.
wbr_next() {
  local file=$1 out=$2 port
  shift 2
  port=$(cat "$file")
  grep -q "$WBR_RACE" "$out" || return 1
  [ $(( (port - WBR_PORT) / 100 )) -lt "$WBR_RESTARTS" ] || return 1
  "$@" || return 1
  echo $(( port + 100 )) >"$file"
  echo "perftest's data-connection race (REJECTED after the control connection); the server restarted on port $(( port + 100 ))"
}

# wbr_restarted OUT (RETRY_HOOK, round 1): the host asks the VM.
wbr_restarted() { wbr_next "$RUN_DIR/wbr-port" "$1" ns_tell "$VM_IP" "$WBR_MSG_PORT" again; }

# wbr_serve PORT OUT: the host's ib_write_bw -R server (output to OUT)
# for the VM's client, started again one port-step up each time the VM
# says "again" (see WBR_RACE) while it runs; its exit status.
wbr_serve() {
  local port=$1 out=$2 pid msg rc=0
  while :; do
    # shellcheck disable=SC2046
    ns_run 400 "${shim[@]}" ib_write_bw $(shim_args ib_write_bw-R "$port" host) >"$out" 2>&1 &
    pid=$!
    msg=
    while kill -0 "$pid" 2>/dev/null; do
      msg=$(ns_hear "$WBR_MSG_PORT" 5)
      [ "$msg" != again ] || break
    done
    [ "$msg" = again ] || break
    kill "$pid" 2>/dev/null
    wait "$pid" || true
    cat "$out"
    port=$(( port + 100 ))
    host_retry_note "ib_write_bw-R server through the shims: started again on port $port (the VM's client lost perftest's data-connection race)"
  done
  wait "$pid" || rc=$?
  return $rc
}

host_main() {
  local f t
  for f in "$NICD" "$LIBIBVERBS_ABI" "$LIBRDMACM_ABI"; do
    [ -e "$f" ] || { host_fail "missing $f: cargo build --release -p nicd -p ibverbs-abi -p rdmacm-abi"; return 1; }
  done
  for t in ibv_rc_pingpong ibv_ud_pingpong rping ib_write_bw ib_read_bw ib_send_bw ib_write_lat; do
    command -v "$t" >/dev/null || { host_fail "missing $t on the host: apt-get install ibverbs-utils rdmacm-utils perftest"; return 1; }
  done
  ns_add_ip "$HOST_IP"
  local lib=$RUN_DIR/shims sock=$RUN_DIR/nicd.sock
  mkdir -p "$lib"
  cp "$LIBIBVERBS_ABI" "$lib/libibverbs.so.1"
  cp "$LIBRDMACM_ABI" "$lib/librdmacm.so.1"
  ns_bg nicd 1500 "$NICD" --ip "$HOST_IP" --mtu 1024 --socket "$sock"
  local n
  for ((n = 0; n < 100; n++)); do [ -S "$sock" ] && break; sleep 0.1; done
  [ -S "$sock" ] || { cat "$RUN_DIR/host-nicd.log"; host_fail "nicd did not make $sock"; return 1; }
  local shim=(env LD_LIBRARY_PATH="$lib" NICD_SOCKET="$sock")
  "${shim[@]}" ibv_devinfo -d nicd0 | sed 's/^/  /' | head -20
  local run tool port bin out
  # Round 1: the VM serves, we connect (retrying while it starts each server).
  for run in $SHIM_RUNS; do
    IFS=: read -r tool port <<< "$run"
    bin=${tool%-R}
    out=$RUN_DIR/host-client-$tool.txt
    if [ "$tool" = ib_write_bw-R ]; then
      echo "$port" >"$RUN_DIR/wbr-port"
      RETRY_HOOK=wbr_restarted retry_if_not_up 600 "$tool client through the shims" "$NOT_UP" "$out" \
        wbr_client || return 1
      ns_tell "$VM_IP" "$WBR_MSG_PORT" done
    else
      # shellcheck disable=SC2046
      retry_if_not_up 600 "$tool client through the shims" "$NOT_UP" "$out" \
        ns_run 180 "${shim[@]}" "$bin" $(shim_args "$tool" "$port" host "$VM_IP") || return 1
    fi
    shim_done "$tool" "$out" || { host_fail "$tool client: no finished run in its output"; return 1; }
    echo "round 1 $tool: Linux rxe serves, Debian's $bin through our shims connects: passed"
  done
  # Round 2: we serve, the VM connects.
  for run in $SHIM_RUNS; do
    IFS=: read -r tool port <<< "$run"
    bin=${tool%-R}
    out=$RUN_DIR/host-server-$tool.txt
    if [ "$tool" = ib_write_bw-R ]; then
      wbr_serve "$port" "$out" || { cat "$out"; host_fail "$tool server through the shims failed"; return 1; }
    else
      # shellcheck disable=SC2046
      ns_run 400 "${shim[@]}" "$bin" $(shim_args "$tool" "$port" host) >"$out" 2>&1 ||
        { cat "$out"; host_fail "$tool server through the shims failed"; return 1; }
    fi
    cat "$out"
    shim_done "$tool" "$out" || { host_fail "$tool server: no finished run in its output"; return 1; }
    echo "round 2 $tool: Debian's $bin through our shims serves, Linux rxe connects: passed"
  done
  kill -0 "$HOST_PID_nicd" 2>/dev/null || { host_fail "nicd is gone after the runs"; return 1; }
}

# serve_wbr PORT: the VM's ib_write_bw -R server for the host's client,
# started again one port-step up each time the host says "again" (see
# WBR_RACE), until it says "done"; then the run must have finished.
serve_wbr() {
  local port=$1 pid msg rc=0
  while :; do
    # shellcheck disable=SC2046
    timeout 600 ib_write_bw $(shim_args ib_write_bw-R "$port" vm) >/tmp/server.txt 2>&1 &
    pid=$!
    msg=$(msg_recv "$WBR_MSG_PORT" 600)
    [ "$msg" = again ] || break
    kill "$pid" 2>/dev/null
    wait "$pid" || true
    cat /tmp/server.txt
    port=$(( port + 100 ))
    retry_note "ib_write_bw-R server: started again on port $port (the host's client lost perftest's data-connection race)"
  done
  [ "$msg" = done ] || { kill "$pid" 2>/dev/null; fail "ib_write_bw-R server: the host said '$msg', not done"; }
  wait "$pid" || rc=$?
  cat /tmp/server.txt
  [ $rc = 0 ] || fail "ib_write_bw-R server exited $rc"
}

# wbr_vm_client: the VM's ib_write_bw -R client against the host's
# server on the port in /tmp/wbr-port.
wbr_vm_client() {
  # shellcheck disable=SC2046
  timeout 180 ib_write_bw $(shim_args ib_write_bw-R "$(cat /tmp/wbr-port)" vm "$HOST_IP")
}

# wbr_vm_restarted OUT (RETRY_HOOK, round 2): the VM asks the host.
wbr_vm_restarted() { wbr_next /tmp/wbr-port "$1" msg_send "$HOST_IP" "$WBR_MSG_PORT" 60 again; }

guest_peer() {
  local run tool port bin
  wait_until 60 "an IPv4 RoCE v2 GID on rxe0" ipv4_gid_index
  GID_INDEX=$(ipv4_gid_index)
  step "rxe0 IPv4 GID index $GID_INDEX"
  for run in $SHIM_RUNS; do
    IFS=: read -r tool port <<< "$run"
    bin=${tool%-R}
    step "$tool server for the host's shims"
    if [ "$tool" = ib_write_bw-R ]; then
      serve_wbr "$port"
      shim_done "$tool" /tmp/server.txt || fail "$tool server: no finished run in its output"
      continue
    fi
    # shellcheck disable=SC2046
    timeout 600 "$bin" $(shim_args "$tool" "$port" vm) >/tmp/server.txt 2>&1 ||
      { cat /tmp/server.txt; fail "$tool server exited $?"; }
    cat /tmp/server.txt
    shim_done "$tool" /tmp/server.txt || fail "$tool server: no finished run in its output"
  done
  for run in $SHIM_RUNS; do
    IFS=: read -r tool port <<< "$run"
    bin=${tool%-R}
    step "$tool client against the host's shims"
    if [ "$tool" = ib_write_bw-R ]; then
      echo "$port" >/tmp/wbr-port
      RETRY_HOOK=wbr_vm_restarted retry_if 300 "$tool client" "$NOT_UP" wbr_vm_client ||
        fail "$tool client failed"
    else
      # shellcheck disable=SC2046
      retry_if 300 "$tool client" "$NOT_UP" timeout 180 "$bin" $(shim_args "$tool" "$port" vm "$HOST_IP") ||
        fail "$tool client failed"
    fi
    shim_done "$tool" /tmp/retry-if.out || fail "$tool client: no finished run in its output"
  done
}
