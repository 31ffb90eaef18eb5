# shellcheck shell=bash
# rxe-rc-pingpong-ours: our soft RoCE NIC against Linux rxe, RC SEND both
# ways through ibv_rc_pingpong's exchange (4 KiB messages at MTU 1024).
PP_TOOL=ibv_rc_pingpong
PP_ARGS=""
OUR_ARGS=""
# RC SEND First/Last (4096 bytes at MTU 1024) and ACKs.
SCENARIO_EXPECT_PROTOCOLS="infiniband.bth.opcode==0 infiniband.bth.opcode==2 infiniband.bth.opcode==17"
# The host harness knows INTEROP_DIR; inside the guest the scenarios live
# in /interop/scenarios.
# shellcheck source=_pingpong-ours.sh
. "${INTEROP_DIR:-/interop}/scenarios/_pingpong-ours.sh"
