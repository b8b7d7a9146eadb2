#!/bin/sh
# nri-midbatch as the runtime pre-launches it: install.sh writes this file into the
# virtualenv, with its command in place of @NRI_MIDBATCH@, and links the plugin
# directory's NN-name to it.
#
# SIGHUP and SIGUSR1 end a process by default, and a runtime does not restart a
# pre-launched plugin that dies. Ignored here, they stay ignored across exec through the
# interpreter's own start, until the plugin's first line takes them over (and remembers
# them until it serves). One ignored in that first instant is moot: the configuration is
# read after it, and the log level is the one started with.
trap '' HUP USR1
exec '@NRI_MIDBATCH@' "$@"
