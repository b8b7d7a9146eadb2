#!/usr/bin/env bash
# Fetch a Debian containerd package for the end-to-end tests without
# installing it, plus Debian 12's runc and busybox-static.
#
#   CONTAINERD_SUITE    Debian suite to take containerd from (default trixie:
#                       1.7.24; sid has 2.1.9)
#   CONTAINERD_VERSION  upstream version the package must carry (e.g. 2.1.9);
#                       unset accepts whatever the suite has. Suites move on:
#                       a mismatch fails loudly instead of testing another
#                       version under the expected name.
#
# Idempotent: each suite's unpacked tree is cached under
# .cache/containerd-<suite>/ in the repository root; a second run only checks
# that it is there (and its version).
# Prints the directory holding containerd, containerd-shim-runc-v2 and ctr.
# Quiet on success; on failure the captured apt output goes to stderr.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SUITE="${CONTAINERD_SUITE:-trixie}"
WANT="${CONTAINERD_VERSION:-}"
CACHE="$ROOT/.cache/containerd-$SUITE"
UNPACKED="$CACHE/unpacked"
BIN="$UNPACKED/usr/bin"
LOG="$CACHE/fetch.log"

SCRIPT=fetch-containerd
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"

mkdir -p "$CACHE"
: >"$LOG"

# --- Debian 12's runc and busybox-static (system-wide, from the normal lists) ---
missing=()
command -v runc >/dev/null 2>&1 || missing+=(runc)
[[ -x /bin/busybox ]] || missing+=(busybox-static)
if ((${#missing[@]})); then
    apt_install "${missing[@]}"
fi

# Debian version "2.1.9~ds1-5" or "1.7.24~ds1-6+b2" -> "2.1.9" / "1.7.24".
upstream_version() {
    local v="${1#*:}"
    v="${v%%[~+-]*}"
    echo "$v"
}

check_version() {
    local have
    have="$(upstream_version "$1")"
    [[ -z "$WANT" || "$have" == "$WANT" ]] ||
        die "$SUITE has containerd $1, not $WANT (CONTAINERD_VERSION); update the e2e matrix"
}

# --- containerd from $SUITE, cached ---
if [[ -x "$BIN/containerd" && -x "$BIN/containerd-shim-runc-v2" && -x "$BIN/ctr" \
    && -s "$CACHE/version" ]]; then
    check_version "$(cat "$CACHE/version")"
    rm -f "$BIN/runc"
    echo "$BIN"
    exit 0
fi

MIRROR="$(find_mirror || true)"
[[ -n "$MIRROR" ]] || die "no Debian mirror found in /etc/apt/sources.list{,.d/*}"
MIRROR="${MIRROR%/}"

APTDIR="$CACHE/apt"
mkdir -p "$APTDIR/lists/partial" "$APTDIR/archives/partial" "$CACHE/debs"
printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s %s main\n' \
    "$MIRROR" "$SUITE" >"$APTDIR/sources.list"
APT_OPTS=(
    -o "Dir::Etc::SourceList=$APTDIR/sources.list"
    -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$APTDIR/lists"
    -o "Dir::Cache::Archives=$APTDIR/archives"
    -o "Dir::Cache::pkgcache="
    -o "Dir::Cache::srcpkgcache="
    -o "APT::Sandbox::User=root"
)
quietly apt-get "${APT_OPTS[@]}" update
rm -f "$CACHE"/debs/containerd_*.deb  # a suite moves on: keep only what it has now
(cd "$CACHE/debs" && quietly apt-get "${APT_OPTS[@]}" download containerd)

shopt -s nullglob
debs=("$CACHE"/debs/containerd_*.deb)
((${#debs[@]})) || die "apt-get download produced no containerd_*.deb"
deb="${debs[-1]}"
version="$(dpkg-deb -f "$deb" Version)"
check_version "$version"

tmp="$(mktemp -d "$CACHE/unpack.XXXXXX")"
quietly dpkg -x "$deb" "$tmp"
# A newer suite's runc (if any) needs a newer glibc; the shim must find Debian 12's.
find "$tmp" -name runc -type f -delete
[[ -x "$tmp/usr/bin/containerd" ]] || die "$deb holds no usr/bin/containerd"
rm -rf "$UNPACKED"
mv "$tmp" "$UNPACKED"
echo "$version" >"$CACHE/version"
echo "$BIN"
