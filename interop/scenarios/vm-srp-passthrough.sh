# shellcheck shell=bash
# vm-srp-passthrough: srptd exporting a real SCSI device by pass-through
# (issue 29 item 1, SCST's scst_disk). VM a loads scsi_debug (a 16 MiB
# disk whose reads of LBAs 30000..30007 fail with MEDIUM ERROR: opts=2),
# finds its sg node, checks the config with `srptd --check` (and that a
# pass-through on /dev/null is refused naming the key), and runs srptd
# with that node as LUN 0 (handler = "pass-through", vendor and usn
# overridden). VM b logs in with Linux ib_srp (vm-srp's initiator login)
# and checks: INQUIRY shows the configured vendor over the device's
# product, VPD 80h the configured usn; a dd pattern written and read back;
# fio crc32c verify; the injected medium error reaches the initiator with
# the device's own sense (sg_raw shows its INFORMATION field, the LBA);
# PERSISTENT RESERVE OUT/IN answered by srptd (scsi_debug has no PR); a
# LUN reset (sg_reset --device, SG_SCSI_RESET on the target's side) and
# I/O after it; logout.
# Needs the binary: cargo build --release -p srptd (SRPTD overrides).

# shellcheck source=vm-srp-ours.sh
. "$(dirname "${BASH_SOURCE[0]}")/vm-srp-ours.sh"

SCENARIO_GUEST_TIMEOUT=900
# The scsi_debug LBA whose reads fail, and how many after it.
MEDIUM_ERROR_LBA=30000
USN=pt-scsi-debug-1

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
  modprobe scsi_debug dev_size_mb=16 opts=2 medium_error_start=$MEDIUM_ERROR_LBA medium_error_count=8 ||
    fail "modprobe scsi_debug (is it in the image's GUEST_MODULES?)"
  wait_until 30 "scsi_debug's sg node" sg_of_scsi_debug
  sg=$(sg_of_scsi_debug)
  wait_until 10 "$sg" test -c "$sg"
  step "scsi_debug disk at $sg: $(cat /sys/class/scsi_generic/${sg#/dev/}/device/vendor) $(cat /sys/class/scsi_generic/${sg#/dev/}/device/model)"
  rdma link delete rxe0 2>/dev/null || true
  modprobe -r rdma_rxe 2>/dev/null || true
  cat >/tmp/pt.toml <<TOML
[target]
ip = "$ip"
rdma_cm_port = $SRP_PORT
control_socket = "/tmp/srptd.sock"

[[device]]
name = "pt0"
handler = "pass-through"
filename = "$sg"
t10_vendor_id = "RUSTSCST"
usn = "$USN"

[[lun]]
lun = 0
device = "pt0"
TOML
  /interop/bin/srptd --check -c /tmp/pt.toml >/tmp/check.out 2>&1 || { cat /tmp/check.out; fail "srptd --check refused the pass-through config"; }
  sed 's|/dev/sg[0-9]*|/dev/null|' /tmp/pt.toml >/tmp/bad.toml
  if /interop/bin/srptd --check -c /tmp/bad.toml >/tmp/bad.out 2>&1; then
    fail "srptd --check took /dev/null for an sg node"
  fi
  grep -q "bad.toml:9: device\[0\].filename: .*not one of the sg driver" /tmp/bad.out ||
    { cat /tmp/bad.out; fail "--check of /dev/null: no file:line:key"; }
  step "--check: $sg accepted; /dev/null refused: $(head -1 /tmp/bad.out)"
  /interop/bin/srptd -c /tmp/pt.toml >/tmp/srptd.log 2>&1 &
  wait_until 30 "srptd to listen" grep -q "listening on" /tmp/srptd.log
  step "$(head -1 /tmp/srptd.log)"
  tgt_guid=$(our_guid "$ip")
  guid_b=$(msg_recv 7001 600)
  [[ $guid_b =~ ^[0-9a-f]{16}$ ]] || fail "bad initiator GUID message '$guid_b'"
  msg_send "$(host_ip b)" "${READY_PORT:-7002}" 300 "ready $tgt_guid"
  step "srptd ready, waiting for the initiator"
  done_msg=$(msg_recv 7001 "${DONE_TIMEOUT:-900}")
  [ "$done_msg" = done ] || fail "initiator reported '$done_msg'"
  # The initiator's LUN reset reached the device (SG_SCSI_RESET): scsi_debug
  # counts the device resets its host was asked for.
  local resets
  resets=$(cat /proc/scsi/scsi_debug/* 2>/dev/null | grep -o "RESETs: device=[0-9]*" | head -1 || true)
  case $resets in
    # Debian's kernel has no /proc/scsi (SCSI_PROC_FS off), where
    # scsi_debug shows its counters.
    "") step "NOTE: no scsi_debug reset counter (no /proc/scsi): the device reset is not checked" ;;
    *device=0) fail "the LUN reset did not reach the device ($resets)" ;;
    *) step "scsi_debug $resets: the LUN reset reached the device" ;;
  esac
  grep -qi "panic" /tmp/srptd.log && { cat /tmp/srptd.log; fail "srptd panicked"; }
  tail -5 /tmp/srptd.log
}

guest_initiator() {
  local dev a inq out
  a=$(host_ip a)
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

  sg_reset --device "$dev" || fail "sg_reset --device"
  dd if="$dev" of=/tmp/readback bs=64k count=64 iflag=direct 2>&1 | tail -1
  cmp /tmp/pattern /tmp/readback || fail "data differs after the LUN reset"
  step "LUN reset: device reset, 4 MiB read back identical after it"

  local p
  for p in /sys/class/srp_remote_ports/port-*; do
    [ -e "$p/delete" ] && echo 1 >"$p/delete"
  done
  wait_until 60 "disk removal" sh -c '! ls /sys/block | grep -q "^sd"'
  msg_send "$a" 7001 120 done
}
