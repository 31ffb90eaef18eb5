# shellcheck shell=bash
# siw-ours: Linux's soft iWARP driver (siw, built for the guest's kernel
# in the image build) in VM a against our soft iWARP NIC (our binaries at
# 10.77.0.2 inside the namespace, RDMA over TCP):
#  1. librdmacm's rping on siw against our rrping --iwarp, both roles, 10
#     pings each with the data validated (RDMA READ and WRITE, SENDs);
#  2. Linux's ib_srp over siw logs in to our srptd --iwarp by RDMA CM
#     (dest=10.77.0.2:5555, the login string of a soft RoCE target there):
#     dd pattern write and read-back, fio randrw crc32c verify, 8 MiB
#     direct I/O in one request, logout and a second login verified;
#  3. our srp io --iwarp (at fd77::3) against LIO's ib_srpt on siw in
#     the VM (its RDMA CM port 5555): verified random I/O, then 64 KiB
#     and 4 MiB transfers (RDMA READ and WRITE of many FPDUs). Over IPv6:
#     ib_srpt listens on the IPv6 wildcard, and siw (6.1) accepts IPv4
#     there as a v4-mapped address that RDMA CM cannot translate to a
#     device, so it refuses every IPv4 login (no private data) before
#     ib_srpt sees it.
#  4. perftest's ib_write_bw and ib_read_bw with -R (RDMA CM: on iWARP
#     the exchange rides SENDs on a connection of its own) on siw against
#     our rperftest --iwarp -R, both roles, 64 KiB x 100: both sides must
#     print a bandwidth line for exactly that size and count; our WRITE
#     server checks every slot was written, our READ client that repeated
#     READs of a slot brought back the same bytes, our READ server that its
#     source was not written.
# The capture must decode as MPA/DDP/RDMAP (tshark's iwarp_mpa and
# iwarp_ddp_rdmap) with nothing malformed and no expert errors.
# Needs the binaries: cargo build --release -p rdma-perf -p srptd -p srp-cli
# (RRPING, SRPTD, SRP_CLI, RPERFTEST override).

# perftest_bw_line and RPERFTEST.
# shellcheck source=perftest-ours.sh
. "$(dirname "${BASH_SOURCE[0]}")/perftest-ours.sh"

SCENARIO_VMS=("a 11 siw")
SCENARIO_GUEST_TIMEOUT=900
# SRP payloads are not RPC-over-RDMA (see linux-srp-initiator-ours).
# SMB Direct neither.
SCENARIO_TSHARK_ARGS="--disable-heuristic rpcrdma_iwarp --disable-heuristic smb_direct_iwarp"
# MPA request and reply; RDMAP WRITE, READ request, READ response, SEND.
SCENARIO_EXPECT_PROTOCOLS="iwarp_mpa.key.req iwarp_mpa.key.rep iwarp_rdma.opcode==0 iwarp_rdma.opcode==1 iwarp_rdma.opcode==2 iwarp_rdma.opcode==3"

BIN=${CARGO_TARGET_DIR:-$INTEROP_DIR/../target}/release
RRPING=${RRPING:-$BIN/rrping}
SRPTD=${SRPTD:-$BIN/srptd}
SRP_CLI=${SRP_CLI:-$BIN/srp}
# perftest over iWARP: test:size:iterations, in this order in both roles.
SIW_PERFTEST_RUNS="write:65536:100 read:65536:100"
# What our -R client says while perftest's server is not listening yet.
SIW_PERFTEST_NOT_UP='^rperftest: NIC setup failed: RDMA CM connect for the exchange to .*(refused|[Nn]o route|unreachable|timed out)'
# What perftest's -R client says while ours is not listening yet.
SIW_LINUX_NOT_UP='Unexpected CM event|Unable to perform rdma_client function'
# LIO's target port ID: siw0's node GUID, EUI-64 of VM a's MAC.
LIO_GUID=505400fffe77000b
# Our initiator port at fd77::3: initiator_ext 1 and the GUID of its
# address (rnic::softroce::ip_guid: 0002c903 and an FNV-1a fold of it).
OUR_PORT_ID=00000000000000010002c90363c476b3
# What srp io says while LIO is not listening yet; nothing else is retried.
SRP_NOT_UP='^srp: open LUN [0-9]+ over .*: login: .*(nothing (answered|listens for) SRP logins|host unreachable|timed out)' 
# srptd's target port over iWARP: the GUID of its address, as on soft
# RoCE: 0002c903 and 10.77.0.2.
OUR_TARGET_GUID=0002c9030a4d0002

host_main() {
  [ -x "$RRPING" ] || { echo "missing $RRPING: run cargo build --release -p rdma-perf"; return 1; }
  [ -x "$SRPTD" ] || { echo "missing $SRPTD: run cargo build --release -p srptd"; return 1; }
  [ -x "$SRP_CLI" ] || { echo "missing $SRP_CLI: run cargo build --release -p srp-cli"; return 1; }
  [ -x "$RPERFTEST" ] || { echo "missing $RPERFTEST: run cargo build --release -p rdma-perf"; return 1; }
  ns_add_ip 10.77.0.2
  # Round 1: Linux rping serves on siw; retry while the VM boots (a TCP
  # connect refused or unanswered), never a validation.
  retry_if_not_up 600 "rrping --iwarp client" '^rrping: .*(refused|[Nn]o route|unreachable|timed out|TimedOut)' \
    "$RUN_DIR/rping1.txt" ns_run 90 "$RRPING" --iwarp -c -a 10.77.0.11 -I 10.77.0.2 -C 10 -v -V --timeout 5 ||
    return 1
  grep -q "rrping: 10 pings, 10 validated" "$RUN_DIR/rping1.txt" ||
    { host_fail "our client did not validate 10 pings"; return 1; }
  echo "rping round 1 passed: our client (iWARP) validated 10 pings from rping on siw"
  # Round 2: we serve; Linux's client connects and validates.
  ns_run 400 "$RRPING" --iwarp -s -a 10.77.0.2 -C 10 -v --timeout 300 >"$RUN_DIR/rping2.txt" 2>&1 ||
    { cat "$RUN_DIR/rping2.txt"; host_fail "our rrping --iwarp server failed"; return 1; }
  cat "$RUN_DIR/rping2.txt"
  grep -q "rrping: 10 pings" "$RUN_DIR/rping2.txt" || { host_fail "our server did not serve 10 pings"; return 1; }
  echo "rping round 2 passed: rping client on siw, our server (iWARP)"
  siw_perftest_host || return 1
  # The SRP target for the guest's ib_srp.
  ns_bg srptd 900 "$SRPTD" --iwarp --ip 10.77.0.2 --ram-mib 32 --rdma-cm-port 5555 \
    --control-socket "$RUN_DIR/srptd.sock"
  ns_bg_ready srptd "listening on" || return 1
  cat "$RUN_DIR/host-srptd.log"
  # Part 3, once the guest's ib_srp part is done and LIO listens: our
  # initiator over iWARP against LIO on siw (srptd keeps 10.77.0.2).
  nsx ip -6 addr add fd77::3/64 dev "$BRIDGE" nodad
  local ok=1 bs
  retry_if_not_up 300 "srp io --iwarp against LIO" "$SRP_NOT_UP" "$RUN_DIR/lio.txt" \
    ns_run 120 "$SRP_CLI" io --iwarp --dest '[fd77::11]:5555' --ip fd77::3 \
      --id-ext $LIO_GUID --ioc-guid $LIO_GUID --size 8388608 --region 4194304 || ok=0
  [ $ok = 0 ] || grep -q "verified [1-9][0-9.]* [KMGTPE]*i*B" "$RUN_DIR/lio.txt" ||
    { ok=0; host_fail "srp io --iwarp against LIO verified nothing"; }
  for bs in 65536 4194304; do
    [ $ok = 1 ] || break
    ns_run 120 "$SRP_CLI" io --iwarp --dest '[fd77::11]:5555' --ip fd77::3 \
      --id-ext $LIO_GUID --ioc-guid $LIO_GUID --bs $bs --iodepth 2 --rw randrw \
      --size $((bs * 16)) --region 16777216 | tee "$RUN_DIR/lio-$bs.txt" ||
      { ok=0; host_fail "srp io --iwarp --bs $bs against LIO failed"; }
    grep -q " 0 verify failures, 0 I/O errors" "$RUN_DIR/lio-$bs.txt" ||
      { ok=0; host_fail "srp io --iwarp --bs $bs against LIO: verify failures or I/O errors"; }
  done
  ns_tell 10.77.0.11 7001 done
  [ $ok = 1 ] || return 1
  echo "our srp io --iwarp: verified I/O against LIO ib_srpt on siw"
}

# Rounds 3 and 4: perftest -R on siw serves, our client runs each test;
# then we serve and its client runs them.
siw_perftest_host() {
  local run op size n out
  for run in $SIW_PERFTEST_RUNS; do
    IFS=: read -r op size n <<< "$run"
    out=$RUN_DIR/perftest-ours-client-$op.txt
    retry_if_not_up 300 "rperftest $op --iwarp -R client" "$SIW_PERFTEST_NOT_UP" "$out" \
      ns_run 120 "$RPERFTEST" "$op" 10.77.0.11 --iwarp --bind 10.77.0.2 -R -F --report_gbits \
        --timeout 60 -s "$size" -n "$n" || return 1
    perftest_bw_line "$out" "$size" "$n" > /dev/null ||
      { host_fail "our $op -R client printed no bandwidth"; return 1; }
    echo "perftest round 3 $op passed: our client (iWARP, -R), ib_${op}_bw -R server on siw: $(perftest_bw_line "$out" "$size" "$n")"
  done
  grep -q "every READ of a slot brought back the same bytes" "$RUN_DIR/perftest-ours-client-read.txt" ||
    { host_fail "our READ client did not check what the READs brought back"; return 1; }
  for run in $SIW_PERFTEST_RUNS; do
    IFS=: read -r op size n <<< "$run"
    out=$RUN_DIR/perftest-ours-server-$op.txt
    perftest_serve_ours host_retry_note "$out" "$size" "$n" ns_run 400 "$RPERFTEST" "$op" --iwarp --bind 10.77.0.2 \
        -R -F --report_gbits --timeout 300 -s "$size" -n "$n" || { host_fail "our $op -R server failed"; return 1; }
    perftest_bw_line "$out" "$size" "$n" > /dev/null ||
      { host_fail "our $op -R server printed no bandwidth"; return 1; }
    echo "perftest round 4 $op passed: ib_${op}_bw -R client on siw, our server (iWARP, -R): $(perftest_bw_line "$out" "$size" "$n")"
  done
  grep -q "verified: all .* written" "$RUN_DIR/perftest-ours-server-write.txt" ||
    { host_fail "our WRITE server did not check the written slots"; return 1; }
}

# perftest -R on siw: servers for our client, then clients against our
# servers; every run prints a bandwidth line for its size and count.
siw_perftest_guest() {
  local run op size n rc
  step "perftest $(ib_write_bw --version 2>&1 | tr '\n' ' ')"
  for run in $SIW_PERFTEST_RUNS; do
    IFS=: read -r op size n <<< "$run"
    step "ib_${op}_bw -R server on siw for our client"
    rc=0
    timeout 300 "ib_${op}_bw" -R -d siw0 -F --report_gbits -s "$size" -n "$n" > /tmp/server.txt 2>&1 || rc=$?
    [ $rc = 0 ] || { cat /tmp/server.txt; siw_fail "ib_${op}_bw -R server exited $rc"; }
    cat /tmp/server.txt
    perftest_linux_server_ok "$op" "$size" "$n" /tmp/server.txt ||
      fail "ib_${op}_bw -R server printed no bandwidth"
  done
  for run in $SIW_PERFTEST_RUNS; do
    IFS=: read -r op size n <<< "$run"
    step "ib_${op}_bw -R client on siw against our server"
    perftest_linux_client siw_fail "$size" "$n" "ib_${op}_bw -R client" "$SIW_LINUX_NOT_UP" \
      timeout 120 "ib_${op}_bw" -R -d siw0 -F --report_gbits -s "$size" -n "$n" 10.77.0.2
  done
}

siw_active() { grep -q ACTIVE /sys/class/infiniband/siw0/ports/1/state; }

# Prints the sdX whose SCSI vendor is ours.
siw_our_disk() { our_disks | head -1; }

# siw_login: add_target over siw0; sets DEV.
siw_login() {
  local add=/sys/class/infiniband_srp/srp-siw0-1/add_target
  [ -e $add ] || fail "$add missing"
  retry 300 "SRP login over siw" sh -c \
    "echo id_ext=$OUR_TARGET_GUID,ioc_guid=$OUR_TARGET_GUID,dest=10.77.0.2:5555 >$add"
  wait_until 120 "our disk" siw_our_disk
  DEV=/dev/$(siw_our_disk)
  wait_until 30 "$DEV node" test -b "$DEV"
}

# siw_fail WHY: what siw logged (its debug messages when dynamic debug
# could be turned on), then the failure.
siw_fail() {
  dmesg | grep -iE "siw|iw_cm|rdma" | tail -60
  fail "$1"
}

guest_siw() {
  # siw's own account of each connection and error, for a failure's log.
  mountpoint -q /sys/kernel/debug || mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null || true
  step "siw0 on eth0 (rxe0 removed, so RDMA CM picks siw)"
  rdma link delete rxe0 || fail "rdma link delete rxe0"
  modprobe siw || fail "modprobe siw (built into the image for $(uname -r))"
  echo 'module siw +p' >/sys/kernel/debug/dynamic_debug/control 2>/dev/null || true
  rdma link add siw0 type siw netdev eth0 || fail "rdma link add siw0"
  wait_until 60 "siw0 port ACTIVE" siw_active
  rdma link show | sed 's/^/  /'

  step "rping server on siw for our client"
  local rc=0
  timeout 600 rping -s -a 10.77.0.11 -C 10 -v >/tmp/rping-server.txt 2>&1 || rc=$?
  cat /tmp/rping-server.txt
  if [ "$rc" -ne 0 ] && ! rping_teardown_race /tmp/rping-server.txt "server "; then
    siw_fail "rping server exited $rc"
  fi
  step "rping client on siw against our server"
  # Our server not listening yet: on iWARP a TCP connection refused.
  retry_if 300 "rping client" 'cma event RDMA_CM_EVENT_(REJECTED|UNREACHABLE|ADDR_ERROR|ROUTE_ERROR|CONNECT_ERROR)|rdma_connect: Connection refused' \
    rping_past_teardown timeout 60 rping -c -a 10.77.0.2 -C 10 -v -V
  siw_perftest_guest

  modprobe ib_srp
  modprobe sd_mod 2>/dev/null || true
  step "ib_srp over siw logs in to our srptd (iWARP)"
  siw_login
  [ "$(cat /sys/block/${DEV#/dev/}/size)" -eq 65536 ] || fail "disk is not 32 MiB"
  pattern_rw "$DEV"
  fio_verify siwverify "$DEV"
  head -c 8388608 /dev/urandom >/tmp/big
  dd if=/tmp/big of="$DEV" bs=8M count=1 oflag=direct conv=fsync 2>/dev/null || fail "dd write 8 MiB"
  dd if="$DEV" of=/tmp/big.back bs=8M count=1 iflag=direct 2>/dev/null || fail "dd read 8 MiB"
  cmp /tmp/big /tmp/big.back || fail "8 MiB read back differs"
  step "8 MiB direct I/O in one request verified"
  srp_remove_all
  step "logged out; logging in again"
  siw_login
  dd if="$DEV" of=/tmp/big.back2 bs=8M count=1 iflag=direct 2>/dev/null || fail "dd read 8 MiB again"
  cmp /tmp/big /tmp/big.back2 || fail "8 MiB differs after the second login"
  srp_remove_all
  step "second login: the 8 MiB written before read back identical; logged out"

  step "LIO ib_srpt on siw0 for our srp io --iwarp"
  local gid0 wwn tpg
  mkdir -p /run/dbus
  dbus-daemon --system --fork || fail "dbus-daemon did not start"
  modprobe target_core_mod
  modprobe target_core_file
  modprobe ib_srpt || fail "modprobe ib_srpt"
  [ "$(tr -d : </sys/class/infiniband/siw0/node_guid)" = $LIO_GUID ] ||
    fail "siw0 node GUID $(cat /sys/class/infiniband/siw0/node_guid) is not $LIO_GUID"
  gid0=$(cat /sys/class/infiniband/siw0/ports/1/gids/0)
  wwn=ib.${gid0//:/}
  (cd /tmp && targetcli /backstores/fileio create f0 /tmp/f0.img 32M >/dev/null) || fail "fileio backstore"
  targetcli /srpt create "$wwn" >/dev/null || siw_fail "targetcli /srpt create $wwn"
  targetcli "/srpt/$wwn/luns" create /backstores/fileio/f0 >/dev/null || fail "LUN 0"
  tpg=$(ls -d /sys/kernel/config/target/srpt/*/tpgt_1 | head -1)
  [ -d "$tpg/lun/lun_0" ] || fail "LUN 0 missing under $tpg"
  local acl=$tpg/acls/0x$OUR_PORT_ID
  mkdir "$acl" && mkdir "$acl/lun_0" && ln -s "$tpg/lun/lun_0" "$acl/lun_0/map0" || fail "ACL"
  ip -6 addr add fd77::11/64 dev eth0 nodad || fail "ip -6 addr add fd77::11"
  echo 5555 >/sys/kernel/config/target/srpt/discovery_auth/rdma_cm_port
  [ "$(cat "$tpg/enable")" = 1 ] || echo 1 >"$tpg/enable"
  step "LIO ready on siw0 ($wwn), waiting for our initiator"
  local done_msg
  done_msg=$(msg_recv 7001 400)
  [ "$done_msg" = done ] || siw_fail "host reported '$done_msg'"
  # For the log only: siw's debug lines may have pushed ib_srpt's out of
  # the ring buffer, and a grep that finds nothing must not fail the
  # scenario (pipefail).
  { dmesg | grep -iE "ib_srpt|srp" | grep -v "siw0: " || true; } | tail -8
}
