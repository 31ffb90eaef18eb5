# shellcheck shell=bash
# vm-srp-ours-lossy: vm-srp-ours with 1 % of our NIC's outgoing datagrams
# dropped (SOFTROCE_FAULTS=loss=0.01 for srptd in VM a). The traffic is
# mixed: RDMA CM MADs, SRP IUs by SEND both ways, data-in by our RDMA
# WRITEs, data-out by our RDMA READs, and ACKs. Our requester recovers its
# own lost packets; Linux rxe's requester recovers from our lost ACKs and
# READ responses; both responders see the gaps and duplicates. Linux's
# ib_srp still has to log in, pass the dd compare, the fio crc32c verify
# and the throughput job, and log out. At the end VM b prints rxe's
# hw_counters and VM a srptd's NIC counters, and both must show recovery
# at work.
# Needs the binaries: cargo build --release -p srptd (SRPTD, SRPTADM).

# shellcheck source=vm-srp-ours.sh
. "$(dirname "${BASH_SOURCE[0]}")/vm-srp-ours.sh"

SRPTADM=${SRPTADM:-$(dirname "$SRPTD")/srptadm}
SCENARIO_GUEST_BINS="$SRPTD $SRPTADM"
LOSS_SPEC=loss=0.01,seed=7
# One short pass of the throughput job (1 MiB reads: long RDMA WRITE runs
# under loss); here it measures recovery, not speed.
THROUGHPUT_LOOPS=1
THROUGHPUT_SIZE=4m

host_main() {
  [ -x "$SRPTD" ] || { echo "missing $SRPTD: run cargo build --release -p srptd -p srp-cli"; return 1; }
  [ -x "$SRPTADM" ] || { echo "missing $SRPTADM: run cargo build --release -p srptd -p srp-cli"; return 1; }
}

guest_target() {
  SRPTD_FAULTS=$LOSS_SPEC DONE_TIMEOUT=1100 srptd_target
  /interop/bin/srptadm --socket /tmp/srptd.sock show >/tmp/show.txt || fail "srptadm show failed"
  grep '^nic_' /tmp/show.txt | sed 's/^/  /'
  local rtx
  rtx=$(awk '$1 == "nic_retransmits" { print $2 }' /tmp/show.txt)
  [ "${rtx:-0}" -gt 0 ] || fail "our NIC retransmitted nothing: was the loss applied?"
  step "our NIC recovered from its own losses: $rtx packets retransmitted"
  tail -5 /tmp/srptd.log
}

# vm-srp's initiator, then rxe's view of the lossy peer.
eval "$(declare -f guest_initiator | sed '1s/guest_initiator/guest_initiator_plain/')"
guest_initiator() {
  guest_initiator_plain
  local hc=/sys/class/infiniband/rxe0/ports/1/hw_counters f seen=0
  for f in out_of_seq_request duplicate_request rcvd_seq_err completer_retry_err \
    retry_exceeded_err sent_pkts rcvd_pkts; do
    [ -r "$hc/$f" ] || continue
    echo "  rxe $f $(cat "$hc/$f")"
  done
  for f in out_of_seq_request rcvd_seq_err completer_retry_err; do
    [ -r "$hc/$f" ] && seen=$((seen + $(cat "$hc/$f")))
  done
  [ "$(cat "$hc/retry_exceeded_err" 2>/dev/null || echo 0)" = 0 ] ||
    fail "rxe gave up on a QP (retry_exceeded_err)"
  [ $seen -gt 0 ] || fail "rxe saw no gap and retried nothing: was the loss applied?"
  step "rxe recovered too: $seen sequence gaps or completer retries"
}
