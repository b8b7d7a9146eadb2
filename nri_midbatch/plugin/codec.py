"""NRI messages to the policy's views, and values back into NRI messages.

What the plugin reads of a pod sandbox and a container (labels, annotations,
cgroup parent, the limits kubelet set), the native-limits annotation that keeps
kubelet's limits across our own adjustments, and the LinuxResources that carry
our values back. `explain` and `replay` read NRI messages through these too.
"""

from __future__ import annotations

import functools
import json
from sys import intern

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.policy import CgroupValues, ContainerView, NativeLimits, PodView
from nri_midbatch.policy.bounded_cache import INPUT_CACHE_BYTES, BoundedCache
from nri_midbatch.policy.holdable import unholdable_kubelet

# An absent optional value reads as 0, which counts as unset here anyway:
# reading `.value` without HasField gives the same answer for half the cost.


def native_limits(resources: api.LinuxResources) -> NativeLimits:
    """Finite limits the runtime or kubelet already set; None where unlimited."""
    return limits_and_values(resources)[0]


def current_values(resources: api.LinuxResources) -> CgroupValues:
    """A container's values as the runtime reports them, unlimited as -1 (see native_limits)."""
    return limits_and_values(resources)[1]


# Nodes have few distinct kubelet limits (often just the 100000us period):
# the caches below hold each once, bounded in case a node has many.
DISTINCT_LIMITS = 1024
#: Resources longer than this (a large `unified` map, many devices) are read
#: field by field rather than remembered by their bytes: no container's usual
#: resources take more, so longer ones would only crowd the cache.
MAX_REMEMBERED_RESOURCES_BYTES = 256


def limits_and_values(resources: api.LinuxResources) -> tuple[NativeLimits, CgroupValues]:
    """native_limits and current_values of the same resources.

    Remembered by the resources' bytes: serializing the few bytes a container's
    resources take costs a third of reading the five nested fields through
    protobuf's wrappers, and a node's containers share a handful of values.
    """
    key = resources.SerializeToString()
    if len(key) > MAX_REMEMBERED_RESOURCES_BYTES:
        return _read_limits_and_values(resources)
    return _remembered_limits_and_values(key)


def _limits_and_values_of(key: bytes) -> tuple[NativeLimits, CgroupValues]:
    return _read_limits_and_values(api.LinuxResources.FromString(key))


remembered_resources: BoundedCache[bytes, tuple[NativeLimits, CgroupValues]] = BoundedCache(
    DISTINCT_LIMITS, INPUT_CACHE_BYTES
)
_remembered_limits_and_values = remembered_resources.memoize(_limits_and_values_of)


def _read_limits_and_values(resources: api.LinuxResources) -> tuple[NativeLimits, CgroupValues]:
    cpu = resources.cpu
    shares, quota, limit = cpu.shares.value, cpu.quota.value, resources.memory.limit.value
    return (
        _native_limits(quota, cpu.period.value, limit, shares),
        _current_values(shares, quota, limit),
    )


@functools.lru_cache(maxsize=DISTINCT_LIMITS)
def _native_limits(quota: int, period: int, limit: int, shares: int = 0) -> NativeLimits:
    """One instance per distinct value: remembered containers mostly share a handful."""
    return NativeLimits(
        cpu_quota=quota if quota > 0 else None,
        cpu_period=period if period > 0 else None,
        memory_limit=limit if limit > 0 else None,
        cpu_shares=shares if shares > 0 else None,
    )


def runtime_pod_baseline(pod: api.PodSandbox) -> NativeLimits | None:
    """Kubelet's pod cgroup values as the runtime tells them; None where it does not.

    containerd 2.x passes the pod's resources, the sum of its containers', and its overhead
    apart; kubelet's pod cgroup holds both (its pod resource config adds the overhead), and so
    is the baseline. containerd 1.7 passes neither.
    """
    linux = pod.linux
    if not linux.HasField("pod_resources"):
        return None
    resources = native_limits(linux.pod_resources)
    overhead = native_limits(linux.pod_overhead)
    return NativeLimits(
        cpu_quota=_with_overhead(resources.cpu_quota, overhead.cpu_quota),
        cpu_period=resources.cpu_period,
        memory_limit=_with_overhead(resources.memory_limit, overhead.memory_limit),
        cpu_shares=_with_overhead(resources.cpu_shares, overhead.cpu_shares),
    )


def _with_overhead(value: int | None, overhead: int | None) -> int | None:
    """A limit plus the overhead's part of it; unlimited stays unlimited."""
    if value is None:
        return None
    return value + (overhead or 0)


def pod_view(pod: api.PodSandbox, native: NativeLimits | None = None) -> PodView:
    """The pod; `native`: kubelet's values for its cgroup where known, else the runtime's."""
    linux = pod.linux
    if native is None:
        native = runtime_pod_baseline(pod) or NativeLimits()
    return PodView(
        uid=pod.uid,
        namespace=pod.namespace,
        name=pod.name,
        labels=pod.labels,
        annotations=pod.annotations,
        cgroup_parent=linux.cgroup_parent,
        native=native,
    )


def container_view(
    container: api.Container,
    resources: api.LinuxResources | None = None,
    *,
    native_known: bool = True,
    native: NativeLimits | None = None,
) -> ContainerView:
    """The container; `native`: `native_limits` of its resources, if the caller has it."""
    if native is None:
        native = native_limits(resources if resources is not None else container.linux.resources)
    return ContainerView(
        id=container.id,
        name=intern(container.name),
        native=native,
        native_known=native_known,
    )


#: On containers we adjust: the limits kubelet gave them, before ours. A
#: running container's resources already hold our values, which must not be
#: mistaken for kubelet's when a restarted plugin synchronizes.
NATIVE_LIMITS_ANNOTATION = "nri-midbatch.io/native-limits"
_NATIVE_KEYS = (
    ("cpuQuota", "cpu_quota"),
    ("cpuPeriod", "cpu_period"),
    ("memoryLimit", "memory_limit"),
    # From this version on: without them, kubelet's shares cannot be given back.
    ("cpuShares", "cpu_shares"),
)


@functools.lru_cache(maxsize=DISTINCT_LIMITS)
def encode_native_limits(native: NativeLimits) -> str:
    present = {key: getattr(native, attr) for key, attr in _NATIVE_KEYS}
    return json.dumps({k: v for k, v in present.items() if v is not None}, separators=(",", ":"))


def _decoded_native_limits(text: str) -> NativeLimits | None:
    """The remembered limits, or None if the text is not what we write."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not set(data) <= {key for key, _ in _NATIVE_KEYS}:
        return None
    values = []
    for key, _ in _NATIVE_KEYS:
        value = data.get(key)
        if value is not None and (type(value) is not int or value <= 0):
            return None
        values.append(value or 0)  # 0: absent, as _native_limits takes it
    limits = _native_limits(*values)
    # Given back as the container's values: what no cgroup file holds is no baseline of kubelet's.
    return None if unholdable_kubelet(limits) is not None else limits


#: Decoded native-limits annotations, by their text: a container brings the text, which
#: is ours only if nobody else wrote it, and may be as long as its annotations allow.
native_limits_texts: BoundedCache[str, NativeLimits | None] = BoundedCache(
    DISTINCT_LIMITS, INPUT_CACHE_BYTES
)
decode_native_limits = native_limits_texts.memoize(_decoded_native_limits)


def annotated_baseline(container: api.Container) -> NativeLimits | None:
    """Kubelet's values as the container's native-limits annotation keeps them; None: none."""
    text = container.annotations.get(NATIVE_LIMITS_ANNOTATION)
    return None if text is None else decode_native_limits(text)


def running_view(container: api.Container) -> tuple[ContainerView, CgroupValues]:
    """A running container as the runtime shows it, and the values it reports for it.

    Its baseline is its native-limits annotation's, known for sure; without one (never
    adjusted by us, or kept in its pod's record) what it holds, which is kubelet's as far as
    never-loosen goes, but not sure enough to scale until a record says so.
    """
    shown, current = limits_and_values(container.linux.resources)
    annotated = annotated_baseline(container)
    view = ContainerView(
        id=container.id,
        name=intern(container.name),
        native=shown if annotated is None else annotated,
        native_known=annotated is not None,
    )
    return view, current


# -- values -> NRI ----------------------------------------------------------


# Replies are filled in place (a message built apart and then handed to its
# parent is copied into it), from one LinuxResources per distinct values:
# copying that is a quarter of the cost of setting three nested fields.


@functools.lru_cache(maxsize=DISTINCT_LIMITS)
def _resources_holding(values: CgroupValues) -> api.LinuxResources:
    resources = api.LinuxResources()
    cpu = resources.cpu
    # A field left None is not claimed: NRI gives each field one owner.
    if values.cpu_shares is not None:
        cpu.shares.value = values.cpu_shares
    cpu.quota.value = values.cpu_quota
    if values.memory_limit is not None:
        resources.memory.limit.value = values.memory_limit
    return resources


def set_resources(resources: api.LinuxResources, values: CgroupValues) -> None:
    """Make `resources` hold the values set (each present, even 0); None fields are absent."""
    resources.CopyFrom(_resources_holding(values))


def container_update(container_id: str, values: CgroupValues) -> api.ContainerUpdate:
    update = api.ContainerUpdate(container_id=container_id)
    set_resources(update.linux.resources, values)
    return update


@functools.lru_cache(maxsize=DISTINCT_LIMITS)
def _current_values(shares: int, quota: int, limit: int) -> CgroupValues:
    """One instance per distinct value: a Synchronize keeps each running container's."""
    return CgroupValues(
        cpu_shares=shares,
        cpu_quota=quota if quota > 0 else -1,
        memory_limit=limit if limit > 0 else -1,
    )
