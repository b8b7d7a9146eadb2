#!/usr/bin/env bash
# Install Debian 12's prometheus package (Prometheus 2.42 and promtool) for
# the monitoring tests, without leaving it running as a service: the tests
# start the binary themselves on a loopback port with a scrape config of their
# own, and a system-wide Prometheus on :9090 would only get in the way.
#
# Idempotent: does nothing when both binaries are already on the PATH.
# Quiet on success; on failure the captured apt output goes to stderr.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    exit 0
fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOG="$ROOT/.cache/install-prometheus.log"
mkdir -p "$(dirname "$LOG")"
: >"$LOG"

SCRIPT=install-prometheus
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"

# The package's maintainer scripts start the service (through invoke-rc.d or
# deb-systemd-invoke, both of which ask policy-rc.d first). Refuse every start
# for the length of the install, unless the machine already has a policy.
POLICY=/usr/sbin/policy-rc.d
if [[ ! -e "$POLICY" ]]; then
    printf '#!/bin/sh\n# install-prometheus.sh: no service starts during its apt-get install\nexit 101\n' >"$POLICY"
    chmod 755 "$POLICY"
    trap 'rm -f "$POLICY"' EXIT
fi

apt_install prometheus

# On a machine run by systemd the unit is enabled by the install: turn it off
# so that the next boot does not start it either.
if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now prometheus.service >>"$LOG" 2>&1 || true
fi
command -v prometheus >/dev/null 2>&1 || die "prometheus not on the PATH after the install"
command -v promtool >/dev/null 2>&1 || die "promtool not on the PATH after the install"
