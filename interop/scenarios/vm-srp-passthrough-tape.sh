# shellcheck shell=bash
# vm-srp-passthrough-tape: a tape drive exported by pass-through (issue 29:
# tapes through scst_disk's equivalent) and driven by Linux's st driver
# with mt and dd on the initiator. Debian 12's scsi_debug has no tape, so
# VM a makes one: tgt's virtual tape (bs_ssc, a 64 MiB cartridge made by
# tgtimg), reached through open-iscsi on loopback, which gives VM a a real
# SCSI tape (type 1) with an sg node; srptd exports that sg node as LUN 0.
# VM b logs in with Linux ib_srp and gets /dev/nst0: `mt status`; 16
# variable-size 64 KiB blocks written with dd, a filemark (st writes one
# when the writer closes the device), a second file of 4 blocks of 32 KiB,
# a filemark, and `mt status` at file 2; rewound,
# both files read back identical (dd stops at each filemark); `mt fsf 1`
# to file 1 and the second file read again; rewound and unloaded (mt
# offline). srptd passes SSC commands it has no table for (READ(6),
# WRITE(6), WRITE FILEMARKS, SPACE, READ POSITION, REWIND, LOAD UNLOAD).
# Needs the binary: cargo build --release -p srptd (SRPTD overrides).

# shellcheck source=vm-srp-ours.sh
. "$(dirname "${BASH_SOURCE[0]}")/vm-srp-ours.sh"

SCENARIO_GUEST_TIMEOUT=900
TAPE_IQN=iqn.2026-11.rdma-interop:tape

# sg_of_tape: the sg node of the (one) tape drive.
sg_of_tape() {
  local d
  for d in /sys/class/scsi_generic/sg*; do
    [ "$(cat "$d/device/type" 2>/dev/null)" = 1 ] && { echo "/dev/${d##*/}"; return 0; }
  done
  return 1
}

# make_tape: tgtd with one virtual tape, logged in to by open-iscsi.
make_tape() {
  modprobe st
  modprobe sg
  modprobe iscsi_tcp || fail "modprobe iscsi_tcp (is it in the image's GUEST_MODULES?)"
  mkdir -p /var/run/tgtd /etc/iscsi /run/lock/iscsi /var/lib/iscsi
  tgtimg --op=new --device-type=tape --barcode=RUST0001 --size=64 --type=data \
    --file=/tmp/tape.img >/tmp/tgtimg.out 2>&1 || { cat /tmp/tgtimg.out; fail "tgtimg"; }
  tgtd -f >/tmp/tgtd.log 2>&1 &
  wait_until 30 "tgtd" tgtadm --lld iscsi --op show --mode target
  tgtadm --lld iscsi --op new --mode target --tid 1 -T "$TAPE_IQN" || fail "tgtadm new target"
  tgtadm --lld iscsi --op new --mode logicalunit --tid 1 --lun 1 --bstype ssc \
    --device-type tape -b /tmp/tape.img || fail "tgtadm new tape LU"
  tgtadm --lld iscsi --op bind --mode target --tid 1 -I ALL || fail "tgtadm bind"
  [ -s /etc/iscsi/initiatorname.iscsi ] ||
    echo "InitiatorName=iqn.2026-11.rdma-interop:a" >/etc/iscsi/initiatorname.iscsi
  iscsid -f >/tmp/iscsid.log 2>&1 &
  wait_until 30 "iscsid" sh -c 'iscsiadm -m session 2>&1 | grep -qv "Could not\|not running\|Connection refused"'
  iscsiadm -m discovery -t st -p 127.0.0.1 >/tmp/disc.out 2>&1 || { cat /tmp/disc.out /tmp/iscsid.log; fail "iscsi discovery"; }
  iscsiadm -m node -T "$TAPE_IQN" -p 127.0.0.1 --login >/tmp/login.out 2>&1 ||
    { cat /tmp/login.out /tmp/iscsid.log; fail "iscsi login to tgt"; }
  wait_until 30 "the tape's sg node" sg_of_tape
}

guest_target() {
  local ip guid_b sg done_msg
  ip=$(my_ip)
  make_tape
  sg=$(sg_of_tape)
  wait_until 10 "$sg" test -c "$sg"
  step "tgt's virtual tape at $sg: $(sg_inq "$sg" | grep -E 'Vendor|Product' | tr -s ' ' | tr '\n' ' ')"
  rdma link delete rxe0 2>/dev/null || true
  modprobe -r rdma_rxe 2>/dev/null || true
  cat >/tmp/tape.toml <<TOML
[target]
ip = "$ip"
rdma_cm_port = $SRP_PORT
control_socket = "/tmp/srptd.sock"

[[device]]
name = "tape0"
handler = "pass-through"
filename = "$sg"

[[lun]]
lun = 0
device = "tape0"
TOML
  /interop/bin/srptd --check -c /tmp/tape.toml >/tmp/check.out 2>&1 || { cat /tmp/check.out; fail "srptd --check refused the tape config"; }
  /interop/bin/srptd -c /tmp/tape.toml >/tmp/srptd.log 2>&1 &
  wait_until 30 "srptd to listen" grep -q "listening on" /tmp/srptd.log
  step "$(head -1 /tmp/srptd.log)"
  guid_b=$(msg_recv 7001 600)
  [[ $guid_b =~ ^[0-9a-f]{16}$ ]] || fail "bad initiator GUID message '$guid_b'"
  msg_send "$(host_ip b)" 7002 300 "ready $(our_guid "$ip")"
  step "srptd ready, waiting for the initiator"
  done_msg=$(msg_recv 7001 "${DONE_TIMEOUT:-900}")
  [ "$done_msg" = done ] || fail "initiator reported '$done_msg'"
  grep -qi "panic" /tmp/srptd.log && { cat /tmp/srptd.log; fail "srptd panicked"; }
  tail -3 /tmp/srptd.log
}

# tape_login: ib_srp logs in to VM a's srptd; waits for its tape.
tape_login() {
  modprobe st
  srp_add_target
  wait_until 120 "a tape drive (st)" test -e /sys/class/scsi_tape/nst0
  wait_until 30 "/dev/nst0" test -c /dev/nst0
}

# tape_fail REASON: tell VM a (which then stops waiting), fail.
tape_fail() {
  msg_send "$(host_ip a)" 7001 30 "failed: $1" || true
  fail "$1"
}

# tape_dd WHAT DD-ARGS...: dd, its last line shown; a failure fails the
# scenario with WHAT.
tape_dd() {
  local what=$1
  shift
  dd "$@" >/tmp/dd.out 2>&1 || { cat /tmp/dd.out; tape_fail "dd: $what"; }
  tail -1 /tmp/dd.out
}

# tape_position DEV: where the drive is, as `mt status` (file and block
# numbers) and READ POSITION (`mt tell`, the drive's logical block, when
# it answers) say.
tape_position() {
  local st tell
  st=$(mt -f "$1" status 2>&1 | sed -n 's/^File number=\([0-9-]*\), block number=\([0-9-]*\).*/file \1, block \2/p')
  tell=$(mt -f "$1" tell 2>&1 || true)
  echo "$st (mt tell: $tell)"
}

guest_initiator() {
  local a t=/dev/nst0 pos
  a=$(host_ip a)
  tape_login
  mt -f "$t" status 2>&1 | sed 's/^/  /'
  mt -f "$t" rewind || tape_fail "mt rewind"
  head -c $((16 * 65536)) /dev/urandom >/tmp/file1
  head -c $((4 * 32768)) /dev/urandom >/tmp/file2
  mt -f "$t" setblk 0 || tape_fail "mt setblk 0 (variable blocks)"
  # st writes a filemark (WRITE FILEMARKS) when the device is closed
  # after writing: each dd leaves one file.
  tape_dd "writing the first file" if=/tmp/file1 of="$t" bs=64k
  tape_dd "writing the second file" if=/tmp/file2 of="$t" bs=32k
  pos=$(tape_position "$t")
  step "wrote 16 x 64 KiB and 4 x 32 KiB blocks in two files: $pos"
  echo "$pos" | grep -q "file 2, block 0" || tape_fail "after writing: $pos, not file 2, block 0"
  mt -f "$t" rewind || tape_fail "mt rewind"
  tape_dd "reading the first file" if="$t" of=/tmp/back1 bs=64k
  cmp /tmp/file1 /tmp/back1 || tape_fail "the first file read back differs"
  tape_dd "reading the second file" if="$t" of=/tmp/back2 bs=32k
  cmp /tmp/file2 /tmp/back2 || tape_fail "the second file read back differs"
  step "rewound; both files read back identical (dd stopped at each filemark)"
  mt -f "$t" rewind || tape_fail "mt rewind"
  mt -f "$t" fsf 1 || tape_fail "mt fsf 1"
  pos=$(tape_position "$t")
  echo "$pos" | grep -q "file 1, block 0" || tape_fail "after fsf 1: $pos, not file 1, block 0"
  tape_dd "reading the second file after fsf" if="$t" of=/tmp/back2b bs=32k
  cmp /tmp/file2 /tmp/back2b || tape_fail "the second file after fsf differs"
  step "mt fsf 1 skipped to the second file ($pos) and read it identical"
  mt -f "$t" rewind || tape_fail "mt rewind"
  mt -f "$t" offline || tape_fail "mt offline (unload)"
  step "rewound and unloaded"
  local p
  for p in /sys/class/srp_remote_ports/port-*; do
    [ -e "$p/delete" ] && echo 1 >"$p/delete"
  done
  wait_until 60 "tape removal" sh -c '! test -e /sys/class/scsi_tape/nst0'
  msg_send "$a" 7001 120 done
}
