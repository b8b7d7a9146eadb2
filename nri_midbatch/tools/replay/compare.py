"""Comparing each decision of a replayed call with what the recording holds.

Containers compare the values the reply sets now with those the recorded reply set; pods,
whose values no reply carries, the decision's values with the recorded decision's.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import Message

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.plugin.codec import current_values
from nri_midbatch.policy import CgroupValues
from nri_midbatch.recording.call import NotedDecision
from nri_midbatch.recording.reader import Entry
from nri_midbatch.tools.replay.runner import Outcome


@dataclass(frozen=True, slots=True)
class Row:
    """One decision of one replayed call, next to what the recording says."""

    entry: Entry
    noted: NotedDecision
    #: What the reply (container) or the recorded decision (pod) held before; None: untouched.
    recorded: CgroupValues | None
    #: False when nothing was recorded to compare with (pod level of an older recording).
    comparable: bool
    #: What the reply carries now (container) or the decision's values (pod).
    now: CgroupValues | None

    @property
    def changed(self) -> bool:
        return self.comparable and self.recorded != self.now


def rows(outcome: Outcome) -> list[Row]:
    entry = outcome.entry
    result = []
    for noted in outcome.decisions:
        if noted.container is None:
            recorded_pod = _recorded_pod_values(entry, noted)
            result.append(
                Row(
                    entry,
                    noted,
                    recorded=recorded_pod[1],
                    comparable=recorded_pod[0],
                    now=noted.decision.values,
                )
            )
            continue
        container_id = noted.container.id
        result.append(
            Row(
                entry,
                noted,
                recorded=sent_values(entry.response, container_id),
                comparable=outcome.response_changed is not None,
                now=sent_values(outcome.response, container_id),
            )
        )
    return result


def sent_values(response: Message | None, container_id: str) -> CgroupValues | None:
    """The values a reply sets for a container, or None if it leaves the container alone."""
    if isinstance(response, api.CreateContainerResponse):
        adjust = response.adjust
        has = response.HasField("adjust") and adjust.HasField("linux")
        if has and adjust.linux.HasField("resources"):
            return _reply_values(adjust.linux.resources)
        return None
    if isinstance(response, api.UpdateContainerResponse | api.SynchronizeResponse):
        for update in response.update:
            if update.container_id == container_id and update.linux.HasField("resources"):
                return _reply_values(update.linux.resources)
    return None


def _reply_values(resources: api.LinuxResources) -> CgroupValues:
    """current_values, with a field the reply does not set as None (a quota-only reply)."""
    values = current_values(resources)
    return CgroupValues(
        values.cpu_shares if resources.cpu.HasField("shares") else None,
        values.cpu_quota,
        values.memory_limit if resources.memory.HasField("limit") else None,
    )


def _recorded_pod_values(entry: Entry, noted: NotedDecision) -> tuple[bool, CgroupValues | None]:
    if entry.decisions is None:
        return False, None
    for recorded in entry.decisions:
        if recorded.get("level") == "pod" and recorded.get("pod_uid") == noted.pod.uid:
            values = recorded.get("values")
            if not isinstance(values, dict):
                return True, None
            try:
                shares, memory = values["cpu_shares"], values["memory_limit"]
                return True, CgroupValues(
                    None if shares is None else int(shares),
                    int(values["cpu_quota"]),
                    None if memory is None else int(memory),
                )
            except (KeyError, TypeError, ValueError):
                return False, None
    return True, None


def change_text(row: Row) -> str:
    if not row.comparable:
        return "?"
    if not row.changed:
        return "="
    before, after = row.recorded, row.now
    if before is None:
        return "was untouched"
    if after is None:
        return "now untouched"
    parts = []
    for label, old, new in (
        ("shares", before.cpu_shares, after.cpu_shares),
        ("quota", before.cpu_quota, after.cpu_quota),
        ("memory", before.memory_limit, after.memory_limit),
    ):
        if old != new:
            parts.append(f"{label} {old} -> {new}")
    return ", ".join(parts)
