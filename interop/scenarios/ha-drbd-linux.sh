# shellcheck shell=bash
# ha-drbd-linux: Active/Passive failover of srptd on DRBD with Linux's
# initiator (issue 30, first must-show). The targets are _ha-drbd.sh's
# (a Primary, b Secondary, each srptd following its DRBD role). VM c runs
# ib_srp on rxe logged in to both, dm-multipath with `prio alua`
# (group_by_prio, hardware_handler "1 alua", no_path_retry queue):
# `multipath -ll` must show one path group of prio 50 active (a,
# active/optimized) and one of prio 1 enabled (b, standby). fio writes
# with crc32c verify headers through the map while the host kills a's
# qemu; b is promoted; the writes must complete again within
# FAILOVER_LIMIT seconds of the kill (sampled from the map's write
# counter), fio's own verify must pass, and a second read-only verify pass
# must find every block fio wrote (and was acknowledged) intact; then
# `multipath -ll` shows b's path in the active group.
#   interop/run scenario ha-drbd-linux

# shellcheck source=_ha-drbd.sh
. "$(dirname "${BASH_SOURCE[0]}")/_ha-drbd.sh"

# Two sdX of ours (the guest library's our_disks): the two paths.
two_paths() { [ "$(our_disks | wc -l)" -eq 2 ]; }

# The map's dm-N (multipath -ll's first line), once it has two paths.
map_dm() { multipath -ll 2>/dev/null | awk '/RUSTSCST/ { for (i = 1; i <= NF; i++) if ($i ~ /^dm-/) { print $i; exit } }'; }
map_has_two() { [ "$(multipath -ll 2>/dev/null | grep -c ' sd[a-z]* ')" -eq 2 ]; }
# groups_ok: a's path group prio 50 active, b's prio 1 enabled (the
# last `multipath -ll` kept in /tmp/mpll.txt, shown if it never gets
# there). dm-multipath makes a group active at the map's first I/O, so
# one block is read through the map first (it goes by the best group).
groups_ok() {
  local dm
  dm=$(map_dm)
  [ -n "$dm" ] && dd if="/dev/$dm" of=/dev/null bs=4096 count=1 iflag=direct 2>/dev/null
  multipath -ll >/tmp/mpll.txt 2>&1
  grep -q "prio=50 status=active" /tmp/mpll.txt && grep -q "prio=1 status=enabled" /tmp/mpll.txt
}

guest_initiator() {
  local m
  for m in scsi_dh_alua dm_mod dm_multipath dm_round_robin dm_service_time ib_srp sd_mod sg; do
    modprobe "$m"
  done
  # udev for multipath's device discovery and the map's node.
  /lib/systemd/systemd-udevd --daemon
  udevadm trigger
  timeout 60 udevadm settle || true
  cat >/etc/multipath.conf <<'EOF'
defaults {
  user_friendly_names no
  find_multipaths off
  polling_interval 1
}
devices {
  device {
    vendor "RUSTSCST"
    product ".*"
    path_grouping_policy group_by_prio
    prio alua
    hardware_handler "1 alua"
    path_checker tur
    failback immediate
    no_path_retry queue
  }
}
EOF
  multipathd || fail "multipathd did not start"

  ha_readies
  local a b add=/sys/class/infiniband_srp/srp-rxe0-1/add_target
  a=$(host_ip a) b=$(host_ip b)
  [ -e $add ] || fail "$add missing"
  retry 120 "SRP login to a" sh -c "echo id_ext=$GUID_a,ioc_guid=$GUID_a,dest=$a:$SRP_PORT >$add"
  retry 120 "SRP login to b" sh -c "echo id_ext=$GUID_b,ioc_guid=$GUID_b,dest=$b:$SRP_PORT >$add"
  wait_until 120 "two paths of ours" two_paths
  local p
  for p in /sys/class/srp_remote_ports/port-*; do
    echo 5 >"$p/fast_io_fail_tmo"
  done
  udevadm settle --timeout=60 || true
  multipathd reconfigure >/dev/null 2>&1 || true
  wait_until 120 "a multipath map with both paths" map_has_two
  local end=$((SECONDS + 60))
  until groups_ok; do
    [ $SECONDS -lt $end ] || {
      sed 's/^/  mpll: /' /tmp/mpll.txt
      for d in $(our_disks); do sg_rtpg -d "/dev/$d" 2>&1 | sed "s/^/  rtpg $d: /"; done
      fail "timeout after 60s waiting for path groups by ALUA prio (50 active, 1 enabled)"
    }
    sleep 1
  done
  multipath -ll | sed 's/^/  /'
  local dm
  dm=$(map_dm)
  [ -n "$dm" ] && [ -b "/dev/$dm" ] || fail "no device node for the map ($dm)"
  step "multipath -ll: a's path prio 50 active, b's prio 1 enabled (standby); map /dev/$dm"

  # fio with verify headers, paced so that it still writes when a dies.
  local job="--name=ha --filename=/dev/$dm --direct=1 --rw=randwrite --bs=4k --size=16m \
    --ioengine=libaio --iodepth=4 --verify=crc32c --verify_fatal=1 --rate_iops=150"
  # shellcheck disable=SC2086
  fio $job --do_verify=1 --output=/tmp/fio.out >/dev/null 2>&1 &
  local fio_pid=$!
  # The map's completed writes (field 5 of its stat), every 0.25 s.
  ( while :; do echo "$(date +%s.%N) $(awk '{ print $5 }' /sys/block/$dm/stat)"; sleep 0.25; done ) >/tmp/writes.log &
  local sampler=$!
  wait_until 120 "500 writes through the map" sh -c "[ \$(awk '{ print \$5 }' /sys/block/$dm/stat) -ge 500 ]"
  ha_kill_a
  local rc=0
  wait $fio_pid || rc=$?
  kill $sampler 2>/dev/null || true
  sed 's/^/  /' /tmp/fio.out | grep -E "err=|WRITE:|READ:|verify" || true
  [ $rc = 0 ] || { tail -20 /tmp/fio.out; fail "fio (writes and their verify) failed through the failover (status $rc)"; }
  # When the writes came back: the first sample after the kill with more
  # writes than the kill's last sample.
  local gap
  gap=$(awk -v k="$KILLED_AT" '$1 <= k { w = $2 } $1 > k && base == "" { base = w } $1 > k && $2 > base + 4 { printf "%.1f", $1 - k; exit }' /tmp/writes.log)
  [ -n "$gap" ] || fail "writes never resumed after the kill"
  step "writes resumed ${gap} s after a was killed (limit ${FAILOVER_LIMIT} s)"
  awk -v g="$gap" -v l="$FAILOVER_LIMIT" 'BEGIN { exit !(g <= l) }' ||
    fail "writes resumed ${gap} s after the kill, more than ${FAILOVER_LIMIT} s"
  # A second, read-only pass: every block fio wrote is there.
  # shellcheck disable=SC2086
  fio $job --verify_only --output=/tmp/verify.out >/dev/null 2>&1 ||
    { tail -20 /tmp/verify.out; fail "the final verify found a lost or wrong block"; }
  step "fio verify passed, and a read-only verify of all 16 MiB found every acknowledged write"
  multipath -ll | sed 's/^/  /'
  local bdev
  for bdev in $(our_disks); do
    case "$(sg_vpd -p di /dev/$bdev 2>/dev/null | awk -F: '/Relative target port: / { gsub(/ /, "", $2); print $2; exit }')" in
      0x2) multipath -ll | grep " $bdev " | grep -q "active ready" ||
             fail "b's path $bdev is not active ready after the failover" ;;
    esac
  done
  multipath -ll | grep -q "prio=50 status=active" || fail "no active prio-50 group after the failover"
  step "multipath -ll: b's path now active (prio 50)"
  msg_send "$b" 7001 120 done
}
