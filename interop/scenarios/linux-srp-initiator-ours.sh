# shellcheck shell=bash
# linux-srp-initiator-ours: Linux's own SRP initiator (ib_srp over rxe, in
# VM a) logs in to our SRP target (srptd on the host side at 10.77.0.2,
# soft RoCE NIC, logins by RDMA CM on port 5555), writes a random pattern
# with dd (O_DIRECT), reads it back and compares, runs a short fio verify
# job, and logs out.
# Needs the binary: cargo build --release -p srpstack (SRPTD overrides).

SCENARIO_VMS=("a 11 initiator")
SCENARIO_GUEST_TIMEOUT=900
# RDMA WRITE (our target moving read data), RDMA READ request (fetching
# write data), SEND (SRP IUs), CM MADs (the RDMA CM login).
SCENARIO_EXPECT_PROTOCOLS="infiniband.bth.opcode>=6&&infiniband.bth.opcode<=10 infiniband.bth.opcode==12 infiniband.bth.opcode==4 infiniband.mad"

SRPTD=${SRPTD:-${CARGO_TARGET_DIR:-$INTEROP_DIR/../target}/release/srptd}
# srptd's target port: id_ext and ioc_guid are its CA GUID.
OUR_TARGET_GUID=0002c90300a00001

host_main() {
  [ -x "$SRPTD" ] || { echo "missing $SRPTD: run cargo build --release -p srpstack"; return 1; }
  ns_add_ip 10.77.0.2
  ns_bg srptd 900 "$SRPTD" --ip 10.77.0.2 --ram-mib 16 --rdma-cm-port 5555
  local i
  for i in $(seq 1 100); do
    grep -q "listening on" "$RUN_DIR/host-srptd.log" 2>/dev/null && break
    sleep 0.1
  done
  grep -q "listening on" "$RUN_DIR/host-srptd.log" || { cat "$RUN_DIR/host-srptd.log"; return 1; }
  cat "$RUN_DIR/host-srptd.log"
}

# Prints the sdX whose SCSI vendor is ours.
our_disk() {
  local d
  for d in /sys/block/sd*; do
    [ -e "$d/device/vendor" ] || continue
    grep -q RUSTSCST "$d/device/vendor" && { echo "${d##*/}"; return 0; }
  done
  return 1
}

guest_initiator() {
  local dev add=/sys/class/infiniband_srp/srp-rxe0-1/add_target
  modprobe ib_srp
  modprobe sd_mod 2>/dev/null || true
  modprobe sg 2>/dev/null || true
  [ -e $add ] || fail "$add missing"
  step "add_target id_ext=$OUR_TARGET_GUID,ioc_guid=$OUR_TARGET_GUID,dest=10.77.0.2:5555"
  retry 120 "SRP login" sh -c "echo id_ext=$OUR_TARGET_GUID,ioc_guid=$OUR_TARGET_GUID,dest=10.77.0.2:5555 >$add"
  wait_until 120 "our disk" our_disk
  dev=/dev/$(our_disk)
  wait_until 30 "$dev node" test -b "$dev"
  step "disk $dev: $(cat /sys/block/${dev#/dev/}/size) sectors"
  sg_inq "$dev" | sed 's/^/  /'
  sg_readcap "$dev" | sed 's/^/  /'
  [ "$(cat /sys/block/${dev#/dev/}/size)" -eq 32768 ] || fail "disk is not 16 MiB"

  head -c 4194304 /dev/urandom >/tmp/pattern
  dd if=/tmp/pattern of="$dev" bs=64k oflag=direct conv=fsync 2>&1 | tail -1
  dd if="$dev" of=/tmp/readback bs=64k count=64 iflag=direct 2>&1 | tail -1
  cmp /tmp/pattern /tmp/readback || fail "read-back data differs from the written pattern"
  step "dd: 4 MiB pattern written and read back identical"

  fio --name=srpverify --filename="$dev" --direct=1 --rw=randwrite --bs=4k \
    --offset=8m --size=4m --ioengine=psync --verify=crc32c --do_verify=1 \
    --output-format=terse --minimal >/tmp/fio.out 2>&1 || { cat /tmp/fio.out; fail "fio verify failed"; }
  step "fio randwrite+verify ok (terse: $(cut -d';' -f1-8 /tmp/fio.out | head -1))"

  local p
  for p in /sys/class/srp_remote_ports/port-*; do
    [ -e "$p/delete" ] && echo 1 >"$p/delete"
  done
  wait_until 60 "disk removal" sh -c '! ls /sys/block | grep -q "^sd"'
  dmesg | grep -i srp | tail -8
}
