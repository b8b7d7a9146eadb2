"""Issue 23 as a model-based test: any history of events ends on the oracle's values.

A hypothesis state machine drives the real App through the containerd-like fake runtime
(history_harness.py) over a real socketpair and a fake cgroup tree, v1 or v2: pods of
every kind run and go, containers are created, resized and removed, the runtime
synchronizes or restarts, the plugin restarts, and the configuration is reloaded, alone
or in bursts; kubelet recreates sandboxes under the same uid, and the bound on the pods
the plugin remembers is made small (history_uids.py); kubelet writes a resized pod's cgroup
before its containers, after them or after UpdatePodSandbox, or reverts an UpdatePodSandbox
whose pod write failed, and someone else writes any file. After every step every pod and
container file, and every reply, must equal the oracle's target (tests/oracle), and nothing
may be looser than kubelet's values: at once after each event, after the plugin's short
re-check when kubelet wrote last, and after one convergence pass when someone else did; pods
the plugin forgot to stay within its bound, only from the next Synchronize that lists them.

`make test` runs a fixed budget; `HYPOTHESIS_PROFILE=long` runs the long one
(docs/testing.md).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.oracle.model import MI, Config, ContainerModel, Extended, Kind, Native, PodModel
from tests.oracle.targets import (
    UNLIMITED,
    Values,
    container_target,
    kubelet_container,
    kubelet_pod,
    pod_target,
)

from .history_harness import (
    CONTAINERD_1_7,
    CONTAINERD_2,
    HistoryNode,
    KubeletOrder,
    RuntimeFlavour,
    start_node,
    validate_in_process,
)
from .history_uids import SandboxSteps
from .nri_fixtures import STEP_TIMEOUT

T = TypeVar("T")

#: `make test`'s budget (see docs/testing.md for its time): the same histories every run,
#: so that a red run is the code's and replays as it was; the long profile explores afresh.
#: No shrinking: a failing history is shown as found, in bounded time; the long profile
#: shrinks it.
FIXED_BUDGET = settings(
    max_examples=50,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)
#: The long profile's own numbers (tests/conftest.py) apply instead of the fixed budget.
BUDGET = settings(deadline=None) if os.environ.get("HYPOTHESIS_PROFILE") == "long" else FIXED_BUDGET

MAX_PODS = 4

# -- what the model generates ---------------------------------------------

#: Native resources a burstable container is created or resized with.
NATIVES = (
    Native(cpu_request=500, cpu_limit=1000, memory_limit=512 * MI),
    Native(cpu_request=500, cpu_limit=1500, memory_limit=512 * MI),
    Native(cpu_request=1000, cpu_limit=4000, memory_limit=2048 * MI),
    Native(cpu_request=250, cpu_limit=None, memory_limit=None),
)
OVERHEADS = (Native(), Native(cpu_request=250, cpu_limit=250, memory_limit=64 * MI))
BATCH = Extended(cpu_request=500, cpu_limit=1000, memory_limit=512 * MI)
MID = Extended(cpu_request=1000, cpu_limit=2000, memory_limit=1024 * MI)
NO_LIMITS = Extended(cpu_request=500)
#: Kubelet's pod write in a resize: before the containers, after them, after UpdatePodSandbox.
ORDERS: tuple[KubeletOrder, ...] = ("pod-first", "pod-after", "sandbox")
#: What a foreign writer puts into a pod's or a container's files, and which of them.
FOREIGN = (
    Values(2048, 300_000, 4096 * MI),
    Values(2, 1_000, 64 * MI),
    Values(1024, UNLIMITED, UNLIMITED),
)


@st.composite
def pods(draw: st.DrawFn, pod_id: str) -> PodModel:
    kind = draw(st.sampled_from(Kind))
    if kind.besteffort:
        app = BATCH if kind is Kind.BATCH_BE else MID
        side = draw(st.sampled_from((None, NO_LIMITS, app)))  # unlisted, no limits, or alike
        containers = [ContainerModel("app", app, Native())]
        if draw(st.booleans()):
            containers.append(ContainerModel("side", side, Native()))
        return PodModel(pod_id, kind, tuple(containers))
    extended = MID if kind is Kind.MID_LS else None
    count = draw(st.integers(1, 2))
    containers = [
        ContainerModel(name, extended, draw(st.sampled_from(NATIVES)))
        for name in ("app", "side")[:count]
    ]
    return PodModel(pod_id, kind, tuple(containers), draw(st.sampled_from(OVERHEADS)))


CONFIGS = st.builds(
    Config,
    ratio=st.sampled_from((None, "1.0", "1.2", "2")),
    cfs_quota=st.booleans(),
    mid_tier=st.booleans(),
    normalization_tier=st.booleans(),
    observe=st.booleans(),
    pod_level=st.booleans(),
)


class History(SandboxSteps, RuleBasedStateMachine):
    cgroup_version = 1

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tmp = Path(tempfile.mkdtemp(prefix="history-"))
        self.node: HistoryNode | None = None
        self.next_pod = 0
        #: replies that differed from the oracle (CreateContainer, UpdateContainer)
        self.bad_replies: list[str] = []

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        async def bounded() -> T:
            async with asyncio.timeout(3 * STEP_TIMEOUT):
                return await coro

        return self.loop.run_until_complete(bounded())

    @property
    def n(self) -> HistoryNode:
        assert self.node is not None
        return self.node

    @initialize(
        flavour=st.sampled_from((CONTAINERD_2, CONTAINERD_1_7)),
        config=CONFIGS,
    )
    def start(self, flavour: RuntimeFlavour, config: Config) -> None:
        self.node = self._run(
            start_node(self.tmp, cgroup_version=self.cgroup_version, flavour=flavour, config=config)
        )

    def teardown(self) -> None:
        try:
            if self.node is not None:
                self._run(self.node.stop_plugin())
        finally:
            self.loop.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    # -- pods and containers -----------------------------------------------

    @precondition(lambda self: len(self.n.pods) < MAX_PODS)
    @rule(data=st.data())
    def run_pod(self, data: st.DataObject) -> None:
        pod = data.draw(pods(f"p{self.next_pod}"), label="pod")
        self.next_pod += 1
        self._run(self.n.run_pod(pod))

    def _not_created(self) -> list[tuple[str, str]]:
        return sorted(
            (pod.id, c.name)
            for pod in self.n.pods.values()
            for c in pod.containers
            if f"{pod.id}-{c.name}" not in self.n.created
        )

    @precondition(lambda self: self._not_created())
    @rule(data=st.data())
    def create(self, data: st.DataObject) -> None:
        pod_id, name = data.draw(st.sampled_from(self._not_created()), label="container")
        self.bad_replies += self._run(self.n.create(pod_id, name))

    @precondition(lambda self: self.n.created)
    @rule(data=st.data(), order=st.sampled_from(ORDERS))
    def update(self, data: st.DataObject, order: KubeletOrder) -> None:
        """UpdateContainer from kubelet: the same resources, or (burstable pods) a resize, with
        kubelet's pod write before the containers, after them, or after UpdatePodSandbox.

        Once the plugin's re-checks have run, the pod's files must equal the oracle's.
        """
        container_id = data.draw(st.sampled_from(sorted(self.n.created)), label="container")
        pod = self.n.pods[self.n.created[container_id]]
        container = pod.container(container_id.removeprefix(f"{pod.id}-"))
        native = container.native
        if not pod.kind.besteffort:
            native = data.draw(st.sampled_from(NATIVES), label="native")
        self.bad_replies += self._run(self.n.resize(pod.id, container.name, native, order))

    def _resizable(self) -> list[str]:
        return sorted(c for c, p in self.n.created.items() if not self.n.pods[p].kind.besteffort)

    @precondition(lambda self: self._resizable())
    @rule(data=st.data(), order=st.sampled_from(ORDERS[1:]))
    def resize_kubelet_last(self, data: st.DataObject, order: KubeletOrder) -> None:
        """A resize to other values, kubelet's pod write coming after the plugin's."""
        container_id = data.draw(st.sampled_from(self._resizable()), label="container")
        pod = self.n.pods[self.n.created[container_id]]
        container = pod.container(container_id.removeprefix(f"{pod.id}-"))
        others = [n for n in NATIVES if n != container.native]
        native = data.draw(st.sampled_from(others), label="native")
        self.bad_replies += self._run(self.n.resize(pod.id, container.name, native, order))

    @precondition(lambda self: self._resizable() and self.n.containerd.flavour.pod_resources)
    @rule(data=st.data())
    def reverted_resize(self, data: st.DataObject) -> None:
        """UpdatePodSandbox for a resize whose pod write fails, then its revert."""
        container_id = data.draw(st.sampled_from(self._resizable()), label="container")
        pod = self.n.pods[self.n.created[container_id]]
        container = pod.container(container_id.removeprefix(f"{pod.id}-"))
        native = data.draw(st.sampled_from(NATIVES), label="native")
        self.bad_replies += self._run(self.n.reverted_resize(pod.id, container.name, native))

    def _held_by_the_oracle(self) -> list[tuple[str, str]]:
        """(cgroup, field) where the oracle's value is not kubelet's: the plugin's to keep.

        A file the plugin leaves at kubelet's value may be another plugin's: not repaired.
        Nor is a container's cpu weight on cgroup v2 (configuration.md).
        """
        node = self.n
        pod_resources = node.containerd.flavour.pod_resources
        held = []
        for pod in node.pods.values():
            want = pod_target(pod, node.config, pod_resources=pod_resources)
            held += _differing(pod.cgroup_parent, want, kubelet_pod(pod))
        for container_id, pod_id in node.created.items():
            pod = node.pods[pod_id]
            container = pod.container(container_id.removeprefix(f"{pod_id}-"))
            want = container_target(pod, container, node.config)
            path = f"{pod.cgroup_parent}/{container_id}"
            differing = _differing(path, want, kubelet_container(container.native))
            # A container's cpu weight is the runtime's conversion: not compared on v2.
            held += [d for d in differing if node.tree.version == 1 or d[1] != "shares"]
        return sorted(held)

    def _held_by_the_plugin(self) -> list[tuple[str, str]]:
        """What the oracle holds of the plugin's, less what it came to claim on pods it forgot."""
        return self.held_while_forgotten(self._held_by_the_oracle())

    @precondition(lambda self: self._held_by_the_plugin())
    @rule(data=st.data(), values=st.sampled_from(FOREIGN))
    def foreign_write(self, data: st.DataObject, values: Values) -> None:
        """Someone else writes a value the plugin keeps in a pod's or a container's files; the
        plugin's pass runs next, as it would within its interval."""
        path, name = data.draw(st.sampled_from(self._held_by_the_plugin()), label="file")
        self.n.foreign_write(path, values, (name,))
        self._run(self.n.converge())

    @precondition(lambda self: self.n.created)
    @rule(data=st.data())
    def remove_container(self, data: st.DataObject) -> None:
        container_id = data.draw(st.sampled_from(sorted(self.n.created)), label="container")
        self._run(self.n.remove_container(container_id))

    @precondition(lambda self: self.n.pods)
    @rule(data=st.data())
    def remove_pod(self, data: st.DataObject) -> None:
        pod_id = data.draw(st.sampled_from(sorted(self.n.pods)), label="pod")
        self._run(self.n.remove_pod(pod_id))

    # -- the runtime, the plugin, the configuration --------------------------

    @rule()
    def synchronize(self) -> None:
        self._run(self.n.synchronize())

    @rule()
    def restart_runtime(self) -> None:
        self._run(self.n.restart_runtime())

    @rule(config=CONFIGS)
    def restart_plugin(self, config: Config) -> None:
        """The plugin goes away and comes back, maybe with another configuration file."""

        async def restart() -> None:
            await self.n.stop_plugin()
            self.n.write_config(config)
            self.n.config = config
            await self.n.start_plugin()

        self._run(restart())

    @rule(config=CONFIGS)
    def reload(self, config: Config) -> None:
        self._run(self.n.reload(config))

    @rule(configs=st.lists(CONFIGS, min_size=1, max_size=5), last=CONFIGS)
    def burst_of_reloads(self, configs: list[Config], last: Config) -> None:
        """Reloads triggered back to back while the file changes; the last file must win."""
        node = self.n

        async def burst() -> None:
            assert node.app is not None
            reloads = []
            for config in (*configs, last):
                node.write_config(config)
                reloads.append(asyncio.create_task(node.app.reload("SIGHUP")))
                await asyncio.sleep(0)
            node.config = last
            await asyncio.gather(*reloads)
            await node.settle()

        self._run(burst())

    # -- the promise ---------------------------------------------------------

    @invariant()
    def values_equal_the_oracle(self) -> None:
        if self.node is None:
            return
        wrong = [*self.bad_replies, *self.node.mismatches(skip=self.forgotten())]
        assert not wrong, "\n".join(wrong)


def _differing(path: str, want: Values, kubelet: Values) -> list[tuple[str, str]]:
    return [
        (path, name)
        for name in ("shares", "quota", "memory")
        if getattr(want, name) != getattr(kubelet, name)
    ]


class HistoryOnCgroupV2(History):
    cgroup_version = 2


@pytest.mark.parametrize("machine", [History, HistoryOnCgroupV2], ids=["cgroup-v1", "cgroup-v2"])
def test_any_history_ends_on_the_oracles_values(
    machine: type[History], monkeypatch: pytest.MonkeyPatch
) -> None:
    validate_in_process(monkeypatch)
    run_state_machine_as_test(machine, settings=BUDGET)
