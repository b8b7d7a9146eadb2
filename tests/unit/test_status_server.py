"""The status socket under clients that hold it, leave it, or ask for too much (issue 30).

Each runs the real App against a loopback runtime and a fake cgroup tree, with its own
StatusServer and injected limits: bounds and counts, never speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import json
import os
import socket
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.cgroups.paths import CgroupLocation
from nri_midbatch.process.status import StatusLimits, StatusServer
from nri_midbatch.tools.status import read_answer, status_command
from tests.factory import container, prod_pod
from tests.fake_cgroups import KERNEL_RULES, KernelRules, Watched

from .app_node import Node, running_node, until
from .nri_fixtures import run

#: Pods and containers of the node: 200 rows, about 90 KB of document.
PODS = 50
CONTAINERS_PER_POD = 3
ROWS = PODS * (1 + CONTAINERS_PER_POD)


def node_of(pods: int = PODS) -> tuple[list[api.PodSandbox], list[api.Container]]:
    sandboxes = [prod_pod(f"p{i:04}") for i in range(pods)]
    containers = [
        container(f"{sandbox.id}-c{j}", sandbox)
        for sandbox in sandboxes
        for j in range(CONTAINERS_PER_POD)
    ]
    return sandboxes, containers


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path, limits: StatusLimits, pods: int = PODS, files: KernelRules = KERNEL_RULES
) -> AsyncIterator[tuple[Node, StatusServer]]:
    async with running_node(tmp_path, synchronized=node_of(pods), cgroup_files=files) as node:
        server = StatusServer(node.app.status_source, tmp_path / "status.sock", limits=limits)
        await server.start()
        try:
            yield node, server
        finally:
            await server.close()


def connect_idle(path: Path) -> socket.socket | None:
    """A client that connects and never reads; None if the backlog is full."""
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.setblocking(False)
    try:
        client.connect(str(path))
    except BlockingIOError:
        client.close()
        return None
    return client


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class Reads:
    """Counts the plugin's cgroup reads from now on (those of status answers), and those
    outside the loop's thread."""

    def __init__(self, files: Watched) -> None:
        self.count = 0
        self.in_threads = 0
        files.reading = self._counted

    def _counted(self, _location: CgroupLocation) -> None:
        self.count += 1
        self.in_threads += threading.current_thread() is not threading.main_thread()


def test_idle_clients_hold_no_more_descriptors_than_the_bound(tmp_path: Path) -> None:
    """Two clients that never read hold both connections; the rest wait in the kernel's
    backlog or are refused there, never as the plugin's open files (issue 30: 1,100 of them
    made a pod's cgroup read fail with EMFILE)."""

    async def scenario() -> None:
        limits = StatusLimits(clients=2, backlog=4, chunk_bytes=2048)
        async with serving(tmp_path, limits) as (_node, server):
            before = open_fds()
            clients = [connect_idle(server.path) for _ in range(60)]
            held = [c for c in clients if c is not None]
            await until(lambda: server.clients == 2, "two connections taken")
            for _ in range(50):  # turns of the loop: it would accept more if it did
                await asyncio.sleep(0)
            assert open_fds() - before - len(held) == 2
            # The kernel keeps at most backlog + 1 waiting; the others are told at once.
            assert len(held) <= 2 + limits.backlog + 1
            for client in held:
                client.close()

    run(scenario())


def test_a_client_that_never_reads_is_dropped_at_its_deadline(tmp_path: Path) -> None:
    """Its connection is aborted when its time is up, and a client that waited behind it in
    the backlog is then served in full."""

    async def scenario() -> None:
        # A document larger than the socket's buffers, so it cannot all be sent.
        limits = StatusLimits(clients=1, seconds=2.0, rows_seconds=1.0, chunk_bytes=2048)
        async with serving(tmp_path, limits) as (_node, server):
            idle = connect_idle(server.path)
            assert idle is not None
            await until(lambda: server.clients == 1, "the idle client accepted")
            with capture_logs() as logs:
                document = json.loads(await asyncio.to_thread(read_answer, server.path))
            assert {"event": "status client dropped", "why": "not done in 2.0 s"} in [
                {k: e[k] for k in ("event", "why") if k in e} for e in logs
            ]
            # The idle client got part of a document, then the end of the connection.
            idle.setblocking(True)
            received = b""
            while chunk := idle.recv(1 << 20):
                received += chunk
            idle.close()
            assert received.startswith(b'{"format":1')
            with pytest.raises(json.JSONDecodeError):
                json.loads(received)
            # The waiting one was served once the idle one was dropped: within its own time.
            assert len(document["workloads"]) + document["omitted"] == ROWS

    run(scenario())


def test_a_client_that_has_gone_costs_no_reads(tmp_path: Path) -> None:
    """A client that left before it was answered gets nothing made for it; one that leaves
    after a chunk stops the work at the next chunk (issue 30: the plugin spent 5-9 s of CPU
    per 10-15 s on answers nobody read)."""

    async def scenario() -> None:
        limits = StatusLimits(clients=1, chunk_bytes=2048)
        files = Watched()
        async with serving(tmp_path, limits, files=files) as (node, server):
            reads = Reads(files)
            for _ in range(5):
                gone = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                gone.connect(str(server.path))
                gone.close()
            await until(
                lambda: server.accepted == 5 and server.clients == 0, "the gone clients handled"
            )
            await node.app.plugin.after_reply.settle()
            assert reads.count == 0

            leaving = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            leaving.connect(str(server.path))
            leaving.settimeout(10)
            first = await asyncio.to_thread(leaving.recv, 4096)
            assert first.startswith(b'{"format":1')
            leaving.close()
            await until(lambda: server.clients == 0, "the leaving client handled")
            await node.app.plugin.after_reply.settle()
            # What the buffers hold ahead of the client (a row is about 450 bytes: a
            # few chunks of 2 KB and the kernel's least socket buffer), not the whole node.
            assert 0 < reads.count <= 60 < ROWS

    run(scenario())


def test_the_answer_is_made_in_the_loop_as_work_after_replies(tmp_path: Path) -> None:
    """In the event loop's thread, a workload at a time between the runtime's requests, as
    the work after replies runs (issue 30: an answer made in a thread, contending for the
    interpreter, stretched a Synchronize chunk from 0.41 to 1.09 s)."""

    async def scenario() -> None:
        files = Watched()
        async with serving(tmp_path, StatusLimits(chunk_bytes=1024), files=files) as (
            node,
            server,
        ):
            reads = Reads(files)
            answer = asyncio.create_task(asyncio.to_thread(read_answer, server.path))
            pods, containers = node_of(PODS)
            for _ in range(3):
                await node.call(
                    "Synchronize",
                    api.SynchronizeRequest(pods=pods, containers=containers),
                    api.SynchronizeResponse,
                )
            document = json.loads(await answer)
            assert len(document["workloads"]) == ROWS
            assert reads.count == ROWS
            assert reads.in_threads == 0

    run(scenario())


def test_the_answer_is_bounded_in_bytes_and_says_what_it_left_out(tmp_path: Path) -> None:
    async def scenario() -> None:
        limits = StatusLimits(max_bytes=20_000)
        async with serving(tmp_path, limits) as (_node, server):
            raw = await asyncio.to_thread(read_answer, server.path)
            document = json.loads(raw)
            workloads = document["workloads"]
            assert 0 < len(workloads) < ROWS
            assert len(json.dumps(workloads, separators=(",", ":"))) <= 20_000 + 2
            assert len(workloads) + document["omitted"] == ROWS
            table = io.StringIO()
            code = await asyncio.to_thread(
                status_command, server.path, fmt="table", out=table, err=io.StringIO()
            )
            assert code == 0
            assert f"{document['omitted']} more workloads left out" in table.getvalue()

    run(scenario())


def test_no_workloads_are_made_after_their_time(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(tmp_path, StatusLimits(rows_seconds=0.0)) as (_node, server):
            document = json.loads(await asyncio.to_thread(read_answer, server.path))
            assert document["workloads"] == []
            assert document["omitted"] == ROWS

    run(scenario())


# ---------------------------------------------------------------------------
# The socket's path
# ---------------------------------------------------------------------------


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "status.sock"


def test_a_second_plugin_leaves_a_served_socket_alone(tmp_path: Path, path: Path) -> None:
    """Two plugins given one socket: the second does not serve, the first goes on; and a
    plugin closing never removes a socket it did not make (issue 30: each unlinked the
    other's)."""

    async def scenario() -> None:
        async with running_node(tmp_path) as node:
            first = StatusServer(node.app.status_source, path)
            second = StatusServer(node.app.status_source, path)
            await first.start()
            with pytest.raises(OSError, match="another process serves"):
                await second.start()
            assert json.loads(await asyncio.to_thread(read_answer, path))["format"] == 1
            await second.close()
            assert path.exists()
            # Someone removes it and another plugin takes the path: the first leaves that be.
            os.unlink(path)
            await second.start()
            await first.close()
            assert json.loads(await asyncio.to_thread(read_answer, path))["format"] == 1
            await second.close()
            assert not path.exists()

    run(scenario())


def test_a_stale_socket_is_replaced_and_a_file_that_is_no_socket_is_kept(
    tmp_path: Path, path: Path
) -> None:
    async def scenario() -> None:
        async with running_node(tmp_path) as node:
            dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            dead.bind(str(path))
            dead.close()  # a dead plugin's: refuses connections
            server = StatusServer(node.app.status_source, path)
            await server.start()
            assert json.loads(await asyncio.to_thread(read_answer, path))["format"] == 1
            await server.close()

            path.write_text("not a socket")
            with pytest.raises(OSError, match="not a socket"):
                await server.start()
            assert path.read_text() == "not a socket"

    run(scenario())


def test_a_taken_socket_is_logged_and_the_plugin_serves_the_node(tmp_path: Path) -> None:
    async def scenario() -> None:
        path = tmp_path / "status.sock"
        other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        other.bind(str(path))
        other.listen()
        try:
            with capture_logs() as logs:
                async with running_node(tmp_path, status_socket=path) as node:
                    assert node.synchronized is not None  # registered and synchronized
            (line,) = [e for e in logs if e["event"] == "status not served"]
            assert line["error"] == f"another process serves {path}: left to it"
            assert path.exists()
        finally:
            other.close()

    run(scenario())


def test_an_accept_that_fails_leaves_the_connection_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of file descriptors, the connection stays in the backlog and is served later."""

    async def scenario() -> None:
        async with running_node(tmp_path, synchronized=node_of()) as node:
            loop = asyncio.get_running_loop()
            accept = loop.sock_accept
            failures = [OSError(errno.EMFILE, "Too many open files")] * 2

            async def failing(sock: socket.socket) -> tuple[socket.socket, Any]:
                if failures:
                    raise failures.pop()
                return await accept(sock)

            monkeypatch.setattr(loop, "sock_accept", failing)
            monkeypatch.setattr("nri_midbatch.process.status.ACCEPT_RETRY_SECONDS", 0.0)
            server = StatusServer(node.app.status_source, tmp_path / "status.sock")
            with capture_logs() as logs:
                await server.start()
                try:
                    document = json.loads(await asyncio.to_thread(read_answer, server.path))
                finally:
                    await server.close()
            assert len(document["workloads"]) == ROWS
            # Once a streak of failures.
            assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
                "status connection not accepted"
            ]

    run(scenario())
