#!/usr/bin/env bash
# Prepare the QEMU guest of the cgroup v2 end-to-end legs (docs/testing.md):
# Debian 12's qemu-system-x86, busybox-static and containernetworking-plugins
# (installed: the DaemonSet test's pod network in the guest), the kernel of
# Debian 12's linux-image-amd64 (downloaded, not installed: only vmlinuz and
# the modules the initramfs loads are unpacked), and our own initramfs built
# from tests/e2e/guest/init.sh.
#
# Idempotent: everything lands under .cache/guest/ in the repository root; a
# second run unpacks the kernel again only when MODULES changed, and rebuilds the
# initramfs only when init.sh or the modules changed.
# Prints the directory holding vmlinuz and initramfs.cpio.gz.
# Quiet on success; on failure the captured apt output goes to stderr.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/.cache/guest"
INIT="$ROOT/tests/e2e/guest/init.sh"
LOG="$CACHE/fetch.log"
# In load order: each needs the ones before it. llc, stp, bridge and veth: the CNI
# bridge plugin's pod network (the DaemonSet test).
MODULES=(virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio-rng
    netfs fscache 9pnet 9pnet_virtio 9p overlay llc stp bridge veth)

SCRIPT=fetch-guest
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"

mkdir -p "$CACHE"
: >"$LOG"

# --- qemu, busybox and the CNI plugins from Debian 12 (system-wide) ---
missing=()
command -v qemu-system-x86_64 >/dev/null 2>&1 || missing+=(qemu-system-x86)
[[ -x /bin/busybox ]] || missing+=(busybox-static)
[[ -x /usr/lib/cni/bridge ]] || missing+=(containernetworking-plugins)
if ((${#missing[@]})); then
    apt_install "${missing[@]}"
fi

# --- the kernel: vmlinuz and a few modules of Debian 12's current one ---
KERNEL="$CACHE/kernel"
if [[ ! -f "$KERNEL/vmlinuz" || "$(cat "$KERNEL/modules/order" 2>/dev/null)" != "$(printf '%s\n' "${MODULES[@]}")" ]]; then
    pkg="$(apt-cache depends linux-image-amd64 2>>"$LOG" |
        awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')"
    if [[ -z "$pkg" ]]; then
        quietly apt-get update
        pkg="$(apt-cache depends linux-image-amd64 2>>"$LOG" |
            awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')"
    fi
    [[ -n "$pkg" ]] || die "apt-cache finds no kernel behind linux-image-amd64"
    debs="$CACHE/debs"
    mkdir -p "$debs"
    (cd "$debs" && quietly apt-get download "$pkg")
    shopt -s nullglob
    found=("$debs/${pkg}"_*.deb)
    ((${#found[@]})) || die "apt-get download produced no ${pkg}_*.deb"
    tmp="$(mktemp -d "$CACHE/unpack.XXXXXX")"
    patterns=(--wildcards './boot/vmlinuz-*')
    for m in "${MODULES[@]}"; do
        patterns+=("*/$m.ko")
    done
    dpkg-deb --fsys-tarfile "${found[-1]}" | tar -x -C "$tmp" "${patterns[@]}" ||
        die "cannot unpack ${found[-1]}"
    mkdir -p "$tmp/out/modules"
    mv "$tmp"/boot/vmlinuz-* "$tmp/out/vmlinuz"
    for m in "${MODULES[@]}"; do
        ko="$(find "$tmp/lib" -name "$m.ko" | head -n 1)"
        [[ -n "$ko" ]] || die "$pkg has no module $m"
        mv "$ko" "$tmp/out/modules/"
    done
    printf '%s\n' "${MODULES[@]}" >"$tmp/out/modules/order"
    rm -rf "$KERNEL" "$debs"
    mv "$tmp/out" "$KERNEL"
    rm -rf "$tmp"
fi

# --- the initramfs: busybox, the modules, our init ---
stamp="$(cat "$INIT" "$KERNEL/modules/order" /bin/busybox | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$CACHE/initramfs.cpio.gz" || "$(cat "$CACHE/initramfs.stamp" 2>/dev/null)" != "$stamp" ]]; then
    tree="$(mktemp -d "$CACHE/initramfs.XXXXXX")"
    mkdir -p "$tree"/{bin,dev,proc,sys,lower,rw,newroot}
    cp /bin/busybox "$tree/bin/busybox"
    ln -s busybox "$tree/bin/sh"
    cp -r "$KERNEL/modules" "$tree/modules"
    install -m 0755 "$INIT" "$tree/init"
    (cd "$tree" && find . | busybox cpio -o -H newc 2>>"$LOG" | gzip -1 >"$CACHE/initramfs.tmp") ||
        die "cannot pack the initramfs"
    mv "$CACHE/initramfs.tmp" "$CACHE/initramfs.cpio.gz"
    echo "$stamp" >"$CACHE/initramfs.stamp"
    rm -rf "$tree"
fi
echo "$CACHE"
