"""Pods bound to a cpuset by Koordinator's scheduler.

The scheduler records an LSE/LSR pod's CPUs in the annotation
`scheduling.koordinator.sh/resource-status` (`{"cpuset": "0-3", ...}`). koordlet's
CPUSetAllocator hook, which runs after BatchResource, then sets the pod's and its containers'
CFS quota to -1 (Koordinator issue #489: the cpuset bounds them; a quota only throttles), and
its CPUNormalization hook leaves such pods alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from .bounded_cache import BoundedCache

__all__ = [
    "RESOURCE_STATUS_ANNOTATION",
    "RESOURCE_STATUS_CACHE_BYTES",
    "RESOURCE_STATUS_CACHE_ENTRIES",
    "bound_cpuset",
    "resource_status_cache",
]

RESOURCE_STATUS_ANNOTATION = "scheduling.koordinator.sh/resource-status"


def bound_cpuset(annotations: Mapping[str, str]) -> str | None:
    """The pod's cpuset, or None when it has none (or the annotation does not parse)."""
    text = annotations.get(RESOURCE_STATUS_ANNOTATION)
    return None if text is None else _cpuset(text)


def _parsed_cpuset(text: str) -> str | None:
    # Go's encoding/json into ResourceStatus{CPUSet string `json:"cpuset"`}: the field name
    # matches case-insensitively and the last one written wins. Any error makes koordlet's
    # GetCPUSetFromPod fail, and the pod is then treated as not bound.
    try:
        document = json.loads(text, object_pairs_hook=list)
    except (ValueError, RecursionError):
        return None
    if not isinstance(document, list):
        return None
    cpuset = ""
    for key, value in document:
        if key.lower() != "cpuset" or value is None:
            continue
        if not isinstance(value, str):
            return None
        cpuset = value
    return cpuset or None


# Each pod's annotation is read at every decision of the pod; the texts are few per node
# and short (a cpuset and NUMA hints), but a pod author may write up to 256 KB of them.
RESOURCE_STATUS_CACHE_ENTRIES = 256
RESOURCE_STATUS_CACHE_BYTES = 1024 * 1024
resource_status_cache: BoundedCache[str, str | None] = BoundedCache(
    RESOURCE_STATUS_CACHE_ENTRIES, RESOURCE_STATUS_CACHE_BYTES
)
_cpuset = resource_status_cache.memoize(_parsed_cpuset)
