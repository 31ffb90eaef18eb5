# shellcheck shell=bash
# vm-srp-passthrough-bsg: vm-srp-passthrough with the device named by its
# block SCSI generic node (/dev/bsg/H:C:T:L) instead of its sg node: SG_IO
# version 4, one flat buffer per command, LUN resets through the device's
# sg node (a bsg node takes no reset).
PT_NODE=bsg
# shellcheck source=vm-srp-passthrough.sh
. "$(dirname "${BASH_SOURCE[0]}")/vm-srp-passthrough.sh"
