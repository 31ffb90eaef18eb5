# shellcheck shell=bash
# vm-srp-ours-soak-lossy: vm-srp-ours-soak with 1 % of our NIC's outgoing
# datagrams dropped (srptd's SOFTROCE_FAULTS): our requester's READ
# re-requests and WRITE retransmissions and rxe's recovery from our lost
# ACKs and READ responses run for the whole soak, and still no channel may
# close before the logout.
SOAK_LOSS=${SOAK_LOSS:-0.01}
# shellcheck source=vm-srp-ours-soak.sh
. "$(dirname "${BASH_SOURCE[0]}")/vm-srp-ours-soak.sh"
