"""The YAML configuration: camelCase keys, unknown keys rejected, defaults = Koordinator."""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Hashable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

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

from .policy import PriorityClass, QoSClass

__all__ = [
    "Config",
    "ConfigError",
    "effective_config_yaml",
    "load_config_file",
    "load_config_text",
]


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the source and the field path."""


class FailurePolicy(StrEnum):
    IGNORE = "Ignore"
    FAIL = "Fail"


class CgroupDriver(StrEnum):
    AUTO = "auto"
    CGROUPFS = "cgroupfs"
    SYSTEMD = "systemd"


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
    cpu: _Name
    memory: _Name

    @model_validator(mode="after")
    def _distinct(self) -> TierResources:
        if self.cpu == self.memory:
            raise ValueError("cpu and memory must name different resources")
        return self


class TierConfig(_Model):
    name: _TierName
    # Order matters: the first class is inferred for unlabelled pods carrying these resources.
    priority_classes: Annotated[
        tuple[PriorityClass, ...], Field(min_length=1), AfterValidator(_unique)
    ]
    qos_classes: Annotated[tuple[QoSClass, ...], Field(min_length=1), AfterValidator(_unique)]
    resources: TierResources
    namespaces: (
        Annotated[tuple[_Name, ...], Field(min_length=1), AfterValidator(_unique)] | None
    ) = None


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
    qos_label: _Name = "koordinator.sh/qosClass"
    priority_class_label: _Name = "koordinator.sh/priority-class"
    extended_resource_spec_annotation: _Name = "node.koordinator.sh/extended-resource-spec"
    qos_from_cgroup_parent: StrictBool = False


class RulesConfig(_Model):
    cfs_quota: StrictBool = True
    cpu_normalization_ratio: (
        Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)] | None
    ) = None


class CgroupsConfig(_Model):
    root: Annotated[str, StringConstraints(pattern=_ABSOLUTE)] = "/sys/fs/cgroup"
    driver: CgroupDriver = CgroupDriver.AUTO
    pod_level: StrictBool = True


class Config(_Model):
    failure_policy: FailurePolicy = FailurePolicy.IGNORE
    tiers: tuple[TierConfig, ...] = _DEFAULT_TIERS
    classification: ClassificationConfig = ClassificationConfig()
    rules: RulesConfig = RulesConfig()
    cgroups: CgroupsConfig = CgroupsConfig()

    @field_validator("tiers")
    @classmethod
    def _tiers_are_unambiguous(cls, tiers: tuple[TierConfig, ...]) -> tuple[TierConfig, ...]:
        names: set[str] = set()
        claims: dict[tuple[PriorityClass, QoSClass], str] = {}
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
            for resource in (tier.resources.cpu, tier.resources.memory):
                if resource in resources:
                    raise ValueError(
                        f"tiers {resources[resource]} and {this} both read resource {resource!r}"
                    )
                resources[resource] = this
        return tiers


def load_config_text(text: str, source: str) -> Config:
    """Parse YAML text; empty text gives the defaults. `source` names the origin in errors."""
    stream = io.StringIO(text)
    stream.name = source  # PyYAML quotes the stream name in error marks
    try:
        document = yaml.load(stream, Loader=_StrictLoader)
    except yaml.YAMLError as error:
        raise ConfigError(f"{source}: not valid YAML: {error}") from None
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of settings")
    try:
        return Config.model_validate(document)
    except ValidationError as error:
        raise ConfigError(f"{source}: " + "; ".join(_describe(e) for e in error.errors())) from None


def load_config_file(path: str | Path) -> Config:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text: {error}") from None
    return load_config_text(text, str(path))


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
    elif kind == "string_pattern_mismatch":
        message = _PATTERN_MEANINGS[str(error.get("ctx", {}).get("pattern"))]
    else:
        message = error["msg"].removeprefix("Value error, ")
    return f"{path}: {message}" if path else message


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key written twice in one mapping instead of keeping the last."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
