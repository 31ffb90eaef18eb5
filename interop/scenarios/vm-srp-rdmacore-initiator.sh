# shellcheck shell=bash
# vm-srp-rdmacore-initiator: our SRP initiator on our rdma-core provider
# against Linux LIO. VM a runs vm-srp's LIO ib_srpt target (16 MiB fileio
# LUN, an ACL for b's initiator port, RDMA CM port 5555); VM b runs `srp
# io --device rxe0`: its sessions' verbs objects on Linux rxe through
# libibverbs, its logins by the kernel's RDMA CM through librdmacm. It
# verifies random 4 KiB I/O (writes as immediate data), 64 KiB I/O (writes
# fetched by LIO's RDMA READs), single 4 and 8 MiB transfers, and reads
# LIO's LUN list with `srp luns`.
# Needs the binary: cargo build --release -p srp-cli (SRP_CLI overrides).

# shellcheck source=vm-srp.sh
. "$(dirname "${BASH_SOURCE[0]}")/vm-srp.sh"

SRP_CLI=${SRP_CLI:-${CARGO_TARGET_DIR:-${INTEROP_DIR:-.}/../target}/release/srp}
SCENARIO_GUEST_BINS="$SRP_CLI"
SCENARIO_GUEST_TIMEOUT=900

host_main() {
  [ -x "$SRP_CLI" ] || { echo "missing $SRP_CLI: run cargo build --release -p srp-cli"; return 1; }
}

# srp_io NAME ARGS...: `srp io` on rxe0 against LIO with ARGS; its output
# in /tmp/NAME.txt must show data verified and no failure.
srp_io() {
  local name=$1
  shift
  /interop/bin/srp io --device rxe0 --dest "$(host_ip a):$SRP_PORT" --id-ext "$TGT_GUID" \
    --initiator-ext 0 "$@" >/tmp/$name.txt 2>&1 || { cat /tmp/$name.txt; fail "srp io ($name) failed"; }
  cat /tmp/$name.txt
  grep -q "verified [1-9][0-9.]* [KMGTPE]*i*B" /tmp/$name.txt || fail "srp io ($name) verified nothing"
  grep -q " 0 verify failures, 0 I/O errors" /tmp/$name.txt || fail "srp io ($name) had failures"
}

guest_initiator() {
  local guid ready a
  a=$(host_ip a)
  wait_until 60 "rxe0 port ACTIVE" grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state
  # Our initiator port ID is initiator_ext 0 and rxe0's GUID: LIO's ACL.
  guid=$(tr -d : </sys/class/infiniband/rxe0/node_guid)
  msg_send "$a" 7001 600 "$guid"
  ready=$(msg_recv 7002 600)
  TGT_GUID=${ready#ready }
  [[ $TGT_GUID =~ ^[0-9a-f]{16}$ ]] || fail "bad ready message '$ready'"
  step "LIO ready (target port ID $TGT_GUID); srp io --device rxe0"
  srp_io small --size 8M --region 4M --rw randrw
  step "4 KiB random I/O verified (writes as immediate data)"
  srp_io bs64k --bs 64k --size 8M --region 4M --rw randrw
  step "64 KiB random I/O verified (writes fetched by RDMA READ)"
  local bs
  for bs in 4M 8M; do
    srp_io "big-$bs" --bs $bs --iodepth 1 --rw randrw --size $((16 * ${bs%M}))M --region 16M
  done
  step "4 and 8 MiB single transfers verified"
  /interop/bin/srp luns --device rxe0 --dest "$a:$SRP_PORT" --id-ext "$TGT_GUID" --initiator-ext 0 \
    >/tmp/luns.txt 2>&1 || { cat /tmp/luns.txt; fail "srp luns failed"; }
  cat /tmp/luns.txt
  grep -q "LUN 0 .*LIO-ORG" /tmp/luns.txt || fail "srp luns did not show LIO's LUN 0"
  step "srp luns on rxe0 shows LIO's LUN 0"
  msg_send "$a" 7001 120 done
}
