# shellcheck shell=bash
# vm-srp-rdmacore: srptd on our rdma-core provider, Linux ib_srp as the
# initiator, with linux-srp-initiator-ours' checks. VM a runs srptd
# --device rxe0: the target port's verbs objects on Linux rxe (through
# libibverbs), its logins by the kernel's RDMA CM (through librdmacm) on
# port 5555; a 32 MiB RAM LUN; and the srptadm relay. VM b runs
# linux-srp-initiator-ours' initiator against it (ib_srp over rxe,
# ch_count=2 and immediate data: dd pattern compare, fio crc32c verify,
# LUN 1 added and removed on a's srptd while fio verifies LUN 0, sg_reset
# under I/O, the THROUGHPUT job, ext4 mkfs/mount/fsck, 4 and 8 MiB direct
# I/O with cmd_sg_entries 1 and 255, 20 logins and logouts). Before that,
# our own initiator on the host side (`srp io`, our soft RoCE NIC at
# 10.77.0.2) logs in to the same srptd and verifies 8 MiB of random I/O
# on LUN 0's first 4 MiB: both of our providers on one fabric. The two
# initiators take turns: both write LUN 0's first 4 MiB (Linux's dd
# pattern, mkfs, big I/O), so at once each would read back the other's
# data as corruption. The host tells a when its I/O is over (a:7003), and
# only then does a tell b it is ready. Then srptd must have seen every
# channel closed by an initiator, none by itself, and stop cleanly with
# 0 verbs objects left.
# Needs the binaries: cargo build --release -p srptd -p srp-cli (SRPTD,
# SRPTADM, SRP_CLI).

# shellcheck source=linux-srp-initiator-ours.sh
. "$(dirname "${BASH_SOURCE[0]}")/linux-srp-initiator-ours.sh"

SCENARIO_VMS=("a 11 target" "b 12 initiator")
SCENARIO_GUEST_TIMEOUT=1500
SRP_PORT=5555
SRPTADM=${SRPTADM:-$(dirname "$SRPTD")/srptadm}
ADM_RELAY_PY=${INTEROP_DIR:-$(dirname "${BASH_SOURCE[0]}")/..}/lib/adm_relay.py
SCENARIO_GUEST_BINS="$SRPTD $SRPTADM $ADM_RELAY_PY"
SRP_CLI=${SRP_CLI:-$(dirname "$SRPTD")/srp}
# rxe's node GUID in VM a: the EUI-64 of its MAC 52:54:00:77:00:0b, so
# srptd's target port ID there.
A_GUID=505400fffe77000b
# What `srp io` says while srptd in VM a is not up yet (see
# ours-srp-initiator-linux).
SRP_NOT_UP='^srp: open LUN [0-9]+ over .*: login: (connection failed: (connection (timed out|rejected)|nothing (answered|listens for) SRP logins)|port [0-9]+ is [A-Za-z]+, not ACTIVE)'

host_main() {
  local b
  for b in "$SRPTD" "$SRPTADM" "$SRP_CLI"; do
    [ -x "$b" ] || { echo "missing $b: run cargo build --release -p srptd -p srp-cli"; return 1; }
  done
  ns_add_ip 10.77.0.2
  local ok=1
  retry_if_not_up 300 "srp io (soft RoCE) to srptd on rxe0" "$SRP_NOT_UP" "$RUN_DIR/host-io.txt" \
    ns_run 120 "$SRP_CLI" io --dest 10.77.0.11:$SRP_PORT --ip 10.77.0.2 --mtu 1024 \
      --id-ext $A_GUID --ioc-guid $A_GUID --size 8M --region 4M --rw randrw || ok=0
  if [ $ok = 1 ]; then
    grep -q "verified [1-9][0-9.]* [KMGTPE]*i*B" "$RUN_DIR/host-io.txt" &&
      grep -q " 0 verify failures, 0 I/O errors" "$RUN_DIR/host-io.txt" ||
      { ok=0; host_fail "srp io from our soft RoCE NIC to srptd on rxe0 did not verify"; }
  fi
  # Linux's initiator may start on LUN 0 now (whatever the verdict: a
  # waits for this word, not for a timeout).
  ns_tell 10.77.0.11 7003 "host-io $([ $ok = 1 ] && echo done || echo failed)"
  [ $ok = 1 ] || return 1
  echo "our soft RoCE initiator: verified I/O against srptd on the rdma-core provider"
}

# srptd_on_rxe0: srptd --device rxe0 with a 32 MiB RAM LUN, listening;
# its log on the console as it is written. Sets SRPTD_PID and NODE_GUID
# (rxe0's node GUID: srptd's target port ID).
srptd_on_rxe0() {
  wait_until 60 "rxe0 port ACTIVE" grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state
  NODE_GUID=$(tr -d : </sys/class/infiniband/rxe0/node_guid)
  /interop/bin/srptd --device rxe0 --ram-mib 32 --rdma-cm-port $SRP_PORT \
    --control-socket /tmp/srptd.sock >/tmp/srptd.log 2>&1 &
  SRPTD_PID=$!
  tail -F /tmp/srptd.log 2>/dev/null | sed -u 's/^/  srptd| /' &
  wait_until 30 "srptd to listen" grep -q "listening on" /tmp/srptd.log ||
    fail "srptd did not start: $(tail -3 /tmp/srptd.log)"
}

guest_target() {
  local ip
  ip=$(my_ip)
  srptd_on_rxe0
  grep -q "$ip:$SRP_PORT of rxe0 (RDMA CM through the kernel)" /tmp/srptd.log ||
    fail "srptd does not say it listens on rxe0 at $ip:$SRP_PORT"
  python3 /interop/bin/adm_relay.py "$ip" 7000 /interop/bin/srptadm /tmp/srptd.sock >/tmp/relay.log 2>&1 &
  wait_until 30 "the srptadm relay" grep -q "relay listening" /tmp/relay.log
  step "srptd ready on rxe0, waiting for the host's srp io to end (it writes LUN 0 too)"
  local host_io
  host_io=$(msg_recv 7003 600)
  step "host: $host_io"
  msg_send "$(host_ip b)" 7002 300 "ready $NODE_GUID"
  step "srptd ready on rxe0 (target port ID $NODE_GUID), waiting for the initiator"
  local done_msg
  done_msg=$(msg_recv 7001 1300)
  [ "$done_msg" = done ] || fail "initiator reported '$done_msg'"
  local logins closed_i closed_t
  logins=$(grep -c "login from .* accepted" /tmp/srptd.log || true)
  closed_i=$(grep -c "closed by the initiator" /tmp/srptd.log || true)
  closed_t=$(grep -c "closed by the target" /tmp/srptd.log || true)
  step "srptd: $logins channels accepted, $closed_i closed by the initiator, $closed_t by the target"
  [ "$logins" -ge 23 ] || fail "only $logins channels were accepted"
  [ "$closed_t" -eq 0 ] || fail "srptd closed $closed_t channels itself"
  wait_until 30 "every channel closed" sh -c \
    "[ \$(grep -c 'closed by the initiator' /tmp/srptd.log) -eq $logins ]"
  /interop/bin/srptadm --socket /tmp/srptd.sock show | sed 's/^/  /'
  # The port is rxe0's, at a's address: soft RoCE's settings (its UDP
  # port, MTU, fabric) do not apply and are not shown; the port's state
  # and active MTU, as rxe0 reports them (ibv_devinfo's), are.
  want_mtu=$(ibv_devinfo -d rxe0 | awk '/active_mtu/ {print $2; exit}')
  /interop/bin/srptadm --socket /tmp/srptd.sock --json show | python3 -c '
import json, sys
v = json.load(sys.stdin)
ok = v.get("device") in ("rxe0", "rxe0:1") and v.get("ip") == sys.argv[1] and not {"udp_port", "mtu", "fabric"} & set(v)
ok = ok and str(v.get("active_mtu")) == sys.argv[2] and v.get("port_state") == "Active"
sys.exit(0 if ok else "srptadm show of a device target: " + json.dumps(v))' "$ip" "$want_mtu" ||
    fail "srptadm show does not name rxe0, a's address alone and rxe0's active MTU ($want_mtu) and state"
  kill -TERM "$SRPTD_PID"
  wait "$SRPTD_PID" || fail "srptd exited with an error: $(tail -3 /tmp/srptd.log)"
  grep -q "stopped cleanly, 0 verbs objects left" /tmp/srptd.log ||
    fail "srptd did not stop cleanly: $(tail -1 /tmp/srptd.log)"
  step "srptd stopped cleanly, 0 verbs objects left on rxe0"
}

# linux-srp-initiator-ours' initiator, pointed at VM a.
eval "ours_$(declare -f guest_initiator)"
guest_initiator() {
  local ready a
  a=$(host_ip a)
  ready=$(msg_recv 7002 900)
  OUR_TARGET_GUID=${ready#ready }
  [[ $OUR_TARGET_GUID =~ ^[0-9a-f]{16}$ ]] || fail "bad ready message '$ready'"
  OUR_TARGET_DEST=$a:$SRP_PORT
  ADM_RELAY=$a
  ours_guest_initiator
  msg_send "$a" 7001 120 done
}
