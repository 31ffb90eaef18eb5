# shellcheck shell=bash
# vm-srp-ours-soak: Linux ib_srp (over rxe, VM b) writes and reads 64 KiB
# and 1 MiB requests to our target (srptd, VM a) for SOAK_SECS (default
# 180) with fio's crc32c verification running alongside the writes
# (verify_backlog: every few writes are read back and checked), two jobs at
# once on separate regions, and not one channel may close before the
# logout: srptd's log must show exactly as many logins as closes by the
# initiator and no close by the target, and ib_srp's kernel log no
# disconnect, reconnect or failed work request. Then the initiator idles
# through several of srptd's keepalives (keepalive_ms 2000: zero-length RDMA
# WRITEs that rxe must acknowledge) and must still be logged in, with the
# keepalives counted. This is the load under
# which srptd used to close channels now and then (a storm of RDMA READ
# re-requests, issue 22). SOAK_LOSS (vm-srp-ours-soak-lossy) drops that
# share of our NIC's outgoing datagrams.
# Needs the binaries: cargo build --release -p srptd (SRPTD, SRPTADM).

# shellcheck source=vm-srp-ours.sh
. "$(dirname "${BASH_SOURCE[0]}")/vm-srp-ours.sh"

SRPTADM=${SRPTADM:-$(dirname "$SRPTD")/srptadm}
SCENARIO_GUEST_BINS="$SRPTD $SRPTADM"
SOAK_SECS=${SOAK_SECS:-180}
SOAK_LOSS=${SOAK_LOSS:-}
SCENARIO_GUEST_TIMEOUT=$((SOAK_SECS + 900))
# The soak moves GBs; the capture keeps what is not RoCE and the MADs (QP
# 1: the logins and any disconnect), as srp-compare's.
SCENARIO_CAPTURE_FILTER=${SOAK_CAPTURE_FILTER-"not udp port 4791 or (udp[12:4] & 0x00ffffff) = 1"}
SCENARIO_EXPECT_PROTOCOLS="infiniband.mad"

host_main() {
  [ -x "$SRPTD" ] || { echo "missing $SRPTD: run cargo build --release -p srptd -p srp-cli"; return 1; }
  [ -x "$SRPTADM" ] || { echo "missing $SRPTADM: run cargo build --release -p srptd -p srp-cli"; return 1; }
}

# soak_srptd: srptd_target's srptd from a config file with a short
# keepalive, the same 16 MiB RAM LUN.
soak_srptd() {
  local ip guid_b
  ip=$(my_ip)
  rdma link delete rxe0 2>/dev/null || true
  modprobe -r rdma_rxe 2>/dev/null || true
  cat >/tmp/srptd.toml <<EOF_CONF
[target]
ip = "$ip"
rdma_cm_port = $SRP_PORT
control_socket = "/tmp/srptd.sock"
keepalive_ms = 2000
[[device]]
name = "ram0"
handler = "ram"
size = "16M"
[[lun]]
lun = 0
device = "ram0"
EOF_CONF
  SOFTROCE_FAULTS=${SOAK_LOSS:+loss=$SOAK_LOSS,seed=11} /interop/bin/srptd --config /tmp/srptd.toml \
    >/tmp/srptd.log 2>&1 &
  wait_until 30 "srptd to listen" grep -q "listening on" /tmp/srptd.log
  step "$(head -1 /tmp/srptd.log)${SOAK_LOSS:+ (loss $SOAK_LOSS)}"
  guid_b=$(msg_recv 7001 600)
  [[ $guid_b =~ ^[0-9a-f]{16}$ ]] || fail "bad initiator GUID message '$guid_b'"
  msg_send "$(host_ip b)" 7002 300 "ready $(our_guid "$ip")"
  step "srptd ready, waiting for the soak"
  # What the target sees every 10 s, shown if the soak fails.
  (
    while sleep 10; do
      {
        echo "t=$(cut -d' ' -f1 /proc/uptime)"
        /interop/bin/srptadm --socket /tmp/srptd.sock show 2>/dev/null |
          awk '/^nic_(retransmits|retransmit_timeouts|duplicate_requests|out_of_sequence|sequence_naks_received|packets_sent)[[:space:]]/ { printf "%s=%s ", $1, $2 } END { print "" }'
        /interop/bin/srptadm --socket /tmp/srptd.sock sessions 2>/dev/null | tail -n +2
      } >>/tmp/mon.log
    done
  ) &
  local idled
  idled=$(msg_recv 7001 $((SOAK_SECS + 800)))
  [ "$idled" = idled ] || {
    # The initiator failed: what srptd saw, for the verdict's logs.
    /interop/bin/srptadm --socket /tmp/srptd.sock show | grep -E '^(nic_|sessions|channels)' | sed 's/^/  /'
    /interop/bin/srptadm --socket /tmp/srptd.sock sessions | sed 's/^/  /'
    tail -20 /tmp/srptd.log | sed 's/^/  srptd: /'
    tail -60 /tmp/mon.log | sed 's/^/  mon: /'
    fail "initiator reported '$idled'"
  }
  local keepalives
  keepalives=$(/interop/bin/srptadm --socket /tmp/srptd.sock --json sessions |
    python3 -c 'import json,sys; print(sum(s["keepalives"] for s in json.load(sys.stdin)))')
  step "keepalives sent to the idle initiator: $keepalives"
  [ "${keepalives:-0}" -gt 0 ] || fail "no keepalive went out while the initiator idled"
  msg_send "$(host_ip b)" 7002 120 "checked"
  local done_msg
  done_msg=$(msg_recv 7001 300)
  [ "$done_msg" = done ] || fail "initiator reported '$done_msg'"
}

guest_target() {
  soak_srptd
  /interop/bin/srptadm --socket /tmp/srptd.sock show >/tmp/show.txt || fail "srptadm show failed"
  grep '^nic_' /tmp/show.txt | sed 's/^/  /'
  local logins by_init by_target
  # The initiator says "done" once its disk is gone; its DREQ may still
  # be on the way (ib_srp sends it from a work item): give the close up
  # to 30 s to reach srptd's log.
  local waited=0
  until [ "$(grep -c "accepted (channel" /tmp/srptd.log)" = "$(grep -c "closed by the initiator" /tmp/srptd.log)" ] ||
    [ $waited -ge 30 ]; do
    sleep 1
    waited=$((waited + 1))
  done
  logins=$(grep -c "accepted (channel" /tmp/srptd.log || true)
  by_init=$(grep -c "closed by the initiator" /tmp/srptd.log || true)
  by_target=$(grep -c "closed by the target" /tmp/srptd.log || true)
  step "srptd: $logins logins, $by_init channels closed by the initiator, $by_target by the target"
  [ "$by_target" = 0 ] || {
    grep "closed by the target" /tmp/srptd.log | head -5
    fail "srptd closed $by_target channels during the soak"
  }
  [ "$logins" -ge 1 ] || fail "no login in srptd's log"
  [ "$logins" = "$by_init" ] || {
    grep "closed by\|accepted" /tmp/srptd.log | head -20
    tail -20 /tmp/srptd.log | sed 's/^/  srptd: /'
    fail "$logins logins but $by_init closes by the initiator (waited ${waited}s): a channel was lost or remade"
  }
  if [ -n "$SOAK_LOSS" ]; then
    local rtx
    rtx=$(awk '$1 == "nic_retransmits" { print $2 }' /tmp/show.txt)
    [ "${rtx:-0}" -gt 0 ] || fail "our NIC retransmitted nothing: was the loss applied?"
    step "our NIC recovered from its own losses: $rtx packets retransmitted"
  fi
}

# soak_fail REASON: tell the target (which then shows what it saw), fail.
soak_fail() {
  local hc=/sys/class/infiniband/rxe0/ports/1/hw_counters f
  soak_dump_report
  for f in "$hc"/*; do echo "  rxe ${f##*/} $(cat "$f")"; done
  dmesg | grep -iE "srp|scsi" | grep -v "abort" >/tmp/srp-dmesg.txt || true
  sed -n 1,20p /tmp/srp-dmesg.txt
  msg_send "$(host_ip a)" 7001 60 "failed: $1" || true
  fail "$1"
}

# soak_job NAME BS OFFSET SIZE DEPTH: verified random writes of BS on DEV
# for SOAK_SECS in the background, the written blocks read back and checked
# as it goes.
# A block that fails verification is dumped (fio's verify_dump: what was
# read and what was written) into /tmp/dump-NAME, for `soak_dump_report`.
soak_job() {
  mkdir -p "/tmp/dump-$1"
  (cd "/tmp/dump-$1" && exec fio --name="$1" --filename="$DEV" --direct=1 --ioengine=libaio \
    --rw=randwrite --bs="$2" --offset="$3" --size="$4" --iodepth="$5" --verify=crc32c \
    --do_verify=1 --verify_backlog=8 --verify_fatal=1 --verify_dump=1 --time_based \
    --runtime="$SOAK_SECS" --output-format=terse --minimal >"/tmp/$1.out" 2>&1) &
}

# soak_dump_report: for each block fio dumped, which 1 KiB pieces (rxe's
# path MTU, so one RoCE packet each) differ from what was written, and what
# each wrong piece holds instead: zeroes, a piece of the written block at
# another offset, or something else (older data). A packet placed at the
# wrong offset, a stale chunk and a lost packet look different here.
soak_dump_report() {
  local f
  for f in /tmp/dump-*/*.received; do
    [ -e "$f" ] || continue
    python3 - "$f" "${f%.received}.expected" <<'EOF_PY'
import sys
got = open(sys.argv[1], "rb").read()
want = open(sys.argv[2], "rb").read()
P = 1024
print(f"  dump {sys.argv[1]}: {len(got)} bytes read, {len(want)} expected")
pieces = {want[i:i + P]: i for i in range(0, len(want), P)}
bad = [i for i in range(0, min(len(got), len(want)), P) if got[i:i + P] != want[i:i + P]]
print(f"  {len(bad)} of {len(want) // P} pieces of {P} bytes differ")
for i in bad[:32]:
    g = got[i:i + P]
    first = next(k for k in range(P) if g[k:k + 1] != want[i + k:i + k + 1])
    if g == bytes(P):
        what = "zeroes"
    elif g in pieces:
        what = f"the written piece at {pieces[g]:#x}"
    else:
        what = f"other data, first wrong byte at +{first:#x}"
    print(f"    piece {i:#07x}: {what}")
EOF_PY
  done
}

guest_initiator() {
  local a
  a=$(host_ip a)
  srp_login
  dmesg -c >/dev/null
  step "soak: 64 KiB and 1 MiB verified writes for ${SOAK_SECS}s${SOAK_LOSS:+, our NIC dropping $SOAK_LOSS}"
  soak_job soak64k 64k 0 6m 8
  local p64=$!
  soak_job soak1m 1m 6m 10m 4
  local p1m=$!
  local rc=0
  wait $p64 || rc=1
  wait $p1m || rc=1
  local j
  for j in soak64k soak1m; do
    [ $rc = 0 ] || cat "/tmp/$j.out"
    # terse v3: field 6 read KiB, 26 write KiB (with verify reads counted in
    # the reads).
    step "$j: read $(cut -d';' -f6 "/tmp/$j.out" | head -1) KiB, wrote $(cut -d';' -f47 "/tmp/$j.out" | head -1) KiB"
  done
  [ $rc = 0 ] || soak_fail "fio verify failed under the soak"
  # rxe's retries after a lost ACK (all of our copies lost: see roce's
  # AckRepeat), the way a soak goes wrong on a lossy link.
  local hc=/sys/class/infiniband/rxe0/ports/1/hw_counters
  step "rxe: completer_retry_err $(cat $hc/completer_retry_err 2>/dev/null), out_of_seq_request $(cat $hc/out_of_seq_request 2>/dev/null), duplicate_request $(cat $hc/duplicate_request 2>/dev/null)"
  local closes
  closes=$(dmesg | grep -ciE "connection closed|reconnect|failed (send|recv|receive) status|DREQ|disconnected|queuecommand|abort|reset" || true)
  [ "$closes" = 0 ] || soak_fail "ib_srp saw $closes disconnects, aborts or failed work requests during the soak"
  step "no channel closed by either side during the soak"
  # Idle through several keepalives; the target counts them.
  sleep 9
  msg_send "$a" 7001 120 idled
  local checked
  checked=$(msg_recv 7002 300)
  [ "$checked" = checked ] || fail "target reported '$checked'"
  closes=$(dmesg | grep -ciE "connection closed|reconnect|failed (send|recv|receive) status|DREQ|disconnected" || true)
  [ "$closes" = 0 ] || fail "ib_srp saw $closes disconnects while idle"
  step "idle through srptd's keepalives, still logged in"
  for p in /sys/class/srp_remote_ports/port-*; do
    [ -e "$p/delete" ] && echo 1 >"$p/delete"
  done
  wait_until 60 "disk removal" sh -c '! ls /sys/block | grep -q "^sd"'
  msg_send "$a" 7001 120 done
}
