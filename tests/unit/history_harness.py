"""A node for the history tests: the real App, a containerd-like fake runtime, kubelet's files.

The fake runtime behaves as containerd does where issue 23 looks: it keeps each
container's resources and annotations, applies the plugin's adjustments and updates
(CreateContainer, UpdateContainer replies, Synchronize replies, unsolicited
UpdateContainers) to what it keeps and to the container's cgroup files, and after a
restart registers again and synchronizes what it kept. "Kubelet" writes each pod's
cgroup before RunPodSandbox, and again when a resize changes the pod's values.

Everything is compared against tests/oracle, which shares no code with the plugin.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import socket
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, TypeVar

import pytest
from google.protobuf.message import Message

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.config.compile import settings_of
from nri_midbatch.config.model import load_config_file
from nri_midbatch.config.settings import Settings
from nri_midbatch.nri.testing import LoopbackRuntime
from nri_midbatch.plugin.reconcile import ConvergenceTimings
from nri_midbatch.process import app as app_module
from nri_midbatch.process.app import App
from nri_midbatch.rpc.service import CallContext, Method, Service
from tests.fake_cgroups import KERNEL_RULES, FakeTree
from tests.oracle.model import Config, ContainerModel, Native, PodModel
from tests.oracle.targets import (
    UNLIMITED,
    Values,
    container_target,
    kubelet_container,
    kubelet_pod,
    looser_than,
    pod_target,
)

from .nri_fixtures import STEP_TIMEOUT

ResponseT = TypeVar("ResponseT", bound=Message)
KubeletOrder = Literal["pod-first", "pod-after", "sandbox"]


def in_process_settings(path: str | Path) -> Settings:
    """The file's settings, validated in this process rather than in a child.

    The App validates a reloaded file in a child process (0.3 s of CPU each); the
    model tests reload hundreds of times on a shared 2-core machine. What a reload
    does once the file is validated is the App's own code either way.
    """
    return settings_of(load_config_file(path))


def validate_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Have the App's reloads validate with `in_process_settings`."""
    monkeypatch.setattr(app_module, "load_settings_file", in_process_settings)


def resources_of(values: Values) -> api.LinuxResources:
    """LinuxResources as containerd's CRI plugin fills them from kubelet's request."""
    resources = api.LinuxResources()
    resources.cpu.shares.value = values.shares
    resources.cpu.period.value = 100_000
    if values.quota != UNLIMITED:
        resources.cpu.quota.value = values.quota
    if values.memory != UNLIMITED:
        resources.memory.limit.value = values.memory
    return resources


def values_of(resources: api.LinuxResources) -> Values:
    cpu = resources.cpu
    quota = cpu.quota.value if cpu.HasField("quota") and cpu.quota.value > 0 else UNLIMITED
    memory = resources.memory.limit.value
    return Values(cpu.shares.value, quota, memory if memory > 0 else UNLIMITED)


def overlay(resources: api.LinuxResources, changes: api.LinuxResources) -> api.LinuxResources:
    """What containerd does with an adjustment or update: the fields it sets replace ours."""
    merged = api.LinuxResources()
    merged.CopyFrom(resources)
    if changes.cpu.HasField("shares"):
        merged.cpu.shares.value = changes.cpu.shares.value
    if changes.cpu.HasField("quota"):
        merged.cpu.quota.value = changes.cpu.quota.value
    if changes.memory.HasField("limit"):
        merged.memory.limit.value = changes.memory.limit.value
    return merged


def pod_resources_of(values: Values) -> api.LinuxResources:
    return resources_of(values)


class _Runtime(LoopbackRuntime):
    """A LoopbackRuntime whose UpdateContainers the fake containerd applies as it comes."""

    def __init__(self, containerd: FakeContainerd) -> None:
        self._containerd = containerd
        super().__init__()

    def _service(self) -> Service:
        """The loopback runtime's service, with UpdateContainers applied before the reply."""
        service = super()._service()
        answer = service.methods["UpdateContainers"]

        async def update(request: api.UpdateContainersRequest, ctx: CallContext) -> Message:
            self._containerd.apply(request.update)
            reply: Message = await answer.handler(request, ctx)
            return reply

        methods = {**service.methods, "UpdateContainers": Method(answer.request_type, update)}
        return Service(service.name, methods)


@dataclass(frozen=True)
class RuntimeFlavour:
    name: str
    version: str
    nri_version: str
    pod_resources: bool  # sends linux.pod_resources and pod_overhead (containerd 2.x)


#: containerd 2.x with an NRI whose UpdateContainers is safe: reloads go through it.
CONTAINERD_2 = RuntimeFlavour("containerd-2", "v2.4.0", "v0.12.2", pod_resources=True)
#: containerd 1.7.24 (NRI v0.6.1): no pod resources, reloads write container files.
CONTAINERD_1_7 = RuntimeFlavour("containerd-1.7", "v1.7.24", "", pod_resources=False)


class FakeContainerd:
    """The runtime's memory of pods and containers, and its side of the plugin connection."""

    def __init__(self, tree: FakeTree, flavour: RuntimeFlavour) -> None:
        self.tree, self.flavour = tree, flavour
        self.pods: dict[str, api.PodSandbox] = {}
        self.containers: dict[str, api.Container] = {}
        self.runtime: _Runtime | None = None
        self._session_task: asyncio.Task[str] | None = None
        #: Synchronizes sent, to tell when every pod has been listed again.
        self.synchronized = 0

    # -- the connection ------------------------------------------------------

    async def connect(self, app: App) -> None:
        """Accept the plugin: register, Configure, Synchronize what is kept."""
        plugin_end, runtime_end = socket.socketpair()
        self.runtime = _Runtime(self)
        await self.runtime.conn.attach(runtime_end)
        self._session_task = asyncio.create_task(app.session.run(plugin_end))
        await self.runtime.configure(
            runtime_name="containerd",
            runtime_version=self.flavour.version,
            nri_version=self.flavour.nri_version,
        )
        await self.synchronize()

    async def disconnect(self) -> None:
        if self.runtime is not None:
            await self.runtime.close()
        if self._session_task is not None:
            async with asyncio.timeout(STEP_TIMEOUT):
                await asyncio.gather(self._session_task, return_exceptions=True)
        self.runtime, self._session_task = None, None

    async def synchronize(self) -> None:
        self.synchronized += 1
        reply = await self._call(
            "Synchronize",
            api.SynchronizeRequest(
                pods=list(self.pods.values()), containers=list(self.containers.values())
            ),
            api.SynchronizeResponse,
        )
        self.apply(reply.update)

    async def _call(
        self, method: str, request: Message, response_type: type[ResponseT]
    ) -> ResponseT:
        assert self.runtime is not None, "no plugin connected"
        return await self.runtime.call(method, request, response_type)

    def apply(self, updates: Sequence[api.ContainerUpdate]) -> None:
        """Apply container updates to what is kept and to the cgroup files."""
        for update in updates:
            container = self.containers.get(update.container_id)
            if container is None:
                continue
            merged = overlay(container.linux.resources, update.linux.resources)
            container.linux.resources.CopyFrom(merged)
            self.tree.write(container.linux.cgroups_path, values_of(merged))

    # -- pods and containers -------------------------------------------------

    def sandbox(self, pod: PodModel) -> api.PodSandbox:
        sandbox = api.PodSandbox(
            id=pod.id,
            name=f"{pod.id}-name",
            uid=pod.uid,
            namespace="default",
            labels=pod.kind.labels,
            annotations=pod.annotations(),
            linux=api.LinuxPodSandbox(cgroup_parent=pod.cgroup_parent),
        )
        if self.flavour.pod_resources and not pod.kind.besteffort:
            self._set_pod_resources(sandbox, pod)
        return sandbox

    def _set_pod_resources(self, sandbox: api.PodSandbox, pod: PodModel) -> None:
        """containerd 2.x: the sum of the containers' resources, and the overhead apart."""
        containers = PodModel(pod.id, pod.kind, pod.containers)  # no overhead
        sandbox.linux.pod_resources.CopyFrom(resources_of(kubelet_pod(containers)))
        overhead = pod.overhead
        if overhead != Native():
            sandbox.linux.pod_overhead.CopyFrom(resources_of(kubelet_container(overhead)))

    async def run_pod(self, pod: PodModel) -> None:
        self.tree.write(pod.cgroup_parent, kubelet_pod(pod))  # kubelet, before the sandbox
        await self.run_sandbox(pod)

    async def run_sandbox(self, pod: PodModel) -> None:
        """RunPodSandbox, in the pod cgroup as it is."""
        sandbox = self.pods[pod.id] = self.sandbox(pod)
        await self._call(
            "StateChange",
            api.StateChangeEvent(event=api.RUN_POD_SANDBOX, pod=sandbox),
            api.Empty,
        )

    async def create(self, pod: PodModel, container: ContainerModel) -> api.ContainerAdjustment:
        container_id = f"{pod.id}-{container.name}"
        ctr = api.Container(
            id=container_id,
            pod_sandbox_id=pod.id,
            name=container.name,
            state=api.CONTAINER_CREATED,
        )
        ctr.linux.resources.CopyFrom(resources_of(kubelet_container(container.native)))
        ctr.linux.cgroups_path = f"{pod.cgroup_parent}/{container_id}"
        reply = await self._call(
            "CreateContainer",
            api.CreateContainerRequest(pod=self.pods[pod.id], container=ctr),
            api.CreateContainerResponse,
        )
        adjust = reply.adjust
        for key, value in adjust.annotations.items():
            ctr.annotations[key] = value
        ctr.linux.resources.CopyFrom(overlay(ctr.linux.resources, adjust.linux.resources))
        ctr.state = api.CONTAINER_RUNNING
        self.containers[container_id] = ctr
        self.apply(reply.update)
        self.tree.write(ctr.linux.cgroups_path, values_of(ctr.linux.resources))  # runc
        return adjust

    def kubelet_pod_write(self, before: PodModel, after: PodModel, *, whole: bool = False) -> None:
        """Kubelet's own pod cgroup write for a resize: the values it changes, and only those
        (doPodResizeAction sets the cpu quota, the cpu shares and the memory limit apart);
        `whole`: all three, as a kubelet that writes its whole pod config would."""
        old, new = kubelet_pod(before), kubelet_pod(after)
        changed = tuple(
            name
            for name in ("shares", "quota", "memory")
            if whole or getattr(old, name) != getattr(new, name)
        )
        if changed:
            self.tree.write(after.cgroup_parent, new, only=changed)

    async def update_pod_sandbox(self, pod: PodModel) -> None:
        """UpdatePodSandbox (NRI v0.10+) with kubelet's pod values for `pod`, overhead apart."""
        sandbox = self.pods[pod.id] = self.sandbox(pod)
        await self._call(
            "UpdatePodSandbox",
            api.UpdatePodSandboxRequest(
                pod=sandbox,
                overhead_linux_resources=sandbox.linux.pod_overhead,
                linux_resources=sandbox.linux.pod_resources,
            ),
            api.UpdatePodSandboxResponse,
        )

    async def resize(
        self, before: PodModel, after: PodModel, name: str, *, pod_first: bool = True
    ) -> Values:
        """kubelet's in-place resize of one container: pod cgroup first (`pod_first`), then
        the runtime; else the pod cgroup is the caller's to write.

        Whatever the order asked, kubelet raises a pod's cpu before its containers and lowers
        it after them (doPodResizeAction), as cgroup v1 refuses a container's quota above its
        pod's: a rising pod quota is written first, a falling one after the container.

        Returns the values the container ends with.
        """
        old, new = kubelet_pod(before), kubelet_pod(after)
        rises = "quota" in looser_than(new, old)
        lowers = "quota" in looser_than(old, new)
        if pod_first and new != old and not lowers:
            self.tree.write(after.cgroup_parent, new)
        elif not pod_first and rises:
            self.tree.write(after.cgroup_parent, new, only=("shares", "quota"))
        sandbox = self.pods[after.id] = self.sandbox(after)
        container_id = f"{after.id}-{name}"
        ctr = self.containers[container_id]
        requested = resources_of(kubelet_container(after.container(name).native))
        reply = await self._call(
            "UpdateContainer",
            api.UpdateContainerRequest(pod=sandbox, container=ctr, linux_resources=requested),
            api.UpdateContainerResponse,
        )
        own = [u for u in reply.update if u.container_id == container_id]
        others = [u for u in reply.update if u.container_id != container_id]
        final = requested
        for update in own:
            final = overlay(final, update.linux.resources)
        ctr.linux.resources.CopyFrom(final)
        self.tree.write(ctr.linux.cgroups_path, values_of(final))
        if pod_first and lowers:
            self.tree.write(after.cgroup_parent, new)
        self.apply(others)
        return values_of(final)

    def stop(self, ctr: api.Container) -> None:
        """The container's task ends: runc deletes its cgroup (on v1 its quota would still
        bound its pod's)."""
        ctr.state = api.CONTAINER_STOPPED
        for controller in ("cpu", "memory"):
            shutil.rmtree(self.tree.directory(controller, ctr.linux.cgroups_path), True)

    async def remove_container(self, container_id: str) -> None:
        ctr = self.containers.pop(container_id)
        self.stop(ctr)
        await self._call(
            "StateChange",
            api.StateChangeEvent(
                event=api.REMOVE_CONTAINER, pod=self.pods[ctr.pod_sandbox_id], container=ctr
            ),
            api.Empty,
        )

    async def remove_pod(self, pod_id: str) -> None:
        for container_id in [c.id for c in self.containers.values() if c.pod_sandbox_id == pod_id]:
            await self.remove_container(container_id)
        sandbox = self.pods.pop(pod_id)
        await self._call(
            "StateChange",
            api.StateChangeEvent(event=api.REMOVE_POD_SANDBOX, pod=sandbox),
            api.Empty,
        )


# ---------------------------------------------------------------------------
# The node: App, runtime, tree and the model of what kubelet asked for
# ---------------------------------------------------------------------------


#: The plugin's re-checks after a resize run when the history says (`HistoryNode.recheck`),
#: never on their own: on a loaded machine a step can outlast the real 0.3 s and 2 s, and a
#: re-check that ran before kubelet's pod write made a history fail, and not again.
RECHECKS_ON_CUE = ConvergenceTimings(rechecks=(3600.0, 7200.0))


@dataclass
class HistoryNode:
    tmp: Path
    tree: FakeTree
    containerd: FakeContainerd
    config: Config
    pods: dict[str, PodModel] = field(default_factory=dict)
    #: container id -> its pod id, for the containers created and not removed
    created: dict[str, str] = field(default_factory=dict)
    #: Pods a container of which was resized: on cgroup v2 without the runtime's pod
    #: resources, the plugin knows their shares only to within one weight (configuration.md).
    resized: set[str] = field(default_factory=set)
    app: App | None = None
    #: Sandboxes kubelet replaced and has not removed yet (dead, with stopped containers).
    stale: list[str] = field(default_factory=list)
    #: The bound on the pods the plugin remembers, where a test makes it small.
    max_pods: int | None = None
    #: The convergence pass's timings (its piece size, where a test makes it small).
    convergence_timings: ConvergenceTimings = RECHECKS_ON_CUE

    @property
    def config_path(self) -> Path:
        return self.tmp / "config.yaml"

    @property
    def state_dir(self) -> Path:
        """Survives plugin restarts, as the plugin's state directory on a node does."""
        return self.tmp / "state"

    def write_config(self, config: Config) -> None:
        """Replace the file as a ConfigMap update does: a new inode behind the same path."""
        staging = self.config_path.with_name("config.yaml.new")
        staging.write_text(json.dumps(config.document(str(self.tree.root))))
        os.replace(staging, self.config_path)

    async def start_plugin(self) -> None:
        self.app = new_app(self.config_path, self.state_dir, self.convergence_timings)
        if self.max_pods is not None:
            self.app.plugin.live.known.max_pods = self.max_pods
        await self.containerd.connect(self.app)
        await self.settle()

    async def stop_plugin(self) -> None:
        await self.containerd.disconnect()
        if self.app is not None:
            self.app.session.close()
            self.app.plugin.after_reply.flush()
        self.app = None

    async def restart_plugin(self) -> None:
        await self.stop_plugin()
        await self.start_plugin()

    async def restart_runtime(self) -> None:
        """The runtime goes away and comes back: the same plugin registers again."""
        assert self.app is not None
        await self.containerd.disconnect()
        await self.containerd.connect(self.app)
        await self.settle()

    async def settle(self) -> None:
        """Let the work the App left for after its replies finish (pod writes, repairs)."""
        assert self.app is not None
        async with asyncio.timeout(STEP_TIMEOUT):
            await self.app.plugin.after_reply.settle()

    async def reload(self, config: Config) -> None:
        """Write the file and reload it as SIGHUP does."""
        assert self.app is not None
        self.write_config(config)
        self.config = config
        async with asyncio.timeout(STEP_TIMEOUT):
            await self.app.reload("SIGHUP")
        await self.settle()

    async def run_pod(self, pod: PodModel) -> None:
        self.pods[pod.id] = pod
        await self.containerd.run_pod(pod)
        await self.settle()

    async def create(self, pod_id: str, name: str) -> list[str]:
        """Create a container; returns how its adjustment differs from the oracle."""
        pod = self.pods[pod_id]
        adjust = await self.containerd.create(pod, pod.container(name))
        self.created[f"{pod_id}-{name}"] = pod_id
        await self.settle()
        got = values_of(
            overlay(
                resources_of(kubelet_container(pod.container(name).native)), adjust.linux.resources
            )
        )
        want = container_target(pod, pod.container(name), self.config)
        return (
            []
            if got == want
            else [f"CreateContainer {pod_id}/{name}: adjusted to {got}, oracle {want}"]
        )

    async def resize(
        self, pod_id: str, name: str, native: Native, order: KubeletOrder = "pod-first"
    ) -> list[str]:
        """Resize a container as kubelet does in `order`; returns how the UpdateContainer reply
        differs from the oracle, and, once the plugin's re-checks have run, the pod's files.

        `pod-first`: the pod cgroup, then the container (kubelet, for an increase).
        `pod-after`: the container, the plugin's work after its reply, then kubelet's pod
        write (for a decrease; the plugin's pod write comes first).
        `sandbox`: the container, then UpdatePodSandbox where the runtime relays it, then
        kubelet's pod write (kubernetes#137555, either direction).
        """
        before = self.pods[pod_id]
        after = self.pods[pod_id] = before.resized(name, native)
        self.resized.add(pod_id)
        got = await self.containerd.resize(before, after, name, pod_first=order == "pod-first")
        await self.settle()
        if order == "sandbox" and self.containerd.flavour.pod_resources:
            await self.containerd.update_pod_sandbox(after)
            await self.settle()
        if order != "pod-first":
            self.containerd.kubelet_pod_write(before, after)
        want = container_target(after, after.container(name), self.config)
        wrong = (
            []
            if got == want
            else [f"UpdateContainer {pod_id}/{name}: updated to {got}, oracle {want}"]
        )
        await self.recheck()
        return wrong + [w for w in self.mismatches() if w.startswith(f"pod {pod_id}:")]

    async def reverted_resize(self, pod_id: str, name: str, native: Native) -> list[str]:
        """Kubelet's resize that fails at its pod write (kubernetes#137555, an increase: pod
        first): UpdatePodSandbox with the new values, then again with the old ones, the
        containers untouched. Returns how the pod's files differ from the oracle's once the
        plugin's re-checks ran."""
        pod = self.pods[pod_id]
        await self.containerd.update_pod_sandbox(pod.resized(name, native))
        await self.settle()
        await self.containerd.update_pod_sandbox(pod)
        await self.settle()
        await self.recheck()
        return [w for w in self.mismatches() if w.startswith(f"pod {pod_id}:")]

    async def recheck(self) -> None:
        """Run the plugin's pending re-checks now, as their time would."""
        assert self.app is not None
        self.app.plugin.reconcile.recheck_now()
        await self.settle()

    async def converge(self) -> None:
        """One convergence pass, as its interval would."""
        assert self.app is not None
        async with asyncio.timeout(STEP_TIMEOUT):
            await self.app.plugin.reconcile.converge()
        await self.settle()

    def foreign_write(self, relpath: str, values: Values, fields: tuple[str, ...]) -> None:
        """Anyone else (an operator, an agent) writes some of a pod's or container's files;
        cgroup v1 refuses a quota above the pod's or below a container's, as it would theirs."""
        try:
            self.tree.write(relpath, values, only=fields)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise

    async def remove_container(self, container_id: str) -> None:
        del self.created[container_id]
        await self.containerd.remove_container(container_id)
        await self.settle()

    async def remove_pod(self, pod_id: str) -> None:
        del self.pods[pod_id]
        self.resized.discard(pod_id)
        self.created = {c: p for c, p in self.created.items() if p != pod_id}
        await self.containerd.remove_pod(pod_id)
        await self.settle()

    async def synchronize(self) -> None:
        await self.containerd.synchronize()
        await self.settle()

    def mismatches(self, skip: Collection[str] = ()) -> list[str]:
        """Every pod and container file that differs from the oracle, or is looser than kubelet.

        `skip`: pods (sandbox ids) whose files and containers are not looked at.
        """
        wrong = []
        pod_resources = self.containerd.flavour.pod_resources
        for pod in self.pods.values():
            if pod.id in skip:
                continue
            want = pod_target(pod, self.config, pod_resources=pod_resources)
            # The fewest shares the weight read gives, moved by the resize: as many or fewer.
            weight_slack = int(
                self.tree.version == 2 and not pod_resources and pod.id in self.resized
            )
            wrong += self._compare(
                f"pod {pod.id}", pod.cgroup_parent, want, kubelet_pod(pod), weight_slack
            )
        for container_id, pod_id in self.created.items():
            if pod_id in skip:
                continue
            pod = self.pods[pod_id]
            container = pod.container(container_id.removeprefix(f"{pod_id}-"))
            want = container_target(pod, container, self.config)
            relpath = f"{pod.cgroup_parent}/{container_id}"
            wrong += self._compare(
                f"container {container_id}", relpath, want, kubelet_container(container.native)
            )
        return wrong

    def _compare(
        self, what: str, relpath: str, want: Values, kubelet: Values, weight_slack: int = 0
    ) -> list[str]:
        """`weight_slack`: how far below the oracle's the cpu weight may be (cgroup v2)."""
        found = self.tree.read(relpath)
        expected = self.tree.expected(want)
        problems = []
        cpu_ok = expected.shares - weight_slack <= found.shares <= expected.shares
        if not cpu_ok or (found.quota, found.memory) != (expected.quota, expected.memory):
            problems.append(f"{what}: files hold {found}, oracle {expected}")
        held = Values(want.shares, found.quota, found.memory)
        looser = looser_than(held, kubelet)
        if looser:
            problems.append(f"{what}: {', '.join(looser)} looser than kubelet's {kubelet}")
        return problems


def new_app(config_path: Path, state_dir: Path, convergence_timings: ConvergenceTimings) -> App:
    """The one place the history tests build an App; `state_dir` survives plugin restarts."""
    return App(
        in_process_settings(config_path),
        name="midbatch",
        idx="10",
        config_path=str(config_path),
        state_dir=state_dir,
        cgroup_files=KERNEL_RULES,
        convergence_timings=convergence_timings,
    )


async def start_node(
    tmp: Path,
    *,
    cgroup_version: int,
    flavour: RuntimeFlavour,
    config: Config,
    convergence_timings: ConvergenceTimings = RECHECKS_ON_CUE,
) -> HistoryNode:
    tree = FakeTree(tmp / "cgroup", cgroup_version)
    node = HistoryNode(tmp, tree, FakeContainerd(tree, flavour), config)
    node.convergence_timings = convergence_timings
    node.state_dir.mkdir(exist_ok=True)
    node.write_config(config)
    await node.start_plugin()
    return node


# ---------------------------------------------------------------------------
# A pod is its uid (issue 34): sandboxes recreated, and the bound on the pods remembered
# ---------------------------------------------------------------------------


async def recreate_sandbox(
    node: HistoryNode, pod_id: str, new_id: str, *, old_removed_first: bool
) -> None:
    """Kubelet runs a new sandbox for the pod: the same uid and pod cgroup, a new sandbox id.

    Kubelet stops the old sandbox and its containers first; it does not write the pod
    cgroup again (it exists: `EnsureExists`). Its garbage collection removes the old sandbox
    with its containers, before the new one runs (`old_removed_first`) or later
    (`remove_stale_sandbox`).
    """
    old = node.pods.pop(pod_id)
    new = node.pods[new_id] = replace(old, id=new_id, pod_uid=old.uid)
    node.created = {c: p for c, p in node.created.items() if p != pod_id}
    if pod_id in node.resized:
        node.resized.discard(pod_id)
        node.resized.add(new_id)
    containerd = node.containerd
    for container in containerd.containers.values():
        if container.pod_sandbox_id == pod_id:
            containerd.stop(container)
    if old_removed_first:
        await containerd.remove_pod(pod_id)
    else:
        node.stale.append(pod_id)
    await containerd.run_sandbox(new)
    await node.settle()


async def remove_stale_sandbox(node: HistoryNode, pod_id: str) -> None:
    """Kubelet's garbage collection removes a replaced sandbox and its stopped containers."""
    node.stale.remove(pod_id)
    await node.containerd.remove_pod(pod_id)
    await node.settle()


def bound_the_table(node: HistoryNode, max_pods: int) -> None:
    """Make the bound on the pods the plugin remembers small, from now on and after restarts."""
    assert node.app is not None
    node.max_pods = max_pods
    node.app.plugin.live.known.max_pods = max_pods


def remembered(node: HistoryNode) -> set[str]:
    """The sandbox ids the plugin remembers now."""
    assert node.app is not None
    return set(node.app.plugin.live.known.pods)
