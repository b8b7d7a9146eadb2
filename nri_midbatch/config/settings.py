"""A validated configuration as the running plugin holds it: plain frozen dataclasses.

pydantic validates every configuration (model.py), in a child process when the plugin
runs (validator.py): its models, schemas and library would otherwise stay in the plugin's
memory for good, some 10 MB of a process that serves the node with less. What comes
back is this: the policy's own types plus the few settings outside the policy. Standard
library only, so that importing it loads no pydantic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from nri_midbatch.cgroups.paths import CgroupDriver, KubeletRoot
from nri_midbatch.policy import ClassificationSettings, Policy, Rules, Tier

__all__ = ["CgroupSettings", "ConfigError", "FailurePolicy", "Mode", "Settings"]


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the source and the field path."""


class FailurePolicy(StrEnum):
    IGNORE = "Ignore"
    FAIL = "Fail"


class Mode(StrEnum):
    ENFORCE = "enforce"
    OBSERVE = "observe"


@dataclass(frozen=True, slots=True)
class CgroupSettings:
    root: str
    driver: CgroupDriver
    pod_level: bool
    #: kubelet's `--cgroup-root`, as names.
    kubelet_root: KubeletRoot = ()


@dataclass(frozen=True, slots=True)
class ConvergenceSettings:
    #: Seconds between two convergence passes; 0: none.
    interval_seconds: float = 10.0


@dataclass(frozen=True, slots=True)
class Settings:
    """What the plugin reads of a configuration: config/compile.py makes it from the model.

    Two settings are equal when their configurations are (`effective`, every setting as
    check-config prints it): a reload of an equal file is counted `unchanged`, as it was
    when the plugin held the model.
    """

    mode: Mode = field(compare=False)
    failure_policy: FailurePolicy = field(compare=False)
    tiers: tuple[Tier, ...] = field(compare=False)
    classification: ClassificationSettings = field(compare=False)
    rules: Rules = field(compare=False)
    cgroups: CgroupSettings = field(compare=False)
    effective: str = field(repr=False)
    convergence: ConvergenceSettings = field(default=ConvergenceSettings(), compare=False)

    def compile(self) -> Policy:
        return Policy(self.tiers, self.classification, self.rules)

    def enforces(self, *, pod: bool) -> bool:
        """Whether the plugin claims values on a pod (`pod`) or a container: never in observe
        mode, and on pods only with pod level on. What it claimed before is given back."""
        return self.mode != Mode.OBSERVE and (not pod or self.cgroups.pod_level)
