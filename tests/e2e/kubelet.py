"""Kubelet's part in the end-to-end tests: the pod cgroup it limits and the resizes it plays.

The tests have no kubelet; this module does what kubelet does to a pod's cgroup and asks of
the runtime, step by step and in kubelet's order, so that the plugin meets the other writer
it meets on a node. Values are kubelet's v1 units (shares, CFS quota per 100 ms, bytes).
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nri_midbatch.cgroups.files import CgroupVersion
from nri_midbatch.cgroups.values import cpu_shares_to_weight
from tests.e2e.containerd import Containerd
from tests.e2e.cri import runtime_pb2 as cri
from tests.e2e.node import CGROUP_ROOT, NODE, SLOWDOWN, Driver
from tests.e2e.pods import Pod

#: A container's LinuxContainerResources as kubelet sends them: cpu_shares, cpu_period,
#: cpu_quota, memory_limit_in_bytes.
Native = Mapping[str, int]


def kubelet_limits_pod_cgroup(parent: str, shares: int, quota: int, memory: int) -> None:
    """What kubelet does before RunPodSandbox for a burstable pod with limits."""
    NODE.prepare_parent(parent)
    if NODE.driver is Driver.CGROUPFS and NODE.version is CgroupVersion.V2:
        _enable_controllers_down_to(parent)
    kubelet_sets_pod_cgroup(parent, shares=shares, quota=quota, memory=memory)


def kubelet_sets_pod_cgroup(
    parent: str, *, shares: int | None = None, quota: int | None = None, memory: int | None = None
) -> None:
    """Kubelet's SetPodCgroupConfig: only the values given, the others left as they are."""
    if NODE.driver is Driver.SYSTEMD:
        # As kubelet's systemd driver does: the slice's unit properties, which systemd
        # writes into files it enables the controllers for.
        properties = []
        if shares is not None:
            properties.append(f"CPUWeight={cpu_shares_to_weight(shares)}")
        if quota is not None:
            properties.append(f"CPUQuota={quota / 1000:g}%")
        if memory is not None:
            properties.append(f"MemoryMax={memory}")
        subprocess.run(
            ["systemctl", "set-property", "--runtime", parent, *properties],
            check=True,
            timeout=30 * SLOWDOWN,
        )
        return
    write_cgroup_files(parent, None, shares=shares, quota=quota, memory=memory)


def write_cgroup_files(
    parent: str,
    container_id: str | None,
    *,
    shares: int | None = None,
    quota: int | None = None,
    memory: int | None = None,
) -> None:
    """Write a pod's (or a container's) files directly, whatever the driver: limited values."""
    if NODE.version is CgroupVersion.V1:
        texts = {
            ("cpu", "cpu.shares"): shares,
            ("cpu", "cpu.cfs_quota_us"): quota,
            ("memory", "memory.limit_in_bytes"): memory,
        }
    else:
        # cpu.max takes the quota alone and keeps its period.
        weight = None if shares is None else cpu_shares_to_weight(shares)
        texts = {
            ("cpu", "cpu.weight"): weight,
            ("cpu", "cpu.max"): quota,
            ("memory", "memory.max"): memory,
        }
    for (controller, name), value in texts.items():
        if value is None:
            continue
        if container_id is None:
            directory = NODE.pod_dir(controller, parent)
        else:
            directory = NODE.container_dir(controller, parent, container_id)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(str(value))


def _enable_controllers_down_to(parent: str) -> None:
    """cgroup v2, cgroupfs: each level hands cpu and memory to the next, as kubelet's do."""
    path = CGROUP_ROOT
    for part in Path(parent.strip("/")).parts:
        (path / "cgroup.subtree_control").write_text("+cpu +memory")
        path = path / part
        path.mkdir(exist_ok=True)


def burstable_pod_config(
    containerd: Containerd,
    name: str,
    pod_labels: Mapping[str, str],
    annotations: Mapping[str, str],
    native: Native,
) -> Any:
    """A one-container burstable pod's sandbox config, its pod cgroup limited by kubelet to
    its container's values (no overhead); the config carries them as kubelet's does."""
    uid = str(uuid.uuid4())
    parent = NODE.new_cgroup_parent("burstable", uid)
    kubelet_limits_pod_cgroup(
        parent, native["cpu_shares"], native["cpu_quota"], native["memory_limit_in_bytes"]
    )
    config = containerd.pod_config(
        name, uid=uid, labels=pod_labels, annotations=annotations, cgroup_parent=parent
    )
    config.linux.resources.CopyFrom(cri.LinuxContainerResources(**native))
    return config


def run_in_sandbox(containerd: Containerd, config: Any, native: Native) -> Pod:
    """RunPodSandbox with `config`, then its container "main" with `native`, started: the
    container's attempt is the sandbox's, as when kubelet recreates a sandbox."""
    pod_id = containerd.run_pod_config(config)
    attempt = config.metadata.attempt
    container_id = containerd.create_container(
        pod_id, name="main", resources=native, attempt=attempt
    )
    containerd.start_container(container_id)
    return Pod(config.linux.cgroup_parent, pod_id, container_id)


def run_burstable(
    containerd: Containerd,
    name: str,
    pod_labels: Mapping[str, str],
    annotations: Mapping[str, str],
    native: Native,
) -> Pod:
    """A one-container burstable pod whose pod limits are its container's (no overhead)."""
    config = burstable_pod_config(containerd, name, pod_labels, annotations, native)
    return run_in_sandbox(containerd, config, native)


def resize(containerd: Containerd, pod: Pod, old: Native, new: Native) -> None:
    """Kubelet's in-place resize of a one-container pod without overhead, from `old` to `new`.

    As kubelet's doPodResizeAction (kubernetes pkg/kubelet/kuberuntime/kuberuntime_manager.go)
    does it: memory first, then CPU, each only if the container's value changes; for each, the
    pod cgroup as kubelet finds it (GetPodCgroupConfig: whatever the plugin or anyone wrote
    there) against kubelet's new pod value decides the order: a value going up is written to
    the pod before UpdateContainerResources, a value going down after it; CPU limits go up
    before requests and come down after them. Kubelet since kubernetes#137555 sends
    UpdatePodSandboxResources before each pod write; containerd 1.7.24 and 2.1.9 relay it to
    no NRI plugin, so on these releases its files and CRI calls are these same ones.
    """
    current = dict(old)
    cpu_fields = ("cpu_shares", "cpu_period", "cpu_quota")
    for resource, fields in (("memory", ("memory_limit_in_bytes",)), ("cpu", cpu_fields)):
        if all(new[f] == old[f] for f in fields):
            continue
        found = NODE.read_values(pod.parent, None)
        wanted = NODE.expect(new["cpu_shares"], new["cpu_quota"], new["memory_limit_in_bytes"])
        # (kubelet's new value, the pod's as found, the write), limits before requests.
        if resource == "memory":
            steps = [(wanted.memory, found.memory, {"memory": new["memory_limit_in_bytes"]})]
        else:
            steps = [
                (wanted.quota, found.quota, {"quota": new["cpu_quota"]}),
                (wanted.cpu, found.cpu, {"shares": new["cpu_shares"]}),
            ]
        for value, now, write in steps:
            if value > now:
                kubelet_sets_pod_cgroup(pod.parent, **write)
        current.update({f: new[f] for f in fields})
        containerd.update_container_resources(pod.container_id, current)
        for value, now, write in reversed(steps):
            if value < now:
                kubelet_sets_pod_cgroup(pod.parent, **write)
