# shellcheck shell=bash
# vm-srp-rdmacore-initiator: our SRP initiator on our rdma-core provider
# against Linux LIO. VM a runs vm-srp's LIO ib_srpt target (16 MiB fileio
# LUN, an ACL for b's initiator port, RDMA CM port 5555); VM b runs `srp
# io --device rxe0`: its sessions' verbs objects on Linux rxe through
# libibverbs, its logins by the kernel's RDMA CM through librdmacm. It
# verifies random 4 KiB I/O (writes as immediate data), 64 KiB I/O (writes
# fetched by LIO's RDMA READs), single 4 and 8 MiB transfers, and reads
# LIO's LUN list with `srp luns`. Then the resident initiator on the
# device: `srpd --device rxe0` is handed an ib_srp login string by `srp
# login` (an IB CM one first, which must be refused with its reason), LIO's
# LUN 0 appears as a file under srpd's mount root (FUSE), a dd pattern
# written through it reads back identical and fio's crc32c verify passes;
# `srp logout` removes the file; a second login reads the pattern back
# through its file, and SIGTERM with it still logged in leaves 0 verbs
# objects.
# Needs the binaries: cargo build --release -p srp-cli (SRP_CLI, SRPD
# override).

# shellcheck source=vm-srp.sh
. "$(dirname "${BASH_SOURCE[0]}")/vm-srp.sh"

SRP_CLI=${SRP_CLI:-${CARGO_TARGET_DIR:-${INTEROP_DIR:-.}/../target}/release/srp}
SRPD=${SRPD:-$(dirname "$SRP_CLI")/srpd}
SCENARIO_GUEST_BINS="$SRP_CLI $SRPD"
SCENARIO_GUEST_TIMEOUT=900

host_main() {
  local b
  for b in "$SRP_CLI" "$SRPD"; do
    [ -x "$b" ] || { echo "missing $b: run cargo build --release -p srp-cli"; return 1; }
  done
}

# srp_io NAME ARGS...: `srp io` on rxe0 against LIO with ARGS; its output
# in /tmp/NAME.txt must show data verified and no failure.
srp_io() {
  local name=$1
  shift
  /interop/bin/srp io --device rxe0 --dest "$(host_ip a):$SRP_PORT" --id-ext "$TGT_GUID" \
    --initiator-ext 0 "$@" >/tmp/$name.txt 2>&1 || { cat /tmp/$name.txt; fail "srp io ($name) failed"; }
  cat /tmp/$name.txt
  grep -q "verified [1-9][0-9.]* [KMGTPE]*i*B" /tmp/$name.txt || fail "srp io ($name) verified nothing"
  grep -q " 0 verify failures, 0 I/O errors" /tmp/$name.txt || fail "srp io ($name) had failures"
}

# srpd_on_device A: srpd --device rxe0 logs in to LIO at A by login
# string; LUN 0's file is written and verified, then logged out.
srpd_on_device() {
  local a=$1 mnt=/tmp/srpd-mnt sock=/tmp/srpd.sock pid lun dgid o1 o2 o3 o4 rc
  modprobe fuse
  [ -c /dev/fuse ] || fail "no /dev/fuse after modprobe fuse"
  mkdir -p $mnt
  /interop/bin/srpd --device rxe0 --mount-root $mnt --control-socket $sock >/tmp/srpd.txt 2>&1 &
  pid=$!
  wait_until 30 "srpd ready" grep -q "^srpd: ready on" /tmp/srpd.txt
  grep "^srpd: ready on" /tmp/srpd.txt | grep -q "CAs rxe0:1 (" ||
    { cat /tmp/srpd.txt; fail "srpd's CA is not rxe0"; }
  step "$(grep "^srpd: ready on" /tmp/srpd.txt)"
  # An IB CM login: refused, saying why and what to do instead.
  IFS=. read -r o1 o2 o3 o4 <<<"$a"
  dgid=$(printf '00000000000000000000ffff%02x%02x%02x%02x' "$o1" "$o2" "$o3" "$o4")
  if /interop/bin/srp login --control-socket $sock \
      "id_ext=$TGT_GUID,ioc_guid=$TGT_GUID,dgid=$dgid,pkey=ffff,service_id=$TGT_GUID" >/tmp/ibcm.txt 2>&1; then
    cat /tmp/ibcm.txt
    fail "srpd --device took an IB CM login"
  fi
  grep -q "IB CM logins are not served on rdma-core device rxe0 yet.*log in by RDMA CM with dest=ip:port" /tmp/ibcm.txt ||
    { cat /tmp/ibcm.txt; fail "the IB CM login was refused without its reason"; }
  step "IB CM login refused: $(cat /tmp/ibcm.txt)"
  /interop/bin/srp login --control-socket $sock --name lio \
      "id_ext=$TGT_GUID,ioc_guid=$TGT_GUID,dest=$a:$SRP_PORT,initiator_ext=0" >/tmp/login.txt 2>&1 ||
    { cat /tmp/login.txt /tmp/srpd.txt; fail "srp login through srpd --device rxe0 failed"; }
  cat /tmp/login.txt
  grep -q "rxe0:.* -> $a:$SRP_PORT" /tmp/login.txt || fail "the login's path is not from rxe0"
  lun=$mnt/lio/lun0
  [ -f $lun ] || fail "no LUN file $lun"
  [ "$(stat -c %s $lun)" -eq 16777216 ] || fail "$lun is $(stat -c %s $lun) bytes, not 16 MiB"
  step "srpd --device rxe0 logged in to LIO: $lun"
  head -c 4194304 /dev/urandom >/tmp/srpd-pattern
  dd if=/tmp/srpd-pattern of=$lun bs=64k oflag=direct conv=notrunc,fsync 2>&1 | tail -1
  dd if=$lun of=/tmp/srpd-readback bs=64k count=64 iflag=direct 2>&1 | tail -1
  cmp /tmp/srpd-pattern /tmp/srpd-readback || fail "data read back through $lun differs from the pattern"
  step "dd: 4 MiB pattern through srpd's LUN file read back identical"
  fio --name=srpdverify --filename=$lun --direct=1 --rw=randwrite --bs=4k \
    --offset=8m --size=4m --ioengine=psync --verify=crc32c --do_verify=1 \
    --output-format=terse --minimal >/tmp/srpd-fio.out 2>&1 || { cat /tmp/srpd-fio.out; fail "fio verify on $lun failed"; }
  step "fio randwrite+crc32c verify through srpd's LUN file ok"
  /interop/bin/srp list --control-socket $sock
  /interop/bin/srp logout --control-socket $sock lio || fail "srp logout lio failed"
  [ ! -e $mnt/lio ] || fail "$mnt/lio is still there after the logout"
  step "logged out: $mnt/lio is gone"
  /interop/bin/srp login --control-socket $sock --name again \
      "id_ext=$TGT_GUID,ioc_guid=$TGT_GUID,dest=$a:$SRP_PORT,initiator_ext=0" >/tmp/login2.txt 2>&1 ||
    { cat /tmp/login2.txt /tmp/srpd.txt; fail "the second login through srpd --device rxe0 failed"; }
  dd if=$mnt/again/lun0 of=/tmp/srpd-readback2 bs=64k count=64 iflag=direct 2>&1 | tail -1
  cmp /tmp/srpd-pattern /tmp/srpd-readback2 || fail "the second login read back other data"
  step "logged in again: the pattern reads back through $mnt/again/lun0; SIGTERM with the login live"
  kill -TERM $pid
  rc=0
  wait $pid || rc=$?
  cat /tmp/srpd.txt
  [ $rc = 0 ] || fail "srpd exited $rc after SIGTERM"
  grep -q "^srpd: 1 logins ended; 0 verbs objects left; stopped" /tmp/srpd.txt ||
    fail "srpd did not end its login with 0 verbs objects left"
  [ ! -e $mnt/again ] || fail "$mnt/again is still there after srpd stopped"
  step "srpd --device rxe0: SIGTERM logged out, stopped with 0 verbs objects left"
}

guest_initiator() {
  local guid ready a
  a=$(host_ip a)
  wait_until 60 "rxe0 port ACTIVE" grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state
  # Our initiator port ID is initiator_ext 0 and rxe0's GUID: LIO's ACL.
  guid=$(tr -d : </sys/class/infiniband/rxe0/node_guid)
  msg_send "$a" 7001 600 "$guid"
  ready=$(msg_recv 7002 600)
  TGT_GUID=${ready#ready }
  [[ $TGT_GUID =~ ^[0-9a-f]{16}$ ]] || fail "bad ready message '$ready'"
  step "LIO ready (target port ID $TGT_GUID); srp io --device rxe0"
  srp_io small --size 8M --region 4M --rw randrw
  step "4 KiB random I/O verified (writes as immediate data)"
  srp_io bs64k --bs 64k --size 8M --region 4M --rw randrw
  step "64 KiB random I/O verified (writes fetched by RDMA READ)"
  local bs
  for bs in 4M 8M; do
    srp_io "big-$bs" --bs $bs --iodepth 1 --rw randrw --size $((16 * ${bs%M}))M --region 16M
  done
  step "4 and 8 MiB single transfers verified"
  /interop/bin/srp luns --device rxe0 --dest "$a:$SRP_PORT" --id-ext "$TGT_GUID" --initiator-ext 0 \
    >/tmp/luns.txt 2>&1 || { cat /tmp/luns.txt; fail "srp luns failed"; }
  cat /tmp/luns.txt
  grep -q "LUN 0 .*LIO-ORG" /tmp/luns.txt || fail "srp luns did not show LIO's LUN 0"
  step "srp luns on rxe0 shows LIO's LUN 0"
  srpd_on_device "$a"
  msg_send "$a" 7001 120 done
}
