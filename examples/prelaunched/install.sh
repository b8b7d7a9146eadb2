#!/bin/sh
# Install nri-midbatch as a pre-launched NRI plugin (started by the runtime itself).
#
#   sudo examples/prelaunched/install.sh [PACKAGE]
#
# PACKAGE is anything pip installs: a wheel built from a checkout
# (python3 -m pip wheel --no-deps -w dist .), or a source checkout; the package is not
# on PyPI. Default: the checkout this script lives in.
#
# What it does:
#   1. creates a virtualenv in $PREFIX (default /opt/nri-midbatch) from $PYTHON
#      (default /usr/bin/python3, 3.11 or newer) and installs PACKAGE into it,
#      non-editable;
#   2. writes $PREFIX/launcher from launcher.sh and links $PLUGIN_DIR/$NAME
#      (default /opt/nri/plugins/10-midbatch) to it. The launcher execs the virtualenv's nri-midbatch by absolute path (the
#      runtime starts plugins with an EMPTY environment, no PATH, and no arguments),
#      with SIGHUP and SIGUSR1 ignored until the plugin's first line takes them over:
#      a signal at the instant the runtime starts it must not end it;
#   3. installs the configuration as $CONF_DIR/$NAME.conf (default
#      /etc/nri/conf.d/10-midbatch.conf) from $CONFIG (default
#      examples/config/default.yaml), unless that file already exists. The runtime
#      hands its contents to the plugin in Configure.
#
# The plugin starts with the runtime: restart containerd or CRI-O afterwards. Read
# examples/prelaunched/README.md first: on containerd 1.7 a pre-launched plugin that
# does not register in time stops the CRI service from starting.
set -eu

here=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
PREFIX=${PREFIX:-/opt/nri-midbatch}
PLUGIN_DIR=${PLUGIN_DIR:-/opt/nri/plugins}
CONF_DIR=${CONF_DIR:-/etc/nri/conf.d}
NAME=${NAME:-10-midbatch}
CONFIG=${CONFIG:-$here/../config/default.yaml}
package=${1:-$here/../..}

die() {
  echo "install.sh: $*" >&2
  exit 1
}

# One badly named executable in the plugin directory makes the runtime's plugin
# discovery fail as a whole: insist on NN-name.
case "$NAME" in
  [0-9][0-9]-?*) ;;
  *) die "NAME must be NN-name (two digits, a dash, a name), not '$NAME'" ;;
esac
case "$PYTHON" in
  /*) ;;
  *) die "PYTHON must be an absolute path, not '$PYTHON'" ;;
esac
# PREFIX goes into the launcher between single quotes, through sed.
case "$PREFIX" in
  *\'* | *'|'* | *'\'* | *'&'*) die "PREFIX may not hold ', |, \\ or &: '$PREFIX'" ;;
  /*) ;;
  *) die "PREFIX must be an absolute path, not '$PREFIX'" ;;
esac
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "$PYTHON is older than Python 3.11"
[ -f "$CONFIG" ] || die "no configuration at $CONFIG"

"$PYTHON" -m venv "$PREFIX"
"$PREFIX/bin/python" -m pip install --quiet --no-cache-dir --upgrade "$package"
# Refuse a configuration the plugin would reject before the runtime ever starts it.
"$PREFIX/bin/nri-midbatch" check-config "$CONFIG" >/dev/null

mkdir -p "$PLUGIN_DIR" "$CONF_DIR"
# Written in the virtualenv and renamed into place, then linked: nothing but NN-name
# ever stands in the plugin directory, and the runtime never runs half a launcher.
sed "s|@NRI_MIDBATCH@|$PREFIX/bin/nri-midbatch|" "$here/launcher.sh" >"$PREFIX/launcher.new"
chmod 0755 "$PREFIX/launcher.new"
mv -f "$PREFIX/launcher.new" "$PREFIX/launcher"
ln -sfn "$PREFIX/launcher" "$PLUGIN_DIR/$NAME"
if [ -e "$CONF_DIR/$NAME.conf" ]; then
  echo "keeping the existing $CONF_DIR/$NAME.conf"
else
  cp "$CONFIG" "$CONF_DIR/$NAME.conf"
  chmod 0644 "$CONF_DIR/$NAME.conf"
fi

echo "installed $PLUGIN_DIR/$NAME -> $PREFIX/launcher, which runs $PREFIX/bin/nri-midbatch"
echo "configuration: $CONF_DIR/$NAME.conf"
echo "now restart the runtime: systemctl restart containerd (or crio)"
