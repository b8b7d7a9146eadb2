"""The recording's line format: what one JSON line holds, and at which version.

One line per call:
    {"v": 1, "ts": RFC 3339 UTC, "method": "...", "request": {...}, "response": {...} | null,
     "error": {"code": int, "message": str} | null, "decisions": [{...}, ...]}
with request and response as protobuf JSON (`MessageToDict`, proto field names), every string
that replay does not need replaced by "<redacted>" unless the recorder is raw (redact.py).
The writer writes it, the reader reads it back, replay and explain print its parts.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from nri_midbatch.policy import CgroupValues, render
from nri_midbatch.recording.call import CallRecord, NotedDecision, Status
from nri_midbatch.recording.redact import DEFAULT_KEPT_ANNOTATIONS, redact

RECORD_VERSION = 1


def message_json(message: Message) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)


def values_json(values: CgroupValues | None) -> dict[str, int | None] | None:
    if values is None:
        return None
    return {
        "cpu_shares": values.cpu_shares,
        "cpu_quota": values.cpu_quota,
        "memory_limit": values.memory_limit,
    }


def status_json(status: Status | None) -> dict[str, Any] | None:
    return None if status is None else {"code": status[0], "message": status[1]}


def decision_json(noted: NotedDecision) -> dict[str, Any]:
    pod, container, decision = noted.pod, noted.container, noted.decision
    return {
        "level": "pod" if container is None else "container",
        "namespace": pod.namespace,
        "pod": pod.name,
        "pod_uid": pod.uid,
        "container": None if container is None else container.name,
        "container_id": None if container is None else container.id,
        "cgroup_parent": pod.cgroup_parent,
        "qos": decision.qos.value,
        "priority": decision.priority.value,
        "tier": decision.tier,
        "values": values_json(decision.values),
        "error": decision.error,
        "trace": render(decision.trace),
    }


def rfc3339(timestamp: float) -> str:
    moment = datetime.fromtimestamp(timestamp, UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def redacted_json(
    message: Message, kept_annotations: Collection[str] = DEFAULT_KEPT_ANNOTATIONS
) -> dict[str, Any]:
    """message_json with every string replay does not need replaced (redact.py)."""
    document = message_json(message)
    redact(message, document, kept_annotations)
    return document


def record_json(
    record: CallRecord,
    *,
    raw: bool = False,
    kept_annotations: Collection[str] = DEFAULT_KEPT_ANNOTATIONS,
) -> dict[str, Any]:
    """The record's line; raw keeps every string, else only annotations in kept_annotations
    keep their values."""

    def as_json(message: Message) -> dict[str, Any]:
        return message_json(message) if raw else redacted_json(message, kept_annotations)

    return {
        "v": RECORD_VERSION,
        "ts": rfc3339(record.started),
        "method": record.method,
        "request": as_json(record.request),
        "response": None if record.response is None else as_json(record.response),
        "error": status_json(record.error),
        "decisions": [decision_json(noted) for noted in record.decisions],
    }


def json_line(document: dict[str, Any]) -> bytes:
    return (json.dumps(document, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
