# shellcheck shell=bash
# srp-compare: Linux ib_srp's read throughput against LIO ib_srpt and
# against our srptd, measured in one run with the rounds interleaved, so
# the machine's drift (other work, TCG's moods) falls on both alike.
#
# VM a runs LIO (vm-srp's target), VM c runs srptd (vm-srp-ours's target),
# VM b logs in to both with ib_srp and then runs the same fio job
# (1 MiB sequential reads, QD8, direct, time based) against each disk in
# the order A B B A A B B A ..., so each target goes first as often as it
# goes second. It prints one THROUGHPUT line per run and a
# THROUGHPUT-RATIO line: the median of the per-round ratios ours/LIO,
# with the range, the ratio of the two targets' summed throughputs, and
# the mean of the per-round ratios with its standard error (to pool runs).
# Single rounds spread widely under TCG on a shared 2-core host (0.7 to
# 1.6 seen), so 8 rounds are run: the median of 4 moved by 0.1 to 0.2
# from one run to the next. Both disks are read-checked against a written pattern
# first, so the numbers come from working sessions.
#
# Wire correctness is the job of vm-srp and vm-srp-ours; this scenario
# captures only the CM MADs (RoCEv2 to QP 1) and the non-RoCE traffic, so
# the capture stays small although the run moves GBs.
# Needs the binary: cargo build --release -p srptd (SRPTD overrides).
# Rounds and seconds per run are set below (the guest sees only this file).

# shellcheck source=vm-srp-ours.sh
. "$(dirname "${BASH_SOURCE[0]}")/vm-srp-ours.sh"

SCENARIO_VMS=("a 11 lio" "c 13 ours" "b 12 initiator")
SCENARIO_GUEST_TIMEOUT=1500
SCENARIO_CAPTURE_FILTER="not udp port 4791 or (udp[12:4] & 0x00ffffff) = 1"
SCENARIO_EXPECT_PROTOCOLS="infiniband.mad"
COMPARE_ROUNDS=8
COMPARE_SECONDS=8

guest_lio() { READY_PORT=7002 lio_target; }
guest_ours() {
  READY_PORT=7003 srptd_target
  tail -3 /tmp/srptd.log
}

# compare_login IP PORT: one ib_srp add_target after the target's "ready".
compare_login() {
  local ip=$1 port=$2 ready guid
  ready=$(msg_recv "$port" 600)
  guid=${ready#ready }
  [[ $guid =~ ^[0-9a-f]{16}$ ]] || fail "bad ready message '$ready' from $ip"
  retry 120 "SRP login to $ip" sh -c \
    "echo id_ext=$guid,ioc_guid=$guid,dest=$ip:$SRP_PORT >/sys/class/infiniband_srp/srp-rxe0-1/add_target"
}

# compare_disk VENDOR: waits for the disk and checks a 4 MiB pattern.
compare_disk() {
  local dev
  DISK_VENDOR=$1 wait_until 120 "$1 disk" lio_disk
  dev=/dev/$(DISK_VENDOR=$1 lio_disk)
  wait_until 30 "$dev node" test -b "$dev"
  dd if=/tmp/pattern of="$dev" bs=64k oflag=direct conv=fsync 2>/dev/null
  dd if="$dev" of=/tmp/readback bs=64k count=64 iflag=direct 2>/dev/null
  cmp -s /tmp/pattern /tmp/readback || fail "$1 disk $dev: read-back differs"
  # The largest request Linux sends each (sd takes it from VPD B0).
  local q=/sys/block/${dev#/dev/}/queue
  echo "$1 $dev: max_sectors_kb $(cat $q/max_sectors_kb), optimal_io_size $(cat $q/optimal_io_size)" >&2
  echo "$dev"
}

# compare_run LABEL DEV: one timed read job; prints KiB/s.
compare_run() {
  fio --name="$1" --filename="$2" --direct=1 --rw=read --bs=1m --iodepth=8 \
    --ioengine=libaio --size=16m --time_based --runtime="$COMPARE_SECONDS" \
    --output-format=terse --minimal >/tmp/bw.out 2>&1 || { cat /tmp/bw.out; fail "fio on $2 failed"; }
  cut -d';' -f7 /tmp/bw.out
}

guest_initiator() {
  local a c guid lio ours r n bl bo sum_l=0 sum_o=0 ratios=()
  a=$(host_ip a)
  c=$(host_ip c)
  modprobe ib_srp
  modprobe sd_mod 2>/dev/null || true
  guid=$(cut -d: -f5- </sys/class/infiniband/rxe0/ports/1/gids/0 | tr -d :)
  msg_send "$a" 7001 600 "$guid"
  msg_send "$c" 7001 600 "$guid"
  compare_login "$a" 7002
  compare_login "$c" 7003
  head -c 4194304 /dev/urandom >/tmp/pattern
  lio=$(compare_disk LIO-ORG)
  ours=$(compare_disk RUSTSCST)
  step "LIO disk $lio, ours $ours: both read back a 4 MiB pattern"

  n=$COMPARE_ROUNDS
  for r in $(seq 1 "$n"); do
    # A B, B A, A B, ...: each target leads in half the rounds.
    if [ $((r % 2)) = 1 ]; then
      bl=$(compare_run lio "$lio")
      bo=$(compare_run ours "$ours")
    else
      bo=$(compare_run ours "$ours")
      bl=$(compare_run lio "$lio")
    fi
    [ "${bl:-0}" -gt 0 ] && [ "${bo:-0}" -gt 0 ] || fail "round $r: no throughput (LIO '$bl', ours '$bo')"
    step "THROUGHPUT round $r LIO $bl KiB/s ours $bo KiB/s"
    sum_l=$((sum_l + bl)) sum_o=$((sum_o + bo))
    ratios+=("$(python3 -c "print(round($bo / $bl, 3))")")
  done
  step "THROUGHPUT-RATIO ours/LIO $(python3 - "$sum_o" "$sum_l" "${ratios[@]}" <<'PY'
import statistics, sys
total = int(sys.argv[1]) / int(sys.argv[2])
r = sorted(float(x) for x in sys.argv[3:])
# The rounds' mean and its standard error, for pooling runs.
se = statistics.stdev(r) / len(r) ** 0.5 if len(r) > 1 else float("nan")
print(f"median {statistics.median(r):.2f} min {r[0]:.2f} max {r[-1]:.2f} over {len(r)} rounds, "
      f"summed {total:.2f}, mean {statistics.mean(r):.3f} standard error {se:.3f}")
PY
)"

  local p
  for p in /sys/class/srp_remote_ports/port-*; do
    [ -e "$p/delete" ] && echo 1 >"$p/delete"
  done
  wait_until 60 "disk removal" sh -c '! ls /sys/block | grep -q "^sd"'
  msg_send "$a" 7001 120 done
  msg_send "$c" 7001 120 done
}
