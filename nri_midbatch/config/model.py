"""The YAML configuration: camelCase keys, unknown keys rejected, defaults = Koordinator.

Longer than the house's 400 lines: every key of the configuration is a model here, with
the bounded YAML reading they go through; docs/configuration.md is generated from this file.
"""

from __future__ import annotations

import io
import os
import re
import stat
from collections import Counter
from collections.abc import Hashable
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal

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
from nri_midbatch.config.settings import ConfigError, FailurePolicy, Mode
from nri_midbatch.policy.calculators import READS_RESOURCES

__all__ = [
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


#: The most a configuration may hold, read from a file or from NRI's Configure: a
#: ConfigMap's own limit, and far above any real configuration (the defaults are 1.5 KB).
MAX_CONFIG_BYTES = 1024 * 1024
#: The deepest nesting a configuration may have (the model itself goes 4 levels deep).
MAX_DEPTH = 32
#: The most YAML nodes a document may stand for once every alias is expanded, so an alias
#: bomb (a few lines that reference each other into billions of nodes) is refused while
#: it is still a few lines; a configuration with 100 tiers has about 2,000.
MAX_NODES = 20_000


def load_startup_config(path: str | Path | None) -> Config:
    """The configuration a command starts with: the file's, or the defaults without one."""
    return load_config_file(path) if path else Config()


def load_config_text(text: str, source: str) -> Config:
    """Parse YAML text; empty text gives the defaults. `source` names the origin in errors.

    Every way the text can fail to load is a ConfigError, so a caller that keeps the
    previous configuration on a ConfigError never meets anything else.
    """
    if len(text) > MAX_CONFIG_BYTES or len(text.encode("utf-8", "surrogatepass")) > (
        MAX_CONFIG_BYTES
    ):
        raise ConfigError(f"{source}: larger than {MAX_CONFIG_BYTES} bytes")
    stream = io.StringIO(text)
    stream.name = source  # PyYAML quotes the stream name in error marks
    try:
        document = yaml.load(stream, Loader=_StrictLoader)
    except yaml.YAMLError as error:
        raise ConfigError(f"{source}: not valid YAML: {error}") from None
    except Exception as error:  # e.g. an integer of 5,000 digits (ValueError)
        raise ConfigError(f"{source}: not valid YAML: {_reason(error)}") from None
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of settings")
    try:
        return Config.model_validate(document)
    except ValidationError as error:
        raise ConfigError(f"{source}: " + "; ".join(_describe(e) for e in error.errors())) from None
    except Exception as error:  # a validator meeting something no rule foresaw
        raise ConfigError(f"{source}: cannot be used: {_reason(error)}") from None


def load_config_file(path: str | Path) -> Config:
    return load_config_text(read_config_file(path), str(path))


def read_config_file(path: str | Path) -> str:
    """The file's text, if it is a regular file of at most MAX_CONFIG_BYTES of UTF-8.

    The path may be a symlink (a mounted ConfigMap is one), so what it resolves to is
    checked: a FIFO would block the reader and a device (/dev/zero) never ends. The
    open does not block either way, and the file is checked again once open, in case
    it was swapped in between.
    """
    try:
        _check_regular(path, os.stat(path).st_mode)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror or error}") from None
    try:
        _check_regular(path, os.fstat(fd).st_mode)
        data = _read_at_most(fd, MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror or error}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text: {error}") from None


def _check_regular(path: str | Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a special file (FIFO, socket or device)"
        raise ConfigError(f"{path}: cannot read: {kind}, not a regular file")


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = os.read(fd, limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _reason(error: Exception) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


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


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that bounds the document's shape and rejects a key written twice.

    PyYAML composes nested nodes recursively: nesting thousands deep would end in a
    RecursionError, so depth is counted as nodes are composed. Aliases share nodes, so
    the document is measured as if every alias were expanded, in one pass over its
    distinct nodes.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"nested more than {MAX_DEPTH} levels deep",
                    self.peek_event().start_mark,  # type: ignore[no-untyped-call]
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> yaml.Node | None:
        node = super().compose_document()
        if node is not None:
            _expanded_size(node, {}, set())
        return node


def _expanded_size(
    node: yaml.Node, sizes: dict[int, tuple[int, int]], open_: set[int]
) -> tuple[int, int]:
    """(nodes, depth) of `node` with every alias expanded; raises past the bounds."""
    key = id(node)
    known = sizes.get(key)
    if known is not None:
        return known
    if key in open_:
        raise yaml.composer.ComposerError(
            None, None, "an alias refers to a node that contains it", node.start_mark
        )
    open_.add(key)
    count, depth = 1, 0
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    for child in children:
        child_count, child_depth = _expanded_size(child, sizes, open_)
        count += child_count
        depth = max(depth, child_depth)
        if count > MAX_NODES:
            raise yaml.composer.ComposerError(
                None,
                None,
                f"stands for more than {MAX_NODES} values once its aliases are expanded",
                node.start_mark,
            )
    depth += 1
    if depth > MAX_DEPTH:
        raise yaml.composer.ComposerError(
            None,
            None,
            f"nested more than {MAX_DEPTH} levels deep once its aliases are expanded",
            node.start_mark,
        )
    open_.discard(key)
    sizes[key] = (count, depth)
    return count, depth


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


# -- numbers ------------------------------------------------------------------------------
#: How the configuration writes a number, for error messages and docs.
DECIMAL_SYNTAX = "digits with an optional sign, fraction and exponent: 2, 1.2, .5, 12e-1, 1e300"
#: The one grammar of numbers here: a decimal. YAML 1.1, which PyYAML reads, also takes
#: 0x10, 0o17, 010 (octal), 1_000 and 1:30 (base 60) for numbers, and reads 1e300 (an
#: exponent without a dot) as text; none of those is what "the decimal written" means.
_DECIMAL = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?\Z")
_INTEGER = re.compile(r"[-+]?[0-9]+\Z")
_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"


def _construct_number(loader: _StrictLoader, node: yaml.ScalarNode) -> int | float:
    """A decimal as the double that is exactly it (compile reads the ratio back by repr).

    Explicit `!!int` and `!!float` tags come here too, so no other spelling gets in.
    """
    text = loader.construct_scalar(node)
    if not _DECIMAL.match(text):
        raise yaml.constructor.ConstructorError(
            None, None, f"{text!r} is not a decimal number ({DECIMAL_SYNTAX})", node.start_mark
        )
    value = float(text)
    # Decimal compares exponents as numbers: no power of ten is built for 1e999999.
    if Decimal(repr(value)) != Decimal(text):
        raise yaml.constructor.ConstructorError(
            None,
            None,
            f"{text} cannot be held exactly as a double (any decimal of up to 15 "
            "significant digits between 1e-308 and 1e308 can)",
            node.start_mark,
        )
    return int(text) if _INTEGER.match(text) else value


_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag not in (_INT_TAG, _FLOAT_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(_FLOAT_TAG, _DECIMAL, list("-+.0123456789"))
_StrictLoader.add_constructor(_INT_TAG, _construct_number)
_StrictLoader.add_constructor(_FLOAT_TAG, _construct_number)
