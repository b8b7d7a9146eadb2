"""A running App driven by a LoopbackRuntime: `running_node` on a FakeTree under
tmp_path/cgroup with its configuration file rewritten as a ConfigMap is; `running_app`
serving its metrics and health over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.config.compile import settings_of
from nri_midbatch.config.model import Config, load_config_file, load_config_text
from nri_midbatch.deferred import DeferredTimings
from nri_midbatch.nri.testing import LoopbackRuntime
from nri_midbatch.plugin.lowering import LoweringTimings
from nri_midbatch.process.app import App
from tests.fake_cgroups import KERNEL_RULES, FakeTree, KernelRules
from tests.oracle.targets import Values

from .http_fixtures import http_get
from .nri_fixtures import STEP_TIMEOUT

#: How often `until` looks again.
POLL = 0.01


def write_config(path: Path, document: dict[str, Any] | str) -> None:
    """Replace the file as a ConfigMap update does: a new inode behind the same path."""
    text = document if isinstance(document, str) else json.dumps(document)
    staging = path.with_name(path.name + ".new")
    staging.write_text(text)
    os.replace(staging, path)


# ---------------------------------------------------------------------------
# An App driven by a LoopbackRuntime
# ---------------------------------------------------------------------------


@dataclass
class Node:
    app: App
    runtime: LoopbackRuntime
    tree: FakeTree
    config_path: Path
    base: dict[str, Any]
    #: The reason of each reload the App has finished, follow-up writes and counts included.
    reloaded: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    #: The plugin's reply to the runtime's first Synchronize.
    synchronized: api.SynchronizeResponse | None = None

    async def watched_reload(self) -> str:
        """Wait for the file watcher's next reload pass to end, and return its reason.

        Waiting for the files to change is not enough: the pass counts what it
        wrote only after its writer thread returns.
        """
        async with asyncio.timeout(STEP_TIMEOUT):
            return await self.reloaded.get()

    async def call(self, method: str, request: Any, response_type: type[Any]) -> Any:
        return await self.runtime.call(method, request, response_type)

    async def create(self, pod: api.PodSandbox, ctr: api.Container) -> None:
        reply = await self.call(
            "CreateContainer",
            api.CreateContainerRequest(pod=pod, container=ctr),
            api.CreateContainerResponse,
        )
        assert reply.adjust.linux.resources.cpu.quota.value == 100_000

    async def state_change(
        self, event: int, pod: api.PodSandbox, ctr: api.Container | None = None
    ) -> None:
        """How a runtime before NRI v0.10 delivers pod and container lifecycle events."""
        await self.call(
            "StateChange", api.StateChangeEvent(event=event, pod=pod, container=ctr), api.Empty
        )

    async def reload_applying_updates(self, parent: str) -> None:
        """A SIGHUP reload, the runtime applying the UpdateContainers it gets to the
        containers' files (under the pod cgroup `parent`) before it answers, as containerd
        runs runc update before its reply."""
        seen = len(self.runtime.record.updates)
        self.runtime.answering_updates.clear()
        reload = asyncio.create_task(self.app.reload("SIGHUP"))
        await until(lambda: reload.done() or len(self.runtime.record.updates) > seen, "an update")
        for update in self.runtime.record.updates[seen:]:
            cpu, memory = update.linux.resources.cpu, update.linux.resources.memory
            values = Values(cpu.shares.value, cpu.quota.value, memory.limit.value)
            self.tree.write(parent, values, update.container_id)
        self.runtime.answering_updates.set()
        await asyncio.wait_for(reload, STEP_TIMEOUT)

    def rewrite(self, **changes: Any) -> None:
        write_config(self.config_path, {**self.base, **changes})


@asynccontextmanager
async def running_node(
    tmp_path: Path,
    *,
    nri_version: str = "",
    runtime_name: str = "containerd",
    runtime_version: str = "v1.7.24",
    watch: bool = True,
    failed_updates: tuple[str, ...] = (),
    state_dir: Path | None = None,
    status_socket: Path | None = None,
    synchronized: tuple[Sequence[api.PodSandbox], Sequence[api.Container]] = ((), ()),
    deferred_timings: DeferredTimings = DeferredTimings(),
    lowering_timings: LoweringTimings = LoweringTimings(),
    cgroup_files: KernelRules = KERNEL_RULES,
    **config: Any,
) -> AsyncIterator[Node]:
    """An App on a fake tree at tmp_path/cgroup (kept if there: a restarted plugin's node),
    its cgroup files read and written through `cgroup_files` (tests/fake_cgroups.py)."""
    tree = FakeTree(tmp_path / "cgroup")
    cgroups = {"root": str(tree.root), **config.pop("cgroups", {})}
    base = {"cgroups": cgroups, **config}
    config_path = tmp_path / "config.yaml"
    write_config(config_path, base)
    app = App(
        settings_of(load_config_file(config_path)),
        name="midbatch",
        idx="10",
        config_path=str(config_path),
        reload_interval=0.05,
        state_dir=state_dir,
        status_socket=status_socket,
        deferred_timings=deferred_timings,
        lowering_timings=lowering_timings,
        cgroup_files=cgroup_files,
    )
    plugin_end, runtime_end = socket.socketpair()
    runtime = await LoopbackRuntime.over(runtime_end, failed_updates=failed_updates)
    node = Node(app, runtime, tree, config_path, base)
    reload = app.reload

    async def reload_and_tell(reason: str) -> None:
        await reload(reason)
        node.reloaded.put_nowait(reason)

    app.reload = reload_and_tell  # type: ignore[method-assign]
    task = asyncio.create_task(app.session.run(plugin_end))
    services = app._services() if watch else _nothing()
    try:
        async with services:
            _, node.synchronized = await runtime.start(
                runtime_name=runtime_name,
                runtime_version=runtime_version,
                nri_version=nri_version,
                pods=synchronized[0],
                containers=synchronized[1],
            )
            yield node
    finally:
        await runtime.close()
        app.session.close()
        await asyncio.gather(task, return_exceptions=True)


@asynccontextmanager
async def _nothing() -> AsyncIterator[None]:
    yield


async def until(condition: Callable[[], bool], what: str, timeout: float = STEP_TIMEOUT) -> None:
    """Poll for a state that no event announces: the App's counts (a reload that no single
    pass announces, a refusal), SystemdUnits' counts, files written in a thread."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(POLL)
    assert condition(), what


# ---------------------------------------------------------------------------
# An App serving metrics and health
# ---------------------------------------------------------------------------


def make_config(root: Path, **extra: Any) -> Config:
    return load_config_text(json.dumps({"cgroups": {"root": str(root)}, **extra}), "test")


# ---------------------------------------------------------------------------
# Scraping
# ---------------------------------------------------------------------------


class Scrape:
    """One /metrics answer, parsed by prometheus_client's own parser."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self.samples[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))


@dataclass
class Running:
    app: App
    runtime: LoopbackRuntime
    task: asyncio.Task[str]
    base: str

    async def get(self, path: str) -> tuple[int, str, str]:
        # From another thread: the server must not need the loop to answer.
        return await asyncio.to_thread(http_get, self.base + path)

    async def scrape(self) -> Scrape:
        status, content_type, text = await self.get("/metrics")
        assert status == 200
        assert content_type.startswith("text/plain; version=0.0.4")
        return Scrape(text)

    async def configure(self) -> api.ConfigureResponse:
        return await self.runtime.configure()

    async def sync(
        self, pods: list[api.PodSandbox], containers: list[api.Container]
    ) -> api.SynchronizeResponse:
        return await self.runtime.call(
            "Synchronize",
            api.SynchronizeRequest(pods=pods, containers=containers),
            api.SynchronizeResponse,
        )

    async def create(
        self, pod: api.PodSandbox, container: api.Container
    ) -> api.CreateContainerResponse:
        return await self.runtime.call(
            "CreateContainer",
            api.CreateContainerRequest(pod=pod, container=container),
            api.CreateContainerResponse,
        )

    async def run_pod_sandbox(self, pod: api.PodSandbox) -> api.RunPodSandboxResponse:
        return await self.runtime.call(
            "RunPodSandbox", api.RunPodSandboxRequest(pod=pod), api.RunPodSandboxResponse
        )


def _stop_in_background(app: App) -> None:
    # HealthServer.stop() joins the server's thread; nothing here needs to wait.
    assert app.health is not None
    threading.Thread(target=app.health.stop, daemon=True).start()


@asynccontextmanager
async def running_app(config: Config) -> AsyncIterator[Running]:
    app = App(
        settings_of(config),
        name="midbatch",
        idx="10",
        config_path=None,
        metrics_address="127.0.0.1:0",
    )
    assert app.health is not None
    app.health.start()
    base = f"http://127.0.0.1:{app.health.port}"
    try:
        # Not ready before anything connected.
        status, _, body = await asyncio.to_thread(http_get, base + "/readyz")
        assert (status, body) == (503, "not registered with a runtime\n")
        plugin_end, runtime_end = socket.socketpair()
        runtime = await LoopbackRuntime.over(runtime_end)
        task = asyncio.create_task(app.session.run(plugin_end))
        try:
            yield Running(app, runtime, task, base)
        finally:
            await runtime.close()
            app.session.close()
            await asyncio.gather(task, return_exceptions=True)
    finally:
        _stop_in_background(app)
