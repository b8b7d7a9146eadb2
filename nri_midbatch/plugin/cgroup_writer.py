"""The one way the plugin reads and writes the cgroup files of pods and containers.

Every write goes through `write`, whatever asked for it (RunPodSandbox, a
Synchronize, a reload, a repair), so every write is confined to the root the
same way, reports its failures the same way, and, under the systemd driver, is
handed to systemd to hold (cgroups/systemd.py) so a daemon-reload puts back our
values rather than older ones. What to log and count is the caller's business.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nri_midbatch.cgroups.fs import (
    apply_container_values,
    apply_pod_values,
    read_container_values,
    read_pod_values,
)
from nri_midbatch.cgroups.paths import CgroupDriver, CgroupPathError
from nri_midbatch.cgroups.systemd import SystemdUnits, UnitTarget
from nri_midbatch.cgroups.values import CgroupReading
from nri_midbatch.policy import CgroupValues, ContainerView, PodView


@dataclass(frozen=True, slots=True)
class Written:
    """How a write went: why it failed (None: every file holds the values), and
    whether any file held other values before."""

    failure: str | None
    changed: bool = False


@dataclass(frozen=True, slots=True)
class CgroupWriter:
    root: Path
    driver: CgroupDriver
    #: The runtime's name: where it sends no cgroups path, its naming finds the container.
    runtime: str = ""
    systemd: SystemdUnits | None = None

    def write(
        self,
        pod: PodView,
        container: ContainerView | None,
        values: CgroupValues,
        cgroups_path: str = "",
    ) -> Written:
        """Write the pod's (container None) or the container's values."""
        try:
            if container is None:
                report = apply_pod_values(self.root, self.driver, pod.cgroup_parent, values)
            else:
                report = apply_container_values(
                    self.root,
                    self.driver,
                    pod.cgroup_parent,
                    container.id,
                    values,
                    cgroups_path,
                    self.runtime,
                )
        except CgroupPathError as exc:
            return Written(str(exc))
        if not report.ok:
            return Written("; ".join(f"{f.operation} {f.path}: {f.error}" for f in report.failed))
        if self.systemd is not None:
            self.systemd.hold(self.unit_target(pod, container, values, cgroups_path))
        return Written(None, bool(report.written))

    def read(
        self, pod: PodView, container: ContainerView | None = None, cgroups_path: str = ""
    ) -> CgroupReading:
        """What the cgroup holds now. Raises CgroupPathError, OSError or ValueError."""
        if container is None:
            return read_pod_values(self.root, self.driver, pod.cgroup_parent)
        return read_container_values(
            self.root, self.driver, pod.cgroup_parent, container.id, cgroups_path
        )

    def unit_target(
        self,
        pod: PodView,
        container: ContainerView | None,
        values: CgroupValues,
        cgroups_path: str = "",
    ) -> UnitTarget:
        """The systemd unit that holds these values: the pod's slice or the container's scope."""
        if container is None:
            return UnitTarget("pod", pod.uid, pod.namespace, pod.name, pod.cgroup_parent, values)
        return UnitTarget(
            "container",
            pod.uid,
            pod.namespace,
            pod.name,
            pod.cgroup_parent,
            values,
            container.name,
            container.id,
            cgroups_path,
            self.runtime,
        )
