# Sourced by the scripts that fetch or install the tests' packages. Each sets
# SCRIPT (its name, for messages) and LOG (where commands' output goes, shown
# only when something fails) before calling these.

die() {
    echo "$SCRIPT: $*" >&2
    if [[ -s "$LOG" ]]; then
        echo "--- $LOG ---" >&2
        tail -n 40 "$LOG" >&2
    fi
    exit 1
}

# Run a command with its output in the log; the log is shown on failure.
quietly() {
    "$@" >>"$LOG" 2>&1 || die "failed: $*"
}

# apt-get install the packages named, from the machine's own lists: straight
# away if the lists know them, else after one update. Waits for another apt or
# dpkg run (other tests install packages too).
apt_install() {
    [[ $EUID -eq 0 ]] || die "need root to apt-get install $*"
    export DEBIAN_FRONTEND=noninteractive
    local apt=(apt-get -y --no-install-recommends -o DPkg::Lock::Timeout=300)
    if ! "${apt[@]}" install "$@" >>"$LOG" 2>&1; then
        quietly apt-get -o DPkg::Lock::Timeout=300 update
        quietly "${apt[@]}" install "$@"
    fi
}
