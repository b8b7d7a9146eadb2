"""Why a pod gets the cgroup values it gets: classification, tier, formulas and rules.

Input is a Kubernetes Pod manifest (what an operator has at hand) or an NRI PodSandbox as JSON
(what a recording holds). A manifest is turned into the views the runtime would give the plugin:
kubelet's QoS cgroup parent, and the CFS quota and memory limit kubelet sets from native limits,
which the policy never loosens. A PodSandbox lists no containers, so its containers are the ones
named in the extended-resource spec.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from google.protobuf.json_format import ParseDict, ParseError

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.cgroups.paths import KubeletRoot, kubelet_root
from nri_midbatch.config.bounded_yaml import UntrustedInputError, load_yaml, read_file
from nri_midbatch.config.compile import compile_policy
from nri_midbatch.config.model import Config
from nri_midbatch.plugin.codec import pod_view
from nri_midbatch.policy import (
    CgroupValues,
    Classified,
    ContainerView,
    Decision,
    NativeLimits,
    PodView,
    Policy,
    decide_container,
    decide_pod,
)
from nri_midbatch.policy.calculate import CFS_BASE_PERIOD, UNLIMITED
from nri_midbatch.policy.chain import check_tier
from nri_midbatch.policy.qos import ContainerResourceLists, kubernetes_qos, qos_cgroup_parent
from nri_midbatch.policy.quantity import Quantity, QuantityError, parse_quantity
from nri_midbatch.policy.spec import ExtendedSpec, load_spec
from nri_midbatch.policy.trace import NoTier, TierCheck
from nri_midbatch.recording.call import NotedDecision
from nri_midbatch.recording.format import decision_json


class PodInputError(ValueError):
    """The file is not a Pod manifest or PodSandbox the explainer can read."""


class NotAPodError(PodInputError):
    """The file is some other object (a Deployment, a configuration): exit status 2."""


@dataclass(frozen=True, slots=True)
class PodInput:
    pod: PodView
    containers: tuple[ContainerView, ...]
    #: Where the container list came from, for the reader.
    containers_from: str


# -- reading -----------------------------------------------------------------


def load_pod(path: Path, policy: Policy, kubelet_root: KubeletRoot = ()) -> PodInput:
    """The pod a manifest or PodSandbox file describes, read within the configuration's bounds.

    The file is anyone's, so it is read as a configuration is (bounded_yaml.py): a regular
    file only, at most 1 MiB, nested at most 32 deep; JSON is read as the YAML it is.
    kubelet_root: kubelet's --cgroup-root, where a manifest's pod cgroup is.
    """
    try:
        document = load_yaml(read_file(path), str(path))
    except UntrustedInputError as exc:
        raise PodInputError(str(exc)) from None
    if not isinstance(document, dict):
        raise PodInputError(f"{path}: expected a Pod manifest or a PodSandbox object")
    kind = document.get("kind")
    if kind == "Pod" or (kind is None and "spec" in document):
        return _from_manifest(document, path, kubelet_root)
    if kind is not None:
        raise NotAPodError(
            f"{path}: a {kind!s:.100}, not a Pod: explain reads a Pod manifest or an NRI "
            "PodSandbox (for a workload's pods, one of them: kubectl get pod NAME -o yaml)"
        )
    if not _SANDBOX_KEYS.intersection(document):
        # Parsed leniently (a newer runtime's fields), anything would be an empty sandbox.
        raise NotAPodError(
            f"{path}: neither a Pod manifest (kind: Pod) nor an NRI PodSandbox (it has none "
            f"of {', '.join(sorted(_SANDBOX_FIELDS))})"
        )
    return _from_sandbox(document, path, policy)


#: A PodSandbox's fields, as protobuf JSON spells them (proto names and JSON names).
_SANDBOX_FIELDS = frozenset(field.name for field in api.PodSandbox.DESCRIPTOR.fields)
_SANDBOX_KEYS = _SANDBOX_FIELDS | {field.json_name for field in api.PodSandbox.DESCRIPTOR.fields}


def _from_sandbox(document: dict[str, Any], path: Path, policy: Policy) -> PodInput:
    try:
        sandbox = ParseDict(document, api.PodSandbox(), ignore_unknown_fields=True)
    except ParseError as exc:
        raise PodInputError(f"{path}: not an NRI PodSandbox: {exc}") from None
    pod = pod_view(sandbox)
    annotation = pod.annotations.get(policy.spec_annotation)
    spec = None if annotation is None else load_spec(annotation)
    names = sorted(spec.containers) if isinstance(spec, ExtendedSpec) else []
    containers = tuple(ContainerView(id="", name=name) for name in names)
    return PodInput(pod, containers, "the extended-resource spec (a PodSandbox lists none)")


def _from_manifest(document: dict[str, Any], path: Path, kubelet_root: KubeletRoot) -> PodInput:
    metadata = _mapping(document.get("metadata"), "metadata", path)
    spec = _mapping(document.get("spec"), "spec", path)
    uid = str(metadata.get("uid", ""))
    containers: list[ContainerView] = []
    limits: list[NativeLimits] = []
    resources: list[ContainerResourceLists] = []
    raw_containers = spec.get("containers")
    if not isinstance(raw_containers, list):
        raise PodInputError(f"{path}: spec.containers must be a list")
    raw_init = spec.get("initContainers") or []
    if not isinstance(raw_init, list):
        raise PodInputError(f"{path}: spec.initContainers must be a list")
    for field, entries in (("initContainers", raw_init), ("containers", raw_containers)):
        for index, raw in enumerate(entries):
            where = f"spec.{field}[{index}]"
            entry = _mapping(raw, where, path)
            name = entry.get("name")
            if not isinstance(name, str) or not name:
                raise PodInputError(f"{path}: {where}.name must be a non-empty string")
            declared = _mapping(entry.get("resources") or {}, f"{where}.resources", path)
            requests = _resource_list(declared.get("requests"), f"{where}.resources.requests", path)
            limit = _resource_list(declared.get("limits"), f"{where}.resources.limits", path)
            # Init containers count for the QoS class only: they are gone when the app runs.
            resources.append((requests, limit))
            if field == "containers":
                native = _native(limit)
                containers.append(ContainerView(id="", name=name, native=native))
                limits.append(native)
    parent = "/".join(("", *kubelet_root, qos_cgroup_parent(kubernetes_qos(resources), uid)[1:]))
    pod = PodView(
        uid=uid,
        namespace=str(metadata.get("namespace", "default")),
        name=str(metadata.get("name", "")),
        labels=_strings(metadata.get("labels"), "metadata.labels", path),
        annotations=_strings(metadata.get("annotations"), "metadata.annotations", path),
        cgroup_parent=parent,
        native=_pod_native(limits),
    )
    return PodInput(pod, tuple(containers), "spec.containers")


def _mapping(value: object, where: str, path: Path) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    raise PodInputError(f"{path}: {where} must be a mapping")


def _strings(value: object, where: str, path: Path) -> dict[str, str]:
    if value is None:
        return {}
    mapping = _mapping(value, where, path)
    # Kubernetes only has string values; YAML may have read `5000` as a number.
    return {str(key): str(item) for key, item in mapping.items()}


def _resource_list(value: object, where: str, path: Path) -> dict[str, Quantity]:
    parsed: dict[str, Quantity] = {}
    for name, raw in _strings(value, where, path).items():
        try:
            parsed[name] = parse_quantity(raw)
        except QuantityError as exc:
            raise PodInputError(f"{path}: {where}.{name}: {exc}") from None
    return parsed


def _native(limits: Mapping[str, Quantity]) -> NativeLimits:
    """What kubelet asks the runtime for: quota = milli-cores x period / 1000 (at least 1000)."""
    cpu_limit, memory_limit = limits.get("cpu"), limits.get("memory")
    cpu = None if cpu_limit is None else cpu_limit.milli_value()
    memory = None if memory_limit is None else memory_limit.value()
    quota = None if not cpu else max(cpu * CFS_BASE_PERIOD // 1000, 1000)
    return NativeLimits(
        cpu_quota=quota,
        cpu_period=None if quota is None else CFS_BASE_PERIOD,
        memory_limit=memory or None,
    )


def _pod_native(limits: Sequence[NativeLimits]) -> NativeLimits:
    """Kubelet limits the pod cgroup only when every container has the limit."""
    quotas = [n.cpu_quota for n in limits]
    memories = [n.memory_limit for n in limits]
    quota = sum(q for q in quotas if q) if limits and all(quotas) else None
    memory = sum(m for m in memories if m) if limits and all(memories) else None
    return NativeLimits(
        cpu_quota=quota,
        cpu_period=None if quota is None else CFS_BASE_PERIOD,
        memory_limit=memory,
    )


# -- explaining --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Explanation:
    pod: PodInput
    pod_decision: Decision
    containers: tuple[tuple[ContainerView, Decision], ...]
    #: One line per tier: matched, or why not.
    tiers: tuple[str, ...]
    pod_level: bool
    failure_policy: str
    mode: str = "enforce"


def explain(source: PodInput, config: Config, policy: Policy) -> Explanation:
    pod = source.pod
    pod_decision = decide_pod(pod, policy)
    decided = tuple((c, decide_container(pod, c, policy)) for c in source.containers)
    return Explanation(
        pod=source,
        pod_decision=pod_decision,
        containers=decided,
        tiers=_tier_lines(pod_decision, policy, pod.namespace),
        pod_level=config.cgroups.pod_level,
        failure_policy=str(config.failure_policy),
        mode=str(config.mode),
    )


def _tier_lines(decision: Decision, policy: Policy, namespace: str) -> tuple[str, ...]:
    # The chain stops at the first match; the tiers after it are checked here too, so the
    # reader learns why every other tier does not apply (the configuration lets only one match).
    priority, qos = decision.priority.value, decision.qos.value
    walked = {step.tier: step for step in decision.trace if isinstance(step, TierCheck)}
    lines = [
        str(walked.get(tier.name) or check_tier(tier, priority, qos, namespace))
        for tier in policy.chain.tiers
    ]
    if decision.tier is None:
        lines.append("no tier matched: the pod is left alone")
    return tuple(lines)


def _how(decision: Decision) -> list[str]:
    """The trace without the classification and tier walk, which are shown once per pod."""
    return [
        str(step)
        for step in decision.trace
        if not isinstance(step, Classified | TierCheck | NoTier)
    ]


# -- rendering ---------------------------------------------------------------


def quota_text(quota: int) -> str:
    if quota == UNLIMITED:
        return "unlimited"
    cpus = f"{quota / CFS_BASE_PERIOD:.3f}".rstrip("0").rstrip(".")
    return f"{quota} ({cpus} CPU)"


def memory_short(memory: int) -> str:
    """512Mi where the byte count is a whole number of Ki, Mi or Gi."""
    if memory == UNLIMITED:
        return "unlimited"
    for unit, size in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if memory >= size and memory % size == 0:
            return f"{memory // size}{unit}"
    return str(memory)


def memory_text(memory: int) -> str:
    short = memory_short(memory)
    return short if short in ("unlimited", str(memory)) else f"{memory} ({short})"


def _kept(value: int | None, text: Callable[[int], str]) -> str:
    return "left as kubelet set it" if value is None else text(value)


def values_lines(values: CgroupValues) -> list[str]:
    return [
        f"cpu.shares    {_kept(values.cpu_shares, str)}",
        f"cpu quota     {quota_text(values.cpu_quota)} per {CFS_BASE_PERIOD}us period",
        f"memory limit  {_kept(values.memory_limit, memory_text)}",
    ]


def render_text(explanation: Explanation) -> str:
    source = explanation.pod
    pod = source.pod
    decision = explanation.pod_decision
    out = [
        f"Pod {pod.namespace}/{pod.name} (uid {pod.uid or '-'})",
        f"  cgroup parent  {pod.cgroup_parent or '-'}",
        "",
        *(
            ["Mode: observe (these values would be set; nothing is written)", ""]
            if explanation.mode == "observe"
            else []
        ),
        "Classification",
        f"  {decision.qos.detail}",
        f"  {decision.priority.detail}",
        "",
        f"Tier: {decision.tier or 'none'}",
        *(f"  {line}" for line in explanation.tiers),
    ]
    where = "written to the pod cgroup at RunPodSandbox and Synchronize"
    if not explanation.pod_level:
        where = "not written: cgroups.podLevel is false"
    out += ["", f"Pod level ({where})", *_native_lines(pod.native)]
    out += _decision_lines(decision, explanation.failure_policy)
    if not source.containers:
        out += ["", f"No containers in {source.containers_from}."]
    for container, container_decision in explanation.containers:
        out += [
            "",
            f"Container {container.name} (adjusted at CreateContainer and UpdateContainer)",
            *_native_lines(container.native),
        ]
        out += _decision_lines(container_decision, explanation.failure_policy)
    if source.containers and source.containers_from != "spec.containers":
        out += ["", f"Containers from {source.containers_from}."]
    return "\n".join(out) + "\n"


def _native_lines(native: NativeLimits) -> list[str]:
    if not (native.cpu_quota or native.memory_limit):
        return []
    quota = "none" if not native.cpu_quota else str(native.cpu_quota)
    memory = "none" if not native.memory_limit else memory_text(native.memory_limit)
    return [f"  native limits cpu quota {quota}, memory {memory} (never loosened)"]


def _decision_lines(decision: Decision, failure_policy: str) -> list[str]:
    lines: list[str] = []
    if decision.error is not None:
        outcome = (
            "the runtime is told to refuse it" if failure_policy == "Fail" else "left untouched"
        )
        lines.append(f"  error: {decision.error}")
        lines.append(f"  failurePolicy {failure_policy}: {outcome}")
    elif decision.values is None:
        lines.append("  left untouched: values stay as kubelet and the runtime set them")
    else:
        lines += [f"  {line}" for line in values_lines(decision.values)]
    how = _how(decision)
    if how:
        lines.append("  how:")
        lines += [f"    - {line}" for line in how]
    return lines


def render_json(explanation: Explanation) -> str:
    pod = explanation.pod.pod
    document = {
        "pod": decision_json(NotedDecision(pod, None, explanation.pod_decision)),
        "containers": [
            decision_json(NotedDecision(pod, container, decision))
            for container, decision in explanation.containers
        ],
        "tiers": list(explanation.tiers),
        "pod_level": explanation.pod_level,
        "failure_policy": explanation.failure_policy,
        "mode": explanation.mode,
    }
    return json.dumps(document, indent=2) + "\n"


def explain_command(pod_file: Path, config: Config, *, fmt: str, out: TextIO, err: TextIO) -> int:
    """`nri-midbatch explain`: 0 when explained, 1 when the pod file cannot be read, 2 when
    it is not a pod at all."""
    policy = compile_policy(config)
    try:
        source = load_pod(pod_file, policy, kubelet_root(config.cgroups.kubelet_cgroup_root))
    except PodInputError as exc:
        err.write(f"nri-midbatch: {exc}\n")
        return 2 if isinstance(exc, NotAPodError) else 1
    explanation = explain(source, config, policy)
    out.write(render_json(explanation) if fmt == "json" else render_text(explanation))
    return 0
