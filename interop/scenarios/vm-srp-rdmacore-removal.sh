# shellcheck shell=bash
# vm-srp-rdmacore-removal: the rdma-core device taken away under I/O. VM a
# runs srptd --device rxe0 (32 MiB RAM LUN); VM b logs in with Linux
# ib_srp (reconnect_delay 2 s, fast_io_fail_tmo off, so I/O waits for the
# path) and runs fio with crc32c verification. Mid-run VM a deletes rxe0
# (`rdma link delete`, which Linux finishes only once every user let the
# device go): srptd's sessions must end, its log say the device was
# removed, and `srptadm show` count 0 verbs objects. Then rxe0 is added
# again: srptd must take logins on it again by itself, ib_srp reconnect,
# and fio finish with every block verified and no I/O error.
# Needs the binaries: cargo build --release -p srptd (SRPTD, SRPTADM).

# shellcheck source=vm-srp-rdmacore.sh
. "$(dirname "${BASH_SOURCE[0]}")/vm-srp-rdmacore.sh"

SCENARIO_GUEST_TIMEOUT=900
# 4 KiB writes travel as immediate data: no RDMA READ in this one.
SCENARIO_EXPECT_PROTOCOLS="infiniband.bth.opcode>=6&&infiniband.bth.opcode<=10 infiniband.bth.opcode==4 infiniband.mad"

host_main() {
  local b
  for b in "$SRPTD" "$SRPTADM"; do
    [ -x "$b" ] || { echo "missing $b: run cargo build --release -p srptd"; return 1; }
  done
}

# verbs_objects: the count `srptadm show` gives for srptd's target.
verbs_objects() {
  /interop/bin/srptadm --socket /tmp/srptd.sock --json show | python3 -c '
import json, sys
def find(v):
    if isinstance(v, dict):
        if "verbs_objects" in v:
            return v["verbs_objects"]
        v = list(v.values())
    if isinstance(v, list):
        for x in v:
            r = find(x)
            if r is not None:
                return r
print(find(json.load(sys.stdin)))'
}

no_objects() { [ "$(verbs_objects)" = 0 ]; }

guest_target() {
  local netdev msg t0
  srptd_on_rxe0
  netdev=$(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/ndevs/1)
  msg_send "$(host_ip b)" 7002 300 "ready $NODE_GUID"
  msg=$(msg_recv 7001 600)
  [ "$msg" = remove ] || fail "initiator said '$msg', not remove"
  step "verbs objects before the removal: $(verbs_objects)"
  t0=$(date +%s)
  timeout 120 rdma link delete rxe0 &
  local del=$!
  local n=0
  while kill -0 "$del" 2>/dev/null && [ $n -lt 60 ]; do
    sleep 1
    n=$((n + 1))
  done
  if kill -0 "$del" 2>/dev/null; then
    step "still held: srptd counts $(verbs_objects) verbs objects; its device files: $(ls -l /proc/$SRPTD_PID/fd | grep -c uverbs) uverbs, $(ls -l /proc/$SRPTD_PID/fd | grep -c rdma_cm) rdma_cm"
    fail "rdma link delete rxe0 did not finish: something still holds rxe0"
  fi
  wait "$del" || fail "rdma link delete rxe0 failed"
  step "rxe0 deleted under I/O in $(( $(date +%s) - t0 )) s (Linux waited for every user to let it go)"
  wait_until 30 "srptd to see the removal" grep -q "rxe0:1 was removed" /tmp/srptd.log
  wait_until 30 "no verbs object left" no_objects ||
    fail "srptd still holds $(verbs_objects) verbs objects after the removal"
  step "srptd: the removal ended its sessions, 0 verbs objects left"
  rdma link add rxe0 type rxe netdev "$netdev" || fail "rdma link add rxe0"
  wait_until 60 "rxe0 port ACTIVE again" grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state
  wait_until 60 "srptd to take logins on rxe0 again" grep -q "rxe0:1 is back" /tmp/srptd.log ||
    fail "srptd did not come back on rxe0"
  step "rxe0 is back; srptd listens on it again"
  msg_send "$(host_ip b)" 7002 120 back
  msg=$(msg_recv 7001 600)
  [ "$msg" = done ] || fail "initiator reported '$msg'"
  kill -TERM "$SRPTD_PID"
  wait "$SRPTD_PID" || fail "srptd exited with an error: $(tail -3 /tmp/srptd.log)"
  grep -q "stopped cleanly, 0 verbs objects left" /tmp/srptd.log ||
    fail "srptd did not stop cleanly: $(tail -1 /tmp/srptd.log)"
  step "srptd stopped cleanly after the device's return"
}

# disk_ios: reads and writes completed on DEV.
disk_ios() {
  local s
  s=$(tr -s ' ' </sys/block/${DEV#/dev/}/stat)
  set -- $s
  echo $(($1 + $5))
}

# io_beyond N: DEV has completed more than N I/Os.
io_beyond() { [ "$(disk_ios)" -gt "$1" ]; }

guest_initiator() {
  local ready a p msg
  a=$(host_ip a)
  modprobe ib_srp
  modprobe sd_mod 2>/dev/null || true
  ready=$(msg_recv 7002 600)
  OUR_TARGET_GUID=${ready#ready }
  [[ $OUR_TARGET_GUID =~ ^[0-9a-f]{16}$ ]] || fail "bad ready message '$ready'"
  OUR_TARGET_DEST=$a:$SRP_PORT
  login ""
  for p in /sys/class/srp_remote_ports/port-*; do
    echo 2 >"$p/reconnect_delay"
    echo off >"$p/fast_io_fail_tmo"
  done
  step "logged in ($DEV); reconnect_delay 2 s, fast_io_fail_tmo off"
  fio --name=removal --filename="$DEV" --direct=1 --rw=randrw --bs=4k --iodepth=4 \
    --ioengine=libaio --size=8m --loops=8 --verify=crc32c --do_verify=1 \
    --output-format=terse --minimal >/tmp/removal.out 2>&1 &
  FIO_PID=$!
  # The removal comes once fio is well under way: 200 I/Os done on the disk.
  local base
  base=$(disk_ios)
  wait_until 60 "fio to be under way" io_beyond $((base + 200))
  kill -0 "$FIO_PID" 2>/dev/null || { cat /tmp/removal.out; fail "fio ended before the removal"; }
  msg_send "$a" 7001 60 remove
  msg=$(msg_recv 7002 600)
  [ "$msg" = back ] || fail "target said '$msg', not back"
  fio_wait removal
  dmesg | grep -i "srp" | tail -6
  step "fio across the removal and return: every block verified, no I/O error"
  srp_remove_all
  msg_send "$a" 7001 120 done
}
