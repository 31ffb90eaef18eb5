# shellcheck shell=bash
# Scenario runner: network namespace with a bridge and taps, qemu VMs under
# TCG, a dumpcap capture on the bridge, verdicts from console markers.
# Sourced by ../run.
#
# Teardown does not depend on variables of the (sub)shell that created
# things: every namespace this run creates is named rdma-interop-<pid>-<n>,
# and every process we start (qemu, dumpcap, host-side tools) lives in one of
# them, so killing `ip netns pids` and deleting the namespace removes it all,
# taps and bridge included.

NS_PREFIX=rdma-interop-$$-
NET=10.77.0
HOST_IP=$NET.1
VM_MEM=${INTEROP_VM_MEM:-1536}
BRIDGE=br0

scenario_list() {
  local f
  for f in "$INTEROP_DIR"/scenarios/*.sh; do
    f=${f##*/}
    case $f in _*) continue ;; esac
    echo "${f%.sh}"
  done
}

# Scaled timeout in seconds.
tmo() { echo $(( $1 * INTEROP_TIMEOUT_SCALE )); }

# --- namespace -----------------------------------------------------------

ns_kill_all() {
  local ns=$1 pids i
  for i in 1 2 3 4 5 6 7 8 9 10; do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -z "$pids" ] && return 0
    if [ "$i" -lt 8 ]; then
      # shellcheck disable=SC2086
      kill -TERM $pids 2>/dev/null || true
    else
      # shellcheck disable=SC2086
      kill -KILL $pids 2>/dev/null || true
    fi
    sleep 1
  done
}

harness_teardown() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    case $ns in "$NS_PREFIX"*) ;; *) continue ;; esac
    ns_kill_all "$ns"
    ip netns del "$ns" 2>/dev/null || log "warning: could not delete namespace $ns"
  done
  [ -n "${RUN_DIR:-}" ] && rm -f "$RUN_DIR/initrd.cpio"
  return 0
}

ns_create() {
  NS=$NS_PREFIX$1
  ip netns add "$NS"
  nsx ip link set lo up
  nsx ip link add "$BRIDGE" type bridge stp_state 0 forward_delay 0
  nsx ip addr add "$HOST_IP/24" dev "$BRIDGE"
  nsx ip link set "$BRIDGE" up
}

# Run a command inside the namespace (no timeout; use ns_run for bounded runs).
nsx() { ip netns exec "$NS" "$@"; }

# ns_run SECONDS CMD...: run a host-side command in the namespace, bounded.
ns_run() {
  local t=$1
  shift
  ip netns exec "$NS" timeout -k 5 "$(tmo "$t")" "$@"
}

# ns_tell IP PORT MSG: from the namespace, one line MSG to a guest's
# msg_recv at IP:PORT, trying for up to 50 s (the guest may not listen
# yet); a scenario's host side says it is done so the VM powers off.
ns_tell() {
  ns_run 60 python3 -c 'import socket,sys,time
for _ in range(50):
    try:
        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).sendall(sys.argv[3].encode() + b"\n"); break
    except OSError: time.sleep(1)' "$1" "$2" "$3"
}

# ns_hear PORT SECONDS: one line a guest sends (msg_send) to the
# namespace's PORT within SECONDS (not scaled), printed; nothing if none
# came.
ns_hear() {
  ns_run $(( $2 + 5 )) python3 "$INTEROP_DIR/guest/hear.py" "$1" "$2" --or-nothing || true
}

# ns_bg NAME SECONDS CMD...: start a host-side process in the namespace in
# the background, output to $RUN_DIR/host-NAME.log; its pid goes to
# HOST_PID_<NAME>. It is killed at teardown at the latest.
ns_bg() {
  local name=$1 t=$2
  shift 2
  ip netns exec "$NS" timeout -k 5 "$(tmo "$t")" "$@" >"$RUN_DIR/host-$name.log" 2>&1 &
  printf -v "HOST_PID_$name" '%s' $!
}

# ns_bg_ready NAME WORDS: wait (10 s at most) until the ns_bg process
# NAME has written WORDS to its log; without them, show the log and fail.
ns_bg_ready() {
  local log=$RUN_DIR/host-$1.log i
  for i in $(seq 1 100); do
    grep -q "$2" "$log" 2>/dev/null && return 0
    sleep 0.1
  done
  grep -q "$2" "$log" 2>/dev/null && return 0
  cat "$log"
  return 1
}

# ns_add_ip ADDR: give a host-side stack its own address on the bridge.
ns_add_ip() { nsx ip addr add "$1/24" dev "$BRIDGE"; }

# host_fail MSG: the reason the verdict gives for a failed host side (the
# first one given); also printed to host.log.
host_fail() {
  echo "$*"
  [ -s "$RUN_DIR/host-reason" ] || echo "$*" >"$RUN_DIR/host-reason"
}

# retry_if_not_up SECONDS DESC PATTERN OUT CMD...: run CMD (a host-side
# client, e.g. `ns_run 120 srp io ...`; its output to OUT, then shown)
# until it succeeds, while the peer in the VM is not up yet. A failed
# attempt is retried only if its output matches the extended regex PATTERN
# (what a peer still booting or not yet listening gives: a connect that
# timed out, was refused or rejected, before any data moved), for SECONDS
# (scaled) while a VM runs. Any other failure (a data verification, an
# I/O error, a timeout of the command itself) ends it at once: the
# scenario fails with CMD's last line as the reason. Every retried
# attempt's reason goes to retries.txt, which the verdict counts.
# RETRY_HOOK, when set, names a function asked first about each failed
# attempt (with OUT): when it prints a reason and returns 0, it has made
# the next attempt possible (e.g. a peer restarted) and the attempt is
# retried for that reason.
retry_if_not_up() {
  local t=$1 desc=$2 pattern=$3 out=$4 end n=0 rc why
  shift 4
  end=$(( $(date +%s) + $(tmo "$t") ))
  while :; do
    n=$(( n + 1 ))
    rc=0
    "$@" >"$out" 2>&1 || rc=$?
    cat "$out"
    [ "$rc" != 0 ] || return 0
    why=
    [ -z "${RETRY_HOOK:-}" ] || why=$("$RETRY_HOOK" "$out") || why=
    [ -n "$why" ] || why=$(grep -E -m1 -- "$pattern" "$out" || true)
    if [ -z "$why" ]; then
      why=$(grep -v '^[[:space:]]*$' "$out" | tail -1)
      host_fail "$desc failed (attempt $n, exit status $rc; not a peer-not-up failure, so not retried): ${why:-no output}"
      return 1
    fi
    host_retry_note "$desc: $why"
    vms_alive || { host_fail "$desc: the VMs stopped while it waited for the peer (attempt $n: $why)"; return 1; }
    [ "$(date +%s)" -lt "$end" ] ||
      { host_fail "$desc: the peer was not up after $(tmo "$t") s ($n attempts, last: $why)"; return 1; }
    sleep 3
  done
}

# host_retry_note "DESC: REASON": a host-side step done again, for the
# verdict (as a guest's retry_note).
host_retry_note() { printf '%s\t%s\n' "${1%%: *}" "${1#*: }" >>"$RUN_DIR/retries.txt"; }

# What was retried while peers came up (host side: retries.txt; guests:
# INTEROP-RETRY lines), as "DESC N times (REASON xK; ...)" per step.
retries_summary() {
  local con
  {
    [ -f "$RUN_DIR/retries.txt" ] && cat "$RUN_DIR/retries.txt"
    for con in "$RUN_DIR"/console-*.log; do
      [ -f "$con" ] || continue
      grep -a '^INTEROP-RETRY ' "$con" | tr -d '\r' |
        sed -E 's/^INTEROP-RETRY (vm=[^ ]+) ([^:]*): /\1 \2\t/'
    done
  } | awk -F'\t' '{
      if (!($1 in n)) order[k++] = $1
      n[$1]++; r = $1 SUBSEP $2
      if (!(r in c)) rorder[$1, m[$1]++] = $2
      c[r]++
    } END {
      for (i = 0; i < k; i++) {
        d = order[i]; s = ""
        for (j = 0; j < m[d]; j++) { x = rorder[d, j]; s = s (j ? "; " : "") x (c[d SUBSEP x] > 1 ? " x" c[d SUBSEP x] : "") }
        printf "%s%s retried %d times (%s)", (i ? "; " : ""), d, n[d], s
      }
    }'
}

# --- capture -------------------------------------------------------------

capture_start() {
  CAP=$RUN_DIR/cap.pcapng
  # A scenario that moves GBs for a measurement may capture less
  # (SCENARIO_CAPTURE_FILTER, a BPF filter); its wire checks live elsewhere.
  local -a filt=()
  [ -z "${SCENARIO_CAPTURE_FILTER:-}" ] || filt=(-f "$SCENARIO_CAPTURE_FILTER")
  # Not through nsx: a backgrounded function runs in a subshell, so $! would
  # be that shell; SIGTERM then ended the shell while dumpcap kept writing,
  # and capture_check read a capture cut short. ip netns exec execs dumpcap.
  ip netns exec "$NS" dumpcap -q -i "$BRIDGE" "${filt[@]}" -w "$CAP" >"$RUN_DIR/dumpcap.log" 2>&1 &
  CAP_PID=$!
  local i
  for i in $(seq 1 $(( $(tmo 30) * 5 ))); do
    [ -s "$CAP" ] && return 0
    kill -0 "$CAP_PID" 2>/dev/null || break
    sleep 0.2
  done
  cat "$RUN_DIR/dumpcap.log" >&2
  die "dumpcap did not start"
}

capture_stop() {
  [ -n "${CAP_PID:-}" ] || return 0
  # SIGTERM: background jobs of a script ignore SIGINT.
  kill -TERM "$CAP_PID" 2>/dev/null || true
  local i
  for i in $(seq 1 100); do
    kill -0 "$CAP_PID" 2>/dev/null || break
    sleep 0.2
  done
  kill -KILL "$CAP_PID" 2>/dev/null || true
  wait "$CAP_PID" 2>/dev/null || true
  CAP_PID=
}

# Checks the capture decodes cleanly; sets CAP_PROBLEM on failure and writes
# $RUN_DIR/capture-summary.txt. One tshark pass does it all (an SRP capture
# can be a GB, and each pass costs a minute): per-frame fields, then the
# protocol hierarchy and, with io,stat, one frame count per filter
# (malformed, then each SCENARIO_EXPECT_PROTOCOLS filter).
capture_check() {
  local out=$RUN_DIR/capture-summary.txt pass=$RUN_DIR/tshark-pass.txt
  # A scenario may pass tshark options, e.g. to turn off a heuristic
  # dissector that mistakes its payloads for another protocol. SMC-R's is
  # off for all: no scenario carries SMC-R, and it takes a RoCE payload of
  # random data (fio's, an RDMA READ response from rxe) whose first byte
  # happens to name an LLC message for one, then reports it malformed
  # (linux-srp-initiator-ours, 2 frames in 729225 once).
  local -a ta=(--disable-heuristic smcr_infiniband)
  [ -z "${SCENARIO_TSHARK_ARGS:-}" ] || read -ra ta <<<"$SCENARIO_TSHARK_ARGS"
  CAP_PROBLEM=
  local -a filters=(_ws.malformed)
  local p f zstat=io,stat,0
  for p in ${SCENARIO_EXPECT_PROTOCOLS:-}; do filters+=("$p"); done
  for f in "${filters[@]}"; do zstat+=",$f"; done
  timeout 900 tshark "${ta[@]}" -r "$CAP" -T fields -e frame.number -e _ws.expert.severity \
    -e _ws.expert.message -e infiniband -e _ws.col.Info -z io,phs -z "$zstat" >"$pass" 2>/dev/null
  local n experr row malformed
  n=$(grep -cP '^[0-9]+\t' "$pass" || true)
  # 0x00800000 (8388608) is PI_ERROR in epan/proto.h; a frame may carry a
  # comma-separated list of severities.
  experr=$(awk -F'\t' '/^[0-9]+\t/ { k = split($2, s, ","); for (i = 1; i <= k; i++) if (s[i] + 0 >= 8388608) { print $1 "\t" $3; break } }' "$pass")
  # The io,stat row: the frame count of filter k is field 3 + 2(k-1) of '|'.
  row=$(grep -E '^\| *[0-9.]+ <> ' "$pass" | tail -1)
  frames_of() { printf '%s\n' "$row" | awk -F'|' -v k="$1" '{ c = $(3 + 2 * (k - 1)); gsub(/ /, "", c); print (c == "" ? -1 : c + 0) }'; }
  malformed=$(frames_of 1)
  {
    echo "frames: $n"
    echo "malformed: $malformed"
    echo "expert errors: $(printf '%s' "$experr" | grep -c . || true)"
    printf '%s\n' "$experr" | head -20
    echo "--- RoCEv2 packets by transport + opcode ---"
    awk -F'\t' '/^[0-9]+\t/ && $4 != "" { print $5 }' "$pass" |
      sed -E 's/ *QP=.*//; s/, *$//' | sort | uniq -c | sort -rn | head -30
    echo "--- protocol hierarchy ---"
    sed -n '/^Protocol Hierarchy Statistics/,/^====/p' "$pass" | sed -n '/^ *eth/,/^====/p'
  } >"$out"
  [ "$n" -gt 0 ] || CAP_PROBLEM="capture is empty"
  [ -n "$row" ] || CAP_PROBLEM="${CAP_PROBLEM:+$CAP_PROBLEM; }tshark gave no statistics"
  [ "$malformed" -eq 0 ] || CAP_PROBLEM="${CAP_PROBLEM:+$CAP_PROBLEM; }$malformed malformed frames"
  [ -z "$experr" ] || CAP_PROBLEM="${CAP_PROBLEM:+$CAP_PROBLEM; }expert errors in capture"
  # A scenario may require protocols (e.g. infiniband) to appear.
  local k=2
  for p in ${SCENARIO_EXPECT_PROTOCOLS:-}; do
    [ "$(frames_of $k)" -gt 0 ] || CAP_PROBLEM="${CAP_PROBLEM:+$CAP_PROBLEM; }no '$p' frames captured"
    k=$((k + 1))
  done
  rm -f "$pass"
}

# --- VMs -----------------------------------------------------------------

# vm_start NAME LAST_OCTET ROLE: boot one VM on the bridge.
vm_start() {
  local name=$1 octet=$2 role=$3 tap mac
  tap=tap-$name
  mac=$(printf '52:54:00:77:00:%02x' "$octet")
  nsx ip tuntap add dev "$tap" mode tap
  nsx ip link set "$tap" master "$BRIDGE" up
  local append="console=ttyS0 quiet loglevel=4 panic=-1 rdinit=/init ${INTEROP_KERNEL_ARGS:-}"
  append+=" interop.scenario=$SCENARIO interop.vm=$name interop.role=$role"
  append+=" interop.ip=$NET.$octet/24 interop.hosts=$HOSTS_ARG"
  append+=" interop.timeout=$(tmo "$SCENARIO_GUEST_TIMEOUT")"
  # INTEROP_QEMU_MONITOR=1: an HMP monitor socket per VM in the results
  # folder (for `info virtio-queue-status` and the like while debugging).
  local monitor=none
  [ "${INTEROP_QEMU_MONITOR:-0}" = 1 ] && monitor="unix:$RUN_DIR/monitor-$name.sock,server,nowait"
  # The guest NIC. With virtio's event-index notifications (qemu's
  # default) a guest's TX queue under TCG now and then stopped for good:
  # the guest had added 233 packets past the index qemu asked to be told
  # about and never notified it again (qemu 7.2 `info virtio-queue-status`
  # plus the rings read with `xp`), so Linux's rxe went silent mid-transfer
  # in about one run in five. Without event indexes the guest notifies
  # whenever qemu has not suppressed it, so a lost notification costs one
  # packet's delay, not the VM's network. INTEROP_NIC / INTEROP_NIC_OPTS
  # override (INTEROP_NIC_OPTS= for qemu's defaults).
  local nic_opts=${INTEROP_NIC_OPTS-event_idx=off}
  # The host-side bound covers boot, the guest's own bound and poweroff.
  ip netns exec "$NS" timeout -k 10 "$(tmo $(( SCENARIO_GUEST_TIMEOUT + 300 )))" \
    qemu-system-x86_64 -accel tcg -m "$VM_MEM" -smp 1 \
    -nodefaults -no-user-config -display none -no-reboot \
    -monitor "$monitor" \
    -serial "file:$RUN_DIR/console-$name.log" \
    -kernel "$IMAGE_DIR/vmlinuz" -initrd "$RUN_DIR/initrd.cpio" -append "$append" \
    -netdev "tap,id=n0,ifname=$tap,script=no,downscript=no" \
    -device "${INTEROP_NIC:-virtio-net-pci}${nic_opts:+,$nic_opts},netdev=n0,mac=$mac" \
    >"$RUN_DIR/qemu-$name.log" 2>&1 &
  VM_PIDS[$name]=$!
  log "  vm $name ($role) $NET.$octet started"
}

# vm_kill NAME: ends VM NAME's qemu at once with SIGKILL, as a power cut
# would (no guest shutdown, no flush): the high-availability scenarios'
# failed target host. qemu is the child of the `timeout` whose pid
# VM_PIDS holds. A killed VM needs no PASS marker in the verdict (a FAIL
# it printed before still counts).
vm_kill() {
  local name=$1 qemu
  qemu=$(pgrep -P "${VM_PIDS[$name]}" -x qemu-system-x86 || pgrep -P "${VM_PIDS[$name]}")
  [ -n "$qemu" ] || { echo "vm_kill $name: no qemu under pid ${VM_PIDS[$name]}"; return 1; }
  kill -KILL "$qemu"
  VM_KILLED[$name]=1
  log "  vm $name killed (qemu pid $qemu, SIGKILL) after $(( $(date +%s) - T_START )) s"
}

# True while at least one VM of the scenario still runs (for host-side loops).
vms_alive() {
  local name
  for name in "${!VM_PIDS[@]}"; do
    kill -0 "${VM_PIDS[$name]}" 2>/dev/null && return 0
  done
  return 1
}

# vm_wait_all [GRACE]: wait until every VM has exited (guests power off
# after their marker). With GRACE seconds (the host side already failed),
# VMs still running after that are stopped: a guest waiting for a message
# the failed host side never sends must not hold the run for its whole
# timeout.
vm_wait_all() {
  local grace=${1:-} name rc end
  if [ -n "$grace" ]; then
    end=$(( $(date +%s) + grace ))
    while vms_alive && [ "$(date +%s)" -lt "$end" ]; do sleep 1; done
    for name in "${!VM_PIDS[@]}"; do
      if kill -0 "${VM_PIDS[$name]}" 2>/dev/null; then
        log "  vm $name still runs ${grace} s after the host side failed: stopping it"
        kill -TERM "${VM_PIDS[$name]}" 2>/dev/null || true
      fi
    done
  fi
  for name in "${!VM_PIDS[@]}"; do
    rc=0
    wait "${VM_PIDS[$name]}" || rc=$?
    VM_RC[$name]=$rc
    log "  vm $name exited (qemu status $rc) after $(( $(date +%s) - T_START )) s"
  done
}

# --- guest overlay -------------------------------------------------------

# The cached rootfs plus a second cpio archive with the harness' guest files
# (the kernel unpacks concatenated archives in order), so editing a scenario
# never rebuilds the image.
make_initrd() {
  local ov=$RUN_DIR/overlay
  rm -rf "$ov"
  mkdir -p "$ov/interop/scenarios"
  install -m 0755 "$INTEROP_DIR/guest/init" "$ov/init"
  install -m 0644 "$INTEROP_DIR/guest/lib.sh" "$ov/interop/lib.sh"
  install -m 0644 "$INTEROP_DIR/guest/hear.py" "$ov/interop/hear.py"
  install -m 0644 "$INTEROP_DIR"/scenarios/*.sh "$ov/interop/scenarios/"
  # Host binaries a scenario runs inside a guest (same Debian release, so
  # the same libc), without their debug info.
  # An entry PATH=NAME goes in as NAME (the OCF agent and srptd share
  # a basename).
  local e b n
  for e in ${SCENARIO_GUEST_BINS:-}; do
    b=${e%%=*} n=$(basename "${e#*=}")
    mkdir -p "$ov/interop/bin"
    # Scripts (a relay in python) go as they are.
    if [ "$(head -c 4 "$b" 2>/dev/null)" = $'\x7fELF' ]; then
      objcopy --strip-debug "$b" "$ov/interop/bin/$n"
    else
      cp "$b" "$ov/interop/bin/$n"
    fi || die "cannot copy $b into the guest"
    chmod 0755 "$ov/interop/bin/$n"
  done
  (cd "$ov" && find . -print0 | cpio --null -o -H newc --quiet -R 0:0) >"$RUN_DIR/overlay.cpio"
  cat "$IMAGE_DIR/rootfs.cpio" "$RUN_DIR/overlay.cpio" >"$RUN_DIR/initrd.cpio"
  rm -rf "$ov"
}

# --- one scenario --------------------------------------------------------

# Runs in a subshell; prints the verdict line; exit status 0 on pass.
scenario_run() {
  local name=$1 f=$INTEROP_DIR/scenarios/$1.sh
  [ -f "$f" ] || die "no scenario $name ($f)"
  SCENARIO=$name
  SCENARIO_VMS=()
  SCENARIO_GUEST_TIMEOUT=600
  SCENARIO_EXPECT_PROTOCOLS=
  SCENARIO_TSHARK_ARGS=
  SCENARIO_GUEST_BINS=
  SCENARIO_CAPTURE_FILTER=
  # shellcheck disable=SC1090
  . "$f"
  RUN_DIR=$INTEROP_RESULTS/$name-$(date -u +%Y%m%dT%H%M%SZ)
  mkdir -p "$RUN_DIR"
  declare -gA VM_PIDS=() VM_RC=() VM_KILLED=()
  T_START=$(date +%s)
  log "scenario $name: results in $RUN_DIR"

  local v vname voct vrole
  HOSTS_ARG=host=$HOST_IP
  for v in "${SCENARIO_VMS[@]}"; do
    read -r vname voct vrole <<<"$v"
    HOSTS_ARG+=",$vname=$NET.$voct"
  done

  make_initrd
  ns_create "$SCENARIO_SEQ"
  capture_start
  for v in "${SCENARIO_VMS[@]}"; do
    read -r vname voct vrole <<<"$v"
    vm_start "$vname" "$voct" "$vrole"
  done

  local host_rc=0 reason= NOTES=
  if declare -F host_main >/dev/null; then
    host_main >"$RUN_DIR/host.log" 2>&1 || host_rc=$?
    if [ "$host_rc" -ne 0 ]; then
      # The first reason host_fail gave, else the last line host_main printed.
      local why
      why=$(head -1 "$RUN_DIR/host-reason" 2>/dev/null || true)
      [ -n "$why" ] || why=$(grep -v '^[[:space:]]*$' "$RUN_DIR/host.log" | tail -1)
      reason="host side failed (status $host_rc): ${why:-no output} (see host.log)"
    fi
  fi
  if [ "$host_rc" -eq 0 ]; then vm_wait_all; else vm_wait_all "$(tmo 60)"; fi
  capture_stop
  T_VMS=$(( $(date +%s) - T_START ))

  # Verdict: every VM must print its PASS marker.
  for v in "${SCENARIO_VMS[@]}"; do
    read -r vname voct vrole <<<"$v"
    local con=$RUN_DIR/console-$vname.log line
    line=$(grep -a -m1 -E "^INTEROP-(PASS|FAIL) $name " "$con" 2>/dev/null | tr -d '\r' || true)
    case $line in
      "INTEROP-PASS $name "*) ;;
      "INTEROP-FAIL $name "*) reason="${reason:+$reason; }vm $vname: ${line#*: }" ;;
      *)
        if [ -n "${VM_KILLED[$vname]:-}" ]; then
          log "  vm $vname: killed by the scenario (no marker needed)"
        else
          reason="${reason:+$reason; }vm $vname: no marker (qemu status ${VM_RC[$vname]:-?}; timeout or crash)"
        fi ;;
    esac
    # Timings, and measurements (THROUGHPUT lines) kept in the run's log.
    grep -a -E '^\[guest [^]]*\] (timing|THROUGHPUT)' "$con" 2>/dev/null | tr -d '\r' | sed "s/^/  /" >&2 || true
    # What the guest noticed about its own NIC (see guest/init).
    line=$(grep -a -m1 '^INTEROP-NOTE ' "$con" 2>/dev/null | tr -d '\r' || true)
    [ -z "$line" ] || { NOTES="${NOTES:+$NOTES; }${line#INTEROP-NOTE }"; echo "  $line" >&2; }
  done
  capture_check
  [ -z "$CAP_PROBLEM" ] || reason="${reason:+$reason; }capture: $CAP_PROBLEM"
  if declare -F host_check >/dev/null && [ -z "$reason" ]; then
    host_check >>"$RUN_DIR/host.log" 2>&1 || reason="host_check failed (see host.log)"
  fi

  sed 's/^/  /' "$RUN_DIR/capture-summary.txt" | head -45 >&2
  log "scenario $name took $(( $(date +%s) - T_START )) s (VMs $T_VMS s)"
  # Every attempt retried while a peer came up, with its reason, pass or fail.
  local retried
  retried=$(retries_summary)
  if [ -z "$reason" ]; then
    echo "INTEROP-PASS $name${retried:+ [$retried]}"
    if [ "${INTEROP_KEEP:-0}" = 1 ]; then
      rm -f "$RUN_DIR/initrd.cpio" "$RUN_DIR/overlay.cpio"
      log "kept: $RUN_DIR"
    else
      rm -rf "$RUN_DIR"
    fi
    return 0
  fi
  rm -f "$RUN_DIR/initrd.cpio" "$RUN_DIR/overlay.cpio"
  echo "INTEROP-FAIL $name: $reason${retried:+ [$retried]}${NOTES:+ [guest notes: $NOTES]}"
  log "logs and capture kept in $RUN_DIR"
  # CI keeps only the tail of its log, and the summary is printed last: a
  # failure's reason and the end of each guest's console go there too, so
  # a failure in CI can be read without its kept logs.
  if [ -n "${CI_SUMMARY:-}" ]; then
    {
      echo "INTEROP-FAIL $name: $reason"
      for v in "${SCENARIO_VMS[@]}"; do
        read -r vname voct vrole <<<"$v"
        echo "  --- last lines of vm $vname's console"
        tr -d '\r' <"$RUN_DIR/console-$vname.log" 2>/dev/null | grep -a -v '^[[:space:]]*$' |
          tail -n "${CI_SUMMARY_LINES:-40}" | cut -c1-300 | sed 's/^/  /'
      done
      [ "$host_rc" -eq 0 ] || { echo "  --- last lines of host.log"; tail -n 15 "$RUN_DIR/host.log" | sed 's/^/  /'; }
    } >>"$CI_SUMMARY" 2>/dev/null || true
  fi
  return 1
}

run_scenarios() {
  local name rc pass=0 fail=0 failed=() seq=0
  for name in "$@"; do
    seq=$(( seq + 1 ))
    rc=0
    (
      SCENARIO_SEQ=$seq
      trap harness_teardown EXIT
      scenario_run "$name"
    ) || rc=$?
    if [ "$rc" -eq 0 ]; then pass=$(( pass + 1 )); else fail=$(( fail + 1 )); failed+=("$name"); fi
  done
  echo "interop: $pass passed, $fail failed${failed:+ (${failed[*]})}"
  # .ci/run repeats it at the end of CI's log.
  [ -z "${CI_SUMMARY:-}" ] || echo "interop: $pass passed, $fail failed${failed:+ (${failed[*]})}" >>"$CI_SUMMARY"
  [ "$fail" -eq 0 ]
}
