#!/bin/sh
# Runs the host's command file in the guest and records how it ended, in the
# results share: output.log, then rc (written last: its presence means done).
cd /
sh /guest-results/command >/guest-results/output.log 2>&1
echo $? >/guest-results/rc
sync
