#!/bin/sh
# How qemu-clients-to-qemu-nbd.pcapng was made (Debian 12: qemu-utils
# 7.2, libnbd-bin 1.14.2): qemu-nbd serves a 1 MiB raw file on
# 127.0.0.1:10899 while dumpcap records loopback; three real clients run.
set -e
truncate -s 1M disk.img
qemu-nbd -f raw -x lun -b 127.0.0.1 -p 10899 --persistent -t disk.img &
dumpcap -i lo -f "tcp port 10899" -w qemu-clients-to-qemu-nbd.pcapng -q &
sleep 1
qemu-img info nbd://127.0.0.1:10899/lun
qemu-io -f raw -c "write -P 0xab 512 4096" -c "read -P 0xab 512 4096" -c flush nbd://127.0.0.1:10899/lun
nbdinfo nbd://127.0.0.1:10899/lun
sleep 1
kill %2 %1
