#!/bin/sh
# PID 1 of the cgroupfs leg: a bare cgroup v2 node with no init system.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
echo "+cpu +memory +pids" >/sys/fs/cgroup/cgroup.subtree_control
mount -t tmpfs -o mode=0755 run /run
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 shm /dev/shm
ip link set lo up
sh "$(dirname "$0")/run.sh"
exec busybox poweroff -f
