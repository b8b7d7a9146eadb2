"""The configuration model turned into the Settings the plugin runs on (and their Policy).

Outside `policy/` on purpose: the pure core knows nothing of the configuration model, so
the one step that reads both lives here, above them (`config -> policy`, never back).
"""

from __future__ import annotations

from fractions import Fraction
from typing import TypeVar

from nri_midbatch.cgroups.paths import CgroupDriver
from nri_midbatch.config.model import Config, effective_config_yaml
from nri_midbatch.config.settings import CgroupSettings, ConvergenceSettings, Settings
from nri_midbatch.policy import (
    ClassificationSettings,
    Policy,
    PriorityClass,
    QoSClass,
    Rules,
    Tier,
)

__all__ = ["compile_policy", "settings_of"]


_C = TypeVar("_C", PriorityClass, QoSClass)


def _class(name: str, kind: type[_C]) -> _C | None:
    """A class as the configuration names it; "None" (a pod without the class) is None."""
    return None if name == "None" else kind(name)


def compile_policy(config: Config) -> Policy:
    return settings_of(config).compile()


def settings_of(config: Config) -> Settings:
    classification = config.classification
    ratio = config.rules.cpu_normalization_ratio
    return Settings(
        mode=config.mode,
        failure_policy=config.failure_policy,
        tiers=tuple(
            Tier(
                name=tier.name,
                priority_classes=tuple(_class(pc, PriorityClass) for pc in tier.priority_classes),
                qos_classes=frozenset(_class(qos, QoSClass) for qos in tier.qos_classes),
                cpu_resource="" if tier.resources is None else tier.resources.cpu,
                memory_resource="" if tier.resources is None else tier.resources.memory,
                namespaces=None if tier.namespaces is None else frozenset(tier.namespaces),
                calculator=tier.calculator,
            )
            for tier in config.tiers
        ),
        classification=ClassificationSettings(
            qos_label=classification.qos_label,
            priority_class_label=classification.priority_class_label,
            spec_annotation=classification.extended_resource_spec_annotation,
            qos_from_cgroup_parent=classification.qos_from_cgroup_parent,
        ),
        # repr() is the shortest decimal that reads back as the same float: 1.2 -> exactly 6/5.
        rules=Rules(
            cfs_quota=config.rules.cfs_quota,
            cpu_normalization_ratio=None if ratio is None else Fraction(repr(ratio)),
        ),
        cgroups=CgroupSettings(
            root=config.cgroups.root,
            driver=CgroupDriver(config.cgroups.driver),
            pod_level=config.cgroups.pod_level,
        ),
        effective=effective_config_yaml(config),
        convergence=ConvergenceSettings(config.convergence.interval_seconds),
    )
