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

# Find the main Debian archive among the machine's own apt sources: the URI
# serving the release's own suite (not -security / -updates) with `main`.
find_mirror() {
    local codename
    codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
    [[ -n "$codename" ]] || codename=bookworm
    {
        # one-line format: deb [opts] URI SUITE COMPONENTS...
        for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
            [[ -r "$f" ]] || continue
            sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" |
                awk -v c="$codename" '$1 == "deb" && $3 == c { print $2 }'
        done
        # deb822 format: paragraphs with Types/URIs/Suites/Components
        for f in /etc/apt/sources.list.d/*.sources; do
            [[ -r "$f" ]] || continue
            awk -v c="$codename" '
                function flush() {
                    if (types ~ /(^| )deb( |$)/ && suites ~ ("(^| )" c "( |$)") \
                        && enabled !~ /^no$/)
                        n = split(uris, u, " ")
                    else
                        n = 0
                    for (i = 1; i <= n; i++) print u[i]
                    types = uris = suites = enabled = ""
                }
                /^[[:space:]]*#/ { next }
                /^[[:space:]]*$/ { flush(); next }
                {
                    key = tolower($1); sub(/:$/, "", key)
                    val = $0; sub(/^[^:]*:[[:space:]]*/, "", val)
                    if (key == "types") types = val
                    else if (key == "uris") uris = val
                    else if (key == "suites") suites = val
                    else if (key == "enabled") enabled = tolower(val)
                }
                END { flush() }
            ' "$f"
        done
    } | grep -E '^(https?|file|mirror\+[a-z]+)://' | grep -v -- '-security' | head -n 1
}
