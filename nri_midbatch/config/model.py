"""The YAML configuration: camelCase keys, unknown keys rejected, defaults = Koordinator.

Longer than the house's 400 lines: every key of the configuration is a model here, with
the way text becomes a Config; docs/configuration.md is generated from this file.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from nri_midbatch.cgroups.paths import CgroupDriver
from nri_midbatch.config.bounded_yaml import (
    DECIMAL_SYNTAX,
    MAX_BYTES,
    MAX_DEPTH,
    MAX_NODES,
    UntrustedInputError,
    load_yaml,
    read_file,
    reason,
)
from nri_midbatch.config.settings import ConfigError, FailurePolicy, Mode
from nri_midbatch.policy.calculators import READS_RESOURCES

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_DEPTH",
    "MAX_NODES",
    "CgroupDriver",
    "Config",
    "ConfigError",
    "FailurePolicy",
    "Mode",
    "effective_config_yaml",
    "load_config_file",
    "load_config_text",
    "load_startup_config",
    "read_config_file",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel)


def _unique(items: tuple[Hashable, ...]) -> tuple[Hashable, ...]:
    repeated = [str(item) for item, count in Counter(items).items() if count > 1]
    if repeated:
        raise ValueError(f"listed more than once: {', '.join(repeated)}")
    return items


_NAME, _TIER_NAME, _ABSOLUTE = r"^\S+$", r"^[a-z0-9-]+$", r"^/"
_PATTERN_MEANINGS = {
    _NAME: "must be non-empty without whitespace",
    _TIER_NAME: "must match [a-z0-9-]+",
    _ABSOLUTE: "must be an absolute path",
}
_Name = Annotated[str, StringConstraints(pattern=_NAME)]
_TierName = Annotated[str, StringConstraints(pattern=_TIER_NAME)]


class TierResources(_Model):
    cpu: _Name = Field(
        description="Extended resource read in milli-cores (the quantity's integer value, as for "
        "Koordinator's `*-cpu` resources, so `500` is half a CPU): a container's request gives "
        "its cpu.shares, its limit the CFS quota."
    )
    memory: _Name = Field(
        description="Extended resource read in bytes: a container's limit gives its memory "
        "limit. Requests of this resource play no part."
    )

    @model_validator(mode="after")
    def _distinct(self) -> TierResources:
        if self.cpu == self.memory:
            raise ValueError("cpu and memory must name different resources")
        return self


# The class names a tier may list; "None" is a pod without the class (no label, nothing to
# infer it from). Literals, not the enums, so that an error lists every accepted name.
_PriorityName = Literal["koord-prod", "koord-mid", "koord-batch", "koord-free", "None"]
_QoSName = Literal["LSE", "LSR", "LS", "BE", "SYSTEM", "None"]
#: The calculators of policy/calculators.py, by the names a tier gives them.
_Calculator = Literal["extended-resources", "cpu-normalization"]


class TierConfig(_Model):
    name: _TierName = Field(
        description="The tier's name, as it appears in logs, decision traces and the `tier` "
        "label of the metrics."
    )
    # Order matters: the first class is inferred for unlabelled pods carrying these resources.
    priority_classes: Annotated[
        tuple[_PriorityName, ...],
        Field(
            min_length=1,
            description="Koordinator priority classes the tier takes; `None` for a pod "
            "whose class is none (no label, nothing to infer it from). The first one listed "
            "is the class inferred for a pod without the priority-class label whose "
            "extended-resource spec names this tier's resources.",
        ),
        AfterValidator(_unique),
    ]
    qos_classes: Annotated[
        tuple[_QoSName, ...],
        Field(
            min_length=1,
            description="Koordinator QoS classes the tier takes; `None` for a pod without "
            "the QoS label.",
        ),
        AfterValidator(_unique),
    ]
    calculator: _Calculator = Field(
        default="extended-resources",
        description="How the tier's pods get their values. `extended-resources` (koordlet's "
        "BatchResource hook): cpu.shares, CFS quota and memory limit from the tier's "
        "extended resources in the extended-resource spec. `cpu-normalization` (koordlet's "
        "CPUNormalization hook): only the CFS quota kubelet set, scaled to "
        "ceil(quota / rules.cpuNormalizationRatio) when the ratio is above 1; pods bound to "
        "a cpuset are left alone; takes no `resources`.",
    )
    resources: TierResources | None = Field(
        default=None,
        description="The extended resources the tier's values are computed from; required "
        "by `extended-resources`, not allowed with `cpu-normalization`.",
    )
    namespaces: (
        Annotated[tuple[_Name, ...], Field(min_length=1), AfterValidator(_unique)] | None
    ) = Field(
        default=None,
        description="Namespaces the tier is limited to; `null` for every namespace. A pod in "
        "another namespace is offered to the next tier.",
    )

    @model_validator(mode="after")
    def _resources_fit_the_calculator(self) -> TierConfig:
        reads = self.calculator in READS_RESOURCES
        if reads and self.resources is None:
            raise ValueError(f"calculator {self.calculator} needs resources")
        if not reads and self.resources is not None:
            raise ValueError(f"calculator {self.calculator} reads no resources")
        return self


# Koordinator's two tiers. Mid is a proposal there (PR #1762): same formulas, mid-* resources.
_DEFAULT_TIERS = tuple(
    TierConfig.model_validate(tier)
    for tier in (
        {
            "name": "batch",
            "priorityClasses": ["koord-batch", "koord-free"],
            "qosClasses": ["BE"],
            "resources": {"cpu": "kubernetes.io/batch-cpu", "memory": "kubernetes.io/batch-memory"},
        },
        {
            "name": "mid",
            "priorityClasses": ["koord-mid"],
            "qosClasses": ["BE", "LS"],
            "resources": {"cpu": "kubernetes.io/mid-cpu", "memory": "kubernetes.io/mid-memory"},
        },
    )
)


class ClassificationConfig(_Model):
    qos_label: _Name = Field(
        default="koordinator.sh/qosClass",
        description="Pod label holding the Koordinator QoS class: `LSE`, `LSR`, `LS`, `BE` or "
        "`SYSTEM`. Any other value means no QoS class, and a pod without one is in no tier.",
    )
    priority_class_label: _Name = Field(
        default="koordinator.sh/priority-class",
        description="Pod label holding the priority class: `koord-prod`, `koord-mid`, "
        "`koord-batch` or `koord-free`. Any other value means no priority class, with no "
        "fallback. Without the label the class is inferred: from the first tier whose "
        "resources the extended-resource spec names, else from the QoS class (`BE` gives "
        "`koord-batch`, any other class `koord-prod`).",
    )
    extended_resource_spec_annotation: _Name = Field(
        default="node.koordinator.sh/extended-resource-spec",
        description="Pod annotation with each container's extended requests and limits (JSON, "
        "written by Koordinator's webhook). A pod without it, or whose annotation has no "
        "`containers` map, is left alone; containers not listed in it are left alone too.",
    )
    qos_from_cgroup_parent: StrictBool = Field(
        default=False,
        description="For a pod without the QoS label, take the class from kubelet's QoS "
        "directory in its cgroup parent: besteffort gives `BE`, burstable `LS`, guaranteed "
        "`LSR`. Koordinator's batch hook reads the label only.",
    )


class RulesConfig(_Model):
    cfs_quota: StrictBool = Field(
        default=True,
        description="`false` gives tier pods and containers no CFS quota (-1), as koordlet does "
        "while the NodeSLO enables BE suppression with `cpuSuppressPolicy: cfsQuota`. A "
        "tighter native quota is still kept.",
    )
    cpu_normalization_ratio: (
        Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)] | None
    ) = Field(
        default=None,
        description="The node's CPU normalization ratio, as Koordinator keeps it in the node "
        "annotation `node.koordinator.sh/cpu-normalization-ratio`. Above 1, every positive "
        "quota becomes ceil(quota / ratio), computed exactly on the decimal written here "
        "(see [numbers](#numbers)); ratios up to 1 are not applied. `null`: no scaling.",
    )


#: The longest period between two convergence passes: a day.
MAX_CONVERGENCE_INTERVAL = 86_400.0


class CgroupsConfig(_Model):
    root: Annotated[str, StringConstraints(pattern=_ABSOLUTE)] = Field(
        default="/sys/fs/cgroup",
        description="Where the cgroup file system is mounted: a cgroup v2 hierarchy (it holds "
        "`cgroup.controllers`) or the directory of the v1 `cpu` and `memory` hierarchies.",
    )
    driver: CgroupDriver = Field(
        default=CgroupDriver.AUTO,
        description="How pod cgroup parents are spelled, as kubelet's `--cgroup-driver`: "
        "`cgroupfs` (`/kubepods/besteffort/pod<uid>`), `systemd` "
        "(`kubepods-besteffort-pod<uid>.slice`), or `auto`: systemd when the parent ends in "
        "`.slice`. Only `systemd` also has systemd hold the values over D-Bus and puts them "
        "back after a `systemctl daemon-reload` (cgroup v2; read at start; see install.md).",
    )
    pod_level: StrictBool = Field(
        default=True,
        description="`false`: adjust containers only; pod cgroup files the plugin set go "
        "back to kubelet's values, and no other is written (at RunPodSandbox, Synchronize or "
        "a reload).",
    )


class ConvergenceConfig(_Model):
    interval_seconds: float = Field(
        default=10.0,
        ge=0,
        le=MAX_CONVERGENCE_INTERVAL,
        allow_inf_nan=False,
        description="How often the plugin compares every pod's and container's cgroup files "
        "with the values it keeps in force, and repairs what another writer changed (kubelet "
        "after a resize, an operator, another agent): the promise holds within this many "
        "seconds, plus twice a pass's duration, of the last write by anyone (see "
        "[convergence](#convergence-whoever-wrote-last)). About koordlet's own period. `0`: "
        "no periodic pass; a pod is still checked again shortly after each resize.",
    )


class Config(_Model):
    mode: Mode = Field(
        default=Mode.ENFORCE,
        description="`enforce`: set the values. `observe`: decide as in `enforce`, log "
        "(`would set`) and count (`nri_midbatch_observed_total`) what would be set and "
        "whether it differs from what the container or pod has, and set nothing: no "
        "container adjustment, and what enforce mode set goes back to kubelet's values. A "
        "reload from `observe` to `enforce` brings every running tier workload to its values.",
    )
    failure_policy: FailurePolicy = Field(
        default=FailurePolicy.IGNORE,
        description="What happens when a tier pod cannot be decided (an unusable "
        "extended-resource spec, a value beyond int64) or its pod cgroup cannot be written. "
        "`Ignore` (koordlet's default): log a warning, count it, and leave the pod or "
        "container as kubelet and the runtime made it. `Fail`: also answer the runtime with "
        "an error, so it refuses to run the pod, create the container or update it. "
        "Synchronize is never refused.",
    )
    tiers: tuple[TierConfig, ...] = Field(
        default=_DEFAULT_TIERS,
        description="The tiers, walked in order: a pod joins the first one that takes its "
        "priority class, its QoS class and its namespace. A pod in no tier is left alone; an "
        "empty list leaves every pod alone. Defaults: Koordinator's batch tier and the mid "
        "tier of its proposal (PR #1762).",
    )
    classification: ClassificationConfig = Field(
        default=ClassificationConfig(),
        description="Where a pod's QoS class, priority class and extended resources are read.",
    )
    rules: RulesConfig = Field(
        default=RulesConfig(),
        description="The node-level rules koordlet takes from the NodeSLO and the node; here "
        "they are set per configuration.",
    )
    cgroups: CgroupsConfig = Field(
        default=CgroupsConfig(),
        description="The pod-level cgroup files, which are written directly (NRI cannot "
        "adjust a pod sandbox).",
    )

    convergence: ConvergenceConfig = Field(
        default=ConvergenceConfig(),
        description="The periodic pass that brings cgroup files others changed back to the "
        "values in force.",
    )

    @field_validator("tiers")
    @classmethod
    def _tiers_are_unambiguous(cls, tiers: tuple[TierConfig, ...]) -> tuple[TierConfig, ...]:
        names: set[str] = set()
        claims: dict[tuple[str, str], str] = {}
        resources: dict[str, str] = {}
        for index, tier in enumerate(tiers):
            this = f"{index} ({tier.name})"
            if tier.name in names:
                raise ValueError(f"tier {this}: name {tier.name!r} is already used")
            names.add(tier.name)
            for pair in ((p, q) for p in tier.priority_classes for q in tier.qos_classes):
                if pair in claims:
                    raise ValueError(
                        f"tiers {claims[pair]} and {this} both claim priority {pair[0]} "
                        f"with qos {pair[1]}; a pod must map to one tier"
                    )
                claims[pair] = this
            read = () if tier.resources is None else (tier.resources.cpu, tier.resources.memory)
            for resource in read:
                if resource in resources:
                    raise ValueError(
                        f"tiers {resources[resource]} and {this} both read resource {resource!r}"
                    )
                resources[resource] = this
        return tiers


#: The most a configuration may hold (bounded_yaml.py has this bound and the others).
MAX_CONFIG_BYTES = MAX_BYTES


def load_startup_config(path: str | Path | None) -> Config:
    """The configuration a command starts with: the file's, or the defaults without one."""
    return load_config_file(path) if path else Config()


def load_config_text(text: str, source: str) -> Config:
    """Parse YAML text; empty text gives the defaults. `source` names the origin in errors.

    Every way the text can fail to load is a ConfigError, so a caller that keeps the
    previous configuration on a ConfigError never meets anything else.
    """
    try:
        document = load_yaml(text, source)
    except UntrustedInputError as error:
        raise ConfigError(str(error)) from None
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of settings")
    try:
        return Config.model_validate(document)
    except ValidationError as error:
        raise ConfigError(f"{source}: " + "; ".join(_describe(e) for e in error.errors())) from None
    except Exception as error:  # a validator meeting something no rule foresaw
        raise ConfigError(f"{source}: cannot be used: {reason(error)}") from None


def load_config_file(path: str | Path) -> Config:
    return load_config_text(read_config_file(path), str(path))


def read_config_file(path: str | Path) -> str:
    """The file's text, if it is a regular file of at most MAX_CONFIG_BYTES of UTF-8."""
    try:
        return read_file(path)
    except UntrustedInputError as error:
        raise ConfigError(str(error)) from None


def effective_config_yaml(config: Config) -> str:
    """Every setting, defaults included, as YAML that load_config_text accepts."""
    data = config.model_dump(mode="json", by_alias=True)
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def _describe(error: ErrorDetails) -> str:
    path = ".".join(str(part) for part in error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        message = "unknown key"
    elif kind == "too_short":
        message = "must not be empty"
    elif kind == "float_type":
        message = f"must be a decimal number ({DECIMAL_SYNTAX}), not {error['input']!r}"
    elif kind == "string_pattern_mismatch":
        message = _PATTERN_MEANINGS[str(error.get("ctx", {}).get("pattern"))]
    else:
        message = error["msg"].removeprefix("Value error, ")
    return f"{path}: {message}" if path else message
