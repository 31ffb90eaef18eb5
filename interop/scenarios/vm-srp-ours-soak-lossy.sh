# shellcheck shell=bash
# vm-srp-ours-soak-lossy: vm-srp-ours-soak with 1 % of our NIC's outgoing
# datagrams dropped (srptd's SOFTROCE_FAULTS): our requester's READ
# re-requests and WRITE retransmissions and rxe's recovery from our lost
# ACKs and READ responses run for the whole soak, and still no channel may
# close before the logout. Linux rxe (6.1) must never time out here with
# two SRP_CMDs unacknowledged: its retry runs the next command's REG_MR a
# second time, fails it, and the QP stops silently until ib_srp's 30 s
# SCSI timeout resets the host; srptd ACKs every request and repeats its
# newest ACK so that one lost ACK never leads there (issue 22 item 6).
SOAK_LOSS=${SOAK_LOSS:-0.01}
# shellcheck source=vm-srp-ours-soak.sh
. "$(dirname "${BASH_SOURCE[0]}")/vm-srp-ours-soak.sh"
