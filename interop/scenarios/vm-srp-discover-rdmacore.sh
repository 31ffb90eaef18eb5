# shellcheck shell=bash
# vm-srp-discover-rdmacore: discovery through the kernel's user MAD
# interface on both sides. VM a runs srptd --device rxe0 (a 32 MiB RAM
# LUN): its DM agent answers on rxe0's QP1 through /dev/infiniband/umad0
# (our rdma-core provider's GSI QP over ib_umad). VM b, with ib_umad
# unloaded first, must be told in one line to load it; then
# `srp discover --device rxe0 --target <a>` (its MADs through umad too)
# must list a's I/O controller and the SRP service entry with srptd's
# target port ID as id_ext, as an RDMA CM login string; `--sa` must be
# refused as a RoCE port has no SA. b then logs in with exactly what
# discovery printed (`srp io --device rxe0`) and verifies 4 MiB of random
# I/O. Then srp_daemon's -e: `srpd --device rxe0` runs, and `srp discover
# --device rxe0 --target <a> --login` hands it the target found (by RDMA
# CM); its LUN file must appear and read back what was written through it,
# and a second `--login` walk must see the login held and not log in
# twice. srpd stops with 0 verbs objects left. Finally srptd must stop
# cleanly with 0 verbs objects left (its MAD agent's QP1 objects
# included).
# Needs the binaries: cargo build --release -p srptd -p srp-cli (SRPTD,
# SRPTADM, SRP_CLI, SRPD).

SCENARIO_VMS=("a 11 target" "b 12 initiator")
SCENARIO_GUEST_TIMEOUT=600
# DM MADs (class 0x06) on the wire, and the login's RDMA traffic.
SCENARIO_EXPECT_PROTOCOLS="infiniband.mad.mgmtclass==0x06 infiniband.bth.opcode==4"
# The DM MADs go by the ports' IPv6 link-local GIDs (the kernel's MAD
# layer pairs a response with its request by GRH, which RoCEv2 over IPv4
# lacks), and Linux rxe leaves the UDP checksum of RoCEv2 over IPv6 at 0
# as RoCEv2 allows (the ICRC covers the packet): not an error here.
SCENARIO_TSHARK_ARGS="-o udp.ignore_ipv6_zero_checksum:TRUE"
SRP_PORT=5555
SRPTD=${SRPTD:-${CARGO_TARGET_DIR:-${INTEROP_DIR:-.}/../target}/release/srptd}
SRPTADM=${SRPTADM:-$(dirname "$SRPTD")/srptadm}
SRP_CLI=${SRP_CLI:-$(dirname "$SRPTD")/srp}
SRPD=${SRPD:-$(dirname "$SRP_CLI")/srpd}
SCENARIO_GUEST_BINS="$SRPTD $SRPTADM $SRP_CLI $SRPD"

host_main() {
  local b
  for b in "$SRPTD" "$SRPTADM" "$SRP_CLI" "$SRPD"; do
    [ -x "$b" ] || { echo "missing $b: run cargo build --release -p srptd -p srp-cli"; return 1; }
  done
}

guest_target() {
  local guid
  wait_until 60 "rxe0 port ACTIVE" grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state
  [ -c /dev/infiniband/umad0 ] || fail "no /dev/infiniband/umad0 (ib_umad): $(ls /dev/infiniband)"
  guid=$(tr -d : </sys/class/infiniband/rxe0/node_guid)
  /interop/bin/srptd --device rxe0 --ram-mib 32 --rdma-cm-port $SRP_PORT \
    --control-socket /tmp/srptd.sock >/tmp/srptd.log 2>&1 &
  SRPTD_PID=$!
  tail -F /tmp/srptd.log 2>/dev/null | sed -u 's/^/  srptd| /' &
  wait_until 30 "srptd to listen" grep -q "listening on" /tmp/srptd.log ||
    fail "srptd did not start: $(tail -3 /tmp/srptd.log)"
  grep -q "rxe0:1: device management agent serving I/O controller $guid" /tmp/srptd.log ||
    fail "srptd has no DM agent on rxe0: $(grep -i "management" /tmp/srptd.log)"
  step "srptd on rxe0 serves logins and discovery (IOC $guid)"
  msg_send "$(host_ip b)" 7002 300 "ready $guid"
  local done_msg
  done_msg=$(msg_recv 7001 500)
  [ "$done_msg" = done ] || fail "initiator reported '$done_msg'"
  /interop/bin/srptadm --socket /tmp/srptd.sock show | sed 's/^/  /'
  kill -TERM "$SRPTD_PID"
  wait "$SRPTD_PID" || fail "srptd exited with an error: $(tail -3 /tmp/srptd.log)"
  grep -q "stopped cleanly, 0 verbs objects left" /tmp/srptd.log ||
    fail "srptd did not stop cleanly: $(tail -1 /tmp/srptd.log)"
  step "srptd stopped cleanly, 0 verbs objects left on rxe0"
}

guest_initiator() {
  local a ready guid line dest id_ext ioc_guid
  a=$(host_ip a)
  wait_until 60 "rxe0 port ACTIVE" grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state
  # No user MAD module: one line naming the fix.
  modprobe -r ib_umad || fail "cannot unload ib_umad"
  if /interop/bin/srp discover --device rxe0 --target "$a" >/tmp/nomod.txt 2>&1; then
    cat /tmp/nomod.txt
    fail "srp discover ran without ib_umad"
  fi
  cat /tmp/nomod.txt
  [ "$(wc -l </tmp/nomod.txt)" -eq 1 ] || fail "more than one line without ib_umad"
  grep -q "modprobe ib_umad" /tmp/nomod.txt || fail "no fix named without ib_umad"
  modprobe ib_umad
  wait_until 10 "/dev/infiniband/umad0" test -c /dev/infiniband/umad0
  step "without ib_umad: $(cat /tmp/nomod.txt)"
  # A RoCE port has no SA: said at once, not a timeout.
  if /interop/bin/srp discover --device rxe0 --sa >/tmp/sa.txt 2>&1; then
    fail "srp discover --device --sa did not refuse"
  fi
  grep -q "no subnet administrator on a RoCE port; give the target's GID/IP" /tmp/sa.txt ||
    { cat /tmp/sa.txt; fail "--sa on RoCE was not refused with its reason"; }
  step "--sa on RoCE: $(cat /tmp/sa.txt)"
  ready=$(msg_recv 7002 500)
  guid=${ready#ready }
  [[ $guid =~ ^[0-9a-f]{16}$ ]] || fail "bad ready message '$ready'"
  RUST_LOG=rdmacore=debug /interop/bin/srp discover --device rxe0 --target "$a" -v >/tmp/disc.txt 2>&1 ||
    { cat /tmp/disc.txt; fail "srp discover --device rxe0 failed"; }
  cat /tmp/disc.txt
  grep -q "slot 1: IOC $guid " /tmp/disc.txt || fail "the listing has no IOC $guid"
  line=$(grep "^id_ext=" /tmp/disc.txt) || fail "no login string found"
  [ "$line" = "id_ext=$guid,ioc_guid=$guid,dest=$a:$SRP_PORT" ] ||
    fail "login string '$line' is not srptd's SRP service entry by RDMA CM"
  step "discovered through umad: $line"
  dest=$(sed 's/.*dest=\([^,]*\).*/\1/' <<<"$line")
  id_ext=$(sed 's/.*id_ext=\([0-9a-f]*\).*/\1/' <<<"$line")
  ioc_guid=$(sed 's/.*ioc_guid=\([0-9a-f]*\).*/\1/' <<<"$line")
  /interop/bin/srp io --device rxe0 --dest "$dest" --id-ext "$id_ext" --ioc-guid "$ioc_guid" \
    --size 4M --region 4M --rw randrw >/tmp/io.txt 2>&1 || { cat /tmp/io.txt; fail "srp io failed"; }
  cat /tmp/io.txt
  grep -q "verified [1-9][0-9.]* [KMGTPE]*i*B" /tmp/io.txt || fail "srp io verified nothing"
  grep -q " 0 verify failures, 0 I/O errors" /tmp/io.txt || fail "srp io had failures"
  step "logged in with what discovery found and verified I/O"
  discover_login "$a"
  msg_send "$a" 7001 120 done
}

# discover_login A: srp discover --device rxe0 --login logs srpd --device
# rxe0 in to the target at A, once however often it walks.
discover_login() {
  local a=$1 mnt=/tmp/srpd-mnt sock=/tmp/srpd.sock pid rc=0
  modprobe fuse
  mkdir -p $mnt
  /interop/bin/srpd --device rxe0 --mount-root $mnt --control-socket $sock >/tmp/srpd.txt 2>&1 &
  pid=$!
  wait_until 30 "srpd ready" grep -q "^srpd: ready on" /tmp/srpd.txt
  /interop/bin/srp discover --device rxe0 --target "$a" --login --control-socket $sock \
    >/tmp/disc-login.txt 2>&1 || { cat /tmp/disc-login.txt /tmp/srpd.txt; fail "srp discover --login failed"; }
  cat /tmp/disc-login.txt
  grep -q "^# logged in as t0$" /tmp/disc-login.txt || fail "srp discover --login did not log srpd in"
  /interop/bin/srp list --control-socket $sock | tee /tmp/list.txt
  grep -q "rxe0:.* -> $a:$SRP_PORT" /tmp/list.txt || fail "srpd's login is not by RDMA CM from rxe0 to $a:$SRP_PORT"
  [ -f $mnt/t0/lun0 ] || fail "no LUN file $mnt/t0/lun0"
  head -c 1048576 /dev/urandom >/tmp/disc-pattern
  dd if=/tmp/disc-pattern of=$mnt/t0/lun0 bs=64k oflag=direct conv=notrunc,fsync 2>&1 | tail -1
  dd if=$mnt/t0/lun0 of=/tmp/disc-readback bs=64k count=16 iflag=direct 2>&1 | tail -1
  cmp /tmp/disc-pattern /tmp/disc-readback || fail "the pattern read back through $mnt/t0/lun0 differs"
  step "srp discover --device rxe0 --login: srpd logged in (t0), 1 MiB through its LUN file read back identical"
  /interop/bin/srp discover --device rxe0 --target "$a" --login -v --control-socket $sock \
    >/tmp/disc-again.txt 2>&1 || { cat /tmp/disc-again.txt; fail "the second srp discover --login failed"; }
  cat /tmp/disc-again.txt
  grep -q "^# logged in already: id_ext=$guid,ioc_guid=$guid,dest=$a:$SRP_PORT$" /tmp/disc-again.txt || fail "the second walk did not see the login held"
  ! grep -q "^# logged in as" /tmp/disc-again.txt || fail "the second walk logged in again"
  [ "$(/interop/bin/srp list --json --control-socket $sock | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')" = 1 ] ||
    fail "srpd holds more than one login after the second walk"
  step "a second --login walk sees the login held and makes none"
  kill -TERM $pid
  wait $pid || rc=$?
  [ $rc = 0 ] || fail "srpd exited $rc after SIGTERM: $(tail -3 /tmp/srpd.txt)"
  grep -q "^srpd: 1 logins ended; 0 verbs objects left; stopped" /tmp/srpd.txt ||
    fail "srpd did not stop with 0 verbs objects left: $(tail -2 /tmp/srpd.txt)"
  step "srpd stopped: 1 login ended, 0 verbs objects left"
}
