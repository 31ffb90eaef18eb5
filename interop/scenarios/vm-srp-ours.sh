# shellcheck shell=bash
# vm-srp-ours: vm-srp with our target in place of LIO. VM a runs srptd
# (our SRP target on our soft RoCE NIC, its rxe removed so srptd owns UDP
# 4791; a 16 MiB RAM LUN, logins by RDMA CM on 5555); VM b runs exactly
# vm-srp's initiator part (ib_srp add_target, dd compare, fio verify, the
# THROUGHPUT job, logout). Both targets then run under the same TCG
# conditions, so the two THROUGHPUT lines give the ratio issue 9 asks for.
# Needs the binary: cargo build --release -p srptd (SRPTD overrides).

# shellcheck source=vm-srp.sh
. "$(dirname "${BASH_SOURCE[0]}")/vm-srp.sh"

DISK_VENDOR=RUSTSCST
SRPTD=${SRPTD:-${CARGO_TARGET_DIR:-${INTEROP_DIR:-.}/../target}/release/srptd}
SCENARIO_GUEST_BINS="$SRPTD"

# our_guid IP: srptd's CA GUID at IPv4 address IP, its target port ID
# (id_ext and ioc_guid): 0002c903 and the address's four bytes.
our_guid() {
  local a b c d
  IFS=. read -r a b c d <<<"$1"
  printf '0002c903%02x%02x%02x%02x\n' "$a" "$b" "$c" "$d"
}

host_main() {
  [ -x "$SRPTD" ] || { echo "missing $SRPTD: run cargo build --release -p srptd -p srp-cli"; return 1; }
}

# srptd_target: srptd on this VM's address (rxe taken away first) with a
# 16 MiB RAM LUN; "ready" goes to b's READY_PORT (default 7002); waits
# DONE_TIMEOUT (default 900) s for b's "done". SRPTD_FAULTS, if set, is
# srptd's SOFTROCE_FAULTS spec. With SRPTD_DEVICE (rxe0) srptd runs on
# that device through our rdma-core provider instead (rxe stays; the
# target port ID is the device's node GUID).
srptd_target() {
  local ip guid_b where tgt_guid
  ip=$(my_ip)
  if [ -n "${SRPTD_DEVICE:-}" ]; then
    wait_until 60 "$SRPTD_DEVICE port ACTIVE" grep -q ACTIVE /sys/class/infiniband/$SRPTD_DEVICE/ports/1/state
    where="--device $SRPTD_DEVICE"
    tgt_guid=$(tr -d : </sys/class/infiniband/$SRPTD_DEVICE/node_guid)
  else
    # Our NIC takes the RoCE port: take rxe away first.
    rdma link delete rxe0 2>/dev/null || true
    modprobe -r rdma_rxe 2>/dev/null || true
    where="--ip $ip"
    tgt_guid=$(our_guid "$ip")
  fi
  # shellcheck disable=SC2086
  SOFTROCE_FAULTS=${SRPTD_FAULTS:-} /interop/bin/srptd $where --ram-mib 16 --rdma-cm-port $SRP_PORT \
    --control-socket /tmp/srptd.sock >/tmp/srptd.log 2>&1 &
  wait_until 30 "srptd to listen" grep -q "listening on" /tmp/srptd.log
  step "$(head -1 /tmp/srptd.log)${SRPTD_FAULTS:+ (SOFTROCE_FAULTS=$SRPTD_FAULTS)}"
  guid_b=$(msg_recv 7001 600)
  [[ $guid_b =~ ^[0-9a-f]{16}$ ]] || fail "bad initiator GUID message '$guid_b'"
  msg_send "$(host_ip b)" "${READY_PORT:-7002}" 300 "ready $tgt_guid"
  step "srptd ready, waiting for the initiator"
  local done_msg
  done_msg=$(msg_recv 7001 "${DONE_TIMEOUT:-900}")
  [ "$done_msg" = done ] || fail "initiator reported '$done_msg'"
}

guest_target() {
  srptd_target
  tail -5 /tmp/srptd.log
}
