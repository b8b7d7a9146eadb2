"""The App keeps a large Synchronize out of the garbage collector's walks (process/heap.py).

What a Synchronize of a large node leaves behind is long-lived; left in the
collector's generations it would be walked by the full collections that its
own allocations set off, tens of milliseconds each on a node of 10,000
containers, in the middle of the chunks and of the work after the reply.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.process import session_watch
from nri_midbatch.process.heap import LARGE_SYNC
from tests.factory import container, prod_pod

from .app_node import make_config, running_app
from .nri_fixtures import STEP_TIMEOUT, run


@pytest.fixture(autouse=True)
def _unfreeze() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.enable()


def _node(pods: int) -> tuple[list[api.PodSandbox], list[api.Container]]:
    pod_list = [prod_pod(f"p{n}") for n in range(pods)]
    return pod_list, [container(f"c{n}", pod, "app") for n, pod in enumerate(pod_list)]


def _chunk(
    pods: list[api.PodSandbox], containers: list[api.Container], *, more: bool
) -> api.SynchronizeRequest:
    return api.SynchronizeRequest(pods=pods, containers=containers, more=more)


def test_a_large_synchronize_is_frozen_chunk_by_chunk_and_at_its_reply(tmp_path: Path) -> None:
    pods, containers = _node(LARGE_SYNC // 2 + 1)  # half in each chunk: together past the bound
    half = len(pods) // 2

    async def scenario() -> tuple[int, int, int]:
        async with running_app(make_config(tmp_path)) as running:
            await running.configure()
            before = gc.get_freeze_count()
            first = _chunk(pods[:half], containers[:half], more=True)
            await running.runtime.call("Synchronize", first, api.SynchronizeResponse)
            after_small_chunk = gc.get_freeze_count()
            second = _chunk(pods[half:], containers[half:], more=True)
            await running.runtime.call("Synchronize", second, api.SynchronizeResponse)
            after_large_chunk = gc.get_freeze_count()
            await running.sync([], [])
            return before, after_small_chunk, after_large_chunk - after_small_chunk

    before, after_small_chunk, frozen_by_chunk = run(scenario())
    # Below the bound so far: nothing frozen yet.
    assert after_small_chunk == before
    # The second chunk brings it past the bound: what the plugin keeps of the
    # chunks (a view per pod and container, at least) goes out of the walks.
    assert frozen_by_chunk >= len(pods) + len(containers)


def test_the_reply_of_a_large_synchronize_freezes_what_it_decided(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pods, containers = _node(LARGE_SYNC // 2 + 1)
    #: For each freeze: how many Synchronizes the session had answered.
    freezes: list[int] = []

    async def scenario() -> None:
        async with running_app(make_config(tmp_path)) as running:
            state = running.app.session.state
            monkeypatch.setattr(
                session_watch, "freeze_survivors", lambda: freezes.append(state.syncs)
            )
            await running.configure()
            await running.sync(pods, containers)

    run(scenario())
    # Once as the one chunk is taken in, once more when it has been decided and answered.
    assert freezes == [0, 1]


def test_a_small_synchronize_is_left_to_the_collector(tmp_path: Path) -> None:
    pods, containers = _node(10)

    async def scenario() -> int:
        async with running_app(make_config(tmp_path)) as running:
            await running.configure()
            await running.sync(pods, containers)
            return gc.get_freeze_count()

    assert run(scenario()) == 0


def test_no_collection_runs_while_a_large_synchronize_is_decided(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From its first large chunk to its reply, then as usual again (process/heap.py)."""
    pods, containers = _node(LARGE_SYNC // 2 + 1)
    half = len(pods) // 2
    #: Whether the collector runs by itself: while deciding, then once answered.
    enabled: list[bool] = []

    async def scenario() -> None:
        async with running_app(make_config(tmp_path)) as running:
            plugin = running.app.plugin
            decide = plugin.synchronize

            async def synchronize() -> api.SynchronizeResponse:
                enabled.append(gc.isenabled())
                return await decide()

            monkeypatch.setattr(plugin, "synchronize", synchronize)
            await running.configure()
            first = _chunk(pods[:half], containers[:half], more=True)
            await running.runtime.call("Synchronize", first, api.SynchronizeResponse)
            enabled.append(gc.isenabled())  # below the bound so far
            await running.sync(pods[half:], containers[half:])
            enabled.append(gc.isenabled())

    run(scenario())
    assert enabled == [True, False, True]


def test_a_synchronize_cut_off_gives_the_collector_back(tmp_path: Path) -> None:
    pods, containers = _node(LARGE_SYNC // 2 + 1)

    async def scenario() -> bool:
        async with running_app(make_config(tmp_path)) as running:
            await running.configure()
            chunk = _chunk(pods, containers, more=True)
            await running.runtime.call("Synchronize", chunk, api.SynchronizeResponse)
            held = not gc.isenabled()
            running.app.session.close()  # the connection goes in the middle of it
            await asyncio.wait({running.task}, timeout=STEP_TIMEOUT)  # the session has ended
            return held and gc.isenabled()

    assert run(scenario())
