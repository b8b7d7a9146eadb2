"""Configuration reload in a running App: the file is watched, and running workloads follow.

Operability §6: watched and hot-reloaded, schema-validated, last-known-good kept on error.
Where the runtime's UpdateContainers is unsafe (NRI < v0.12.2, e.g. containerd 1.7.24 with
NRI v0.6.1) running containers are brought to the new values through their cgroup files;
from v0.12.2 through UpdateContainers. Pod cgroups are always files (NRI cannot update them).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.cgroups.paths import CgroupLocation
from nri_midbatch.deferred import DeferredTimings
from nri_midbatch.plugin.lowering import LoweringTimings
from nri_midbatch.process.app import App
from tests.factory import MI, PRIORITY, QOS, batch_pod, container
from tests.fake_cgroups import BESTEFFORT, Watched
from tests.oracle.targets import UNLIMITED, Values

from .app_node import POLL, Node, running_node, until, write_config
from .hostile_config import HOSTILE_YAML
from .nri_fixtures import STEP_TIMEOUT, Probe, run

#: What CreateContainer gives an "app" container, and so what its cgroup holds afterwards.
APP_VALUES = Values(512, 100000, 512 * MI)
HALVED_VALUES = Values(512, 50000, 512 * MI)
#: A removed container's cgroup left behind, with no quota to hold its pod's up.
LINGERING = Values(512, UNLIMITED, 512 * MI)


def reloads_metric(app: App) -> dict[str, float]:
    text = generate_latest(app.metrics.registry).decode()
    (family,) = [
        f for f in text_string_to_metric_families(text) if f.name == "nri_midbatch_config_reloads"
    ]
    return {s.labels["result"]: s.value for s in family.samples if s.name.endswith("_total")}


# ---------------------------------------------------------------------------
# NRI v0.6.1 (containerd 1.7.24): UpdateContainers is unsafe, cgroup files are written
# ---------------------------------------------------------------------------


def test_file_change_brings_containers_and_pods_to_the_new_values(tmp_path: Path) -> None:
    pod = batch_pod()
    parent = pod.linux.cgroup_parent
    # An earlier instance of the same container, removed (restarted) before the reload.
    gone = container("c-gone", pod, "app")
    live = container("c-app", pod, "app")

    async def scenario() -> Node:
        async with running_node(tmp_path) as node:
            assert node.app.plugin.runtime is not None
            assert not node.app.plugin.runtime.update_containers_safe
            node.tree.write(parent, BESTEFFORT)
            await node.state_change(api.RUN_POD_SANDBOX, pod)
            assert node.tree.read(parent) == APP_VALUES
            # The runtime applied our adjustments to the containers' cgroups.
            for ctr in (gone, live):
                node.tree.write(parent, APP_VALUES, ctr.id)
                await node.create(pod, ctr)
            # Removed before the reload; its directory lingers, but it is not ours any more.
            # (Created first: a wrongly remembered c-gone would be written before c-app.)
            await node.state_change(api.REMOVE_CONTAINER, pod, gone)
            # Without a quota: cgroup v1 would keep the pod above a lingering child's.
            node.tree.write(parent, LINGERING, gone.id)

            node.rewrite(rules={"cpuNormalizationRatio": 2.0})
            assert await node.watched_reload() == "file changed"
            assert node.tree.read(parent, live.id) == HALVED_VALUES
            assert node.tree.read(parent).quota == 50000
            assert node.app.reloads == {"applied": 1}
            assert node.runtime.record.updates == []
            return node

    node = run(scenario())
    assert node.tree.read(parent) == HALVED_VALUES
    assert node.tree.read(parent, live.id) == HALVED_VALUES
    # One container and one pod through their files (NRI v0.6.1).
    assert node.app.plugin.reconcile.follow.followed[("cgroup_files", "ok")] == 2
    assert node.app.plugin.reconcile.follow.followed[("update_containers", "ok")] == 0
    assert node.tree.read(parent, gone.id) == LINGERING
    assert node.app.plugin.live.in_force.config.rules.cpu_normalization_ratio == 2.0
    assert reloads_metric(node.app)["applied"] == 1


def test_invalid_file_keeps_the_values_counts_and_names_the_field(tmp_path: Path) -> None:
    pod = batch_pod()
    parent = pod.linux.cgroup_parent
    live = container("c-app", pod, "app")

    async def scenario() -> Node:
        async with running_node(tmp_path) as node:
            node.tree.write(parent, BESTEFFORT)
            await node.state_change(api.RUN_POD_SANDBOX, pod)
            node.tree.write(parent, APP_VALUES, live.id)
            await node.create(pod, live)
            before = node.tree.snapshot()
            config = node.app.plugin.live.in_force.config

            # A misspelt key: the whole file is refused, nothing half-applied.
            node.rewrite(rules={"cpuNormalisationRatio": 2.0})
            assert await node.watched_reload() == "file changed"
            assert node.app.reloads == {"invalid": 1}
            assert node.app.plugin.live.in_force.config is config
            assert node.tree.snapshot() == before
            assert reloads_metric(node.app)["invalid"] == 1

            # Fixed: the next change is applied as usual.
            node.rewrite(rules={"cpuNormalizationRatio": 2.0})
            assert await node.watched_reload() == "file changed"
            assert node.tree.read(parent, live.id) == HALVED_VALUES
            assert node.tree.read(parent) == HALVED_VALUES
            assert node.app.reloads == {"invalid": 1, "applied": 1}
            return node

    with capture_logs() as logs:
        run(scenario())
    (rejected,) = [e for e in logs if e["event"].startswith("configuration rejected")]
    assert rejected["log_level"] == "error"
    assert "rules.cpuNormalisationRatio: unknown key" in rejected["error"]
    assert str(tmp_path / "config.yaml") in rejected["error"]


@pytest.mark.parametrize("nri_version", ["", "v0.12.0"])
def test_crio_container_without_a_cgroups_path_is_found_under_crios_name(
    tmp_path: Path, nri_version: str
) -> None:
    """CRI-O 1.37 vendors NRI v0.12.0: UpdateContainers is unsafe, files are written.

    Its cgroupfs containers live in `crio-<id>` below the pod (runc's default
    under containerd is the bare id). Without the runtime's cgroups_path the
    plugin must still find them by the runtime it is registered with, whether
    that runtime states its NRI version or leaves it to the version table.
    """
    pod = batch_pod()
    parent = pod.linux.cgroup_parent
    live = container("c-app", pod, "app")
    crio_dir = f"crio-{live.id}"

    async def scenario() -> Node:
        async with running_node(
            tmp_path,
            nri_version=nri_version,
            runtime_name="cri-o",
            runtime_version="1.37.0",
            watch=False,
        ) as node:
            runtime = node.app.plugin.runtime
            assert runtime is not None
            assert runtime.nri_version == (0, 12, 0)
            assert not runtime.update_containers_safe
            node.tree.write(parent, BESTEFFORT)
            await node.call("RunPodSandbox", api.RunPodSandboxRequest(pod=pod), api.Empty)
            node.tree.write(parent, APP_VALUES, crio_dir)
            await node.create(pod, live)

            node.rewrite(rules={"cpuNormalizationRatio": 2.0})
            await node.app.reload("SIGHUP")
            assert node.app.reloads == {"applied": 1}
            assert node.runtime.record.updates == []
            return node

    node = run(scenario())
    assert node.tree.read(parent, crio_dir) == HALVED_VALUES
    assert node.tree.read(parent) == HALVED_VALUES
    assert node.app.plugin.reconcile.follow.followed[("cgroup_files", "ok")] == 2
    assert node.app.plugin.reconcile.follow.followed[("cgroup_files", "failed")] == 0


# ---------------------------------------------------------------------------
# NRI v0.12.2: UpdateContainers is safe and carries the container values
# ---------------------------------------------------------------------------


def test_safe_runtime_gets_update_containers_and_no_container_file_is_written(
    tmp_path: Path,
) -> None:
    pod = batch_pod()
    parent = pod.linux.cgroup_parent
    gone = container("c-gone", pod, "app")
    live = container("c-app", pod, "app")

    async def scenario() -> Node:
        async with running_node(
            tmp_path, nri_version="v0.12.2", runtime_version="v2.4.0", watch=False
        ) as node:
            assert node.app.plugin.runtime is not None
            assert node.app.plugin.runtime.update_containers_safe
            node.tree.write(parent, BESTEFFORT)
            await node.call("RunPodSandbox", api.RunPodSandboxRequest(pod=pod), api.Empty)
            assert node.tree.read(parent) == APP_VALUES
            for ctr in (gone, live):
                node.tree.write(parent, APP_VALUES, ctr.id)
                await node.create(pod, ctr)
            await node.call(
                "RemoveContainer",
                api.RemoveContainerRequest(pod=pod, container=gone),
                api.RemoveContainerResponse,
            )
            node.tree.write(parent, LINGERING, gone.id)
            containers_before = {k: v for k, v in node.tree.snapshot().items() if "/c-" in k}

            node.rewrite(rules={"cpuNormalizationRatio": 2.0})
            # Returns once the pass is done; the runtime applies the update to c-app.
            await node.reload_applying_updates(parent)

            (update,) = node.runtime.record.updates
            assert update.container_id == "c-app"
            res = update.linux.resources
            assert (res.cpu.shares.value, res.cpu.quota.value, res.memory.limit.value) == (
                512,
                50_000,
                512 * MI,
            )
            # The runtime sets container cgroups; the plugin writes only the pod's.
            assert {k: v for k, v in node.tree.snapshot().items() if "/c-gone" in k} == {
                k: v for k, v in containers_before.items() if "/c-gone" in k
            }
            assert node.tree.read(parent, live.id) == HALVED_VALUES
            assert node.tree.read(parent) == HALVED_VALUES
            assert node.app.reloads == {"applied": 1}
            assert node.app.plugin.reconcile.follow.followed == {
                ("update_containers", "ok"): 1,
                ("update_containers", "refused"): 0,
                ("cgroup_files", "ok"): 1,  # the pod
                ("cgroup_files", "failed"): 0,
            }
            return node

    run(scenario())


def test_sighup_with_an_unchanged_file_counts_unchanged_and_touches_nothing(
    tmp_path: Path,
) -> None:
    pod = batch_pod()
    parent = pod.linux.cgroup_parent
    live = container("c-app", pod, "app")

    async def scenario() -> None:
        async with running_node(
            tmp_path, nri_version="v0.12.2", runtime_version="v2.4.0", watch=False
        ) as node:
            node.tree.write(parent, BESTEFFORT)
            await node.call("RunPodSandbox", api.RunPodSandboxRequest(pod=pod), api.Empty)
            node.tree.write(parent, APP_VALUES, live.id)
            await node.create(pod, live)
            before = node.tree.snapshot()
            config = node.app.plugin.live.in_force.config

            await node.app.reload("SIGHUP")
            # Rewritten with the same content (a ConfigMap resync): still unchanged.
            node.rewrite()
            await node.app.reload("SIGHUP")

            assert node.app.reloads == {"unchanged": 2}
            assert node.app.plugin.live.in_force.config is config
            assert node.runtime.record.updates == []
            assert node.tree.snapshot() == before
            assert reloads_metric(node.app)["unchanged"] == 2

    run(scenario())


def test_reload_with_pod_level_off_writes_no_pod_file(tmp_path: Path) -> None:
    pod = batch_pod()
    parent = pod.linux.cgroup_parent
    live = container("c-app", pod, "app")

    async def scenario() -> Node:
        async with running_node(tmp_path, watch=False, cgroups={"podLevel": False}) as node:
            node.tree.write(parent, BESTEFFORT)
            await node.state_change(api.RUN_POD_SANDBOX, pod)
            node.tree.write(parent, APP_VALUES, live.id)
            await node.create(pod, live)
            assert node.tree.read(parent) == BESTEFFORT

            node.rewrite(rules={"cpuNormalizationRatio": 2.0})
            await node.app.reload("SIGHUP")
            assert node.app.reloads == {"applied": 1}
            return node

    node = run(scenario())
    assert node.tree.read(parent, live.id) == HALVED_VALUES
    # podLevel: false means pod cgroups are kubelet's alone, on reload as on RunPodSandbox.
    assert node.tree.read(parent) == BESTEFFORT


def test_a_reload_lets_a_synchronizes_pending_pod_writes_land_first(tmp_path: Path) -> None:
    """A Synchronize's pod writes were decided under the old configuration: they go first.

    Otherwise a pod still waiting for the runtime to lower its containers
    would be written after the reload's plan, and put the old values back.
    """
    pod = batch_pod()
    parent = pod.linux.cgroup_parent
    live = container("c-app", pod, "app")

    async def scenario() -> Node:
        polls = LoweringTimings(poll=POLL)
        async with running_node(tmp_path, watch=False, lowering_timings=polls) as node:
            node.tree.write(parent, BESTEFFORT)
            node.tree.write(parent, BESTEFFORT, live.id)
            await node.call(
                "Synchronize",
                api.SynchronizeRequest(pods=[pod], containers=[live]),
                api.SynchronizeResponse,
            )
            # The pod waits for the runtime to lower its container.
            node.rewrite(rules={"cpuNormalizationRatio": 2.0})
            reload = asyncio.create_task(node.app.reload("SIGHUP"))
            await asyncio.sleep(POLL * 5)
            assert not reload.done()
            assert node.tree.read(parent) == BESTEFFORT
            node.tree.write(parent, APP_VALUES, live.id)  # the runtime applies the update
            await asyncio.wait_for(reload, STEP_TIMEOUT)
            assert node.app.reloads == {"applied": 1}
            # Nothing left to come after the reload's own writes.
            await node.app.plugin.after_reply.settle()
            return node

    node = run(scenario())
    assert node.tree.read(parent) == HALVED_VALUES
    assert node.tree.read(parent, live.id) == HALVED_VALUES


def test_reload_lowers_a_pod_only_after_update_containers_returns(tmp_path: Path) -> None:
    """The runtime has applied the updates when it replies: only then may the pod go down."""
    pod = batch_pod()
    parent = pod.linux.cgroup_parent
    live = container("c-app", pod, "app")
    #: how many updates the runtime had received at each pod write
    seen: list[int] = []
    files = Watched()

    async def scenario() -> None:
        async with running_node(
            tmp_path,
            nri_version="v0.12.2",
            runtime_version="v2.4.0",
            watch=False,
            cgroup_files=files,
        ) as node:
            node.tree.write(parent, BESTEFFORT)
            await node.call("RunPodSandbox", api.RunPodSandboxRequest(pod=pod), api.Empty)
            node.tree.write(parent, APP_VALUES, live.id)
            await node.create(pod, live)

            def apply(location: CgroupLocation) -> None:
                if location.container_id is None:
                    seen.append(len(node.runtime.record.updates))

            files.applying = apply
            node.rewrite(rules={"cpuNormalizationRatio": 2.0})
            await node.reload_applying_updates(parent)
            assert node.tree.read(parent) == HALVED_VALUES

    run(scenario())
    assert seen == [1]


def test_cgroup_file_reload_lowers_a_pod_after_its_containers(tmp_path: Path) -> None:
    """Without UpdateContainers the plugin writes both: containers down first, then the pod."""
    pod = batch_pod()
    parent = pod.linux.cgroup_parent
    live = container("c-app", pod, "app")
    #: the container's quota at each pod write
    seen: list[int] = []
    files = Watched()

    async def scenario() -> None:
        async with running_node(tmp_path, watch=False, cgroup_files=files) as node:
            node.tree.write(parent, BESTEFFORT)
            await node.call("RunPodSandbox", api.RunPodSandboxRequest(pod=pod), api.Empty)
            node.tree.write(parent, APP_VALUES, live.id)
            await node.create(pod, live)

            def apply(location: CgroupLocation) -> None:
                if location.container_id is None:
                    seen.append(node.tree.read(parent, live.id).quota)

            files.applying = apply
            node.rewrite(rules={"cpuNormalizationRatio": 2.0})
            await node.reload_applying_updates(parent)
            assert node.tree.read(parent) == HALVED_VALUES

    run(scenario())
    assert seen == [50000]


def test_a_container_the_runtime_could_not_update_is_named_counted_and_written(
    tmp_path: Path,
) -> None:
    pod = batch_pod()
    parent = pod.linux.cgroup_parent
    live = container("c-app", pod, "app")

    async def scenario() -> Node:
        async with running_node(
            tmp_path,
            nri_version="v0.12.2",
            runtime_version="v2.4.0",
            watch=False,
            failed_updates=("c-app",),
        ) as node:
            node.tree.write(parent, BESTEFFORT)
            await node.call("RunPodSandbox", api.RunPodSandboxRequest(pod=pod), api.Empty)
            node.tree.write(parent, APP_VALUES, live.id)
            await node.create(pod, live)
            node.rewrite(rules={"cpuNormalizationRatio": 2.0})
            with capture_logs() as logs:
                await node.app.reload("SIGHUP")
            (warning,) = [line for line in logs if line["log_level"] == "warning"]
            assert warning["event"] == (
                "runtime could not update the container, writing its cgroup files"
            )
            assert (warning["pod"], warning["container"]) == (pod.name, "app")
            return node

    node = run(scenario())
    assert node.app.plugin.reconcile.follow.followed[("update_containers", "refused")] == 1
    assert node.tree.read(parent, live.id) == HALVED_VALUES
    assert node.tree.read(parent) == HALVED_VALUES


# ---------------------------------------------------------------------------
# Hostile files while events flow: refused, logged, counted; the watch goes on
# ---------------------------------------------------------------------------


def _break(path: Path, how: str) -> str:
    """Turn the configuration file bad in one of the ways an operator or attacker can."""
    if how in HOSTILE_YAML:
        write_config(path, HOSTILE_YAML[how][0])
        return HOSTILE_YAML[how][1]
    path.unlink()
    if how == "deleted":
        return "No such file or directory"
    if how == "directory":
        path.mkdir()
        return "a directory, not a regular file"
    if how == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(how)
    return "not a regular file"


def _repair(path: Path, document: dict[str, Any]) -> None:
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    write_config(path, document)


@pytest.mark.parametrize(
    "how",
    [
        "nested-20000-deep",
        "number-of-5000-digits",
        "alias-bomb",
        "too-large",
        "deleted",
        "directory",
        "fifo",
        "/dev/zero",
    ],
)
def test_a_broken_file_is_refused_and_the_watch_goes_on(tmp_path: Path, how: str) -> None:
    pod = batch_pod()
    parent = pod.linux.cgroup_parent
    live = container("c-app", pod, "app")

    async def scenario() -> None:
        async with running_node(tmp_path) as node:
            node.tree.write(parent, BESTEFFORT)
            await node.state_change(api.RUN_POD_SANDBOX, pod)
            node.tree.write(parent, APP_VALUES, live.id)
            config = node.app.plugin.live.in_force.config

            reason = _break(node.config_path, how)
            await until(lambda: node.app.reloads.get("invalid") == 1, "refusal counted")
            assert node.app.plugin.live.in_force.config is config
            assert reloads_metric(node.app)["invalid"] == 1
            # Events are still served under the previous configuration.
            await node.create(pod, live)

            # Repaired: the watch is alive and applies it.
            _repair(node.config_path, {**node.base, "rules": {"cpuNormalizationRatio": 2.0}})
            await until(lambda: node.tree.read(parent, live.id) == HALVED_VALUES, "applied")
            assert node.app.reloads == {"invalid": 1, "applied": 1}
            logs.append(reason)

    logs: list[str] = []
    with capture_logs() as captured:
        run(scenario(), timeout=30)
    (reason,) = logs
    (rejected,) = [e for e in captured if e["event"].startswith("configuration rejected")]
    assert rejected["log_level"] == "error"
    assert reason in rejected["error"]


def test_a_runtime_that_never_answers_update_containers_does_not_stop_the_watch(
    tmp_path: Path,
) -> None:
    pod = batch_pod()
    parent = pod.linux.cgroup_parent
    live = container("c-app", pod, "app")

    async def scenario() -> None:
        async with running_node(tmp_path, nri_version="v0.12.2", runtime_version="v2.4.0") as node:
            node.app._update_containers_timeout = 0.2
            node.runtime.answering_updates.clear()
            node.tree.write(parent, BESTEFFORT)
            await node.call("RunPodSandbox", api.RunPodSandboxRequest(pod=pod), api.Empty)
            node.tree.write(parent, APP_VALUES, live.id)
            await node.create(pod, live)

            node.rewrite(rules={"cpuNormalizationRatio": 2.0})
            # Unanswered: counted, and the container's files are written instead.
            await until(
                lambda: (
                    node.app.plugin.reconcile.follow.followed.get(("update_containers", "failed"))
                    == 1
                ),
                "counted",
            )
            await until(lambda: node.tree.read(parent, live.id) == HALVED_VALUES, "files")
            # The watch is free for the next change.
            node.rewrite(rules={"cpuNormalizationRatio": 4.0})
            await until(lambda: node.app.reloads.get("applied") == 2, "next change applied")
            await until(
                lambda: (
                    node.app.plugin.reconcile.follow.followed.get(("update_containers", "failed"))
                    == 2
                ),
                "again",
            )
            assert [u.container_id for u in node.runtime.record.updates] == [live.id, live.id]

    with capture_logs() as captured:
        run(scenario(), timeout=30)
    failures = [
        e for e in captured if e["event"] == "UpdateContainers failed, writing cgroup files"
    ]
    assert failures and failures[0]["error"] == "no answer within 0.2 s"


def test_an_error_of_the_plugins_own_is_counted_and_the_watch_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        async with running_node(tmp_path) as node:
            real = node.app.plugin.reconfigure
            calls: list[int] = []

            def fails_once(config: Any) -> Any:
                calls.append(1)
                if len(calls) == 1:
                    raise RuntimeError("a bug")
                return real(config)

            monkeypatch.setattr(node.app.plugin, "reconfigure", fails_once)
            node.rewrite(rules={"cpuNormalizationRatio": 2.0})
            await until(lambda: node.app.reloads.get("failed") == 1, "counted")
            assert reloads_metric(node.app)["failed"] == 1
            node.rewrite(rules={"cpuNormalizationRatio": 4.0})
            await until(lambda: node.app.reloads.get("applied") == 1, "next change applied")
            assert node.app.plugin.live.in_force.config.rules.cpu_normalization_ratio == 4.0

    with capture_logs() as captured:
        run(scenario(), timeout=30)
    (failed,) = [e for e in captured if e["event"] == "configuration reload failed"]
    assert failed["log_level"] == "error" and failed["error"] == "a bug"


# ---------------------------------------------------------------------------
# mode: observe, then a reload to enforce
# ---------------------------------------------------------------------------


def metric(app: App, name: str) -> dict[tuple[str, ...], float]:
    text = generate_latest(app.metrics.registry).decode()
    return {
        tuple(sample.labels.values()): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in (name, name + "_total")
    }


def test_observe_sets_nothing_and_a_reload_to_enforce_applies_the_values(tmp_path: Path) -> None:
    pod = batch_pod()
    parent = pod.linux.cgroup_parent
    live = container("c-app", pod, "app")

    async def scenario() -> Node:
        async with running_node(tmp_path, mode="observe") as node:
            node.tree.write(parent, BESTEFFORT)
            with capture_logs() as logs:
                await node.state_change(api.RUN_POD_SANDBOX, pod)
                reply = await node.call(
                    "CreateContainer",
                    api.CreateContainerRequest(pod=pod, container=live),
                    api.CreateContainerResponse,
                )
            # Nothing adjusted, nothing written ...
            assert reply == api.CreateContainerResponse()
            assert node.tree.read(parent) == BESTEFFORT
            node.tree.write(parent, BESTEFFORT, live.id)  # what the runtime gave it
            # ... but said: what would be set, and how it differs.
            would = [e for e in logs if e["event"] == "would set"]
            assert [(e["method"], e.get("container")) for e in would] == [
                ("RunPodSandbox", None),
                ("CreateContainer", "app"),
            ]
            assert would[1]["changes"] == {
                "cpu_shares": [0, 512],
                "cpu_quota": [-1, 100_000],
                "memory_limit": [-1, 512 * MI],
            }
            assert would[0]["changes"]["cpu_quota"] == [-1, 100_000]
            observed = metric(node.app, "nri_midbatch_observed")
            assert {key: n for key, n in observed.items() if n} == {
                ("pod", "differs"): 1,
                ("container", "differs"): 1,
            }
            assert metric(node.app, "nri_midbatch_mode") == {("enforce",): 0, ("observe",): 1}
            assert node.app.plugin.counters.adjusted == {}

            node.rewrite(mode="enforce")
            await until(lambda: node.tree.read(parent, live.id) == APP_VALUES, "container set")
            await until(lambda: node.tree.read(parent) == APP_VALUES, "pod set")
            await until(
                lambda: node.app.plugin.reconcile.follow.followed[("cgroup_files", "ok")] == 2,
                "counted",
            )
            assert metric(node.app, "nri_midbatch_mode") == {("enforce",): 1, ("observe",): 0}
            return node

    node = run(scenario())
    assert node.app.plugin.reconcile.follow.followed[("cgroup_files", "ok")] == 2


def test_a_reload_into_observe_gives_kubelets_values_back(tmp_path: Path) -> None:
    """Observe mode sets nothing: what enforce mode set goes back to kubelet's values."""
    pod = batch_pod()
    parent = pod.linux.cgroup_parent
    live = container("c-app", pod, "app")
    live.linux.resources.cpu.shares.value = 2  # kubelet's for a BestEffort container
    given_back = BESTEFFORT  # kubelet's for a BestEffort pod and container

    async def scenario() -> Node:
        async with running_node(tmp_path) as node:
            node.tree.write(parent, BESTEFFORT)
            await node.state_change(api.RUN_POD_SANDBOX, pod)
            assert node.tree.read(parent) == APP_VALUES  # so given back below is a write
            node.tree.write(parent, APP_VALUES, live.id)
            await node.create(pod, live)
            node.rewrite(mode="observe", rules={"cpuNormalizationRatio": 2.0})
            await until(lambda: node.app.reloads.get("applied") == 1, "reloaded")
            await until(lambda: node.tree.read(parent) == given_back, "pod given back")
            await until(
                lambda: node.tree.read(parent, live.id) == given_back, "container given back"
            )
            # The files change in the App's writer thread before the pass takes what went
            # through: a second reload waits for the first pass to end, and finds nothing to
            # do, as nothing is the plugin's any more.
            await node.app.reload("after the pass")
            assert node.app.reloads.get("unchanged") == 1
            assert node.app.plugin.live.known.applied == {}
            return node

    node = run(scenario())
    assert node.tree.read(parent) == given_back
    assert node.tree.read(parent, live.id) == given_back


def test_a_ratio_change_rescales_a_normalized_container_quota_file_only(tmp_path: Path) -> None:
    tiers = [
        {
            "name": "prod",
            "priorityClasses": ["koord-prod"],
            "qosClasses": ["LS"],
            "calculator": "cpu-normalization",
        }
    ]
    pod = api.PodSandbox(
        id="web",
        name="web",
        uid="uid-web",
        namespace="default",
        labels={QOS: "LS", PRIORITY: "koord-prod"},
        linux=api.LinuxPodSandbox(cgroup_parent="/kubepods/burstable/poduid-web"),
    )
    parent = pod.linux.cgroup_parent
    ctr = container("c-web", pod, "web")
    ctr.linux.resources.cpu.quota.value = 200_000
    ctr.linux.resources.cpu.period.value = 100_000

    async def scenario() -> Node:
        async with running_node(
            tmp_path, tiers=tiers, rules={"cpuNormalizationRatio": 1.25}
        ) as node:
            reply = await node.call(
                "CreateContainer",
                api.CreateContainerRequest(pod=pod, container=ctr),
                api.CreateContainerResponse,
            )
            assert reply.adjust.linux.resources.cpu.quota.value == 160_000
            # kubelet's shares and memory, and our quota, as the runtime applied them.
            node.tree.write(parent, Values(1024, 160000, 512 * MI), ctr.id)
            node.rewrite(rules={"cpuNormalizationRatio": 2.0})
            await until(lambda: node.tree.read(parent, ctr.id).quota == 100000, "rescaled")
            return node

    node = run(scenario())
    # From kubelet's 200000, not from our 160000; shares and memory not written.
    assert node.tree.read(parent, ctr.id) == Values(1024, 100000, 512 * MI)


# ---------------------------------------------------------------------------
# Deferred work and the runtime's connection
# ---------------------------------------------------------------------------


def test_work_held_for_a_request_goes_on_once_the_app_has_answered_it(tmp_path: Path) -> None:
    """The app's deferred work observes its session: told when the connection is idle.

    The wait for a busy connection is stretched to a minute: only the
    session saying the request is answered can let the work go on in time.
    """
    pod = batch_pod()
    done: list[int] = []

    async def scenario() -> None:
        async with running_node(tmp_path, deferred_timings=DeferredTimings(recheck=60.0)) as node:
            after_reply = node.app.plugin.after_reply
            held = [True]  # as if a request were in progress
            after_reply.connected(Probe(lambda: held[0]))
            for n in range(3):
                after_reply.defer(done.append, n)
            await asyncio.sleep(0.01)
            assert done == []
            held[0] = False
            node.tree.write(pod.linux.cgroup_parent, BESTEFFORT)
            await node.state_change(api.RUN_POD_SANDBOX, pod)
            async with asyncio.timeout(STEP_TIMEOUT):
                await after_reply.settle()

    run(scenario())
    assert done == [0, 1, 2]
