# shellcheck shell=bash
# vm-srp-passthrough: srptd exporting a real SCSI device by pass-through
# (issue 29 item 1, SCST's scst_disk). VM a loads scsi_debug (a 16 MiB
# disk whose reads of LBAs 30000..30007 fail with MEDIUM ERROR, device
# resets logged: opts=0x2002; commands answered in the submitting thread,
# delay=0), finds its sg node, checks the config with `srptd --check` (and
# that a pass-through on /dev/null is refused naming the key), and runs
# srptd with that node as LUN 0 (handler = "pass-through", vendor and usn
# overridden). VM b logs in with Linux ib_srp (vm-srp's initiator login)
# and checks: INQUIRY shows the configured vendor over the device's
# product, VPD 80h the configured usn; a dd pattern written and read back;
# fio crc32c verify; the injected medium error reaches the initiator with
# the device's own sense (sg_raw shows its INFORMATION field, the LBA);
# PERSISTENT RESERVE OUT/IN answered by srptd (scsi_debug has no PR). A
# second ib_srp login with another initiator_ext (another initiator port
# ID, so another I_T nexus and a second disk) shows the reservations are
# per initiator: with the first holding WRITE EXCLUSIVE, the second's
# WRITE and RESERVE get RESERVATION CONFLICT, its READ passes, and after
# the release its WRITE passes. A LUN reset (sg_reset --device, SG_SCSI_RESET
# on the target's side) with no I/O and one while a fio crc32c verify job
# runs (the job still passes); VM a then counts scsi_debug's device resets
# in its kernel log (at least the two). Last, the device is deleted on VM
# a (sysfs `delete`, as a pulled disk) while fio writes through the LUN:
# fio must end with an I/O error within a minute, not hang, the initiator's
# kernel log show the target's LOGICAL UNIT NOT SUPPORTED, srptd report
# the device gone (`srptadm --json devices`) and the logout still work.
# LUN 1 is a vcdrom (SCST's virtual CD-ROM) over a 2 MiB image: Linux's
# sr driver reads it as /dev/srN, byte for byte the image; an eject (START
# STOP UNIT through its sg node) leaves the drive with no medium.
# PT_NODE=bsg (vm-srp-passthrough-bsg) names the device by its bsg node
# (/dev/bsg/H:C:T:L, SG_IO version 4) instead of its sg node; its LUN
# resets then go through the device's sg node.
# Needs the binaries: cargo build --release -p srptd (SRPTD, SRPTADM
# override).

# shellcheck source=vm-srp-ours.sh
. "$(dirname "${BASH_SOURCE[0]}")/vm-srp-ours.sh"

SCENARIO_GUEST_TIMEOUT=900
SRPTADM=${SRPTADM:-$(dirname "$SRPTD")/srptadm}
SCENARIO_GUEST_BINS="$SRPTD $SRPTADM"
# The scsi_debug LBA whose reads fail, and how many after it.
MEDIUM_ERROR_LBA=30000
USN=pt-scsi-debug-1
# The vcdrom's image, made the same way on both VMs.
CD_IMAGE=/tmp/disc.iso
make_cd_image() {
  python3 -c 'import random, sys; open(sys.argv[1], "wb").write(random.Random(29).randbytes(2 << 20))' "$CD_IMAGE"
}
PT_NODE=${PT_NODE:-sg}

# sg_of_scsi_debug: the sg node of scsi_debug's disk.
sg_of_scsi_debug() {
  local d
  for d in /sys/class/scsi_generic/sg*; do
    grep -q scsi_debug "$d/device/model" 2>/dev/null && { echo "/dev/${d##*/}"; return 0; }
  done
  return 1
}

guest_target() {
  local ip guid_b sg tgt_guid done_msg
  ip=$(my_ip)
  modprobe sg
  modprobe scsi_debug dev_size_mb=16 opts=0x2002 delay=0 medium_error_start=$MEDIUM_ERROR_LBA medium_error_count=8 ||
    fail "modprobe scsi_debug (is it in the image's GUEST_MODULES?)"
  wait_until 30 "scsi_debug's sg node" sg_of_scsi_debug
  sg=$(sg_of_scsi_debug)
  wait_until 10 "$sg" test -c "$sg"
  step "scsi_debug disk at $sg: $(cat /sys/class/scsi_generic/${sg#/dev/}/device/vendor) $(cat /sys/class/scsi_generic/${sg#/dev/}/device/model)"
  local sysdev node
  sysdev=$(readlink -f "/sys/class/scsi_generic/${sg#/dev/}/device")
  node=$sg
  if [ "$PT_NODE" = bsg ]; then
    node=/dev/bsg/${sysdev##*/}
    wait_until 10 "$node" test -c "$node"
    step "exporting it by its bsg node $node"
  fi
  rdma link delete rxe0 2>/dev/null || true
  modprobe -r rdma_rxe 2>/dev/null || true
  make_cd_image
  cat >/tmp/pt.toml <<TOML
[target]
ip = "$ip"
rdma_cm_port = $SRP_PORT
control_socket = "/tmp/srptd.sock"

[[device]]
name = "pt0"
handler = "pass-through"
filename = "$node"
t10_vendor_id = "RUSTSCST"
usn = "$USN"

[[lun]]
lun = 0
device = "pt0"

[[device]]
name = "cd0"
handler = "vcdrom"
filename = "$CD_IMAGE"

[[lun]]
lun = 1
device = "cd0"
TOML
  /interop/bin/srptd --check -c /tmp/pt.toml >/tmp/check.out 2>&1 || { cat /tmp/check.out; fail "srptd --check refused the pass-through config"; }
  sed 's|^filename = .*|filename = "/dev/null"|' /tmp/pt.toml >/tmp/bad.toml
  if /interop/bin/srptd --check -c /tmp/bad.toml >/tmp/bad.out 2>&1; then
    fail "srptd --check took /dev/null for an sg node"
  fi
  grep -q "bad.toml:9: device\[0\].filename: .*not one of the sg driver" /tmp/bad.out ||
    { cat /tmp/bad.out; fail "--check of /dev/null: no file:line:key"; }
  step "--check: $node accepted; /dev/null refused: $(head -1 /tmp/bad.out)"
  /interop/bin/srptd -c /tmp/pt.toml >/tmp/srptd.log 2>&1 &
  wait_until 30 "srptd to listen" grep -q "listening on" /tmp/srptd.log
  step "$(head -1 /tmp/srptd.log)"
  tgt_guid=$(our_guid "$ip")
  guid_b=$(msg_recv 7001 600)
  [[ $guid_b =~ ^[0-9a-f]{16}$ ]] || fail "bad initiator GUID message '$guid_b'"
  msg_send "$(host_ip b)" "${READY_PORT:-7002}" 300 "ready $tgt_guid"
  step "srptd ready, waiting for the initiator"
  # The initiator's last step: the device deleted under its I/O.
  done_msg=$(msg_recv 7003 "${DONE_TIMEOUT:-900}")
  [ "$done_msg" = remove ] || fail "initiator reported '$done_msg'"
  echo 1 >"$sysdev/delete" || fail "cannot delete $sysdev"
  wait_until 30 "$sg to go" sh -c "! test -e /sys/class/scsi_generic/${sg#/dev/}"
  step "scsi_debug's disk deleted ($sysdev) under the initiator's I/O"
  msg_send "$(host_ip b)" 7004 60 removed
  done_msg=$(msg_recv 7001 "${DONE_TIMEOUT:-900}")
  [ "$done_msg" = done ] || fail "initiator reported '$done_msg'"
  local gone
  gone=$(/interop/bin/srptadm --socket /tmp/srptd.sock --json devices |
    python3 -c 'import json,sys; print([d["gone"] for d in json.load(sys.stdin) if d["name"] == "pt0"])')
  [ "$gone" = "[True]" ] || fail "srptadm devices: pt0 gone is $gone, not [True]"
  step "srptadm devices: pt0 is gone"
  # The initiator's LUN resets reached the device (SG_SCSI_RESET): with
  # opts' reset noise (0x2000) scsi_debug logs each device reset it is
  # asked for (Debian's kernel has no /proc/scsi, where it counts them).
  local resets
  resets=$(dmesg | grep -cE "scsi_debug_device_reset|doing device reset" || true)
  [ "$resets" -ge 2 ] || { dmesg | tail -20; fail "scsi_debug saw $resets device resets, not the initiator's 2"; }
  step "scsi_debug logged $resets device resets: the LUN resets reached the device"
  grep -qi "panic" /tmp/srptd.log && { cat /tmp/srptd.log; fail "srptd panicked"; }
  tail -5 /tmp/srptd.log
}

guest_initiator() {
  local dev a inq out
  a=$(host_ip a)
  modprobe sr_mod || fail "modprobe sr_mod (is it in the image's GUEST_MODULES?)"
  srp_login
  dev=$DEV
  step "disk $dev: $(cat /sys/block/${dev#/dev/}/size) sectors"
  [ "$(cat /sys/block/${dev#/dev/}/size)" -eq 32768 ] || fail "disk is not scsi_debug's 16 MiB"

  inq=$(sg_inq "$dev")
  echo "$inq" | sed 's/^/  /'
  echo "$inq" | grep -q "Vendor identification: RUSTSCST" || fail "vendor is not the configured RUSTSCST"
  echo "$inq" | grep -q "Product identification: scsi_debug" || fail "product is not the device's scsi_debug"
  sg_vpd -p sn "$dev" | sed 's/^/  /'
  sg_vpd -p sn "$dev" | grep -q "$USN" || fail "VPD 80h is not the configured usn"
  step "INQUIRY: configured vendor over the device's product; VPD 80h: $USN"

  head -c 4194304 /dev/urandom >/tmp/pattern
  dd if=/tmp/pattern of="$dev" bs=64k oflag=direct conv=fsync 2>&1 | tail -1
  dd if="$dev" of=/tmp/readback bs=64k count=64 iflag=direct 2>&1 | tail -1
  cmp /tmp/pattern /tmp/readback || fail "read-back data differs from the written pattern"
  step "dd: 4 MiB pattern written and read back identical"

  fio --name=ptverify --filename="$dev" --direct=1 --rw=randrw --bs=4k --iodepth=4 \
    --ioengine=libaio --offset=8m --size=4m --verify=crc32c --do_verify=1 \
    --output-format=terse --minimal >/tmp/fio.out 2>&1 || { cat /tmp/fio.out; fail "fio verify failed"; }
  step "fio randrw crc32c verify ok (terse: $(cut -d';' -f1-8 /tmp/fio.out | head -1))"

  # READ(10) of the injected LBA: the device's CHECK CONDITION, with its
  # INFORMATION field (the LBA), which only the device's sense carries.
  out=$(sg_raw -r 512 "$dev" 28 00 00 00 75 30 00 00 01 00 2>&1) && fail "READ of LBA $MEDIUM_ERROR_LBA succeeded"
  echo "$out" | sed 's/^/  /'
  echo "$out" | grep -qi "Medium Error" || fail "no MEDIUM ERROR for LBA $MEDIUM_ERROR_LBA"
  echo "$out" | grep -qi "Unrecovered read error" || fail "no UNRECOVERED READ ERROR"
  echo "$out" | grep -qiE "Info fld=0x7530|info.*30000" || fail "sense lacks the device's INFORMATION (LBA 0x7530)"
  if dd if="$dev" of=/dev/null bs=512 skip=$MEDIUM_ERROR_LBA count=1 iflag=direct 2>/dev/null; then
    fail "dd read of LBA $MEDIUM_ERROR_LBA succeeded"
  fi
  step "medium error: sg_raw and dd see the device's sense (Medium Error, 11/00, info $MEDIUM_ERROR_LBA)"

  # Persistent reservations are the target's (scsi_debug has none).
  sg_persist --out --register --param-sark=0x1234abcd "$dev" >/dev/null 2>&1 || fail "PR OUT REGISTER"
  sg_persist --out --reserve --param-rk=0x1234abcd --prout-type=1 "$dev" >/dev/null 2>&1 || fail "PR OUT RESERVE"
  sg_persist --in --read-keys "$dev" 2>&1 | sed 's/^/  /'
  sg_persist --in --read-keys "$dev" 2>&1 | grep -qi "0x1234abcd" || fail "READ KEYS lacks our key"
  sg_persist --in --read-reservation "$dev" 2>&1 | grep -qi "Write Exclusive" || fail "no Write Exclusive reservation"
  sg_persist --out --release --param-rk=0x1234abcd --prout-type=1 "$dev" >/dev/null 2>&1 || fail "PR OUT RELEASE"
  sg_persist --out --register --param-rk=0x1234abcd --param-sark=0 "$dev" >/dev/null 2>&1 || fail "PR OUT unregister"
  step "PR: register, reserve (write exclusive), read keys/reservation, release, unregister"

  second_nexus_reservations "$dev"

  vcdrom_read

  sg_reset --device "$dev" || fail "sg_reset --device"
  dd if="$dev" of=/tmp/readback bs=64k count=64 iflag=direct 2>&1 | tail -1
  cmp /tmp/pattern /tmp/readback || fail "data differs after the LUN reset"
  step "LUN reset: device reset, 4 MiB read back identical after it"

  reset_under_io "$dev"
  dd if="$dev" of=/tmp/readback bs=64k count=64 iflag=direct 2>&1 | tail -1
  cmp /tmp/pattern /tmp/readback || fail "data differs after the LUN reset under I/O"

  removal_under_io "$dev"

  local p
  for p in /sys/class/srp_remote_ports/port-*; do
    [ -e "$p/delete" ] && echo 1 >"$p/delete"
  done
  wait_until 60 "disk removal" sh -c '! ls /sys/block | grep -q "^sd"'
  msg_send "$a" 7001 120 done
}

# second_nexus_reservations DEV: a second ib_srp login (initiator_ext 2,
# so another initiator port ID) gives a second disk on the same LU; the
# reservation one nexus holds is enforced on the other (SPC-4 5.13).
second_nexus_reservations() {
  local dev1=$1 dev2 a tgt add out rc
  a=$(host_ip a)
  tgt=$(our_guid "$a")
  add=/sys/class/infiniband_srp/srp-rxe0-1/add_target
  retry 120 "second SRP login" sh -c "echo id_ext=$tgt,ioc_guid=$tgt,dest=$a:$SRP_PORT,initiator_ext=0000000000000002 >$add"
  wait_until 120 "a second $DISK_VENDOR disk" sh -c "[ \$(grep -l $DISK_VENDOR /sys/block/sd*/device/vendor | wc -l) -ge 2 ]"
  dev2=/dev/$(our_disks | grep -vx "${dev1#/dev/}" | head -1)
  wait_until 30 "$dev2 node" test -b "$dev2"
  step "second login (initiator_ext 2): $dev2, the same LU as $dev1"
  head -c 512 /dev/urandom >/tmp/blk
  # LBA 20480 (10 MiB), in the region fio overwrites later.
  local wr=(2a 00 00 00 50 00 00 00 01 00) rd=(28 00 00 00 50 00 00 00 01 00)

  sg_persist --out --register --param-sark=0xa1 "$dev1" >/dev/null 2>&1 || fail "PR OUT REGISTER (first nexus)"
  sg_persist --out --reserve --param-rk=0xa1 --prout-type=1 "$dev1" >/dev/null 2>&1 || fail "PR OUT RESERVE (first nexus)"
  sg_persist --out --register --param-sark=0xb2 "$dev2" >/dev/null 2>&1 || fail "PR OUT REGISTER (second nexus)"
  out=$(sg_persist --in --read-keys "$dev2" 2>&1)
  echo "$out" | sed 's/^/  /'
  echo "$out" | grep -qi "0xa1" && echo "$out" | grep -qi "0xb2" || fail "READ KEYS through the second nexus lacks a key"
  out=$(sg_persist --in --read-reservation "$dev2" 2>&1)
  echo "$out" | grep -qi "Key=0xa1" && echo "$out" | grep -qi "Write Exclusive" ||
    { echo "$out"; fail "the second nexus does not see the first's Write Exclusive reservation"; }

  # The second nexus: WRITE and RESERVE conflict, READ passes.
  rc=0; out=$(sg_raw -s 512 -i /tmp/blk "$dev2" "${wr[@]}" 2>&1) || rc=$?
  echo "$out" | sed 's/^/  /'
  echo "$out" | grep -qi "Reservation Conflict" ||
    fail "the second nexus's WRITE under the first's reservation: no RESERVATION CONFLICT (rc $rc)"
  rc=0; sg_persist --out --reserve --param-rk=0xb2 --prout-type=1 "$dev2" >/tmp/res2.out 2>&1 || rc=$?
  [ $rc -ne 0 ] && grep -qi "conflict" /tmp/res2.out ||
    { cat /tmp/res2.out; fail "the second nexus's RESERVE under the first's reservation: no RESERVATION CONFLICT (exit $rc)"; }
  sg_raw -r 512 "$dev2" "${rd[@]}" >/dev/null 2>&1 || fail "the second nexus's READ under Write Exclusive was refused"
  sg_raw -s 512 -i /tmp/blk "$dev1" "${wr[@]}" >/dev/null 2>&1 || fail "the holder's WRITE was refused"
  step "PR across nexuses: first holds Write Exclusive; second's WRITE and RESERVE get RESERVATION CONFLICT, its READ passes"

  sg_persist --out --release --param-rk=0xa1 --prout-type=1 "$dev1" >/dev/null 2>&1 || fail "PR OUT RELEASE"
  sg_raw -s 512 -i /tmp/blk "$dev2" "${wr[@]}" >/dev/null 2>&1 || fail "the second nexus's WRITE after the release was refused"
  sg_persist --out --register --param-rk=0xa1 --param-sark=0 "$dev1" >/dev/null 2>&1 || fail "PR OUT unregister (first)"
  sg_persist --out --register --param-rk=0xb2 --param-sark=0 "$dev2" >/dev/null 2>&1 || fail "PR OUT unregister (second)"
  out=$(sg_persist --in --read-keys "$dev1" 2>&1)
  echo "$out" | grep -qiE "0xa1|0xb2" && { echo "$out"; fail "keys left after unregistering"; }
  step "PR: after the release the second nexus writes; both keys unregistered"
}

# reset_under_io DEV: a fio crc32c verify job on DEV, a LUN reset sent
# while it writes (its write count has moved and it still runs), and the
# job's verify passing.
reset_under_io() {
  local dev=$1 sd base now fio_pid n rc=0
  sd=${dev#/dev/}
  base=$(awk '{print $5}' "/sys/block/$sd/stat")
  fio --name=ptreset --filename="$dev" --direct=1 --rw=randwrite --bs=4k --iodepth=8 \
    --ioengine=libaio --offset=8m --size=4m --verify=crc32c --do_verify=1 \
    --output-format=terse --minimal >/tmp/fio-reset.out 2>&1 &
  fio_pid=$!
  # Bounded: 300 looks, 0.1 s apart, for fio's first completed writes.
  for ((n = 0; n < 300; n++)); do
    now=$(awk '{print $5}' "/sys/block/$sd/stat")
    [ "$now" -gt $((base + 16)) ] && break
    kill -0 $fio_pid 2>/dev/null || break
    sleep 0.1
  done
  [ "$now" -gt $((base + 16)) ] || { cat /tmp/fio-reset.out; fail "fio wrote nothing in 30 s"; }
  kill -0 $fio_pid 2>/dev/null || fail "fio ended before the LUN reset (make the job longer)"
  local during=$((now - base))
  sg_reset --device "$dev" || fail "sg_reset --device under I/O"
  wait $fio_pid || rc=$?
  [ $rc -eq 0 ] || { cat /tmp/fio-reset.out; fail "fio verify across the LUN reset failed (rc $rc)"; }
  step "LUN reset under I/O: sent after $during of fio's writes; crc32c verify passed ($(cut -d';' -f1-8 /tmp/fio-reset.out | head -1))"
}

# removal_under_io DEV: fio writes to DEV while VM a deletes the device
# behind the LUN; fio must end with an error within a minute (the target
# answers LOGICAL UNIT NOT SUPPORTED, which Linux does not retry), not
# hang until its runtime.
removal_under_io() {
  local dev=$1 sd base now fio_pid n rc=0 a
  a=$(host_ip a)
  sd=${dev#/dev/}
  base=$(awk '{print $5}' "/sys/block/$sd/stat")
  dmesg -c >/dev/null
  fio --name=ptgone --filename="$dev" --direct=1 --rw=randwrite --bs=4k --iodepth=4 \
    --ioengine=libaio --offset=8m --size=4m --time_based --runtime=300 \
    --output-format=terse --minimal >/tmp/fio-gone.out 2>&1 &
  fio_pid=$!
  # Bounded: 300 looks, 0.1 s apart, for fio's first completed writes.
  for ((n = 0; n < 300; n++)); do
    now=$(awk '{print $5}' "/sys/block/$sd/stat")
    [ "$now" -gt $((base + 16)) ] && break
    sleep 0.1
  done
  [ "$now" -gt $((base + 16)) ] || { cat /tmp/fio-gone.out; fail "fio wrote nothing in 30 s"; }
  msg_send "$a" 7003 60 remove
  [ "$(msg_recv 7004 120)" = removed ] || fail "the target did not remove the device"
  # Bounded: 600 looks, 0.1 s apart.
  for ((n = 0; n < 600; n++)); do
    kill -0 $fio_pid 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 $fio_pid 2>/dev/null; then
    kill $fio_pid
    fail "fio still runs 60 s after the device behind the LUN was removed"
  fi
  wait $fio_pid || rc=$?
  [ $rc -ne 0 ] || { cat /tmp/fio-gone.out; fail "fio passed although the device was removed under it"; }
  dmesg | grep -i "sense" | head -3 | sed 's/^/  /'
  dmesg | grep -qi "Logical unit not supported" ||
    { dmesg | tail -20; fail "no LOGICAL UNIT NOT SUPPORTED in the kernel log"; }
  step "device removed under I/O: fio ended with an error (rc $rc) after $((n / 10)) s, LOGICAL UNIT NOT SUPPORTED"
}

# vcdrom_read: LUN 1, the vcdrom, is Linux's CD-ROM drive srN: its size and
# bytes are the image's; an eject through its sg node leaves no medium.
vcdrom_read() {
  local sr sgcd out
  wait_until 60 "the vcdrom's sr node" sh -c 'ls /sys/block | grep -q "^sr"'
  sr=$(ls /sys/block | grep "^sr" | head -1)
  wait_until 30 "/dev/$sr" test -b "/dev/$sr"
  sg_inq "/dev/$sr" | grep -E "PDT|Vendor|Product" | sed 's/^/  /'
  sg_inq "/dev/$sr" | grep -q "PDT=5" || fail "/dev/$sr is not a CD-ROM (peripheral type 5)"
  [ "$(cat "/sys/block/$sr/size")" -eq 4096 ] || fail "/dev/$sr has $(cat "/sys/block/$sr/size") sectors, not the image's 4096"
  make_cd_image
  dd if="/dev/$sr" of=/tmp/disc.read bs=2048 iflag=direct 2>&1 | tail -1
  cmp "$CD_IMAGE" /tmp/disc.read || fail "/dev/$sr differs from the vcdrom's image"
  step "vcdrom: /dev/$sr is a CD-ROM of 2 MiB, read back identical to the image"
  sgcd=/dev/$(ls "/sys/block/$sr/device/scsi_generic" | head -1)
  sg_start --eject "$sgcd" || fail "sg_start --eject $sgcd"
  out=$(sg_turs -v "$sgcd" 2>&1) && fail "TEST UNIT READY passed with the disc ejected"
  echo "$out" | sed 's/^/  /' | head -3
  echo "$out" | grep -qi "medium not present" || fail "TEST UNIT READY after the eject: no MEDIUM NOT PRESENT"
  step "vcdrom: ejected through $sgcd, TEST UNIT READY says medium not present"
}
