# shellcheck shell=bash
# vm-srp: SRP over RoCEv2 between two Linux VMs. VM a runs LIO with ib_srpt
# (fileio backstore of 16 MiB, an ACL for b's initiator port ID, RDMA CM
# port 5555); VM b logs in with ib_srp (add_target ... dest=a:5555), writes
# a random pattern to the new disk with dd (O_DIRECT), reads it back and
# compares; then a short fio verify job; then logs out.
#
# The two guests coordinate over tiny TCP messages (guest/lib.sh msg_*):
#   b -> a:7001  "<b's port GUID>"     a creates the ACL
#   a -> b:7002  "ready <a's node GUID>"
#   b -> a:7001  "done"                a may power off

SCENARIO_VMS=("a 11 target" "b 12 initiator")
SCENARIO_GUEST_TIMEOUT=1200
# Must appear in the capture: RDMA WRITE (opcodes 6-10: the target moving
# read data), RDMA READ Request (12: the target fetching write data), SEND
# Only (4: SRP IUs), CM MADs (login via RDMA CM).
# SRP payloads are not RPC-over-RDMA: tshark's rpcordma heuristic takes an
# SRP_RSP whose REQ_LIM_DELTA is 1 for an RPC-over-RDMA v1 header and then
# reports it malformed.
SCENARIO_TSHARK_ARGS="--disable-heuristic rpcrdma_infiniband"
SCENARIO_EXPECT_PROTOCOLS="infiniband.bth.opcode>=6&&infiniband.bth.opcode<=10 infiniband.bth.opcode==12 infiniband.bth.opcode==4 infiniband.mad"

SRP_PORT=5555

# lio_target: LIO ib_srpt with one fileio LUN and an ACL for the initiator
# whose GUID arrives on 7001; "ready" goes to b's READY_PORT (default 7002).
lio_target() {
  local tpg guid_b node_guid gid0 wwn acl
  mkdir -p /run/dbus
  dbus-daemon --system --fork || fail "dbus-daemon did not start"
  modprobe target_core_mod
  modprobe target_core_file
  modprobe ib_srpt
  guid_b=$(msg_recv 7001 600)
  [[ $guid_b =~ ^[0-9a-f]{16}$ ]] || fail "bad initiator GUID message '$guid_b'"
  step "initiator port GUID $guid_b"

  gid0=$(cat /sys/class/infiniband/rxe0/ports/1/gids/0)
  wwn=ib.${gid0//:/}
  node_guid=$(tr -d : </sys/class/infiniband/rxe0/node_guid)
  cd /tmp
  targetcli /backstores/fileio create f0 /tmp/f0.img 16M
  targetcli /srpt create "$wwn"
  targetcli "/srpt/$wwn/luns" create /backstores/fileio/f0
  # rtslib names the configfs directory in its own spelling of the WWN.
  tpg=$(ls -d /sys/kernel/config/target/srpt/*/tpgt_1 | head -1)
  [ -d "$tpg/lun/lun_0" ] || fail "LUN 0 missing under $tpg"
  acl=$tpg/acls/0x0000000000000000$guid_b
  mkdir "$acl"
  mkdir "$acl/lun_0"
  ln -s "$tpg/lun/lun_0" "$acl/lun_0/map0"
  echo $SRP_PORT >/sys/kernel/config/target/srpt/discovery_auth/rdma_cm_port
  [ "$(cat "$tpg/enable")" = 1 ] || echo 1 >"$tpg/enable"
  # Diagnostic only: ls also probes fabrics the image lacks (iscsi).
  targetcli ls / 2>&1 | sed 's/^/  /' || true
  msg_send "$(host_ip b)" "${READY_PORT:-7002}" 300 "ready $node_guid"
  step "target ready, waiting for the initiator"
  local done_msg
  done_msg=$(msg_recv 7001 900)
  [ "$done_msg" = done ] || fail "initiator reported '$done_msg'"
  dmesg | grep -i srpt | tail -5
}

guest_target() { lio_target; }

# The target's SCSI vendor (vm-srp-ours reuses this initiator for ours).
DISK_VENDOR=${DISK_VENDOR:-LIO-ORG}

# Prints the sdX whose SCSI vendor is DISK_VENDOR.
lio_disk() {
  local d
  for d in /sys/block/sd*; do
    [ -e "$d/device/vendor" ] || continue
    grep -q "$DISK_VENDOR" "$d/device/vendor" && { echo "${d##*/}"; return 0; }
  done
  return 1
}

# srp_login: ib_srp logs in to the target in VM a (srp_add_target) and DEV
# is set to the new disk.
srp_login() {
  srp_add_target
  wait_until 120 "$DISK_VENDOR disk" lio_disk
  DEV=/dev/$(lio_disk)
  wait_until 30 "$DEV node" test -b "$DEV"
}

# srp_add_target: ib_srp logs in to the target in VM a (our port GUID to
# a:7001, its GUID from b:7002); what it exports is the caller's to wait
# for.
srp_add_target() {
  local guid ready tgt_guid a
  a=$(host_ip a)
  modprobe ib_srp
  modprobe sd_mod 2>/dev/null || true
  modprobe sg 2>/dev/null || true
  # The port GUID is the interface ID of GID 0 (fe80::/64 + GUID).
  guid=$(cut -d: -f5- </sys/class/infiniband/rxe0/ports/1/gids/0 | tr -d :)
  msg_send "$a" 7001 600 "$guid"
  ready=$(msg_recv 7002 600)
  tgt_guid=${ready#ready }
  [[ $tgt_guid =~ ^[0-9a-f]{16}$ ]] || fail "bad ready message '$ready'"
  local add=/sys/class/infiniband_srp/srp-rxe0-1/add_target
  [ -e $add ] || fail "$add missing"
  step "add_target id_ext=$tgt_guid,ioc_guid=$tgt_guid,dest=$a:$SRP_PORT"
  retry 120 "SRP login" sh -c "echo id_ext=$tgt_guid,ioc_guid=$tgt_guid,dest=$a:$SRP_PORT >$add"
}

guest_initiator() {
  local dev a
  a=$(host_ip a)
  srp_login
  dev=$DEV
  step "disk $dev: $(cat /sys/block/${dev#/dev/}/size) sectors"
  sg_inq "$dev" | sed 's/^/  /'
  sg_readcap "$dev" | sed 's/^/  /'
  [ "$(cat /sys/block/${dev#/dev/}/size)" -eq 32768 ] || fail "disk is not 16 MiB"

  # dd: random pattern, O_DIRECT both ways, compare.
  head -c 4194304 /dev/urandom >/tmp/pattern
  dd if=/tmp/pattern of="$dev" bs=64k oflag=direct conv=fsync 2>&1 | tail -1
  dd if="$dev" of=/tmp/readback bs=64k count=64 iflag=direct 2>&1 | tail -1
  cmp /tmp/pattern /tmp/readback || fail "read-back data differs from the written pattern"
  step "dd: 4 MiB pattern written and read back identical"

  # fio: random writes with crc32c verification on another region.
  fio --name=srpverify --filename="$dev" --direct=1 --rw=randwrite --bs=4k \
    --offset=8m --size=4m --ioengine=psync --verify=crc32c --do_verify=1 \
    --output-format=terse --minimal >/tmp/fio.out 2>&1 || { cat /tmp/fio.out; fail "fio verify failed"; }
  step "fio randwrite+verify ok (terse: $(cut -d';' -f1-8 /tmp/fio.out | head -1))"

  # The same sequential read job linux-srp-initiator-ours runs against our
  # target, for the throughput ratio (both under the same TCG conditions).
  fio --name=seqread --filename="$dev" --direct=1 --rw=read --bs=1m --iodepth=8 \
    --ioengine=libaio --size=${THROUGHPUT_SIZE:-16m} --loops=${THROUGHPUT_LOOPS:-8} --output-format=terse --minimal >/tmp/bw.out 2>&1 ||
    { cat /tmp/bw.out; fail "fio seq read failed"; }
  step "THROUGHPUT seq-read-1m-qd8 $(cut -d';' -f7 /tmp/bw.out) KiB/s"

  # Log out so the target sees a clean DREQ.
  local p
  for p in /sys/class/srp_remote_ports/port-*; do
    [ -e "$p/delete" ] && echo 1 >"$p/delete"
  done
  wait_until 60 "disk removal" sh -c '! ls /sys/block | grep -q "^sd"'
  msg_send "$a" 7001 120 done
}
