"""Kubernetes' QoS class of a pod manifest, and the cgroup parent kubelet gives it.

One implementation for every reader of a manifest (the webhook, `explain`): the runtime
only ever shows the plugin the cgroup parent, so a manifest has to be turned into one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction

from .quantity import Quantity

__all__ = ["ContainerResourceLists", "kubernetes_qos", "qos_cgroup_parent"]

#: (requests, limits) of one container, init or app.
ContainerResourceLists = tuple[Mapping[str, Quantity], Mapping[str, Quantity]]

_QOS_RESOURCES = ("cpu", "memory")


def kubernetes_qos(containers: Iterable[ContainerResourceLists]) -> str:
    """GetPodQOS, as kubelet's cgroup directory name, over init and app containers alike.

    Only cpu and memory, positive quantities only. A request left out defaults to the limit,
    as the API server's defaulting does before any admission webhook or kubelet sees the pod.
    Nothing requested or limited -> besteffort; every container limits both and the summed
    requests equal the summed limits -> guaranteed; else burstable. (Pod-level resources, a
    newer Kubernetes feature, are not considered.)
    """
    requests: dict[str, Fraction] = {}
    limits: dict[str, Fraction] = {}
    guaranteed = True
    for declared_requests, declared_limits in containers:
        limited = 0
        for name in _QOS_RESOURCES:
            limit = declared_limits.get(name)
            request = declared_requests.get(name, limit)
            if request is not None and request.amount > 0:
                requests[name] = requests.get(name, Fraction(0)) + request.amount
            if limit is not None and limit.amount > 0:
                limits[name] = limits.get(name, Fraction(0)) + limit.amount
                limited += 1
        if limited != len(_QOS_RESOURCES):
            guaranteed = False
    if not requests and not limits:
        return "besteffort"
    if guaranteed and requests == limits:
        return "guaranteed"
    return "burstable"


def qos_cgroup_parent(qos: str, uid: str = "") -> str:
    """The cgroupfs parent kubelet gives a pod of that QoS class."""
    return f"/kubepods/pod{uid}" if qos == "guaranteed" else f"/kubepods/{qos}/pod{uid}"
