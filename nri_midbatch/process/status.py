"""The live face of the baseline: what `nri-midbatch status` reads from a running plugin.

For each pod and container the plugin remembers: its tier, kubelet's values, the values the
configuration in force puts there (the target), what the plugin last put in force, what its
cgroup files hold now, and whether they drift from the target. Served on a Unix socket that
only root can open (0600), not beyond the node: a client connects and reads one JSON document.

Bounded: STATUS_CLIENTS clients at a time (others wait in the listen backlog), each answered
within STATUS_SECONDS; the document grows with the pods the runtime runs (about 400 bytes a
container).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from nri_midbatch.cgroups.values import holds
from nri_midbatch.plugin.cgroup_writer import CgroupUnreadable
from nri_midbatch.plugin.handlers import MidBatchPlugin
from nri_midbatch.plugin.reconcile import PodCheck
from nri_midbatch.policy import (
    CgroupValues,
    ContainerView,
    NativeLimits,
    PodView,
    decide_container,
    decide_pod,
)
from nri_midbatch.state.baseline import target as target_of

__all__ = ["STATUS_CLIENTS", "STATUS_SECONDS", "StatusServer", "status_document"]

log = structlog.get_logger(__name__)

STATUS_CLIENTS = 2
STATUS_SECONDS = 30.0
FORMAT = 1


@dataclass(frozen=True, slots=True)
class _Row:
    pod_id: str
    pod: PodView
    container: ContainerView | None
    cgroups_path: str
    tier: str | None
    kubelet: NativeLimits
    target: CgroupValues | None
    applied: CgroupValues | None
    #: The pod's: when the convergence pass last checked it, and the last drift it found.
    check: PodCheck | None = None


def _rows(plugin: MidBatchPlugin) -> list[_Row]:
    """What the plugin remembers and targets now: taken in the loop, where it changes."""
    known, policy = plugin.known, plugin.policy
    enforce = not plugin.observing
    pod_level = plugin.config.cgroups.pod_level
    rows = []
    for pod_id, pod in known.pods.items():
        decision = decide_pod(pod, policy)
        applied = known.applied.get(pod_id)
        target = target_of(decision, applied, pod.native, enforce=enforce and pod_level)
        check = plugin.reconcile.checks.get(pod_id)
        rows.append(_Row(pod_id, pod, None, "", decision.tier, pod.native, target, applied, check))
        for container_id in known.containers_of(pod_id):
            container = known.containers[container_id][1]
            decided = decide_container(pod, container, policy)
            applied = known.applied.get(container_id)
            target = target_of(decided, applied, container.native, enforce=enforce)
            path = known.cgroups_path(container_id)
            rows.append(
                _Row(pod_id, pod, container, path, decided.tier, container.native, target, applied)
            )
    return rows


def status_document(plugin: MidBatchPlugin, rows: list[_Row]) -> dict[str, Any]:
    """The rows with what each cgroup holds now: blocking reads, for a thread."""
    workloads = []
    for row in rows:
        now: dict[str, int | None] | None
        drift: bool | None
        unreadable: str | None
        try:
            reading = plugin.cgroups.read(row.pod, row.container, row.cgroups_path)
        except CgroupUnreadable as exc:
            now, drift, unreadable = None, None, str(exc)
        else:
            now = {
                "cpu_shares": reading.cpu_shares,
                "cpu_weight": reading.cpu_weight,
                "cpu_quota": reading.cpu_quota,
                "memory_limit": reading.memory_limit,
            }
            drift = row.target is not None and not holds(reading, row.target)
            unreadable = None
        workloads.append(
            {
                "level": "pod" if row.container is None else "container",
                "namespace": row.pod.namespace,
                "pod": row.pod.name,
                "pod_uid": row.pod.uid,
                "container": None if row.container is None else row.container.name,
                "container_id": None if row.container is None else row.container.id,
                "tier": row.tier,
                "kubelet": _limits(row.kubelet),
                "target": _values(row.target),
                "applied": _values(row.applied),
                "now": now,
                "drift": drift,
                "unreadable": unreadable,
                **({} if row.container is not None else _convergence(row.check)),
            }
        )
    return {
        "format": FORMAT,
        "mode": str(plugin.config.mode),
        "keeping_records": plugin.store.keeping,
        "workloads": workloads,
    }


def _convergence(check: PodCheck | None) -> dict[str, Any]:
    """A pod's: when it was last checked (seconds since the epoch; None: not yet), and the
    last drift found in it or its containers, whoever wrote it."""
    if check is None or not check.checked_at:
        return {"checked_at": None, "last_drift": None}
    drift = check.drift
    return {
        "checked_at": round(check.checked_at, 3),
        "last_drift": None
        if drift is None
        else {
            "at": round(drift.at, 3),
            "container": drift.container,
            "writer": drift.writer,
            "changes": drift.fields,
            "repaired": drift.repaired,
        },
    }


def _limits(native: NativeLimits) -> dict[str, int]:
    """Kubelet's values, -1 for unlimited; shares absent where unknown."""
    out = {
        "cpu_quota": native.cpu_quota or -1,
        "memory_limit": native.memory_limit or -1,
    }
    if native.cpu_shares is not None:
        out["cpu_shares"] = native.cpu_shares
    return out


def _values(values: CgroupValues | None) -> dict[str, int] | None:
    if values is None:
        return None
    return {
        name: value
        for name, value in (
            ("cpu_shares", values.cpu_shares),
            ("cpu_quota", values.cpu_quota),
            ("memory_limit", values.memory_limit),
        )
        if value is not None
    }


class StatusServer:
    """The Unix socket `nri-midbatch status` reads; one JSON document per connection."""

    def __init__(self, plugin: MidBatchPlugin, path: Path) -> None:
        self._plugin = plugin
        self.path = path
        self._server: asyncio.Server | None = None
        self._slots = asyncio.Semaphore(STATUS_CLIENTS)

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a socket a dead plugin left
        os.makedirs(self.path.parent, mode=0o700, exist_ok=True)
        old = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=self.path)
        finally:
            os.umask(old)
        log.info("status served", socket=str(self.path))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    async def _serve(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with self._slots, asyncio.timeout(STATUS_SECONDS):
                rows = _rows(self._plugin)
                document = await asyncio.to_thread(status_document, self._plugin, rows)
                writer.write(json.dumps(document, separators=(",", ":")).encode())
                await writer.drain()
        except (TimeoutError, OSError) as exc:
            log.warning("status not served", error=str(exc) or type(exc).__name__)
        except Exception:  # a bug here must not end the plugin
            log.exception("status failed")
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
