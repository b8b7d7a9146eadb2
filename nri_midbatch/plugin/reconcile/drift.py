"""What the pass tells of a value it found wrong: who wrote it, what changed, and the note
`status` shows of each pod.

Kept apart from the check that finds it (check.py) because these are the pass's words to
operators (`status`, the drift log lines and metrics), read by the process's status too.
A value found that is kubelet's known one is counted as kubelet's (a resize's write after
the plugin's); any other as unknown (an operator, an agent, another plugin, systemd).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nri_midbatch.cgroups.values import CgroupReading, CgroupValues, cpu_shares_to_weight, drifted
from nri_midbatch.policy import NativeLimits
from nri_midbatch.state.baseline import kubelet_value

Writer = Literal["kubelet", "unknown"]


@dataclass(frozen=True, slots=True)
class Drift:
    """Values found in a cgroup that were neither the target nor left alone."""

    at: float  # wall clock, seconds
    container: str | None  # its name; None: the pod's own cgroup
    writer: Writer
    #: field -> [found, target]
    fields: dict[str, list[int | None]]
    repaired: bool


@dataclass(slots=True)
class PodCheck:
    """What `status` shows of a pod's convergence."""

    checked_at: float = 0.0  # wall clock, seconds; 0: not yet
    drift: Drift | None = None  # the last drift found in the pod or its containers


def writer_of(
    reading: CgroupReading, off: tuple[str, ...], kubelet: NativeLimits, *, container: bool
) -> Writer:
    """Kubelet's, if every field off holds kubelet's known value there; else unknown."""
    if "cpu_shares" in off and kubelet.cpu_shares is None:
        return "unknown"
    quota = kubelet_value(kubelet, "cpu_quota")
    assert quota is not None  # only the shares can be unknown
    theirs = CgroupValues(kubelet.cpu_shares, quota, kubelet_value(kubelet, "memory_limit"))
    still_off = drifted(reading, theirs, container=container)
    return "unknown" if any(name in still_off for name in off) else "kubelet"


def changes_of(
    reading: CgroupReading, values: CgroupValues, off: tuple[str, ...]
) -> dict[str, list[int | None]]:
    """field -> [found, target], for the fields off; a v2 weight as the weight."""
    changes: dict[str, list[int | None]] = {}
    for name in off:
        if name == "cpu_shares" and reading.cpu_shares is None:
            assert values.cpu_shares is not None  # only a field set is off
            changes["cpu_weight"] = [reading.cpu_weight, cpu_shares_to_weight(values.cpu_shares)]
        else:
            changes[name] = [getattr(reading, name), getattr(values, name)]
    return changes
