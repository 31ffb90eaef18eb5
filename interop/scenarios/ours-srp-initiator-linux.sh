# shellcheck shell=bash
# ours-srp-initiator-linux: our SRP initiator (`srp io` on the host side at
# 10.77.0.2, soft RoCE NIC with MTU 1024) logs in by RDMA CM to Linux LIO
# ib_srpt (fileio backstore of 16 MiB, rdma_cm_port 5555) in VM a, runs
# 8 MiB of verified random 4 KiB reads and writes on LUN 0 (writes as SRP
# immediate data), then 8 MiB at 64 KiB (writes fetched by RDMA READ), and
# logs out after each; then 4 MiB and 8 MiB transfers verified, `srp luns`
# shows LIO's LUN, `srp discover` finds LIO's I/O controller through
# ib_srpt's device management agent, LIO accepts our LOGICAL UNIT RESET, and `srp fuse`
# serves the LUN as a file that fio verifies. Last, LIO unmaps the LUN
# from our initiator's ACL while `srp io` runs on it: our initiator must
# stop with a clear error (CHECK CONDITION with its sense), never report
# success or hang. LIO then shows its small read-only virtual LUN 0 in
# place of the unmapped one, so the first error is DATA PROTECT (07/27/00)
# for a write or LBA OUT OF RANGE (05/21/00) for a read, not LOGICAL UNIT
# NOT SUPPORTED (05/25/00).
# Needs the binary: cargo build --release -p srp-cli (SRP_CLI overrides).

SCENARIO_VMS=("a 11 target")
SCENARIO_GUEST_TIMEOUT=900
# SRP payloads are not RPC-over-RDMA: tshark's rpcordma heuristic takes an
# SRP_RSP whose REQ_LIM_DELTA is 1 for an RPC-over-RDMA v1 header and then
# reports it malformed.
SCENARIO_TSHARK_ARGS="--disable-heuristic rpcrdma_infiniband"
SCENARIO_EXPECT_PROTOCOLS="infiniband.bth.opcode>=6&&infiniband.bth.opcode<=10 infiniband.bth.opcode==12 infiniband.bth.opcode==4 infiniband.mad"

SRP_CLI=${SRP_CLI:-${CARGO_TARGET_DIR:-$INTEROP_DIR/../target}/release/srp}
SRP_PORT=5555
# rxe's node GUID is the EUI-64 of the VM's MAC 52:54:00:77:00:0b.
LIO_GUID=505400fffe77000b
# Our initiator port ID: initiator_ext 1, then our CA GUID, which is
# 0002c903 and our address (10.77.0.2).
OUR_PORT_ID=00000000000000010002c9030a4d0002
# What `srp io` says when its login finds nobody yet: our port not ACTIVE
# (the bridge has no carrier before the VM's tap comes up), no answer (the
# VM is booting) or a CM REJ (ib_srpt not listening, or LIO not configured
# yet). Only the login: a failure after it, a verify failure above all, is
# never retried.
SRP_NOT_UP='^srp: open LUN [0-9]+ over .*: login: (connection failed: (connection (timed out|rejected)|nothing (answered|listens for) SRP logins)|port [0-9]+ is [A-Za-z]+, not ACTIVE)'

host_main() {
  [ -x "$SRP_CLI" ] || { echo "missing $SRP_CLI: run cargo build --release -p srptd -p srp-cli"; return 1; }
  ns_add_ip 10.77.0.2
  local ok=0
  # Retry while the VM boots and configures LIO.
  retry_if_not_up 300 "srp io (first login)" "$SRP_NOT_UP" "$RUN_DIR/first.txt" \
    ns_run 120 "$SRP_CLI" io --dest 10.77.0.11:$SRP_PORT --ip 10.77.0.2 --mtu 1024 \
      --id-ext $LIO_GUID --ioc-guid $LIO_GUID --size 8388608 --region 4194304 && ok=1
  if [ $ok = 1 ]; then
    grep -q "verified [1-9][0-9.]* [KMGTPE]*i*B" "$RUN_DIR/first.txt" ||
      { ok=0; host_fail "srp io (first login) verified nothing"; }
  fi
  # Writes above the 8 KiB of immediate data make LIO fetch them by RDMA READ.
  if [ $ok = 1 ]; then
    ns_run 120 "$SRP_CLI" io --dest 10.77.0.11:$SRP_PORT --ip 10.77.0.2 --mtu 1024 \
      --id-ext $LIO_GUID --ioc-guid $LIO_GUID --bs 65536 --size 8388608 --region 4194304 |
      tee "$RUN_DIR/bs64k.txt" || { ok=0; host_fail "srp io --bs 65536 (writes by RDMA READ) failed"; }
    grep -q "verified [1-9][0-9.]* [KMGTPE]*i*B" "$RUN_DIR/bs64k.txt" ||
      { ok=0; host_fail "srp io --bs 65536 verified nothing"; }
  fi
  # Large transfers in one SRP_CMD each (descriptor lists, RDMA at MTU 1024).
  if [ $ok = 1 ]; then
    local bs
    for bs in 4194304 8388608; do
      # 16 random 4/8 MiB I/Os over 2-4 slots: reads hit written data.
      ns_run 120 "$SRP_CLI" io --dest 10.77.0.11:$SRP_PORT --ip 10.77.0.2 --mtu 1024 \
        --id-ext $LIO_GUID --ioc-guid $LIO_GUID --bs $bs --iodepth 1 --rw randrw \
        --size $((bs * 16)) --region 16777216 | tee "$RUN_DIR/big-$bs.txt" ||
        { ok=0; host_fail "srp io --bs $bs failed"; }
      grep -q "verified [1-9][0-9.]* [KMGTPE]*i*B" "$RUN_DIR/big-$bs.txt" ||
        { ok=0; host_fail "srp io --bs $bs verified nothing"; }
    done
  fi
  if [ $ok = 1 ]; then
    ns_run 60 "$SRP_CLI" luns --dest 10.77.0.11:$SRP_PORT --ip 10.77.0.2 --mtu 1024 \
      --id-ext $LIO_GUID --ioc-guid $LIO_GUID | tee "$RUN_DIR/luns.txt"
    grep -q "LUN 0 .*LIO-ORG" "$RUN_DIR/luns.txt" || { ok=0; host_fail "srp luns did not show LIO's LUN 0"; }
  fi
  if [ $ok = 1 ]; then
    # Discovery against ib_srpt's own device management agent: the login
    # string names LIO's target port.
    ns_run 60 "$SRP_CLI" discover --target 10.77.0.11 --ip 10.77.0.2 -v --timeout-ms 2000 \
      | tee "$RUN_DIR/discover.txt"
    grep -q "ioc_guid=$LIO_GUID" "$RUN_DIR/discover.txt" ||
      { ok=0; host_fail "srp discover did not find LIO's I/O controller"; }
  fi
  if [ $ok = 1 ]; then
    ns_run 60 "$SRP_CLI" reset --dest 10.77.0.11:$SRP_PORT --ip 10.77.0.2 --mtu 1024 \
      --id-ext $LIO_GUID --ioc-guid $LIO_GUID --lun 0 || { ok=0; host_fail "LIO refused our LUN reset"; }
  fi
  # The FUSE mount lives in the namespace's own mount namespace, so fio
  # runs in the same `ip netns exec`.
  if [ $ok = 1 ]; then
    # ABORT TASK on demand under verified I/O: every 100 ms the oldest
    # outstanding command is aborted; LIO answers each, aborted commands
    # are retried, and every block still reads back as written.
    ns_run 180 "$SRP_CLI" io --dest 10.77.0.11:$SRP_PORT --ip 10.77.0.2 --mtu 1024 \
      --id-ext $LIO_GUID --ioc-guid $LIO_GUID --bs 4194304 --iodepth 2 --size 67108864 --rw randrw \
      --region 16777216 --abort-every-ms 150 | tee "$RUN_DIR/abort.txt" || { ok=0; host_fail "srp io with aborts failed"; }
    local answered
    answered=$(sed -n 's/^srp: ABORT TASK asked [0-9]* times: \([0-9]*\) function complete, \([0-9]*\) failed.*/\1 \2/p' "$RUN_DIR/abort.txt")
    [ -n "$answered" ] && [ $((${answered% *} + ${answered#* })) -gt 0 ] ||
      { ok=0; host_fail "LIO answered none of our ABORT TASKs"; }
    grep -q " 0 verify failures, 0 I/O errors" "$RUN_DIR/abort.txt" || { ok=0; host_fail "I/O under aborts lost data"; }
    [ $ok = 1 ] && echo "our initiator: $(grep "^srp: ABORT TASK" "$RUN_DIR/abort.txt") against LIO"
  fi
  if [ $ok = 1 ] && [ -e /dev/fuse ] && command -v fio >/dev/null; then
    mkdir -p "$RUN_DIR/mnt"
    ns_run 180 bash -c '
      "$1" fuse --dest 10.77.0.11:'$SRP_PORT' --ip 10.77.0.2 --mtu 1024 \
        --id-ext '$LIO_GUID' --ioc-guid '$LIO_GUID' --mountpoint "$2" >"$3/fuse.log" 2>&1 &
      pid=$!
      for i in $(seq 1 300); do grep -q "srp: mounted" "$3/fuse.log" && break; sleep 0.1; done
      grep -q "srp: mounted" "$3/fuse.log" || { cat "$3/fuse.log"; kill $pid; exit 1; }
      fio --name=fuse --filename="$2/lun0" --rw=randrw --bs=4k --size=8m --direct=1 \
        --ioengine=psync --verify=crc32c --do_verify=1 --verify_state_save=0 \
        --output-format=terse --minimal >"$3/fio-fuse.out" 2>&1
      rc=$?
      kill -TERM $pid; wait $pid
      cat "$3/fuse.log"
      [ $rc = 0 ] && [ "$(cut -d";" -f5 "$3/fio-fuse.out")" = 0 ] || { cat "$3/fio-fuse.out"; exit 1; }
    ' _ "$SRP_CLI" "$RUN_DIR/mnt" "$RUN_DIR" || { ok=0; host_fail "fio through srp fuse failed"; }
    [ $ok = 1 ] && echo "our initiator: fio crc32c verify through srp fuse against LIO passed"
  fi
  # LIO-side LUN removal under I/O: the VM unmaps LUN 0 from our ACL.
  if [ $ok = 1 ]; then
    ns_run 200 bash -c '
      "$1" io --dest 10.77.0.11:'$SRP_PORT' --ip 10.77.0.2 --mtu 1024 \
        --id-ext '$LIO_GUID' --ioc-guid '$LIO_GUID' --size 1073741824 --region 4194304 \
        >"$2/removal.txt" 2>&1 &
      pid=$!
      for i in $(seq 1 300); do grep -q "srp: logged in" "$2/removal.txt" && break; sleep 0.1; done
      python3 -c "import socket,time
for _ in range(30):
    try:
        socket.create_connection((\"10.77.0.11\", 7001), timeout=2).sendall(b\"remove-lun\\n\"); break
    except OSError: time.sleep(1)"
      wait $pid
      rc=$?
      cat "$2/removal.txt"
      [ $rc != 0 ] && grep -q "first I/O error: .*CHECK CONDITION, sense key" "$2/removal.txt"
    ' _ "$SRP_CLI" "$RUN_DIR" || { ok=0; host_fail "LUN removal on LIO did not surface as a clear SCSI error"; }
    [ $ok = 1 ] && echo "our initiator: LIO-side LUN removal surfaced as $(grep -o "first I/O error.*" "$RUN_DIR/removal.txt")"
  fi
  # Tell the VM we are done either way, so it powers off.
  ns_tell 10.77.0.11 7001 done
  [ $ok = 1 ] || return 1
  echo "our initiator: verified I/O against LIO ib_srpt"
}

guest_target() {
  local tpg gid0 wwn acl
  mkdir -p /run/dbus
  dbus-daemon --system --fork || fail "dbus-daemon did not start"
  modprobe target_core_mod
  modprobe target_core_file
  modprobe ib_srpt
  [ "$(tr -d : </sys/class/infiniband/rxe0/node_guid)" = $LIO_GUID ] ||
    fail "rxe0 node GUID $(cat /sys/class/infiniband/rxe0/node_guid) is not $LIO_GUID"
  gid0=$(cat /sys/class/infiniband/rxe0/ports/1/gids/0)
  wwn=ib.${gid0//:/}
  cd /tmp
  targetcli /backstores/fileio create f0 /tmp/f0.img 16M
  targetcli /srpt create "$wwn"
  targetcli "/srpt/$wwn/luns" create /backstores/fileio/f0
  tpg=$(ls -d /sys/kernel/config/target/srpt/*/tpgt_1 | head -1)
  [ -d "$tpg/lun/lun_0" ] || fail "LUN 0 missing under $tpg"
  acl=$tpg/acls/0x$OUR_PORT_ID
  mkdir "$acl"
  mkdir "$acl/lun_0"
  ln -s "$tpg/lun/lun_0" "$acl/lun_0/map0"
  echo $SRP_PORT >/sys/kernel/config/target/srpt/discovery_auth/rdma_cm_port
  [ "$(cat "$tpg/enable")" = 1 ] || echo 1 >"$tpg/enable"
  step "LIO ready, waiting for our initiator"
  local done_msg
  done_msg=$(msg_recv 7001 800)
  if [ "$done_msg" = remove-lun ]; then
    rm "$acl/lun_0/map0" && rmdir "$acl/lun_0" || fail "could not unmap LUN 0 from $acl"
    step "LUN 0 unmapped from our initiator's ACL"
    done_msg=$(msg_recv 7001 300)
  fi
  [ "$done_msg" = done ] || fail "host reported '$done_msg'"
  dmesg | grep -i srpt | tail -8
}
