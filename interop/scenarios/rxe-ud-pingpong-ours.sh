# shellcheck shell=bash
# rxe-ud-pingpong-ours: our soft RoCE NIC against Linux rxe, UD SEND both
# ways (DETH, Q_Key 0x11111111, GRH in the receive buffer) through
# ibv_ud_pingpong's exchange.
PP_TOOL=ibv_ud_pingpong
PP_ARGS="-s 1000"
OUR_ARGS="--ud -s 1000"
# UD SEND Only with a DETH.
SCENARIO_EXPECT_PROTOCOLS="infiniband.bth.opcode==100 infiniband.deth"
# The host harness knows INTEROP_DIR; inside the guest the scenarios live
# in /interop/scenarios.
# shellcheck source=_pingpong-ours.sh
. "${INTEROP_DIR:-/interop}/scenarios/_pingpong-ours.sh"
