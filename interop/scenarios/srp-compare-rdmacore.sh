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
