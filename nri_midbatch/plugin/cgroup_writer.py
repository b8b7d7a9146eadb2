"""The one way the plugin reads and writes the cgroup files of pods and containers.

Every write goes through `write`, whatever asked for it (RunPodSandbox, a
Synchronize, a reload, a repair), so every write is confined to the root the
same way, reports its failures the same way, and, under the systemd driver, is
handed to systemd to hold (cgroups/systemd.py) so a daemon-reload puts back our
values rather than older ones. Every read goes through `read`, and fails one way
(CgroupUnreadable). What to log and count is the caller's business.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nri_midbatch.cgroups.fs import apply_values, read_values
from nri_midbatch.cgroups.paths import CgroupDriver, CgroupLocation, CgroupPathError, KubeletRoot
from nri_midbatch.cgroups.systemd import SystemdUnits, UnitTarget
from nri_midbatch.cgroups.values import CgroupReading
from nri_midbatch.policy import CgroupValues, ContainerView, PodView


class CgroupUnreadable(Exception):
    """A cgroup whose values cannot be read: its path is refused, a file is missing (the
    cgroup is gone) or unreadable, or holds no cgroup value."""


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
    #: Only under the systemd driver.
    systemd: SystemdUnits | None = None
    #: kubelet's `--cgroup-root`: only pods below its `kubepods` are written.
    kubelet_root: KubeletRoot = ()

    def write(
        self,
        pod: PodView,
        container: ContainerView | None,
        values: CgroupValues,
        cgroups_path: str = "",
    ) -> Written:
        """Write the pod's (container None) or the container's values."""
        location = self.location(pod, container, cgroups_path)
        try:
            report = apply_values(self.root, location, values)
        except CgroupPathError as exc:
            return Written(str(exc))
        if not report.ok:
            return Written("; ".join(f"{f.operation} {f.path}: {f.error}" for f in report.failed))
        if self.systemd is not None:
            self.systemd.hold(_unit(location, pod, container, values))
        return Written(None, bool(report.written))

    def read(
        self, pod: PodView, container: ContainerView | None = None, cgroups_path: str = ""
    ) -> CgroupReading:
        """What the cgroup holds now. Raises CgroupUnreadable."""
        try:
            return read_values(self.root, self.location(pod, container, cgroups_path))
        except (CgroupPathError, OSError, ValueError) as exc:
            reason = str(exc)
        # Raised without the error as its cause: that one's traceback holds this frame,
        # which holds it, a cycle for the garbage collector on every gone container.
        raise CgroupUnreadable(reason)

    def location(
        self, pod: PodView, container: ContainerView | None, cgroups_path: str = ""
    ) -> CgroupLocation:
        """Where the pod's (container None) or the container's cgroup is."""
        if container is None:
            return CgroupLocation(self.driver, pod.cgroup_parent, kubelet_root=self.kubelet_root)
        return CgroupLocation(
            self.driver,
            pod.cgroup_parent,
            container.id,
            cgroups_path,
            self.runtime,
            self.kubelet_root,
        )

    def unit_target(
        self,
        pod: PodView,
        container: ContainerView | None,
        values: CgroupValues,
        cgroups_path: str = "",
    ) -> UnitTarget:
        """The systemd unit that holds these values: the pod's slice or the container's scope."""
        return _unit(self.location(pod, container, cgroups_path), pod, container, values)


def _unit(
    location: CgroupLocation, pod: PodView, container: ContainerView | None, values: CgroupValues
) -> UnitTarget:
    name = "" if container is None else container.name
    return UnitTarget(location, values, pod.uid, pod.namespace, pod.name, name)
