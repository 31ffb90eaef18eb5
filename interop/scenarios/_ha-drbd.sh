# shellcheck shell=bash
# Shared body of the high-availability scenarios (issue 30): two target
# VMs, a (10.77.0.11) and b (10.77.0.12), each with a 64 MiB loop disk
# replicated by DRBD (the kernel's 8.4, drbd-utils 9 through drbdadm-84;
# protocol C, so a write is acknowledged once both disks have it) and
# srptd (our soft RoCE NIC, rxe taken away) exporting /dev/drbd0 as LUN 0
# with the same usn on both, started and promoted by our OCF agent
# (crates/srptd/ocf/srptd, drbd_device=r0). Target port group a (a's
# port, rel_tgt_id 1) and b (b's, 2) both `follow = "r0"`: a's host is
# Primary, so a is active/optimized and b standby, on both hosts.
#
# The initiator VM c (the scenario file's guest_initiator) logs in to
# both, runs its I/O, and asks the host (port 7100) to kill a: the host
# ends a's qemu with SIGKILL (vm_kill: no shutdown, no flush, a power
# cut). b sees DRBD lose its peer, becomes Primary (drbdadm primary r0,
# then the OCF agent's promote: srptadm set-role r0 primary), srptd opens
# /dev/drbd0 and group b goes active; c's I/O resumes through b.
#
# Messages: a, b -> c:7002 "ready NAME GUID"; c -> host:7100 "kill a";
# host -> c:7003 "killed"; c -> b:7001 "done".
# Needs: cargo build --release -p srptd (SRPTD overrides the path).

SCENARIO_VMS=("a 11 target" "b 12 target" "c 13 initiator")
SCENARIO_GUEST_TIMEOUT=1500
SCENARIO_TSHARK_ARGS="--disable-heuristic rpcrdma_infiniband"
# The CM MADs only: the data moved is not what this checks, and DRBD's
# own TCP stream is not ours to judge.
SCENARIO_CAPTURE_FILTER="udp port 4791 and (udp[12:4] & 0x00ffffff) = 1"
SCENARIO_EXPECT_PROTOCOLS="infiniband.mad"

SRPTD=${SRPTD:-${CARGO_TARGET_DIR:-${INTEROP_DIR:-.}/../target}/release/srptd}
SRPTADM=${SRPTADM:-$(dirname "$SRPTD")/srptadm}
OCF_AGENT=${INTEROP_DIR:-.}/../crates/srptd/ocf/srptd
SCENARIO_GUEST_BINS="$SRPTD $SRPTADM $OCF_AGENT=ocf-srptd"
SRP_PORT=5555
# Seconds from the kill until c's writes complete again: DRBD's ping
# (ping-int 3 s, ping-timeout 1 s), b's promotion, srptd's poll (0.5 s),
# ib_srp's fast_io_fail_tmo (5 s) and multipath's checker (1 s), with
# room for TCG.
FAILOVER_LIMIT=${FAILOVER_LIMIT:-90}

host_main() {
  local b v
  for b in "$SRPTD" "$SRPTADM"; do
    [ -x "$b" ] || { host_fail "missing $b: run cargo build --release -p srptd"; return 1; }
  done
  # Wait (bounded) for c's "kill a"; give up when c is gone.
  local end=$(( $(date +%s) + $(tmo 1400) )) msg=
  while [ "$(date +%s)" -lt "$end" ]; do
    for v in a b c; do
      kill -0 "${VM_PIDS[$v]}" 2>/dev/null || { host_fail "VM $v ended before c asked for the kill"; return 1; }
    done
    msg=$(ns_hear 7100 10)
    [ -n "$msg" ] && break
  done
  [ "$msg" = "kill a" ] || { host_fail "expected 'kill a' from c, got '${msg:-nothing}'"; return 1; }
  vm_kill a || { host_fail "could not kill VM a"; return 1; }
  ns_run 60 python3 - 10.77.0.13 7003 <<'PY' || { host_fail "could not tell c that a was killed"; return 1; }
import socket, sys, time
end = time.monotonic() + 50
while True:
    try:
        with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as c:
            c.sendall(b"killed\n")
        break
    except OSError:
        if time.monotonic() > end:
            sys.exit(1)
        time.sleep(0.5)
PY
  echo "VM a killed; c told"
}

# our_guid IP: srptd's target port ID at IPv4 address IP (id_ext and
# ioc_guid): 0002c903 and the address's four bytes.
our_guid() {
  local a b c d
  IFS=. read -r a b c d <<<"$1"
  printf '0002c903%02x%02x%02x%02x\n' "$a" "$b" "$c" "$d"
}

drbd_connected() { grep -q "cs:Connected" /proc/drbd; }
drbd_uptodate() { grep -q "ds:UpToDate/UpToDate" /proc/drbd; }

# agent ACTION: our OCF agent, as Pacemaker runs it.
agent() {
  OCF_RESOURCE_INSTANCE=srptd OCF_RESKEY_config=/etc/srptd.toml \
    OCF_RESKEY_socket=/tmp/srptd.sock OCF_RESKEY_drbd_device=r0 \
    OCF_RESKEY_srptd=/interop/bin/srptd OCF_RESKEY_srptadm=/interop/bin/srptadm \
    OCF_RESKEY_pidfile=/tmp/srptd.pid OCF_RESKEY_logfile=/tmp/srptd.log \
    sh /interop/bin/ocf-srptd "$1"
}

adm() { /interop/bin/srptadm --socket /tmp/srptd.sock "$@"; }

guest_target() {
  local me ip rel a b c
  me=$INTEROP_VM ip=$(my_ip) a=$(host_ip a) b=$(host_ip b) c=$(host_ip c)
  case $me in a) rel=1 ;; b) rel=2 ;; *) fail "target VM $me is neither a nor b" ;; esac
  modprobe loop
  modprobe drbd
  # drbdadm's lock files (/var/lock is /run/lock, a fresh tmpfs here).
  mkdir -p /run/lock
  truncate -s 64M /tmp/r0.img
  local loopdev
  loopdev=$(losetup -f --show /tmp/r0.img)
  cat >/etc/drbd.conf <<EOF
global { usage-count no; }
resource r0 {
  net { protocol C; ping-int 3; ping-timeout 10; timeout 20; connect-int 3; }
  on a { device /dev/drbd0; disk $loopdev; address $a:7789; meta-disk internal; }
  on b { device /dev/drbd0; disk $loopdev; address $b:7789; meta-disk internal; }
}
EOF
  drbdadm create-md r0 </dev/null >/tmp/create-md.log 2>&1 || { cat /tmp/create-md.log; fail "drbdadm create-md r0"; }
  drbdadm up r0
  wait_until 300 "DRBD r0 connected to its peer" drbd_connected
  # Both disks are zeroes: no initial sync is needed (new-current-uuid
  # with --clear-bitmap marks them in sync).
  if [ "$me" = a ]; then
    drbdadm -- --clear-bitmap new-current-uuid r0
  fi
  wait_until 120 "DRBD r0 UpToDate on both sides" drbd_uptodate
  step "DRBD: $(grep ' 0:' /proc/drbd)"

  # Our NIC takes the RoCE port: rxe goes first.
  rdma link delete rxe0 2>/dev/null || true
  modprobe -r rdma_rxe 2>/dev/null || true
  cat >/etc/srptd.toml <<EOF
[[target]]
ip = "$ip"
rdma_cm_port = $SRP_PORT
rel_tgt_id = $rel
mtu = 1024
control_socket = "/tmp/srptd.sock"

[alua]
implicit_transition_time = 10

[drbd]
poll_interval_ms = 500

[[device]]
name = "r0"
handler = "vdisk_blockio"
filename = "/dev/drbd0"
usn = "ha-r0"
drbd_minor = 0

[[lun]]
lun = 0
device = "r0"

[[target_group]]
name = "a"
group_id = 1
targets = [1]
follow = "r0"

[[target_group]]
name = "b"
group_id = 2
targets = [2]
follow = "r0"
EOF
  /interop/bin/srptd --check --config /etc/srptd.toml || fail "srptd --check refused the configuration"
  agent start || fail "OCF agent start (see /tmp/srptd.log): $(tail -3 /tmp/srptd.log)"
  agent monitor || fail "OCF monitor after start: not running unpromoted (status $?)"
  if [ "$me" = a ]; then
    drbdadm primary r0
    agent promote || fail "OCF agent promote on a"
    local rc=0
    agent monitor || rc=$?
    [ $rc = 8 ] || fail "OCF monitor after promote: status $rc, not 8 (promoted)"
  fi
  adm roles | sed 's/^/  /'
  adm target-groups | sed 's/^/  /'
  msg_send "$c" 7002 600 "ready $me $(our_guid "$ip")"
  if [ "$me" = a ]; then
    step "a is Primary and serving; waiting to be killed"
    msg_recv 7001 1400 >/dev/null
    fail "a was never killed"
  fi

  # b: the peer's loss, then promotion (the scenario stands in for the
  # cluster manager: DRBD first, then srptd by the agent).
  wait_until 1200 "DRBD to lose its peer (a killed)" sh -c '! grep -q "cs:Connected" /proc/drbd'
  step "DRBD lost its peer: $(grep ' 0:' /proc/drbd)"
  drbdadm primary r0 || fail "drbdadm primary r0 on b"
  agent promote || fail "OCF agent promote on b: $(tail -3 /tmp/srptd.log)"
  step "b promoted: $(grep ' 0:' /proc/drbd)"
  adm roles | sed 's/^/  /'
  adm target-groups | sed 's/^/  /'
  local done_msg
  done_msg=$(msg_recv 7001 1200)
  [ "$done_msg" = done ] || fail "initiator reported '$done_msg'"
  # srptd's own account of the takeover.
  grep -q "DRBD minor 0.*opened" /tmp/srptd.log || fail "srptd on b logged no opening of r0"
  grep "DRBD minor 0" /tmp/srptd.log | tail -n 3 | sed 's/^/  /'
}

# ha_readies: waits for both targets' "ready NAME GUID"; sets GUID_a, GUID_b.
ha_readies() {
  local m n
  for n in 1 2; do
    m=$(msg_recv 7002 900)
    set -- $m
    [ "$1" = ready ] && [[ ${3:-} =~ ^[0-9a-f]{16}$ ]] || fail "bad ready message '$m'"
    printf -v "GUID_$2" '%s' "$3"
    step "target $2 ready (port $3)"
  done
  [ -n "${GUID_a:-}" ] && [ -n "${GUID_b:-}" ] || fail "ready from a and b expected"
}

# ha_kill_a: asks the host to kill a; returns once it has.
ha_kill_a() {
  msg_send "$(host_ip host)" 7100 60 "kill a"
  local k
  k=$(msg_recv 7003 120)
  [ "$k" = killed ] || fail "host said '$k' instead of killed"
  KILLED_AT=$(date +%s.%N)
  step "a killed (qemu SIGKILL)"
}
