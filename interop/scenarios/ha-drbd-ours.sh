# shellcheck shell=bash
# ha-drbd-ours: ha-drbd-linux with our initiator in VM c (issue 30,
# second must-show). The targets are _ha-drbd.sh's (a Primary, b
# Secondary, each srptd following its DRBD role). VM c runs `srp io` on
# our soft RoCE NIC (its rxe taken away; a second address for the second
# path) with two --dest, a and b, the failover path policy: I/O goes to
# a (active/optimized) only. While it runs verified random reads and
# writes, the host kills a's qemu; b is promoted, srp io moves to b and
# finishes with 0 verify failures and 0 I/O errors, its read-back of
# every block written checked, and its longest I/O (the one that waited
# through the failover) under FAILOVER_LIMIT seconds.
#   interop/run scenario ha-drbd-ours

# shellcheck source=_ha-drbd.sh
. "$(dirname "${BASH_SOURCE[0]}")/_ha-drbd.sh"

SRP_BIN=${SRP_BIN:-$(dirname "$SRPTD")/srp}
SCENARIO_GUEST_BINS="$SCENARIO_GUEST_BINS $SRP_BIN"

guest_initiator() {
  local a b ip2
  a=$(host_ip a) b=$(host_ip b)
  # Our NIC takes the RoCE port; a second initiator port for path b.
  rdma link delete rxe0 2>/dev/null || true
  modprobe -r rdma_rxe 2>/dev/null || true
  ip2=10.77.0.14
  ip addr add "$ip2/24" dev eth0
  ha_readies
  /interop/bin/srp io --dest "$a:$SRP_PORT" --ip "$(my_ip)" --dest "$b:$SRP_PORT" --ip "$ip2" \
    --mtu 1024 --path-policy failover --rw randrw --bs 4k --iodepth 4 \
    --region 16M --size 64M >/tmp/io.out 2>&1 &
  local io=$!
  wait_until 120 "srp io to log in over both paths" grep -q "srp: logged in .*(2 paths" /tmp/io.out
  step "$(grep 'srp: logged in' /tmp/io.out)"
  # Some I/O through a first (4 MiB more through eth0 since the login),
  # then the power cut.
  local st=/sys/class/net/eth0/statistics base
  base=$(( $(cat $st/tx_bytes) + $(cat $st/rx_bytes) ))
  wait_until 120 "4 MiB of I/O through a" sh -c \
    "[ \$(( \$(cat $st/tx_bytes) + \$(cat $st/rx_bytes) )) -ge $(( base + 4194304 )) ]"
  kill -0 $io 2>/dev/null || fail "srp io ended before the kill: $(tail -1 /tmp/io.out)"
  ha_kill_a
  local rc=0
  wait $io || rc=$?
  sed 's/^/  /' /tmp/io.out
  [ $rc = 0 ] || fail "srp io failed through the failover (status $rc): $(tail -1 /tmp/io.out)"
  grep -q ", 0 verify failures, 0 I/O errors" /tmp/io.out || fail "srp io: $(grep 'verify failures' /tmp/io.out)"
  grep -q "(all in the read-back)\| in the read-back)" /tmp/io.out || fail "srp io did no read-back of what it wrote"
  local max
  max=$(awk '$1 == "total" { print $8 }' /tmp/io.out)
  [ -n "$max" ] || max=$(awk '$1 == "write" { print $8 }' /tmp/io.out)
  step "longest I/O ${max} us (limit ${FAILOVER_LIMIT} s)"
  awk -v m="$max" -v l="$FAILOVER_LIMIT" 'BEGIN { exit !(m != "" && m / 1e6 <= l) }' ||
    fail "the longest I/O took ${max} us, more than ${FAILOVER_LIMIT} s"
  msg_send "$b" 7001 120 done
}
