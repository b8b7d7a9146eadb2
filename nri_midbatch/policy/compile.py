"""Turn a validated configuration into the Policy the decisions run on, once per config."""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING

from .calculate import Rules
from .classify import ClassificationSettings
from .compiled import Policy
from .tiers import Tier

if TYPE_CHECKING:  # the core never imports pydantic at run time; it only reads the fields
    from ..config import Config


def compile_policy(config: Config) -> Policy:
    classification = config.classification
    ratio = config.rules.cpu_normalization_ratio
    return Policy(
        tiers=[
            Tier(
                name=tier.name,
                priority_classes=tier.priority_classes,
                qos_classes=frozenset(tier.qos_classes),
                cpu_resource=tier.resources.cpu,
                memory_resource=tier.resources.memory,
                namespaces=None if tier.namespaces is None else frozenset(tier.namespaces),
            )
            for tier in config.tiers
        ],
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
    )
