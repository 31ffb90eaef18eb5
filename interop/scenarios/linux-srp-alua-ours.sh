# shellcheck shell=bash
# linux-srp-alua-ours: ALUA of our target seen by Linux's tools (issue 30).
# srptd on the host side has two target ports, 10.77.0.2 (rel_tgt_id 1,
# target port group 1 "a", active) and 10.77.0.3 (rel_tgt_id 2, group 2
# "b", standby), one LU behind both. Linux's ib_srp in VM a logs in to
# both ports (two SCSI disks of one LU). sg3-utils checks: INQUIRY TPGS=1,
# VPD 0x83's relative port and group designators, sg_rtpg's groups and
# states (both header formats) identical through both paths; the standby
# path refuses a read, the active one serves it. Then srptadm (through the
# host relay) swaps the groups: sg_rtpg shows the new states and the
# other path serves I/O, with the data written before the swap intact.
# Needs the binaries: cargo build --release -p srptd (SRPTD overrides).

SCENARIO_VMS=("a 11 initiator")
SCENARIO_GUEST_TIMEOUT=600
SCENARIO_TSHARK_ARGS="--disable-heuristic rpcrdma_infiniband"
SCENARIO_EXPECT_PROTOCOLS="infiniband.bth.opcode==4 infiniband.mad"

SRPTD=${SRPTD:-${CARGO_TARGET_DIR:-$INTEROP_DIR/../target}/release/srptd}
SRPTADM=${SRPTADM:-$(dirname "$SRPTD")/srptadm}

host_main() {
  [ -x "$SRPTD" ] || { echo "missing $SRPTD: run cargo build --release -p srptd"; return 1; }
  [ -x "$SRPTADM" ] || { echo "missing $SRPTADM: run cargo build --release -p srptd"; return 1; }
  ns_add_ip 10.77.0.2
  ns_add_ip 10.77.0.3
  cat >"$RUN_DIR/srptd.toml" <<TOML
[[target]]
ip = "10.77.0.2"
rdma_cm_port = 5555
rel_tgt_id = 1
mtu = 1024
control_socket = "$RUN_DIR/srptd.sock"

[[target]]
ip = "10.77.0.3"
rdma_cm_port = 5555
rel_tgt_id = 2
mtu = 1024

[alua]
implicit_transition_time = 7

[[target_group]]
name = "a"
group_id = 1
state = "active"
preferred = true
targets = [1]

[[target_group]]
name = "b"
group_id = 2
state = "standby"
targets = [2]

[[device]]
name = "disk0"
handler = "ram"
size = "32M"

[[lun]]
lun = 0
device = "disk0"
TOML
  ns_bg srptd 600 "$SRPTD" --config "$RUN_DIR/srptd.toml"
  ns_bg_ready srptd "listening on" || return 1
  cat "$RUN_DIR/host-srptd.log"
  ns_bg relay 600 python3 "$INTEROP_DIR/lib/adm_relay.py" 10.77.0.1 7000 "$SRPTADM" "$RUN_DIR/srptd.sock"
  ns_bg_ready relay "relay listening" || return 1
}

# adm ARGS...: srptadm ARGS on the host, through the relay.
adm() {
  python3 - 10.77.0.1 "$@" <<'PY'
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

two_disks() { [ "$(our_disks | wc -l)" -eq 2 ]; }

# rel_port DEV: the relative target port VPD 0x83 names for DEV's path.
rel_port() {
  sg_vpd -p di "$1" | awk -F: '/Relative target port: / { gsub(/ /, "", $2); print $2; exit }'
}

# rtpg_state DEV GROUP: GROUP's (hex, no 0x) asymmetric access state code
# (hex, no 0x, no leading zeros) as sg_rtpg shows it through DEV, whatever
# width sg3-utils prints; a unit attention first is retried.
rtpg_state() {
  local n out
  for n in 1 2 3; do
    out=$(sg_rtpg "$1" 2>&1) && break
  done
  echo "$out" | awk -v g="$2" '
    function norm(s) { gsub(/[ \t]/, "", s); sub(/^0[xX]/, "", s); sub(/^0+/, "", s); return s == "" ? "0" : s }
    /target port group id/ { split($0, a, ":"); split(a[2], b, ","); cur = norm(b[1]) }
    /asymmetric access state/ && cur == g { split($0, a, ":"); split(a[2], b, "("); print norm(b[1]); exit }'
}

guest_initiator() {
  modprobe ib_srp
  modprobe sd_mod 2>/dev/null || true
  modprobe sg 2>/dev/null || true
  local add=/sys/class/infiniband_srp/srp-rxe0-1/add_target
  [ -e $add ] || fail "$add missing"
  # Each port's id_ext/ioc_guid: 0002c903 and its IPv4 address.
  retry 120 "SRP login to port a" sh -c "echo id_ext=0002c9030a4d0002,ioc_guid=0002c9030a4d0002,dest=10.77.0.2:5555 >$add"
  retry 120 "SRP login to port b" sh -c "echo id_ext=0002c9030a4d0003,ioc_guid=0002c9030a4d0003,dest=10.77.0.3:5555 >$add"
  wait_until 120 "two disks of ours" two_disks
  local d A= B=
  for d in $(our_disks); do
    wait_until 30 "/dev/$d" test -b "/dev/$d"
    step "$d: VPD 0x83"
    sg_vpd -p di "/dev/$d" 2>&1 | sed 's/^/  /'
    case "$(rel_port /dev/$d)" in
      0x1) A=/dev/$d ;;
      0x2) B=/dev/$d ;;
    esac
  done
  [ -n "$A" ] && [ -n "$B" ] || fail "no disk per relative port (a=$A b=$B)"
  step "path a is $A, path b is $B"

  sg_inq "$A" | sed 's/^/  /'
  sg_inq "$A" | grep -q "TPGS=1" || fail "INQUIRY TPGS is not 1 (implicit ALUA)"
  sg_vpd -p di "$B" | sed 's/^/  /'
  sg_vpd -p di "$B" | grep -qi "Target port group: 0x2" || fail "VPD 0x83 of path b names no target port group 2"
  sg_vpd -p di "$A" | grep -qi "Target port group: 0x1" || fail "VPD 0x83 of path a names no target port group 1"

  local dev
  for dev in "$A" "$B"; do
    sg_rtpg -d "$dev" 2>&1 | sed 's/^/  /'
    sg_rtpg -e -d "$dev" >/tmp/rtpg-ext 2>&1 || sg_rtpg -e -d "$dev" >/tmp/rtpg-ext 2>&1 || { cat /tmp/rtpg-ext; fail "sg_rtpg -e $dev"; }
    sed 's/^/  /' /tmp/rtpg-ext
    [ "$(rtpg_state "$dev" 1)" = 0 ] || fail "sg_rtpg $dev: group 1 is not active/optimized"
    [ "$(rtpg_state "$dev" 2)" = 2 ] || fail "sg_rtpg $dev: group 2 is not standby"
  done
  step "sg_rtpg: group 1 active/optimized, group 2 standby, through both paths"

  head -c 1048576 /dev/urandom >/tmp/pattern
  dd if=/tmp/pattern of="$A" bs=64k oflag=direct conv=fsync 2>/dev/null || fail "dd write through the active path"
  if dd if="$B" of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null; then
    fail "the standby path served a read"
  fi
  # TEST UNIT READY through b: NOT READY, 04/0B (sg_turs exits 2).
  sg_turs -v "$B" >/tmp/turs 2>&1 && fail "TEST UNIT READY through the standby path was GOOD"
  sed 's/^/  /' /tmp/turs
  grep -q "target port in standby state" /tmp/turs || fail "standby TEST UNIT READY: not 04/0B"
  step "active path a wrote 1 MiB; standby path b refused a read"

  adm set-group-state b active || fail "srptadm set-group-state b active"
  adm set-group-state a standby || fail "srptadm set-group-state a standby"
  local t=0
  until [ "$(rtpg_state "$B" 1)" = 2 ]; do
    t=$(( t + 1 ))
    [ $t -le 30 ] || fail "sg_rtpg through path b never showed group 1 standby"
    sleep 1
  done
  [ "$(rtpg_state "$B" 2)" = 0 ] || fail "group 2 is not active/optimized after the swap"
  [ "$(rtpg_state "$A" 1)" = 2 ] || fail "path a does not see group 1 standby"
  sg_rtpg -d "$B" 2>&1 | sed 's/^/  /'
  local n ok=0
  for n in 1 2 3 4 5; do
    dd if="$B" of=/tmp/readback bs=64k count=16 iflag=direct 2>/dev/null && { ok=1; break; }
    sleep 1
  done
  [ $ok = 1 ] || fail "path b does not serve reads after it became active"
  cmp /tmp/pattern /tmp/readback || fail "data written through a before the swap differs through b"
  if dd if="$A" of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null; then
    fail "path a served a read in standby"
  fi
  step "after the swap: path b serves the data written through a; path a refuses"
  dmesg | grep -i "alua\|not accessible\|asymmetric" | tail -8
}
