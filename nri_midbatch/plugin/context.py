"""What a reload and a Synchronize replace: the configuration in force, what the plugin knows.

Everything else a room of the plugin uses (the counters, the record store, the work
after replies, the observers) is given to it, by name, when it is made. These two are
replaced while the plugin runs: a reload (or the runtime's Configure) puts a new
`InForce` in force whole, a Synchronize puts a new `Known` in place. Each room asks
`Live` for them at each use, so none keeps a copy that could go stale.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from nri_midbatch.cgroups.fs import KERNEL_FILES, CgroupFiles
from nri_midbatch.cgroups.paths import CgroupDriver
from nri_midbatch.cgroups.systemd import SystemdUnits
from nri_midbatch.config.settings import Settings
from nri_midbatch.plugin.cgroup_writer import CgroupWriter
from nri_midbatch.policy import Policy
from nri_midbatch.state.known import Known


@dataclass(frozen=True, slots=True)
class InForce:
    """A configuration, the policy compiled from it and the cgroup writer it implies."""

    config: Settings
    policy: Policy
    cgroups: CgroupWriter

    @classmethod
    def of(
        cls,
        config: Settings,
        runtime: str,
        systemd: SystemdUnits | None,
        files: CgroupFiles = KERNEL_FILES,
    ) -> InForce:
        return cls(config, config.compile(), writer_for(config, runtime, systemd, files))

    def for_runtime(self, runtime: str) -> InForce:
        """The same, its writer naming cgroups as `runtime` does."""
        return replace(self, cgroups=replace(self.cgroups, runtime=runtime))

    @property
    def observing(self) -> bool:
        """Decide and report, set nothing (`mode: observe`)."""
        return self.config.mode == "observe"

    @property
    def fail(self) -> bool:
        """Bad input makes the runtime refuse what it can refuse (`failurePolicy: Fail`)."""
        return self.config.failure_policy == "Fail"

    @property
    def pod_level(self) -> bool:
        return self.config.cgroups.pod_level


@dataclass(slots=True)
class Live:
    """The one owner of what is replaced while the plugin runs (one per plugin)."""

    #: Replaced whole by a reload, the runtime's Configure, and the runtime's name.
    in_force: InForce
    #: Replaced by each Synchronize (plugin/synchronize.py).
    known: Known


def writer_for(
    config: Settings,
    runtime: str,
    systemd: SystemdUnits | None,
    files: CgroupFiles = KERNEL_FILES,
) -> CgroupWriter:
    """The cgroup writer of a configuration: its root and driver, the runtime's naming."""
    cgroups = config.cgroups
    return CgroupWriter(
        Path(cgroups.root),
        CgroupDriver(cgroups.driver),
        runtime,
        systemd,
        cgroups.kubelet_root,
        files,
    )
