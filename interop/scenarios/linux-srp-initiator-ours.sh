# shellcheck shell=bash
# linux-srp-initiator-ours: Linux's own SRP initiator (ib_srp over rxe, in
# VM a) logs in to our SRP target (srptd on the host side at 10.77.0.2,
# soft RoCE NIC, logins by RDMA CM on port 5555), writes a random pattern
# with dd (O_DIRECT), reads it back and compares, runs fio verify jobs,
# makes an ext4 file system and checks it, measures sequential read
# bandwidth, moves 4 and 8 MiB direct I/Os with cmd_sg_entries=1 and 255,
# adds and removes a LUN on our side (srptadm, through a host relay) while
# fio verifies LUN 0, resets the LU with sg_reset during I/O, and logs out
# and in again 20 times under verification. ch_count=2 (two RDMA
# channels, SINGLE then MULTI) and immediate data are used.
# Needs the binary: cargo build --release -p srptd (SRPTD overrides).

SCENARIO_VMS=("a 11 initiator")
SCENARIO_GUEST_TIMEOUT=900
# RDMA WRITE (our target moving read data), RDMA READ request (fetching
# write data), SEND (SRP IUs), CM MADs (the RDMA CM login).
# SRP payloads are not RPC-over-RDMA: tshark's rpcordma heuristic takes an
# SRP_RSP whose REQ_LIM_DELTA is 1 for an RPC-over-RDMA v1 header and then
# reports it malformed.
SCENARIO_TSHARK_ARGS="--disable-heuristic rpcrdma_infiniband"
SCENARIO_EXPECT_PROTOCOLS="infiniband.bth.opcode>=6&&infiniband.bth.opcode<=10 infiniband.bth.opcode==12 infiniband.bth.opcode==4 infiniband.mad"

SRPTD=${SRPTD:-${CARGO_TARGET_DIR:-$INTEROP_DIR/../target}/release/srptd}
SRPTADM=${SRPTADM:-$(dirname "$SRPTD")/srptadm}
# srptd's target port: id_ext and ioc_guid are its CA GUID, which is
# 0002c903 and its address (10.77.0.2).
OUR_TARGET_GUID=0002c9030a4d0002

host_main() {
  [ -x "$SRPTD" ] || { echo "missing $SRPTD: run cargo build --release -p srptd -p srp-cli"; return 1; }
  [ -x "$SRPTADM" ] || { echo "missing $SRPTADM: run cargo build --release -p srptd -p srp-cli"; return 1; }
  ns_add_ip 10.77.0.2
  ns_bg srptd 900 "$SRPTD" --ip 10.77.0.2 --ram-mib 32 --rdma-cm-port 5555 --control-socket "$RUN_DIR/srptd.sock"
  ns_bg_ready srptd "listening on" || return 1
  cat "$RUN_DIR/host-srptd.log"
  # The guest changes our LUN maps through this relay (srptadm on the host).
  ns_bg relay 900 python3 "$INTEROP_DIR/lib/adm_relay.py" 10.77.0.1 7000 "$SRPTADM" "$RUN_DIR/srptd.sock"
  ns_bg_ready relay "relay listening" || return 1
}

# Where the srptadm relay listens (the host side; a scenario with our
# target in a VM points it there).
ADM_RELAY=${ADM_RELAY:-10.77.0.1}

# adm ARGS...: srptadm ARGS on our target's side, through the relay.
adm() {
  python3 - "$ADM_RELAY" "$@" <<'PY'
import socket, sys
s = socket.create_connection((sys.argv.pop(1), 7000), timeout=30)
s.sendall((" ".join(sys.argv[1:]) + "\n").encode())
data = b""
while True:
    b = s.recv(4096)
    if not b:
        break
    data += b
out = data.decode()
print(out, end="")
sys.exit(0 if out.startswith("OK") else 1)
PY
}

# The H:C:T of our disk's SCSI address (DEV must be set).
disk_htc() {
  local a
  a=$(ls /sys/block/${DEV#/dev/}/device/scsi_device/)
  echo "${a%:*}"
}

# fio_bg NAME: verified random I/O on DEV's 8..16 MiB in the background; sets FIO_PID.
fio_bg() {
  fio --name="$1" --filename="$DEV" --direct=1 --rw=randrw --bs=4k --iodepth=4 \
    --ioengine=libaio --offset=8m --size=8m --loops=6 --verify=crc32c --do_verify=1 \
    --output-format=terse --minimal >/tmp/$1.out 2>&1 &
  FIO_PID=$!
}

fio_wait() {
  wait "$FIO_PID" || { cat /tmp/$1.out; fail "$1: fio failed"; }
  # terse v3: field 5 is the job's error count.
  [ "$(cut -d';' -f5 /tmp/$1.out | head -1)" = 0 ] || { cat /tmp/$1.out; fail "$1: fio errors"; }
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

# Where our target listens (a scenario with it in a VM sets both).
OUR_TARGET_DEST=${OUR_TARGET_DEST:-10.77.0.2:5555}

# login EXTRA: add_target with extra options; sets DEV.
login() {
  local add=/sys/class/infiniband_srp/srp-rxe0-1/add_target
  local base="id_ext=$OUR_TARGET_GUID,ioc_guid=$OUR_TARGET_GUID,dest=$OUR_TARGET_DEST"
  [ -e $add ] || fail "$add missing"
  retry 120 "SRP login ($1)" sh -c "echo $base${1:+,$1} >$add"
  wait_until 120 "our disk" our_disk
  DEV=/dev/$(our_disk)
  wait_until 30 "$DEV node" test -b "$DEV"
}

# big_io MIB: one O_DIRECT write and read of MIB MiB in a single request, compared.
big_io() {
  head -c $(( $1 * 1048576 )) /dev/urandom >/tmp/big
  dd if=/tmp/big of="$DEV" bs=${1}M count=1 oflag=direct conv=fsync 2>/dev/null || fail "dd write ${1} MiB"
  dd if="$DEV" of=/tmp/big.back bs=${1}M count=1 iflag=direct 2>/dev/null || fail "dd read ${1} MiB"
  cmp /tmp/big /tmp/big.back || fail "${1} MiB read back differs"
}

guest_initiator() {
  modprobe ib_srp
  modprobe sd_mod 2>/dev/null || true
  modprobe sg 2>/dev/null || true

  step "login with ch_count=2"
  login "ch_count=2"
  step "disk $DEV: $(cat /sys/block/${DEV#/dev/}/size) sectors"
  [ "$(cat /sys/block/${DEV#/dev/}/size)" -eq 65536 ] || fail "disk is not 32 MiB"
  wait_until 20 "ib_srp to use immediate data" sh -c 'dmesg | grep -q "using immediate data"'
  step "ib_srp messages: $(dmesg | grep -i 'scsi host' | grep -i srp | tail -3 | tr '\n' '|')"
  sg_inq "$DEV" | sed 's/^/  /'
  sg_inq "$DEV" | grep -q "Vendor identification: RUSTSCST" || fail "vendor is not RUSTSCST"
  sg_vpd -p di "$DEV" | sed 's/^/  /'
  sg_vpd -p di "$DEV" | grep -qi "naa" || fail "no NAA designator in VPD 0x83"

  pattern_rw "$DEV"

  fio_verify srpverify "$DEV"

  step "LUN 1 added and removed on our target while fio verifies LUN 0"
  fio_bg lunchange
  adm add-device extra --handler ram --size 16M >/dev/null || fail "srptadm add-device"
  adm add-lun 1 extra >/dev/null || fail "srptadm add-lun"
  local htc lun1
  htc=$(disk_htc)
  echo "- - -" >/sys/class/scsi_host/host${htc%%:*}/scan
  wait_until 30 "LUN 1 to appear" test -d "/sys/class/scsi_device/$htc:1/device/block"
  lun1=/dev/$(ls "/sys/class/scsi_device/$htc:1/device/block/")
  wait_until 30 "$lun1 node" test -b "$lun1"
  [ "$(cat /sys/block/${lun1#/dev/}/size)" -eq 32768 ] || fail "LUN 1 is not 16 MiB"
  head -c 2097152 /dev/urandom >/tmp/l1
  dd if=/tmp/l1 of="$lun1" bs=64k oflag=direct 2>/dev/null || fail "write LUN 1"
  dd if="$lun1" of=/tmp/l1.back bs=64k count=32 iflag=direct 2>/dev/null || fail "read LUN 1"
  cmp /tmp/l1 /tmp/l1.back || fail "LUN 1 data differs"
  adm remove-lun 1 >/dev/null || fail "srptadm remove-lun"
  if dd if="$lun1" of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null; then
    fail "LUN 1 still readable after removal"
  fi
  echo 1 >"/sys/class/scsi_device/$htc:1/device/delete"
  adm remove-device extra >/dev/null || fail "srptadm remove-device"
  fio_wait lunchange
  step "LUN 1: appeared on rescan, 2 MiB verified, refused after removal; fio on LUN 0 verified with no errors"

  step "sg_reset --device during verified I/O"
  fio_bg reset
  sg_reset --device "$DEV" || fail "sg_reset --device"
  fio_wait reset
  dmesg | grep -i "reset" | tail -3
  step "LOGICAL UNIT RESET during I/O: fio verified with no errors"

  fio --name=seqread --filename="$DEV" --direct=1 --rw=read --bs=1m --iodepth=8 \
    --ioengine=libaio --size=16m --loops=8 --output-format=terse --minimal >/tmp/bw.out 2>&1 ||
    { cat /tmp/bw.out; fail "fio seq read failed"; }
  # terse v3: field 7 is read bandwidth in KiB/s.
  step "THROUGHPUT seq-read-1m-qd8 $(cut -d';' -f7 /tmp/bw.out) KiB/s"

  mkfs.ext4 -q -F "$DEV" || fail "mkfs.ext4"
  mkdir -p /mnt/srp
  mount "$DEV" /mnt/srp || fail "mount"
  for i in 1 2 3 4; do head -c 1048576 /dev/urandom >/mnt/srp/file$i; done
  sha1sum /mnt/srp/file* >/tmp/sums
  umount /mnt/srp
  mount "$DEV" /mnt/srp || fail "mount again"
  (cd / && sha1sum -c /tmp/sums >/dev/null) || fail "files changed across a remount"
  umount /mnt/srp
  fsck.ext4 -fn "$DEV" >/tmp/fsck.out 2>&1 || { cat /tmp/fsck.out; fail "fsck found errors"; }
  step "ext4: mkfs, 4 files written and read back after a remount, fsck -fn clean"
  srp_remove_all

  local sg
  for sg in 1 255; do
    login "cmd_sg_entries=$sg"
    big_io 4
    big_io 8
    step "cmd_sg_entries=$sg: 4 MiB and 8 MiB direct I/O verified"
    srp_remove_all
  done

  local n
  for n in $(seq 1 20); do
    login ""
    dd if=/tmp/pattern of="$DEV" bs=64k oflag=direct 2>/dev/null
    dd if="$DEV" of=/tmp/readback bs=64k count=64 iflag=direct 2>/dev/null
    cmp /tmp/pattern /tmp/readback || fail "login $n: data differs"
    srp_remove_all
  done
  step "20 more logins and logouts, 4 MiB verified in each"
  dmesg | grep -i srp | tail -8
}
