"""The live face of the baseline: what `nri-midbatch status` reads from a running plugin.

For each pod and container the plugin remembers: its tier, kubelet's values, the values the
configuration in force puts there (the target), what the plugin last put in force, what its
cgroup files hold now, and whether they drift from the target. Served on a Unix socket that
only root can open (0600), not beyond the node: a client connects and reads one JSON document.

What clients can make the plugin hold or do is bounded (`StatusLimits`):

- `clients` connections at a time: the plugin accepts a connection only while fewer are
  open. The others wait in the kernel's listen backlog (`backlog` of them; beyond it a
  client's connect waits or fails), and hold none of the plugin's file descriptors.
- `seconds` from accept to a connection's last byte; then it is dropped, aborted, so that a
  client that never reads cannot keep it open either.
- The document is written as it is made, one workload (one cgroup read) at a time, as work
  after replies (deferred.py, `defer_idle`): only while the runtime's connection is
  idle, even under steady load, so it never stretches a reply to the runtime. Workloads are
  made a chunk (`chunk_bytes`) ahead of what the client has taken, so what a client holds is
  a chunk and the socket's buffers, and a client that has gone is noticed at the next write,
  before anything more is made for it.
- At most `max_bytes` of workloads, made within `rows_seconds` of accept: the workloads left
  out are counted in the document's `omitted`.

The socket's path is taken only from no one: a path another process serves (it accepts a
connection) is left alone and status is not served; only a socket that refuses connections
(a dead plugin's) is removed, and a path that is not a socket never is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from nri_midbatch.cgroups.values import drifted
from nri_midbatch.deferred import AfterReply
from nri_midbatch.plugin.cgroup_writer import CgroupUnreadable
from nri_midbatch.plugin.context import Live
from nri_midbatch.plugin.reconcile import PodCheck, Reconciler
from nri_midbatch.policy import (
    CgroupValues,
    ContainerView,
    NativeLimits,
    PodView,
    decide_container,
    decide_pod,
)
from nri_midbatch.state.baseline import target as target_of

__all__ = ["StatusLimits", "StatusServer", "StatusSource", "status_document"]

log = structlog.get_logger(__name__)

FORMAT = 1
#: How long the plugin waits before it accepts again after an accept failed (out of file
#: descriptors, say): the connection stays in the backlog meanwhile.
ACCEPT_RETRY_SECONDS = 1.0
_COMPACT = (",", ":")


@dataclass(frozen=True, slots=True)
class StatusSource:
    """What status reads of the plugin, each thing by its name."""

    #: The configuration in force and what the plugin knows.
    live: Live
    #: The convergence pass: when it last checked each pod, and what it found.
    convergence: Reconciler
    #: Whether pod records are kept (a state directory).
    records_kept: bool
    #: Where status's work waits its turn behind the runtime's requests.
    after_reply: AfterReply


@dataclass(frozen=True, slots=True)
class StatusLimits:
    """What status clients may cost the plugin (see the module's text)."""

    #: Connections served at a time.
    clients: int = 2
    #: Connections the kernel keeps waiting to be accepted.
    backlog: int = 8
    #: From accept to a connection's last byte.
    seconds: float = 60.0
    #: From accept to the last workload made: the rest of the time is for the client to read.
    rows_seconds: float = 45.0
    #: The workloads of one answer: about 500 bytes a container, 60,000 containers.
    max_bytes: int = 32 * 1024 * 1024
    #: Workloads made at a time; also the connection's write buffer and the socket's send
    #: buffer (which the kernel doubles): about four chunks are made ahead of the client.
    chunk_bytes: int = 64 * 1024


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


def _rows(live: Live, convergence: Reconciler, pod_ids: Iterable[str]) -> list[_Row]:
    """What the plugin remembers and targets now of these pods (those it still knows), their
    containers after each: taken in the loop, where it changes."""
    known, policy, config = live.known, live.in_force.policy, live.in_force.config
    rows = []
    for pod_id in pod_ids:
        pod = known.pods.get(pod_id)
        if pod is None:
            continue  # gone since the answer began
        decision = decide_pod(pod, policy)
        applied = known.applied.get(pod_id)
        target = target_of(decision, applied, pod.native, enforce=config.enforces(pod=True)).values
        check = convergence.checker.checks.get(pod_id)
        rows.append(_Row(pod_id, pod, None, "", decision.tier, pod.native, target, applied, check))
        for container_id in known.containers_of(pod_id):
            container = known.containers[container_id][1]
            decided = decide_container(pod, container, policy)
            applied = known.applied.get(container_id)
            target = target_of(
                decided, applied, container.native, enforce=config.enforces(pod=False)
            ).values
            path = known.cgroups_path(container_id)
            rows.append(
                _Row(pod_id, pod, container, path, decided.tier, container.native, target, applied)
            )
    return rows


def status_document(live: Live, records_kept: bool, readiness: str | None = None) -> dict[str, Any]:
    """The document's fields but its workloads, which follow them (`_workloads`).

    records_kept: whether the plugin keeps pod records (a state directory).
    readiness: what /readyz says (`ok`, `not registered with a runtime`, ...), None unknown.
    """
    return {
        "format": FORMAT,
        "mode": str(live.in_force.config.mode),
        "keeping_records": records_kept,
        "readiness": readiness,
    }


def _workloads(live: Live, rows: Iterable[_Row]) -> Iterator[dict[str, Any]]:
    """The rows with what each cgroup holds now, one read for each row taken."""
    for row in rows:
        now: dict[str, int | None] | None
        drift: bool | None
        unreadable: str | None
        try:
            reading = live.in_force.cgroups.read(row.pod, row.container, row.cgroups_path)
        except CgroupUnreadable as exc:
            now, drift, unreadable = None, None, str(exc)
        else:
            now = {
                "cpu_shares": reading.cpu_shares,
                "cpu_weight": reading.cpu_weight,
                "cpu_quota": reading.cpu_quota,
                "memory_limit": reading.memory_limit,
            }
            drift = row.target is not None and bool(
                drifted(reading, row.target, container=row.container is not None)
            )
            unreadable = None
        yield (
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


class _Answer:
    """One client's document: its fields, then its workloads a chunk at a time, each made as
    work after replies (`fill`), then the count of those left out (`tail`)."""

    def __init__(
        self,
        source: StatusSource,
        limits: StatusLimits,
        rows_until: float,
        readiness: str | None = None,
    ) -> None:
        self._source = source
        self._readiness = readiness
        self._limits = limits
        self._rows_until = rows_until
        #: The pods known when the answer began: those gone by their turn are left out.
        self._pods = deque(source.live.known.pods)
        #: The rows of the pod under way not yet made.
        self._pod_rows: deque[_Row] = deque()
        self._made = _workloads(source.live, self._pending_rows())
        self._bytes = 0
        self._chunk: list[bytes] = []
        self._chunk_bytes = 0
        self.omitted = 0
        self.done = False

    def head(self) -> bytes:
        source = self._source
        document = status_document(source.live, source.records_kept, self._readiness)
        fields = json.dumps(document, separators=_COMPACT)
        return f'{fields[:-1]},"workloads":['.encode()

    def tail(self) -> bytes:
        return f'],"omitted":{self.omitted}}}'.encode()

    def fill(self) -> asyncio.Future[bytes]:
        """The next chunk of workloads; `done` once the last is in it.

        Cancel the future to stop: the work after replies sees it and makes no more.
        """
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._source.after_reply.defer_idle(self._piece, future)
        return future

    def _pending_rows(self) -> Iterator[_Row]:
        while self._pods:
            pod_id = self._pods.popleft()
            self._pod_rows.extend(_rows(self._source.live, self._source.convergence, (pod_id,)))
            while self._pod_rows:
                yield self._pod_rows.popleft()

    def _piece(self, future: asyncio.Future[bytes]) -> None:
        """One workload: its decisions, its cgroup read; then the next, or the chunk is out."""
        if future.done():  # the client has gone, or its time is up
            return
        try:
            if asyncio.get_running_loop().time() >= self._rows_until:
                self._stop()
            elif (workload := next(self._made, None)) is None:
                self.done = True
            else:
                data = json.dumps(workload, separators=_COMPACT).encode()
                if self._bytes + len(data) > self._limits.max_bytes:
                    self.omitted = 1
                    self._stop()
                else:
                    self._add(data)
        except Exception as exc:  # a bug here must not leave the client waiting
            future.set_exception(exc)
            return
        if self.done or self._chunk_bytes >= self._limits.chunk_bytes:
            future.set_result(b"".join(self._chunk))
            self._chunk, self._chunk_bytes = [], 0
        else:
            self._source.after_reply.defer_idle(self._piece, future)

    def _add(self, data: bytes) -> None:
        if self._bytes:
            data = b"," + data
        self._chunk.append(data)
        self._chunk_bytes += len(data)
        self._bytes += len(data)

    def _stop(self) -> None:
        """No more workloads: those not made are counted, the pods still known."""
        known = self._source.live.known
        self.omitted += len(self._pod_rows) + sum(
            1 + len(known.containers_of(pod_id)) for pod_id in self._pods if pod_id in known.pods
        )
        self.done = True


class StatusServer:
    """The Unix socket `nri-midbatch status` reads; one JSON document per connection."""

    def __init__(
        self,
        source: StatusSource,
        path: Path,
        readiness: Callable[[], tuple[bool, str]] | None = None,
        *,
        limits: StatusLimits = StatusLimits(),
    ) -> None:
        self._source = source
        self.path = path
        #: The App's readiness: whether a runtime is there to have told the plugin anything.
        self._readiness = readiness
        self._limits = limits
        self._sock: socket.socket | None = None
        #: The socket file this server made: only that one is removed at close.
        self._made: tuple[int, int] | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._clients: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(limits.clients)
        #: Connections accepted so far.
        self.accepted = 0

    @property
    def clients(self) -> int:
        """Connections open now."""
        return len(self._clients)

    async def start(self) -> None:
        """Serve at `path`; raises OSError where it cannot, or another process serves it."""
        os.makedirs(self.path.parent, mode=0o700, exist_ok=True)
        _clear_stale(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            old = os.umask(0o177)
            try:
                sock.bind(str(self.path))
            finally:
                os.umask(old)
            made = os.lstat(self.path)
            sock.listen(self._limits.backlog)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock, self._made = sock, (made.st_dev, made.st_ino)
        self._accepting = asyncio.create_task(self._accept(sock))
        log.info("status served", socket=str(self.path))

    async def close(self) -> None:
        tasks = [*self._clients, *([self._accepting] if self._accepting else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._accepting = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            with contextlib.suppress(FileNotFoundError):
                now = os.lstat(self.path)
                if (now.st_dev, now.st_ino) == self._made:
                    os.unlink(self.path)

    async def _accept(self, sock: socket.socket) -> None:
        """Accept a connection whenever fewer than `clients` are open."""
        loop = asyncio.get_running_loop()
        failing = False
        while True:
            await self._slots.acquire()
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as exc:
                self._slots.release()
                if not failing:  # once a streak: the connections wait in the backlog meanwhile
                    log.warning("status connection not accepted", error=str(exc))
                failing = True
                await asyncio.sleep(ACCEPT_RETRY_SECONDS)
                continue
            except BaseException:
                self._slots.release()
                raise
            failing = False
            self.accepted += 1
            # What a client that does not read holds: this buffer, the transport's and a chunk.
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._limits.chunk_bytes)
            task = asyncio.create_task(self._serve(conn))
            self._clients.add(task)
            task.add_done_callback(self._served)

    def _served(self, task: asyncio.Task[None]) -> None:
        self._clients.discard(task)
        self._slots.release()

    async def _serve(self, conn: socket.socket) -> None:
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(self._limits.seconds):
                _, writer = await asyncio.open_unix_connection(sock=conn)
                writer.transport.set_write_buffer_limits(high=self._limits.chunk_bytes)
                await self._answer(writer)
        except TimeoutError:
            log.warning("status client dropped", why=f"not done in {self._limits.seconds} s")
        except OSError as exc:  # a client that leaves is not the plugin's concern
            log.debug("status client gone", error=str(exc) or type(exc).__name__)
        except Exception:  # a bug here must not end the plugin
            log.exception("status failed")
        finally:
            if writer is None:
                conn.close()
            else:
                # Aborted, not closed: a client that does not read must not hold the connection
                # open. What was written is in the client's socket already (AF_UNIX).
                writer.transport.abort()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

    async def _answer(self, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        ready = None if self._readiness is None else self._readiness()[1]
        answer = _Answer(self._source, self._limits, loop.time() + self._limits.rows_seconds, ready)
        # Nothing is made for a client that has gone: the first write tells.
        writer.write(answer.head())
        await writer.drain()
        while not answer.done:
            # Cancelled with this task (the deadline, a close), the chunk stops being made.
            writer.write(await answer.fill())
            await writer.drain()
        writer.write(answer.tail())
        # The last byte handed to the kernel within the deadline, then closed.
        writer.transport.set_write_buffer_limits(high=0)
        await writer.drain()


def _clear_stale(path: Path) -> None:
    """Remove the socket at `path` if no one serves it; raises OSError if someone may."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(found.st_mode):
        raise OSError(f"{path} is not a socket: left as it is")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        probe.connect(str(path))
    except ConnectionRefusedError:
        os.unlink(path)  # a socket a dead plugin left
        log.info("stale status socket removed", socket=str(path))
        return
    except BlockingIOError:
        pass  # served, and its backlog full
    finally:
        probe.close()
    raise OSError(f"another process serves {path}: left to it")
