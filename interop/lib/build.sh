# shellcheck shell=bash
# Image build: a Debian bookworm minbase rootfs packed as an uncompressed
# initramfs plus the stock linux-image-amd64 kernel and just the modules the
# scenarios need. Cached under $INTEROP_CACHE/<key>; the key hashes the
# package list, the candidate versions apt sees and this file.
# Sourced by ../run (which provides log/die and the INTEROP_* variables).

# What goes into the guest. Keep in sync with the README.
GUEST_PACKAGES=(
  kmod iproute2 procps busybox python3 dbus
  rdma-core ibverbs-utils rdmacm-utils perftest
  targetcli-fb fio sg3-utils tgt open-iscsi mt-st
  drbd-utils multipath-tools
)
KERNEL_META=linux-image-amd64
SUITE=bookworm
MIRROR=${INTEROP_MIRROR:-http://deb.debian.org/debian}

# Modules the guest may load; their dependency closure is copied in.
GUEST_MODULES=(
  virtio_pci virtio_net virtio_blk virtio_console
  rdma_rxe ib_core ib_uverbs rdma_cm rdma_ucm ib_umad ib_cm iw_cm
  ib_srp scsi_transport_srp ib_srpt
  target_core_mod target_core_file target_core_iblock tcm_loop
  sd_mod sg sr_mod st iscsi_tcp loop configfs crc32c_generic libcrc32c ext4 fuse scsi_debug
  crc32_generic crc32_pclmul crc32c_intel
  drbd dm_mod dm_multipath dm_round_robin dm_service_time dm_queue_length scsi_dh_alua
  siw
)

HOST_TOOLS=(qemu-system-x86_64:qemu-system-x86 debootstrap:debootstrap
  gcc-12:gcc-12 make:make xz:xz-utils
  tshark:tshark dumpcap:tshark ip:iproute2 cpio:cpio dpkg-deb:dpkg
  timeout:coreutils depmod:kmod modprobe:kmod ping:iputils-ping)

ensure_host_tools() {
  local need=() t cmd pkg
  for t in "${HOST_TOOLS[@]}"; do
    cmd=${t%%:*} pkg=${t#*:}
    command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
  done
  [ ${#need[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null 2>&1 || die "missing host tools (${need[*]}) and no apt-get"
  [ "$(id -u)" = 0 ] || die "missing host tools (${need[*]}); run as root to install them"
  log "installing host tools: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  timeout 900 apt-get update -q >/dev/null || die "apt-get update failed"
  # A qemu-img newer than the distribution's (a backport, as some machines
  # come with) is removed by apt to make room for the distribution's
  # qemu-system-x86: the tests that make disk images need it back.
  local had_qemu_img=
  command -v qemu-img >/dev/null 2>&1 && had_qemu_img=1
  timeout 1800 apt-get install -y -q --no-install-recommends \
    $(printf '%s\n' "${need[@]}" | sort -u) >/dev/null || die "apt-get install failed"
  if [ -n "$had_qemu_img" ] && ! command -v qemu-img >/dev/null 2>&1; then
    log "apt removed qemu-utils for qemu-system-x86; installing the matching qemu-utils"
    timeout 900 apt-get install -y -q --no-install-recommends qemu-utils >/dev/null ||
      die "apt-get install qemu-utils failed (qemu-img is gone: apt-get install qemu-utils)"
  fi
}

# Prints "package version" lines for everything the image is built from.
package_versions() {
  local p v kpkg
  # awk reads to the end (no `exit`): apt-cache still writing into a
  # closed pipe dies of SIGPIPE (exit 100 when it is ignored), which
  # pipefail turns into a failed build.
  kpkg=$(apt-cache depends "$KERNEL_META" 2>/dev/null |
    awk '/Depends: linux-image-/ && !k {k = $2} END {print k}')
  [ -n "$kpkg" ] || return 1
  for p in "$KERNEL_META" "$kpkg" "${GUEST_PACKAGES[@]}"; do
    v=$(apt-cache show --no-all-versions "$p" 2>/dev/null | awk '/^Version:/ && !v {v = $2} END {print v}')
    [ -n "$v" ] || return 1
    echo "$p $v"
  done
}

image_key() {
  local versions
  if ! versions=$(package_versions); then
    log "apt lists lack the packages; running apt-get update"
    timeout 900 apt-get update -q >/dev/null || die "apt-get update failed"
    versions=$(package_versions) || die "cannot resolve package versions with apt-cache"
  fi
  {
    echo "suite $SUITE"
    echo "$versions"
    printf 'module %s\n' "${GUEST_MODULES[@]}"
    sha256sum <"$INTEROP_DIR/lib/build.sh" | cut -c1-16
  } | sha256sum | cut -c1-16
}

# Sets IMAGE_DIR to the cached image, building it if absent.
image_ensure() {
  ensure_host_tools
  local key
  key=$(image_key)
  IMAGE_DIR=$INTEROP_CACHE/$key
  if [ -f "$IMAGE_DIR/complete" ]; then
    log "image cached: $IMAGE_DIR"
    return 0
  fi
  image_build "$key"
}

# build_siw TMP KPKG KVER: Linux's soft iWARP driver, which Debian's
# kernel config leaves out (CONFIG_RDMA_SIW is not set), built as an
# out-of-tree module for exactly the guest's kernel: its sources from
# linux-source-6.1 of the kernel package's version (only
# drivers/infiniband/sw/siw is unpacked), compiled against that
# version's linux-headers (Module.symvers, so modversions match) with
# the compiler Debian built the kernel with (gcc-12). The module lands in
# TMP/kx/lib/modules/KVER/extra, where the module closure finds it, and a
# copy stays beside the image (siw.ko). Unsigned: the kernel loads it
# tainted, as it does any out-of-tree module.
build_siw() {
  local tmp=$1 kpkg=$2 kver=$3 ver flavour src hdr
  ver=$(awk -v k="$kpkg" '$1 == k {print $2}' "$tmp/host-apt-versions.txt")
  flavour=${kver#*-*-}          # 6.1.0-57-amd64 -> amd64
  mkdir -p "$tmp/siwdeb" "$tmp/siwx"
  src=linux-source-$(echo "$kver" | cut -d. -f1-2)
  (cd "$tmp/siwdeb" && timeout 900 apt-get download -q "$src=$ver" \
      "linux-headers-$kver=$ver" "linux-headers-${kver%-"$flavour"}-common=$ver" \
      "linux-kbuild-$(echo "$kver" | cut -d. -f1-2)=$ver" >"$tmp/siw-download.log" 2>&1) ||
    die "apt-get download of $src and the headers of $kver ($ver) failed (log: $tmp/siw-download.log)"
  local d
  for d in "$tmp"/siwdeb/linux-headers-*.deb "$tmp"/siwdeb/linux-kbuild-*.deb; do
    dpkg-deb -x "$d" "$tmp/siwx"
  done
  hdr=$tmp/siwx/usr/src/linux-headers-$kver
  [ -f "$hdr/Module.symvers" ] || die "no Module.symvers in linux-headers-$kver"
  # The flavour's Makefile includes the common headers by absolute path.
  sed -i "s|^include /usr/src/|include $tmp/siwx/usr/src/|" "$hdr/Makefile"
  dpkg-deb --fsys-tarfile "$tmp"/siwdeb/"$src"_*.deb |
    tar -xO "./usr/src/$src.tar.xz" | xz -dc |
    tar -x -C "$tmp/siwx" --wildcards "$src/drivers/infiniband/sw/siw/*" ||
    die "cannot unpack drivers/infiniband/sw/siw from $src"
  timeout 900 make -C "$hdr" M="$tmp/siwx/$src/drivers/infiniband/sw/siw" CONFIG_RDMA_SIW=m \
      modules >"$tmp/siw-build.log" 2>&1 ||
    { tail -20 "$tmp/siw-build.log" >&2; die "siw.ko did not build (log: $tmp/siw-build.log)"; }
  mkdir -p "$tmp/kx/lib/modules/$kver/extra"
  cp "$tmp/siwx/$src/drivers/infiniband/sw/siw/siw.ko" "$tmp/kx/lib/modules/$kver/extra/siw.ko"
  cp "$tmp/siwx/$src/drivers/infiniband/sw/siw/siw.ko" "$tmp/siw.ko"
  rm -rf "$tmp/siwdeb" "$tmp/siwx"
  log "siw.ko built for $kver from $src $ver"
}

image_build() {
  local key=$1 tmp root kpkg kver t0 mods
  t0=$(date +%s)
  tmp=$INTEROP_CACHE/$key.tmp.$$
  mkdir -p "$INTEROP_CACHE"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  BUILD_TMP=$tmp   # removed by the EXIT trap if we fail
  root=$tmp/root
  log "building image $key in $tmp (debootstrap takes minutes)"
  package_versions >"$tmp/host-apt-versions.txt"
  kpkg=$(awk -v m="$KERNEL_META" '$1 != m && /^linux-image-/ {print $1; exit}' "$tmp/host-apt-versions.txt")

  local inc
  inc=$(IFS=,; echo "${GUEST_PACKAGES[*]}")
  timeout 3600 debootstrap --variant=minbase --include="$inc" "$SUITE" "$root" "$MIRROR" \
    >"$tmp/debootstrap.log" 2>&1 || {
      tail -20 "$tmp/debootstrap.log" >&2
      die "debootstrap failed (log: $tmp/debootstrap.log)"
    }
  log "debootstrap done after $(( $(date +%s) - t0 )) s"

  # Kernel: the stock amd64 flavour, extracted from its .deb on the host.
  mkdir -p "$tmp/kdeb" "$tmp/kx"
  (cd "$tmp/kdeb" && timeout 900 apt-get download -q "$kpkg" >/dev/null 2>&1) ||
    die "apt-get download $kpkg failed"
  dpkg-deb -x "$tmp"/kdeb/*.deb "$tmp/kx"
  kver=$(ls "$tmp/kx/lib/modules" | head -1)
  [ -n "$kver" ] || die "no modules in $kpkg"
  cp "$tmp/kx/boot/vmlinuz-$kver" "$tmp/vmlinuz"
  build_siw "$tmp" "$kpkg" "$kver"
  depmod -b "$tmp/kx" "$kver"
  mods=$(for m in "${GUEST_MODULES[@]}"; do
      modprobe -d "$tmp/kx" -S "$kver" --show-depends "$m" 2>/dev/null || true
    done | awk '$1 == "insmod" {print $2}' | sort -u)
  [ -n "$mods" ] || die "module closure is empty"
  local m rel
  for m in $mods; do
    rel=${m#"$tmp"/kx/}
    mkdir -p "$root/$(dirname "$rel")"
    cp "$m" "$root/$rel"
  done
  cp "$tmp/kx/lib/modules/$kver"/modules.{order,builtin,builtin.modinfo} "$root/lib/modules/$kver/" 2>/dev/null || true
  depmod -b "$root" "$kver"
  for m in rdma_rxe siw ib_srp ib_srpt target_core_file virtio_net drbd dm_multipath; do
    modprobe -d "$root" -S "$kver" --show-depends "$m" >/dev/null 2>&1 ||
      die "module $m missing from the image"
  done

  # Trim what a console-only VM never reads.
  rm -rf "$root"/usr/share/{doc,man,info,locale,lintian,linda} \
    "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
    "$root"/var/cache/debconf/*-old
  chroot "$root" dpkg-query -W -f '${Package} ${Version}\n' >"$tmp/guest-packages.txt"
  echo "$kpkg $kver" >"$tmp/kernel.txt"

  (cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) >"$tmp/rootfs.cpio" ||
    die "cpio failed"
  rm -rf "$root" "$tmp/kx" "$tmp/kdeb"
  echo "built $(date -u +%FT%TZ) in $(( $(date +%s) - t0 )) s" >"$tmp/complete"
  rm -rf "${INTEROP_CACHE:?}/$key"
  mv "$tmp" "$INTEROP_CACHE/$key"
  BUILD_TMP=
  IMAGE_DIR=$INTEROP_CACHE/$key
  log "image built in $(( $(date +%s) - t0 )) s: $IMAGE_DIR ($(du -sh "$IMAGE_DIR" | cut -f1))"
}
