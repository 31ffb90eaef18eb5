# shellcheck shell=bash
# srp-compare-rdmacore: srp-compare with srptd on our rdma-core provider
# (srptd --device rxe0 in VM c: Linux rxe does the transport, the kernel's
# RDMA CM the logins) in place of srptd on its own soft RoCE NIC. Linux
# ib_srp in VM b reads 1 MiB QD8 from LIO (VM a) and from srptd in
# interleaved rounds; THROUGHPUT-RATIO is srptd-on-rdma-core over LIO,
# both on the same rxe under the same TCG conditions.
# Needs the binary: cargo build --release -p srptd (SRPTD overrides).

# shellcheck source=srp-compare.sh
. "$(dirname "${BASH_SOURCE[0]}")/srp-compare.sh"

SRPTD_DEVICE=rxe0

# Where each target VM spends its CPU (one vCPU each): /proc/stat's
# user, system and softirq time (and idle) over the target's whole run,
# which is the setup, the pattern check and its own rounds (the other
# target's rounds leave it idle); for srptd also the process' own user
# and system time. Divided by what the target moved (the THROUGHPUT
# lines: KiB/s x COMPARE_SECONDS per round), it is CPU per MiB.
vm_cpu() { head -1 /proc/stat | awk '{print $2 + $3, $4, $6, $7, $8, $5}'; }

cpu_report() {
  local label=$1 t0=$2 t1 pid
  t1=$(vm_cpu)
  python3 - "$label" "$t0" "$t1" <<'PY'
import sys
label, a, b = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
d = [int(y) - int(x) for x, y in zip(a, b)]
names = ["user", "system", "iowait", "irq", "softirq", "idle"]
print(f"CPU {label} (s): " + ", ".join(f"{n} {v / 100:.1f}" for n, v in zip(names, d)))
PY
  pid=$(grep -lx srptd /proc/[0-9]*/comm 2>/dev/null | head -1 | cut -d/ -f3 || true)
  [ -z "$pid" ] || echo "CPU $label srptd process (s): user $(awk '{print $14 / 100}' /proc/"$pid"/stat), system $(awk '{print $15 / 100}' /proc/"$pid"/stat)"
}

guest_lio() {
  local t0
  t0=$(vm_cpu)
  READY_PORT=7002 lio_target
  cpu_report LIO "$t0"
}

guest_ours() {
  local t0
  t0=$(vm_cpu)
  READY_PORT=7003 srptd_target
  tail -3 /tmp/srptd.log
  cpu_report "srptd on rxe0" "$t0"
}
