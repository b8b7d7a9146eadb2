#!/usr/bin/env bash
# Build the project's image from `Dockerfile` with buildah, on a Python base made
# from Debian's packages (no registry is reachable), and save it as a docker
# archive that `ctr images import` takes.
#
#   IMAGE   name:tag to give the image (default ghcr.io/example/nri-midbatch:0.1.0,
#           the DaemonSet's)
#
# The base is Debian 12 (mmdebstrap --variant=minbase) with python3 and pip
# installed from Debian's pip wheel (python3-pip-whl) into /usr/local, as on the
# python:*-slim images, so the Dockerfile builds unchanged on either base. The
# base's rootfs tarball, buildah's storage (vfs driver) and the archive live under
# .cache/image/. The archive is named after a hash of the build's inputs (the
# Dockerfile, .dockerignore, pyproject.toml, README.md, the package, this script),
# and a run with the same inputs only prints it. (Not buildah's --layers cache:
# buildah 1.28 does not mount a cached stage for RUN --mount=from=build.)
# Needs root; installs buildah and mmdebstrap with apt-get when missing.
# Prints the archive's path. Quiet on success; on failure the log goes to stderr.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${IMAGE:-ghcr.io/example/nri-midbatch:0.1.0}"
SUITE=bookworm
CACHE="$ROOT/.cache/image"
BASE_TAR="$CACHE/python-$SUITE.tar"
BASE_IMAGE="localhost/nri-midbatch-python:$SUITE"
LOG="$CACHE/build.log"

SCRIPT=build-image
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"

mkdir -p "$CACHE"
: >"$LOG"

inputs_hash() {
    (cd "$ROOT" && find Dockerfile .dockerignore pyproject.toml README.md nri_midbatch \
        scripts/build-image.sh -type f ! -path '*/__pycache__/*' -print0 |
        sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
}
ARCHIVE="$CACHE/nri-midbatch-$(inputs_hash).tar"
if [[ -s "$ARCHIVE" ]]; then
    echo "$ARCHIVE"
    exit 0
fi

missing=()
command -v buildah >/dev/null 2>&1 || missing+=(buildah)
command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
if ((${#missing[@]})); then
    apt_install "${missing[@]}"
fi

# vfs: overlay storage does not work on every filesystem (e.g. inside a container);
# chroot isolation: no user namespaces or nested runtime needed.
buildah=(buildah --root "$CACHE/storage" --runroot "$CACHE/run" --storage-driver vfs)

# --- the base: Debian's python3, pip in /usr/local, no apt lists or docs ---
if [[ ! -s "$BASE_TAR" ]]; then
    MIRROR="$(find_mirror || true)"
    [[ -n "$MIRROR" ]] || die "no Debian mirror found in /etc/apt/sources.list{,.d/*}"
    # Debian's python3-pip would put pip in /usr/lib, where pip refuses to uninstall
    # it and EXTERNALLY-MANAGED blocks installs; pip run from its own wheel installs
    # itself into /usr/local instead, as a python:*-slim image has it.
    quietly mmdebstrap --variant=minbase --include=python3,python3-pip-whl \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
        --customize-hook='chroot "$1" sh -c "w=\$(echo /usr/share/python-wheels/pip-*.whl) \
            && python3 \$w/pip install --no-index --no-cache-dir \$w"' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
        "$SUITE" "$CACHE/new.tar" "${MIRROR%/}"
    mv "$CACHE/new.tar" "$BASE_TAR"
    "${buildah[@]}" rmi "$BASE_IMAGE" >>"$LOG" 2>&1 || true
fi
if ! "${buildah[@]}" inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
    ctr="$("${buildah[@]}" from scratch)"
    quietly "${buildah[@]}" add "$ctr" "$BASE_TAR" /
    quietly "${buildah[@]}" config \
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env LANG=C.UTF-8 --cmd python3 "$ctr"
    quietly "${buildah[@]}" commit --rm "$ctr" "$BASE_IMAGE"
fi

# --- the image, from the Dockerfile as it is ---
# pip in the build stage fetches from PyPI; Debian's pip trusts the CAs in
# /etc/ssl/certs/ca-certificates.crt, so the host's bundle is lent to the RUN steps
# (a proxy the host trusts is then trusted too). It is a build volume, not a layer.
volumes=()
HOST_CA=/etc/ssl/certs/ca-certificates.crt
[[ -s "$HOST_CA" ]] && volumes+=(--volume "$HOST_CA:$HOST_CA:ro")
quietly "${buildah[@]}" build --isolation chroot "${volumes[@]}" \
    --build-arg "PYTHON_IMAGE=$BASE_IMAGE" -t "$IMAGE" -f "$ROOT/Dockerfile" "$ROOT"
rm -f "$CACHE"/nri-midbatch-*.tar
quietly "${buildah[@]}" push "$IMAGE" "docker-archive:$CACHE/new-image.tar:$IMAGE"
# Only the base and this image: the working containers and dangling images of earlier
# builds would fill the vfs storage (a full copy of the rootfs each).
quietly "${buildah[@]}" rm --all
quietly "${buildah[@]}" rmi --prune
mv "$CACHE/new-image.tar" "$ARCHIVE"
echo "$ARCHIVE"
