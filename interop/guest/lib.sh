# shellcheck shell=bash
# Helpers for guest-side scenario code (sourced in the VM).

# Our tools in the guest run on soft RoCE NICs of their own, as on the
# host side (interop/run): no NIC daemon is installed in the guests.
export NICD_MODE=own

# step MSG: progress line with seconds since the guest reached user space.
step() {
  local now
  now=$(cut -d' ' -f1 /proc/uptime)
  echo "[guest $INTEROP_VM ${now}s] $*"
}

# fail MSG: record the reason for the FAIL marker and stop the scenario.
fail() {
  echo "$*" >/tmp/fail-reason
  echo "[guest $INTEROP_VM] FAIL: $*" >&2
  exit 1
}

# host_ip NAME: address of a VM (or "host") from interop.hosts.
host_ip() {
  local kv
  for kv in ${INTEROP_HOSTS//,/ }; do
    [ "${kv%%=*}" = "$1" ] && { echo "${kv#*=}"; return 0; }
  done
  return 1
}

my_ip() { echo "${INTEROP_IP%/*}"; }

# The index of rxe0's IPv4-mapped (RoCE v2) GID, as show_gids would list it.
ipv4_gid_index() {
  local f n g
  for f in /sys/class/infiniband/rxe0/ports/1/gids/*; do
    n=${f##*/}
    g=$(cat "$f" 2>/dev/null) || continue
    case $g in
      0000:0000:0000:0000:0000:ffff:*)
        [ "$(cat "/sys/class/infiniband/rxe0/ports/1/gid_attrs/types/$n" 2>/dev/null)" = "RoCE v2" ] &&
          { echo "$n"; return 0; } ;;
    esac
  done
  return 1
}

# wait_until SECONDS DESC CMD...: poll CMD once a second until it succeeds.
wait_until() {
  local t=$1 desc=$2 end
  shift 2
  end=$(( SECONDS + t ))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || fail "timeout after ${t}s waiting for $desc"
    sleep 1
  done
}

# retry_note TEXT: one INTEROP-RETRY line for the host's verdict, on the
# console even when the caller's output goes to a file.
retry_note() {
  echo "INTEROP-RETRY vm=$INTEROP_VM $*" >/dev/console 2>/dev/null || echo "INTEROP-RETRY vm=$INTEROP_VM $*"
}

# retry SECONDS DESC CMD...: run CMD (showing its output) until it exits 0.
# For steps whose failure cannot hide a data error (a login, a connect);
# each failed attempt is an INTEROP-RETRY line, which the host's verdict
# counts. A step that moves data uses retry_if.
retry() {
  local t=$1 desc=$2 end n=0 rc
  shift 2
  end=$(( SECONDS + t ))
  while :; do
    n=$(( n + 1 ))
    rc=0
    "$@" || rc=$?
    [ $rc != 0 ] || { step "$desc: ok after $n attempt(s)"; return 0; }
    retry_note "$desc: exit status $rc"
    [ $SECONDS -lt $end ] || fail "$desc failed $n times in ${t}s"
    sleep 2
  done
}

# retry_if SECONDS DESC PATTERN CMD...: run CMD (showing its output) until
# it exits 0, retrying only a failure whose output matches the extended
# regex PATTERN: what a peer not listening yet gives ("Couldn't connect",
# a CM REJ), never a data check. Any other failure fails the scenario at
# once with CMD's last line. Each retried attempt is an INTEROP-RETRY line.
# RETRY_HOOK, as the host's retry_if_not_up's: a function asked first
# about each failed attempt (with its output file), which may make the
# next attempt possible and give the reason.
retry_if() {
  local t=$1 desc=$2 pattern=$3 end n=0 rc why
  shift 3
  end=$(( SECONDS + t ))
  while :; do
    n=$(( n + 1 ))
    rc=0
    "$@" >/tmp/retry-if.out 2>&1 || rc=$?
    cat /tmp/retry-if.out
    [ $rc != 0 ] || { step "$desc: ok after $n attempt(s)"; return 0; }
    why=
    [ -z "${RETRY_HOOK:-}" ] || why=$("$RETRY_HOOK" /tmp/retry-if.out) || why=
    [ -n "$why" ] || why=$(grep -E -m1 -- "$pattern" /tmp/retry-if.out || true)
    [ -n "$why" ] || fail "$desc failed (attempt $n, exit status $rc, not retried): $(grep -v '^[[:space:]]*$' /tmp/retry-if.out | tail -1)"
    retry_note "$desc: $why"
    [ $SECONDS -lt $end ] || fail "$desc failed $n times in ${t}s (last: $why)"
    sleep 2
  done
}

# The image's rping (librdmacm's example) has a teardown race, gone from
# later versions (whose CM thread leaves on an eventfd): its CM thread may
# still wait in rdma_get_cm_event when the main thread destroys the event
# channel after the DISCONNECT, and then exits the process with 255
# ("rdma_get_cm_event: Bad file descriptor"), server or client.
# rping_teardown_race OUT PREFIX: whether that is all that went wrong in
# rping's output OUT: all 10 pings done first (PREFIX "server " for a
# server's lines, "" for a client's, whose -V checked each), the
# DISCONNECT seen, no other line.
rping_teardown_race() {
  local out=$1 prefix=$2
  [ "$(grep -c "^${prefix}ping data: rdma-ping-" "$out")" -eq 10 ] &&
    grep -q 'DISCONNECT EVENT' "$out" &&
    grep -q '^rdma_get_cm_event: Bad file descriptor$' "$out" &&
    ! grep -v -e "^${prefix}ping data: " -e 'DISCONNECT EVENT' \
      -e '^wait for RDMA_READ_ADV state 10$' -e '^rdma_get_cm_event: Bad file descriptor$' "$out" | grep -q .
}

# rping_past_teardown CMD...: runs an rping client (CMD, showing its
# output); a failure that is only the teardown race above counts as a
# pass, and says so.
rping_past_teardown() {
  local rc=0 out=/tmp/rping-client.out
  "$@" >"$out" 2>&1 || rc=$?
  cat "$out"
  if [ $rc -ne 0 ] && rping_teardown_race "$out" ""; then
    echo "rping client: exit status $rc from its teardown race after 10 validated pings, passed"
    return 0
  fi
  return $rc
}

# our_disks [VENDOR]: every sdX whose SCSI vendor is VENDOR (default
# DISK_VENDOR, else RUSTSCST: srptd's), one a line.
our_disks() {
  local d vendor=${1:-${DISK_VENDOR:-RUSTSCST}}
  for d in /sys/block/sd*; do
    [ -e "$d/device/vendor" ] || continue
    grep -q "$vendor" "$d/device/vendor" && echo "${d##*/}"
  done
  return 0
}

# pattern_rw DEV: 4 MiB of random data written to DEV with O_DIRECT and
# read back identical.
pattern_rw() {
  head -c 4194304 /dev/urandom >/tmp/pattern
  dd if=/tmp/pattern of="$1" bs=64k oflag=direct conv=fsync 2>&1 | tail -1
  dd if="$1" of=/tmp/readback bs=64k count=64 iflag=direct 2>&1 | tail -1
  cmp /tmp/pattern /tmp/readback || fail "read-back data differs from the written pattern"
  step "dd: 4 MiB pattern written and read back identical"
}

# fio_verify NAME DEV: fio random read/write with crc32c verify on 8 MiB
# of DEV at 8 MiB, no error.
fio_verify() {
  fio --name="$1" --filename="$2" --direct=1 --rw=randrw --bs=4k --iodepth=8 \
    --ioengine=libaio --offset=8m --size=8m --verify=crc32c --do_verify=1 \
    --output-format=terse --minimal >/tmp/fio.out 2>&1 || { cat /tmp/fio.out; fail "fio verify failed"; }
  [ "$(cut -d';' -f5 /tmp/fio.out | head -1)" = 0 ] || { cat /tmp/fio.out; fail "fio errors"; }
  step "fio randrw crc32c verify ok"
}

# srp_remove_all: Linux ib_srp logs out of every target (each remote
# port's delete), then waits for the disks and the remote ports to go (a
# login before the port is gone fails with EIO).
srp_remove_all() {
  local p
  for p in /sys/class/srp_remote_ports/port-*; do
    [ -e "$p/delete" ] && echo 1 >"$p/delete"
  done
  wait_until 60 "disk removal" sh -c '! ls /sys/block | grep -q "^sd"'
  wait_until 60 "remote port removal" sh -c '! ls /sys/class/srp_remote_ports | grep -q port'
}

# msg_recv PORT SECONDS: accept one TCP connection, print the line it sends.
msg_recv() {
  python3 /interop/hear.py "$1" "$2" || fail "no message on port $1 within $2 s"
}

# msg_send HOST_IP PORT SECONDS TEXT: deliver one line, retrying until the
# peer listens.
msg_send() {
  python3 - "$@" <<'PY' || fail "could not send '$4' to $1:$2 within $3 s"
import socket, sys, time
host, port, t, text = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
end = time.monotonic() + t
while True:
    try:
        with socket.create_connection((host, port), timeout=5) as c:
            c.sendall(text.encode() + b"\n")
        break
    except OSError:
        if time.monotonic() > end:
            sys.exit(1)
        time.sleep(1)
PY
}

rxe_active() { grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state; }
gid1_set() {
  local g
  g=$(cat /sys/class/infiniband/rxe0/ports/1/gids/1 2>/dev/null) || return 1
  [ -n "$g" ] && [ "$g" != "0000:0000:0000:0000:0000:0000:0000:0000" ]
}

# Network and rxe; runs in a subshell from /init.
guest_setup() {
  set -e
  modprobe virtio_pci 2>/dev/null || true
  modprobe virtio_net 2>/dev/null || true
  modprobe configfs 2>/dev/null || true
  mountpoint -q /sys/kernel/config || mount -t configfs configfs /sys/kernel/config
  wait_until 30 "eth0" test -e /sys/class/net/eth0
  ip link set lo up
  ip addr add "$INTEROP_IP" dev eth0
  ip link set eth0 up
  # rxe computes the ICRC with the crypto API's crc32.
  modprobe crc32_generic
  modprobe rdma_rxe
  modprobe ib_uverbs
  modprobe rdma_ucm
  modprobe ib_umad
  rdma link add rxe0 type rxe netdev eth0
  wait_until 60 "rxe0 port ACTIVE" rxe_active
  wait_until 60 "rxe0 GID index 1" gid1_set
  step "rxe0 GID1 $(cat /sys/class/infiniband/rxe0/ports/1/gids/1)"
  touch /tmp/setup-ok
}
