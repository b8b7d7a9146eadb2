#!/bin/sh
# PID 1 of the systemd leg, before systemd: a lean boot to our own target.
#
# nri-e2e.target needs basic.target and nri-e2e.service, a oneshot that runs
# run.sh once D-Bus is up and powers the guest off however it ends. Units the
# test does not need are masked. Everything written here lands in the
# overlay's tmpfs layer, never on the host.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
here="$(dirname "$(readlink -f "$0")")"
units=/etc/systemd/system
cat >"$units/nri-e2e.target" <<UNIT
[Unit]
Description=nri-midbatch end-to-end tests
Requires=basic.target nri-e2e.service
After=basic.target nri-e2e.service
AllowIsolate=yes
UNIT
cat >"$units/nri-e2e.service" <<UNIT
[Unit]
Description=nri-midbatch end-to-end tests
Wants=dbus.service
After=basic.target dbus.service
SuccessAction=poweroff-force
FailureAction=poweroff-force

[Service]
Type=oneshot
Environment=PATH=$PATH HOME=/root LANG=C.UTF-8
ExecStart=/bin/sh $here/run.sh
TimeoutStartSec=infinity
StandardOutput=journal+console
UNIT
for unit in systemd-timesyncd.service systemd-pstore.service apt-daily.timer \
    apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer e2scrub_reap.service \
    fstrim.timer man-db.timer systemd-tmpfiles-clean.timer getty.target \
    serial-getty@ttyS0.service console-getty.service cron.service; do
    ln -sf /dev/null "$units/$unit"
done
# Debian's tmpfiles rule would empty /tmp, and with it a checkout that lives there.
mkdir -p /etc/tmpfiles.d
ln -sf /dev/null /etc/tmpfiles.d/tmp.conf
exec /lib/systemd/systemd --unit=nri-e2e.target --show-status=1
