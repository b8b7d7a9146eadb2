"""Reading the fields of a Pod (as an AdmissionReview carries it, JSON) that admission needs.

Only what the policy looks at is read: metadata labels and annotations, spec.priority, and the
requests and limits of the containers. Anything of the wrong shape is a PodError naming the
field path, which the handlers turn into a denial with that message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nri_midbatch.policy.bounded_cache import INPUT_CACHE_BYTES, BoundedCache
from nri_midbatch.policy.qos import kubernetes_qos, qos_cgroup_parent
from nri_midbatch.policy.quantity import Quantity, QuantityError, parse_quantity

from .budget import UNLIMITED, Budget

__all__ = ["ContainerResources", "PodError", "PodFacts", "cgroup_parent", "pod_qos", "read_pod"]


class PodError(ValueError):
    """The object is not a Pod the webhook can read; the message names the field."""


@dataclass(frozen=True, slots=True)
class ContainerResources:
    name: str
    requests: Mapping[str, Quantity]
    limits: Mapping[str, Quantity]


@dataclass(frozen=True, slots=True)
class PodFacts:
    namespace: str
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    # Whether metadata.labels / metadata.annotations exist: a JSON patch must create a missing
    # map before it can add a key to it.
    has_labels: bool
    has_annotations: bool
    priority: int | None
    containers: tuple[ContainerResources, ...]
    init_containers: tuple[ContainerResources, ...]


def read_pod(
    obj: object, namespace: str, where: str = "object", budget: Budget = UNLIMITED
) -> PodFacts:
    """`namespace` is the request's: a Pod created through a namespaced URL may omit its own.

    `budget` is checked before each container is read.
    """
    pod = _mapping(obj, where)
    kind = pod.get("kind")
    if kind is not None and kind != "Pod":
        raise PodError(f"{where}.kind is {kind!r}, not 'Pod'")
    api_version = pod.get("apiVersion")
    if api_version is not None and api_version != "v1":
        raise PodError(f"{where}.apiVersion is {api_version!r}, not 'v1'")
    metadata = _mapping(pod.get("metadata"), f"{where}.metadata")
    spec = _mapping(pod.get("spec"), f"{where}.spec")
    raw_labels = metadata.get("labels")
    raw_annotations = metadata.get("annotations")
    priority = spec.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise PodError(f"{where}.spec.priority must be an integer, not {priority!r}")
    own_namespace = metadata.get("namespace")
    return PodFacts(
        namespace=namespace or (own_namespace if isinstance(own_namespace, str) else ""),
        name=str(metadata.get("name") or metadata.get("generateName") or ""),
        labels=_strings(raw_labels, f"{where}.metadata.labels"),
        annotations=_strings(raw_annotations, f"{where}.metadata.annotations"),
        has_labels=raw_labels is not None,
        has_annotations=raw_annotations is not None,
        priority=priority,
        containers=_containers(spec.get("containers"), f"{where}.spec.containers", True, budget),
        init_containers=_containers(
            spec.get("initContainers"), f"{where}.spec.initContainers", False, budget
        ),
    )


def pod_qos(pod: PodFacts) -> str:
    """Kubernetes' QoS class of the pod, init containers included."""
    return kubernetes_qos((c.requests, c.limits) for c in (*pod.init_containers, *pod.containers))


def cgroup_parent(pod: PodFacts, uid: str = "") -> str:
    """The cgroupfs parent kubelet gives the pod, for classification by QoS directory."""
    return qos_cgroup_parent(pod_qos(pod), uid)


def _containers(
    value: object, where: str, required: bool, budget: Budget
) -> tuple[ContainerResources, ...]:
    if value is None and not required:
        return ()
    if not isinstance(value, list):
        raise PodError(f"{where} must be a list")
    result: list[ContainerResources] = []
    seen: set[str] = set()
    for index, raw in enumerate(value):
        budget.check()
        at = f"{where}[{index}]"
        entry = _mapping(raw, at)
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise PodError(f"{at}.name must be a non-empty string")
        if name in seen:
            raise PodError(f"{at}.name {name!r} is used by an earlier container")
        seen.add(name)
        resources = entry.get("resources")
        declared = {} if resources is None else _mapping(resources, f"{at}.resources")
        result.append(
            ContainerResources(
                name,
                _quantities(declared.get("requests"), f"{at}.resources.requests"),
                _quantities(declared.get("limits"), f"{at}.resources.limits"),
            )
        )
    return tuple(result)


def _quantities(value: object, where: str) -> dict[str, Quantity]:
    if value is None:
        return {}
    parsed: dict[str, Quantity] = {}
    for name, raw in _mapping(value, where).items():
        # The API server always sends quantities as strings; a bare integer is what Go's
        # Quantity.UnmarshalJSON would also take.
        if isinstance(raw, int) and not isinstance(raw, bool):
            raw = str(raw)
        if not isinstance(raw, str):
            raise PodError(f"{where}[{name!r}] must be a quantity string, not {raw!r}")
        quantity = _quantity(raw.strip())
        if isinstance(quantity, QuantityError):
            raise PodError(f"{where}[{name!r}]: {quantity}")
        parsed[name] = quantity
    return parsed


#: Quantity texts longer than this (no real one is) are parsed each time, not cached.
QUANTITY_CACHE_TEXT = 64


def _quantity(text: str) -> Quantity | QuantityError:
    """A quantity, or why the text is none; short texts (all real ones) are cached."""
    if len(text) > QUANTITY_CACHE_TEXT:
        return _parse_quantity(text)
    return _cached_quantity(text)


def _parse_quantity(text: str) -> Quantity | QuantityError:
    try:
        return parse_quantity(text)
    except QuantityError as error:
        return error


# Exact parsing takes tens of microseconds, four times a container, and a pod's containers
# repeat a few quantities ("1k", "1Gi"): each is parsed once. Quantities are immutable, so
# containers may share one. At most 1024 keys of at most QUANTITY_CACHE_TEXT characters.
quantity_cache = BoundedCache[str, Quantity | QuantityError](1024, INPUT_CACHE_BYTES)
_cached_quantity = quantity_cache.memoize(_parse_quantity)


def _mapping(value: object, where: str) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if value is None:
        raise PodError(f"{where} is missing")
    raise PodError(f"{where} must be an object, not {type(value).__name__}")


def _strings(value: object, where: str) -> dict[str, str]:
    if value is None:
        return {}
    mapping = _mapping(value, where)
    bad = next((key for key, item in mapping.items() if not isinstance(item, str)), None)
    if bad is not None:
        raise PodError(f"{where}[{bad!r}] must be a string")
    return mapping
