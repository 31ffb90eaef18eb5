# shellcheck shell=bash
# vm-srpd-rdmacore-removal: our resident initiator's rdma-core device taken
# away under I/O and given back. VM a runs srptd --device rxe0 (32 MiB RAM
# LUN) for the whole run. VM b runs srpd --device rxe0 (reconnect_delay
# 2 s) logged in to it by login string, and deletes its own rxe0
# (`rdma link delete`, which Linux finishes only once every user let the
# device go) while fio runs on srpd's LUN file, then adds it again (`rdma
# link add rxe0 type rxe netdev eth0`). Twice:
#  1. fast_io_fail_tmo 3 s: fio ends with I/O errors, a read during the
#     outage fails with EIO instead of hanging, `srp list` answers and
#     shows the LUN failfast; srpd holds no uverbs file once the device is
#     gone. After the return the LUN reconnects under the same file name,
#     the pattern written before reads back identical and a fio verify
#     passes.
#  2. fast_io_fail_tmo off (a new srpd): I/O waits for the device, and
#     the fio verify job under way across the removal and the return
#     finishes with every block verified and no error.
# Each srpd stops on SIGTERM with 0 verbs objects left.
# Needs the binaries: cargo build --release -p srptd -p srp-cli (SRPTD,
# SRPTADM, SRP_CLI, SRPD).

# shellcheck source=vm-srp-rdmacore.sh
. "$(dirname "${BASH_SOURCE[0]}")/vm-srp-rdmacore.sh"

SRPD=${SRPD:-$(dirname "$SRP_CLI")/srpd}
SCENARIO_GUEST_BINS="$SRPTD $SRPTADM $SRP_CLI $SRPD"
SCENARIO_GUEST_TIMEOUT=1200
# RDMA WRITE (read data), RDMA READ request (64 KiB writes fetched by the
# target), SEND (SRP IUs), CM MADs (the RDMA CM logins).
SCENARIO_EXPECT_PROTOCOLS="infiniband.bth.opcode>=6&&infiniband.bth.opcode<=10 infiniband.bth.opcode==12 infiniband.bth.opcode==4 infiniband.mad"

host_main() {
  local b
  for b in "$SRPTD" "$SRPTADM" "$SRP_CLI" "$SRPD"; do
    [ -x "$b" ] || { echo "missing $b: run cargo build --release -p srptd -p srp-cli"; return 1; }
  done
}

guest_target() {
  local msg
  srptd_on_rxe0
  msg_send "$(host_ip b)" 7002 300 "ready $NODE_GUID"
  step "srptd ready on rxe0 (target port ID $NODE_GUID)"
  msg=$(msg_recv 7001 1100)
  [ "$msg" = done ] || fail "initiator reported '$msg'"
  kill -TERM "$SRPTD_PID"
  wait "$SRPTD_PID" || fail "srptd exited with an error: $(tail -3 /tmp/srptd.log)"
  grep -q "stopped cleanly, 0 verbs objects left" /tmp/srptd.log ||
    fail "srptd did not stop cleanly: $(tail -1 /tmp/srptd.log)"
  step "srptd stopped cleanly"
}

MNT=/tmp/srpd-mnt
SOCK=/tmp/srpd.sock

# start_srpd PHASE FAST_IO_FAIL_TMO: srpd --device rxe0 logged in to VM a
# as login `t`; its output in /tmp/srpd-PHASE.txt, on the console as it is
# written. Sets SRPD_PID, SRPD_LOG and LUN.
start_srpd() {
  SRPD_LOG=/tmp/srpd-$1.txt
  /interop/bin/srpd --device rxe0 --mount-root $MNT --control-socket $SOCK \
    --reconnect-delay 2 --fast-io-fail-tmo "$2" --dev-loss-tmo 600 >"$SRPD_LOG" 2>&1 &
  SRPD_PID=$!
  tail -F "$SRPD_LOG" 2>/dev/null | sed -u "s/^/  srpd-$1| /" &
  wait_until 30 "srpd ready" grep -q "^srpd: ready on" "$SRPD_LOG"
  retry 120 "srp login through srpd" /interop/bin/srp login --control-socket $SOCK --name t \
    "id_ext=$TGT_GUID,ioc_guid=$TGT_GUID,dest=$(host_ip a):$SRP_PORT,initiator_ext=0"
  LUN=$MNT/t/lun0
  [ -f $LUN ] || fail "no LUN file $LUN"
  step "srpd --device rxe0 (fast_io_fail_tmo $2) logged in: $LUN"
}

# stop_srpd: SIGTERM; srpd must log out and stop with 0 verbs objects.
stop_srpd() {
  local rc=0
  kill -TERM "$SRPD_PID"
  wait "$SRPD_PID" || rc=$?
  [ $rc = 0 ] || fail "srpd exited $rc after SIGTERM: $(tail -3 "$SRPD_LOG")"
  grep -q "^srpd: 1 logins ended; 0 verbs objects left; stopped" "$SRPD_LOG" ||
    fail "srpd did not stop with 0 verbs objects left: $(tail -2 "$SRPD_LOG")"
  step "srpd stopped: 1 login ended, 0 verbs objects left"
}

# lun_field KEY: KEY of LUN 0 of login t in `srp list --json` (srpd must
# answer within 10 s).
lun_field() {
  timeout 10 /interop/bin/srp list --json --control-socket $SOCK | python3 -c '
import json, sys
print([l for l in json.load(sys.stdin) if l["name"] == "t"][0]["luns"][0][sys.argv[1]])' "$1"
}

lun_state_is() { [ "$(lun_field state)" = "$1" ]; }

uverbs_files() { ls -l /proc/"$SRPD_PID"/fd 2>/dev/null | grep -c uverbs || true; }

# remove_rxe0: deletes rxe0 (srpd must let it go) and waits for srpd to
# say so. Sets NETDEV.
remove_rxe0() {
  local t0 del n=0
  NETDEV=$(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/ndevs/1)
  t0=$SECONDS
  timeout 120 rdma link delete rxe0 &
  del=$!
  while kill -0 "$del" 2>/dev/null && [ $n -lt 60 ]; do
    sleep 1
    n=$((n + 1))
  done
  if kill -0 "$del" 2>/dev/null; then
    fail "rdma link delete rxe0 did not finish in 60 s: srpd holds $(uverbs_files) uverbs and $(ls -l /proc/"$SRPD_PID"/fd | grep -c rdma_cm) rdma_cm files"
  fi
  wait "$del" || fail "rdma link delete rxe0 failed"
  step "rxe0 deleted under I/O in $((SECONDS - t0)) s: srpd let the device go"
  wait_until 30 "srpd to see the removal" grep -q "^srpd: rxe0:1 was removed" "$SRPD_LOG"
  [ "$(uverbs_files)" = 0 ] || fail "srpd still holds $(uverbs_files) uverbs files"
}

# add_rxe0: adds rxe0 again on NETDEV and waits for srpd's RDMA CM to be
# back on it.
add_rxe0() {
  rdma link add rxe0 type rxe netdev "$NETDEV" || fail "rdma link add rxe0"
  wait_until 60 "rxe0 port ACTIVE again" grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state
  wait_until 60 "srpd to come back on rxe0" grep -q "^srpd: rxe0:1 is back" "$SRPD_LOG"
  step "rxe0 is back: $(grep "^srpd: rxe0:1 is back" "$SRPD_LOG" | tail -1)"
}

# fio_job NAME OFFSET ARGS...: fio crc32c write+verify of 4 KiB blocks on
# LUN in the background (FIO_PID), output in /tmp/NAME.out.
fio_job() {
  local name=$1 off=$2
  shift 2
  fio --name="$name" --filename=$LUN --direct=1 --rw=randwrite --bs=4k --ioengine=psync \
    --offset="$off" --size=4m --verify=crc32c --do_verify=1 "$@" \
    --output-format=terse --minimal >/tmp/"$name".out 2>&1 &
  FIO_PID=$!
}

fio_running() { kill -0 "$FIO_PID" 2>/dev/null; }
fio_ended() { ! fio_running; }

# completed: commands completed by login t's channel 0 (0 when none).
completed() {
  timeout 10 /interop/bin/srp list --json --control-socket $SOCK | python3 -c '
import json, sys
l = [l for l in json.load(sys.stdin) if l["name"] == "t"][0]
print(sum(c["completed"] for c in l["channels"]))'
}

io_beyond() { [ "$(completed)" -gt "$1" ]; }

guest_initiator() {
  local ready base rc t0
  modprobe fuse
  [ -c /dev/fuse ] || fail "no /dev/fuse after modprobe fuse"
  mkdir -p $MNT
  wait_until 60 "rxe0 port ACTIVE" grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state
  ready=$(msg_recv 7002 600)
  TGT_GUID=${ready#ready }
  [[ $TGT_GUID =~ ^[0-9a-f]{16}$ ]] || fail "bad ready message '$ready'"

  # 1. fast_io_fail_tmo 3 s: I/O fails while the device is away.
  start_srpd failfast 3
  head -c 4194304 /dev/urandom >/tmp/pattern
  dd if=/tmp/pattern of=$LUN bs=64k oflag=direct conv=notrunc,fsync 2>&1 | tail -1
  dd if=$LUN of=/tmp/readback bs=64k count=64 iflag=direct 2>&1 | tail -1
  cmp /tmp/pattern /tmp/readback || fail "the pattern read back through $LUN differs"
  step "dd: 4 MiB pattern through $LUN read back identical"
  fio_job failfast 16m --loops=1000
  base=$(completed)
  wait_until 60 "fio to be under way" io_beyond $((base + 200))
  fio_running || { cat /tmp/failfast.out; fail "fio ended before the removal"; }
  remove_rxe0
  wait_until 60 "fio to fail (fast_io_fail_tmo 3 s)" fio_ended
  rc=0
  wait "$FIO_PID" || rc=$?
  [ $rc != 0 ] || { cat /tmp/failfast.out; fail "fio passed with the device away"; }
  grep -q "Input/output error" /tmp/failfast.out ||
    { cat /tmp/failfast.out; fail "fio failed other than with an I/O error"; }
  step "fio ended with I/O errors: $(grep -m1 "Input/output error" /tmp/failfast.out)"
  rc=0
  timeout 30 dd if=$LUN of=/dev/null bs=4k count=1 iflag=direct 2>/tmp/dd-away.txt || rc=$?
  [ $rc != 0 ] && [ $rc != 124 ] || fail "a read with rxe0 away: exit status $rc (124: it hung)"
  grep -q "Input/output error" /tmp/dd-away.txt || fail "a read with rxe0 away: $(cat /tmp/dd-away.txt)"
  wait_until 30 "srp list to show LUN 0 failfast" lun_state_is failfast
  step "with rxe0 away: a read fails at once with EIO; srp list answers, LUN 0 $(lun_field state)"
  add_rxe0
  wait_until 60 "LUN 0 running again" lun_state_is running
  [ "$(lun_field reconnects)" -ge 1 ] || fail "LUN 0 shows no reconnect"
  dd if=$LUN of=/tmp/readback2 bs=64k count=64 iflag=direct 2>&1 | tail -1
  cmp /tmp/pattern /tmp/readback2 || fail "the pattern read back after the return differs"
  fio_job again 24m
  fio_wait again
  step "after the return: $LUN reconnected ($(lun_field reconnects) reconnect), pattern identical, fio verify ok"
  stop_srpd

  # 2. fast_io_fail_tmo off: I/O waits for the device.
  start_srpd wait off
  fio_job waiting 16m --loops=20
  base=$(completed)
  wait_until 60 "fio to be under way" io_beyond $((base + 200))
  fio_running || { cat /tmp/waiting.out; fail "fio ended before the removal"; }
  t0=$SECONDS
  remove_rxe0
  fio_running || { cat /tmp/waiting.out; fail "fio ended while rxe0 was away"; }
  wait_until 30 "LUN 0 blocked (fast_io_fail_tmo off)" lun_state_is blocked
  step "with rxe0 away: fio waits, srp list answers, LUN 0 blocked"
  add_rxe0
  fio_wait waiting
  step "fio across the removal and return ($((SECONDS - t0)) s): every block verified, no I/O error"
  stop_srpd
  msg_send "$(host_ip a)" 7001 120 done
}
