"""What the handlers, the Synchronize pass, the decisions and the writers share.

One per plugin. A reload replaces the configuration and what is compiled from
it, a Synchronize replaces `known`: every room of the plugin reads them here,
so none keeps a copy that could go stale.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from nri_midbatch.cgroups.fs import KERNEL_FILES, CgroupFiles
from nri_midbatch.cgroups.paths import CgroupDriver
from nri_midbatch.cgroups.systemd import SystemdUnits
from nri_midbatch.config.settings import Settings
from nri_midbatch.plugin.cgroup_writer import CgroupWriter
from nri_midbatch.plugin.counters import Counters
from nri_midbatch.plugin.deferred import AfterReply
from nri_midbatch.plugin.observer import Observer
from nri_midbatch.policy import Policy
from nri_midbatch.state.known import Known
from nri_midbatch.state.store import BaselineStore


@dataclass
class PluginContext:
    config: Settings
    policy: Policy
    cgroups: CgroupWriter
    store: BaselineStore
    #: Decide pod-level values but write no cgroup file (replay, audits).
    dry_run: bool = False
    #: Told of every decision, e.g. to record it with the call.
    observers: tuple[Observer, ...] = ()
    known: Known = field(default_factory=Known)
    counters: Counters = field(default_factory=Counters)
    #: Log lines, Synchronize's pod cgroups and records, once the runtime has its reply.
    after_reply: AfterReply = field(default_factory=AfterReply)

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

    def configure(self, config: Settings, runtime: str, systemd: SystemdUnits | None) -> None:
        """Put `config` in force, with the writer it implies."""
        self.config = config
        self.policy = config.compile()
        self.cgroups = writer_for(config, runtime, systemd, self.cgroups.files)


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
