#!/bin/sh
# /init of the guest's initramfs (built by scripts/fetch-guest.sh).
#
# Loads the virtio, 9p and overlay modules, mounts the host's root (9p tag
# `host`, read-only) as the lower layer of an overlay with a tmpfs upper
# layer, mounts the writable results share (9p tag `results`) at
# /guest-results and a tmpfs at /guest-tmp, and hands over to the program named by
# `guest.init=` on the kernel command line, as PID 1 of the new root.
/bin/busybox --install -s /bin
export PATH=/bin

fail() {
    echo "guest initramfs: $*"
    echo o >/proc/sysrq-trigger
    sleep 60
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

for m in $(cat /modules/order); do
    insmod "/modules/$m.ko" || fail "insmod $m"
done

p9=trans=virtio,version=9p2000.L,msize=512000
# The host's files do not change during a run: let the guest cache them.
mount -t 9p -o "ro,cache=loose,$p9" host /lower || fail "cannot mount the host root"
mount -t tmpfs -o mode=0755 upper /rw
mkdir /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot ||
    fail "cannot mount the overlay"
# The host image says it is a container; systemd would then ignore its target.
rm -f /newroot/.dockerenv
mkdir -p /newroot/guest-results
mount -t 9p -o "$p9" results /newroot/guest-results || fail "cannot mount the results share"
# A real tmpfs for the tests' files (TMPDIR): containerd's overlay snapshots
# cannot live on the overlay root. Not on /tmp, which would hide a checkout
# that lives there on the host (CI may clone anywhere).
mkdir -p /newroot/guest-tmp
mount -t tmpfs -o mode=1777 tmp /newroot/guest-tmp

init="$(sed -n 's/.*guest\.init=\([^ ]*\).*/\1/p' /proc/cmdline)"
[ -n "$init" ] || fail "no guest.init= on the kernel command line"
mount --move /dev /newroot/dev
mount --move /sys /newroot/sys
mount --move /proc /newroot/proc
exec switch_root /newroot "$init"
