"""The one way the plugin reads and writes the cgroup files of pods and containers.

Every write goes through `write`, whatever asked for it (RunPodSandbox, a
Synchronize, a reload, a repair), so every write is confined to the root the
same way, reports its failures the same way, and, under the systemd driver, is
handed to systemd to hold (cgroups/systemd.py) so a daemon-reload puts back our
values rather than older ones. Every read goes through `read`, and fails one way
(CgroupUnreadable). What to log and count is the caller's business.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nri_midbatch.cgroups.fs import KERNEL_FILES, CgroupFiles, LocatedFiles, OpenDirectories
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
    #: What reads and writes the files: the kernel's, or a test's (cgroups/fs.py).
    files: CgroupFiles = KERNEL_FILES

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
            report = self.files.apply_values(self.root, location, values)
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
            return self.files.read_values(self.root, self.location(pod, container, cgroups_path))
        except (OSError, ValueError) as exc:  # ValueError: CgroupPathError among them
            reason = str(exc)
        # Raised without the error as its cause: that one's traceback holds this frame,
        # which holds it, a cycle for the garbage collector on every gone container.
        raise CgroupUnreadable(reason)

    def locate(self, location: CgroupLocation) -> LocatedFiles:
        """The cgroup's value files, resolved and checked. Raises CgroupUnreadable."""
        try:
            return self.files.locate(self.root, location)
        except (OSError, ValueError) as exc:  # ValueError: CgroupPathError among them
            reason = str(exc)
        raise CgroupUnreadable(reason)  # without its cause, as in `read`

    def read_located(
        self, located: LocatedFiles, directories: OpenDirectories | None = None
    ) -> CgroupReading:
        """What the located files hold now (their directories held open in `directories`, if
        given). Raises CgroupUnreadable."""
        try:
            return self.files.read_located(located, directories)
        except (OSError, ValueError) as exc:
            reason = str(exc)
        raise CgroupUnreadable(reason)  # without its cause, as in `read`

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


class LocatedCgroups:
    """Each known workload's cgroup files, located once and read as often as asked.

    The convergence pass reads the same cgroups every pass, and resolving and checking
    their paths (cgroups/fs.py `locate`) cost most of each read. Owned by the event loop's
    thread. An entry is used only with the writer that located it (a reload builds another:
    root, driver, kubelet's root) and for the same location (a new sandbox or path locates
    again). What it read is what a fresh read gives: its directories are opened by their
    real names without following a link, and only entries without a symlink below the
    hierarchies are kept (the root and a v1 controller's hierarchy, mount points, are taken
    as they were resolved); a read that fails drops the entry and locates the cgroup again,
    so a failure is reported as a first read reports it. The owner bounds it (`keep`).
    """

    def __init__(self) -> None:
        self._writer: CgroupWriter | None = None
        #: (pod sandbox id, container id or None) -> where, and its files
        self._entries: dict[tuple[str, str | None], tuple[CgroupLocation, LocatedFiles]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def workloads(self) -> set[tuple[str, str | None]]:
        """The workloads whose files are kept located."""
        return set(self._entries)

    def read(
        self,
        writer: CgroupWriter,
        key: tuple[str, str | None],
        pod: PodView,
        container: ContainerView | None,
        cgroups_path: str,
        directories: OpenDirectories,
    ) -> CgroupReading:
        """What the workload's cgroup holds now, its directories opened in `directories` (the
        caller holds them for a moment). Raises CgroupUnreadable."""
        if writer is not self._writer:
            self._entries.clear()
            self._writer = writer
        location = writer.location(pod, container, cgroups_path)
        entry = self._entries.pop(key, None)
        if entry is not None and entry[0] == location:
            try:
                reading = writer.read_located(entry[1], directories)
            except CgroupUnreadable:
                # Gone, or changed: located again and read afresh (not through directories
                # opened before), so that a failure is reported as it is without the entry.
                located = writer.locate(location)
                reading = writer.read_located(located)
            else:
                self._entries[key] = entry
                return reading
        else:
            located = writer.locate(location)
            reading = writer.read_located(located, directories)
        if located.plain:
            self._entries[key] = (location, located)
        return reading

    def keep(self, known: Callable[[tuple[str, str | None]], bool]) -> None:
        """Drop the entries of workloads no longer `known`."""
        for key in [key for key in self._entries if not known(key)]:
            del self._entries[key]


def _unit(
    location: CgroupLocation, pod: PodView, container: ContainerView | None, values: CgroupValues
) -> UnitTarget:
    name = "" if container is None else container.name
    return UnitTarget(location, values, pod.uid, pod.namespace, pod.name, name)
