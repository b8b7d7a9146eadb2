"""Under the systemd driver, values go through systemd and come back after its reloads.

Against a fake systemd manager on a private dbus-daemon (fake_systemd.py),
which rewrites unit files on a reload the way systemd 252 does.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path, PurePosixPath

import pytest
from dbus_fast.aio import MessageBus
from structlog.testing import capture_logs

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.cgroups.paths import CgroupDriver, CgroupLocation
from nri_midbatch.cgroups.reload_burst import RepairTimings
from nri_midbatch.cgroups.systemd import (
    INFINITY,
    SystemdUnits,
    UnitTarget,
    unit_properties,
)
from nri_midbatch.cgroups.values import UNLIMITED
from nri_midbatch.config.compile import settings_of
from nri_midbatch.config.model import load_config_text
from nri_midbatch.nri.events import Event
from nri_midbatch.plugin.handlers import MidBatchPlugin
from nri_midbatch.policy import CgroupValues, ContainerView, PodView
from nri_midbatch.state.plan import ContainerChange, Plan, PodChange
from tests import factory
from tests.factory import MI, batch_spec
from tests.fake_cgroups import BESTEFFORT, FakeTree
from tests.oracle.targets import Values

from .app_node import until
from .fake_systemd import (
    FakeManager,
    Held,
    peers,
    ping,
    private_bus,
    send_reloading,
    serve_manager,
)
from .nri_fixtures import run

SLICE = "kubepods-besteffort-poduid_batch.slice"
SLICE_DIR = f"kubepods.slice/kubepods-besteffort.slice/{SLICE}"
SCOPE = "cri-containerd-c1.scope"
#: What kubelet gives a BestEffort pod slice: weight 1, no limits.
KUBELET_BESTEFFORT = Held(1, INFINITY, INFINITY)


#: The batch pod's "app" container: request 250m, memory 256Mi, the cpu limit as named.
APP_1K = batch_spec(app=("250", "1k", "256Mi"))
APP_375 = batch_spec(app=("250", "375", "256Mi"))
#: The batch pod of jobs/batch in SLICE, as `factory.batch_pod` takes it.
JOBS_BATCH = {"name": "batch", "uid": "uid_batch", "namespace": "jobs", "cgroup_parent": SLICE}


def app_container() -> api.Container:
    return api.Container(
        id="c1",
        pod_sandbox_id="batch",
        name="app",
        state=api.CONTAINER_RUNNING,
        linux=api.LinuxContainer(cgroups_path=f"{SLICE}:cri-containerd:c1"),
    )


@pytest.fixture
def bus(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with private_bus() as address:
        monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", address)
        yield address


@pytest.fixture
def tree(tmp_path: Path) -> FakeTree:
    return FakeTree(tmp_path, version=2)


@pytest.fixture
def root(tree: FakeTree) -> Path:
    return tree.root


@contextlib.asynccontextmanager
async def running(units: SystemdUnits) -> AsyncIterator[None]:
    """The plugin's D-Bus task, while in the block; it must stop when cancelled."""
    task = asyncio.create_task(units.run())
    try:
        yield
    finally:
        task.cancel()
        # The App stops it so at shutdown: a task that swallows the
        # cancellation would hang the plugin's exit.
        done, _ = await asyncio.wait({task}, timeout=10)
        assert done, "the D-Bus task did not stop when cancelled"


def systemd_plugin(root: Path) -> tuple[MidBatchPlugin, SystemdUnits]:
    plugin = MidBatchPlugin(
        settings_of(load_config_text(f"cgroups:\n  root: {root}\n  driver: systemd\n", "test"))
    )
    assert plugin.systemd is not None
    return plugin, plugin.systemd


# -- the mapping ---------------------------------------------------------------


def test_unit_properties_are_the_values_the_cgroupfs_path_writes() -> None:
    # shares 256 -> weight 1 + (254 * 9999) // 262142 = 10; 37.5 ms per 100 ms
    # is 375 ms per second, which systemd writes back as exactly 37500.
    assert unit_properties(CgroupValues(256, 37_500, 256 * MI)) == [
        ("CPUWeight", 10),
        ("CPUQuotaPerSecUSec", 375_000),
        ("MemoryMax", 256 * MI),
    ]
    assert unit_properties(CgroupValues(2, UNLIMITED, UNLIMITED)) == [
        ("CPUWeight", 1),
        ("CPUQuotaPerSecUSec", INFINITY),
        ("MemoryMax", INFINITY),
    ]


# -- through a fake systemd ------------------------------------------------------


def test_pod_values_are_held_by_systemd_and_survive_its_reload(
    bus: str, root: Path, tree: FakeTree
) -> None:
    # A whole-percent quota (1 CPU): systemd keeps every value exactly.
    manager = FakeManager()
    manager.add_unit(SLICE, root / SLICE_DIR, KUBELET_BESTEFFORT)
    plugin, units = systemd_plugin(root)

    async def scenario() -> None:
        async with serve_manager(bus, manager), running(units):
            await plugin.pod_event(
                Event.RUN_POD_SANDBOX,
                factory.batch_pod(**JOBS_BATCH, annotation=APP_1K),
            )
            await manager.wait_calls(1)
            manager.daemon_reload()

    run(scenario(), timeout=20)
    assert manager.calls == [
        (
            SLICE,
            True,
            [("CPUWeight", 10), ("CPUQuotaPerSecUSec", 1_000_000), ("MemoryMax", 256 * MI)],
        )
    ]
    # Without the properties, the reload would have put back kubelet's 1 / max / max.
    assert tree.read(SLICE_DIR) == Values(10, 100000, 256 * MI)


def test_a_reload_that_changes_values_is_repaired_and_counted(
    bus: str, root: Path, tree: FakeTree
) -> None:
    # 375 milli-CPU: systemd's drop-in keeps 37 %, runc rounded the container up to 38 %.
    manager = FakeManager()
    manager.add_unit(SLICE, root / SLICE_DIR, KUBELET_BESTEFFORT)
    plugin, units = systemd_plugin(root)
    pod, ctr = factory.batch_pod(**JOBS_BATCH, annotation=APP_375), app_container()
    exact = Values(10, 37500, 256 * MI)

    async def scenario() -> None:
        async with serve_manager(bus, manager), running(units):
            await plugin.pod_event(Event.RUN_POD_SANDBOX, pod)
            response = await plugin.create_container(pod, ctr)
            assert response.adjust.linux.resources.cpu.quota.value == 37_500
            # What runc does with that adjustment: the unit gets the quota
            # rounded up to whole percent, the files get it exactly.
            scope = root / SLICE_DIR / SCOPE
            manager.add_unit(SCOPE, scope, Held(10, 380_000, 256 * MI))
            (scope / "cpu.max").write_text("37500 100000\n")
            await manager.wait_calls(1)
            assert tree.read(SLICE_DIR) == exact
            manager.daemon_reload()
            # Repaired: each unit's files put back, the scope also set anew.
            # (The slice is set anew only if its first set had completed.)
            await until(
                lambda: units.drift_repaired == {"pod": 1, "container": 1}, "both units repaired"
            )
            await manager.wait_unit_calls(SCOPE, 1)

    run(scenario(), timeout=20)
    assert tree.read(SLICE_DIR) == exact
    assert tree.read(SLICE_DIR, SCOPE) == exact
    held = [("CPUWeight", 10), ("CPUQuotaPerSecUSec", 375_000), ("MemoryMax", 256 * MI)]
    assert {unit for unit, _, _ in manager.calls} == {SLICE, SCOPE}
    assert all(call[1:] == (True, held) for call in manager.calls)
    assert (
        units.property_sets[("pod", "failed")] == units.property_sets[("container", "failed")] == 0
    )


#: Parents of issue 24 that named units of the node's own: each got the pod's values.
FOREIGN_UNITS = {
    "/system.slice": "system.slice",
    "system.slice": "system.slice",
    "/init.scope": "init.scope",
    "/system.slice/sshd.service": "system.slice/sshd.service",
    "/system.slice/containerd.service": "system.slice/containerd.service",
    "/user.slice/user-1000.slice/session-1.scope": "user.slice/user-1000.slice/session-1.scope",
}


def test_units_outside_kubepods_are_neither_set_nor_written(
    bus: str, root: Path, tree: FakeTree
) -> None:
    manager = FakeManager()
    for directory in set(FOREIGN_UNITS.values()):
        manager.add_unit(PurePosixPath(directory).name, root / directory, KUBELET_BESTEFFORT)
    manager.add_unit(SLICE, root / SLICE_DIR, KUBELET_BESTEFFORT)
    plugin, units = systemd_plugin(root)
    before = {d: tree.read(d) for d in FOREIGN_UNITS.values()}

    async def scenario() -> None:
        async with serve_manager(bus, manager), running(units):
            with capture_logs() as logs:
                for i, parent in enumerate(FOREIGN_UNITS):
                    await plugin.pod_event(
                        Event.RUN_POD_SANDBOX,
                        factory.batch_pod(
                            name="batch",
                            uid=f"uid{i}",
                            namespace="jobs",
                            cgroup_parent=parent,
                            annotation=APP_375,
                        ),
                    )
            # Units are set in the order they were queued: once the kubepods
            # pod's is, any before it would have been too.
            await plugin.pod_event(
                Event.RUN_POD_SANDBOX,
                factory.batch_pod(**JOBS_BATCH, annotation=APP_375),
            )
            await manager.wait_calls(1)
        refused = [entry for entry in logs if entry["event"] == "pod cgroup not set"]
        assert [(e["namespace"], e["pod"]) for e in refused] == [("jobs", "batch")] * 6
        assert all("not a pod cgroup of kubelet's" in e["reason"] for e in refused)

    run(scenario(), timeout=20)
    assert [call[0] for call in manager.calls] == [SLICE]
    assert {d: tree.read(d) for d in FOREIGN_UNITS.values()} == before
    assert plugin.counters.pod_writes_failed == len(FOREIGN_UNITS)
    assert plugin.counters.pod_writes_ok == 1


def slice_units(root: Path, timings: RepairTimings) -> SystemdUnits:
    """The D-Bus side alone, holding the batch pod's slice at 375 milli-CPU."""
    units = SystemdUnits(root, list, timings)
    units.hold(
        UnitTarget(
            CgroupLocation(CgroupDriver.SYSTEMD, SLICE), QUOTA_375, "uid_batch", "jobs", "batch"
        )
    )
    return units


QUOTA_375 = CgroupValues(256, 37_500, 256 * MI)
#: A burst's pass within a few milliseconds of its last reload.
PROMPT = RepairTimings(quiet=0.01, longest=1.0)


async def settled(manager: FakeManager) -> None:
    """The slice set once, and the plugin subscribed to `manager`'s signals."""
    await manager.wait_calls(1)
    await manager.wait_subscribers(1)


EXACT = Values(10, 37500, 256 * MI)


async def until_exact(tree: FakeTree) -> None:
    await until(lambda: tree.read(SLICE_DIR) == EXACT, "the slice's files put back")


def test_reloading_signals_count_only_from_systemds_own_bus_name(
    bus: str, root: Path, tree: FakeTree
) -> None:
    manager = FakeManager()
    manager.add_unit(SLICE, root / SLICE_DIR, KUBELET_BESTEFFORT)
    units = slice_units(root, PROMPT)

    async def scenario() -> None:
        async with serve_manager(bus, manager) as systemd, running(units):
            await settled(manager)
            spoofer = await MessageBus(bus_address=bus).connect()
            try:
                (plugin,) = await peers(spoofer) - {systemd.unique_name}
                with capture_logs() as logs:
                    for _ in range(100):
                        send_reloading(spoofer, plugin, False)  # unicast: no match rule stops it
                    send_reloading(spoofer, None, False)  # broadcast: the bus filters it
                    await ping(spoofer, plugin)
                # Had one been taken, its pass would be due PROMPT.quiet from now.
                assert (units.signals_ignored, units.reloads, units.repair_passes) == (100, 0, 0)
                ignored = [e for e in logs if e["event"].startswith("Reloading signal not from")]
                assert [e["sender"] for e in ignored] == [spoofer.unique_name]
            finally:
                spoofer.disconnect()
            manager.daemon_reload()  # files back to whole percent, then Reloading(false)
            await until(lambda: units.repair_passes > 0, "a repair pass")
            await until_exact(tree)

    run(scenario(), timeout=20)
    assert (units.reloads, units.repair_passes) == (1, 1)


def test_a_burst_of_reloads_gives_one_repair_pass_after_it(
    bus: str, root: Path, tree: FakeTree
) -> None:
    manager = FakeManager()
    manager.add_unit(SLICE, root / SLICE_DIR, KUBELET_BESTEFFORT)
    # A second of quiet: the 30 reloads come far closer together than that.
    units = slice_units(root, RepairTimings(quiet=1.0, longest=30.0))

    async def scenario() -> None:
        async with serve_manager(bus, manager), running(units):
            await settled(manager)
            with capture_logs() as logs:
                for _ in range(30):
                    manager.daemon_reload()
                await until(lambda: units.repair_passes > 0, "a repair pass")
                assert units.reloads == 30  # all of them before the pass
                await until_exact(tree)
            passes = [e for e in logs if e["event"].startswith("systemd reloaded")]
            assert [e["reloads"] for e in passes] == [30]

    run(scenario(), timeout=20)
    assert units.repair_passes == 1


def test_a_restarted_systemd_is_followed_to_its_new_bus_name(
    bus: str, root: Path, tree: FakeTree
) -> None:
    first, second = FakeManager(), FakeManager()
    for manager in (first, second):
        manager.add_unit(SLICE, root / SLICE_DIR, KUBELET_BESTEFFORT)
    units = slice_units(root, PROMPT)

    async def scenario() -> None:
        async with running(units):
            async with serve_manager(bus, first):
                await settled(first)
            async with serve_manager(bus, second):
                await second.wait_subscribers(1)  # subscribed anew, on the same connection
                second.daemon_reload()  # taken: from the name's new owner
                await until(lambda: units.repair_passes > 0, "a repair pass")
                await until_exact(tree)

    run(scenario(), timeout=20)
    assert units.unreachable == 0


def test_without_dbus_the_files_are_written_and_the_failure_counted(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tree: FakeTree
) -> None:
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", f"unix:path={tmp_path}/no-bus")
    tree.write(SLICE_DIR, BESTEFFORT)
    plugin, units = systemd_plugin(root)

    async def scenario() -> None:
        async with running(units):
            await until(lambda: units.unreachable > 0, "systemd found unreachable")
            await plugin.pod_event(
                Event.RUN_POD_SANDBOX,
                factory.batch_pod(**JOBS_BATCH, annotation=APP_375),
            )

    run(scenario(), timeout=20)
    assert tree.read(SLICE_DIR) == Values(10, 37500, 256 * MI)
    assert plugin.counters.pod_writes_ok == 1
    assert units.property_sets[("pod", "failed")] == 0  # queued, not tried


def test_values_queued_while_dbus_is_away_reach_systemd_once_it_is_back(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    address = f"unix:path={tmp_path}/bus"
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", address)
    manager = FakeManager()
    manager.add_unit(SLICE, root / SLICE_DIR, KUBELET_BESTEFFORT)
    plugin, units = systemd_plugin(root)

    async def scenario() -> None:
        async with running(units):
            await until(lambda: units.unreachable > 0, "systemd found unreachable")
            await plugin.pod_event(
                Event.RUN_POD_SANDBOX,
                factory.batch_pod(**JOBS_BATCH, annotation=APP_375),
            )
            with private_bus(address):
                async with serve_manager(address, manager):
                    await manager.wait_calls(1)  # after the next attempt, RETRY_MIN later

    run(scenario(), timeout=20)
    assert manager.calls == [
        (SLICE, True, [("CPUWeight", 10), ("CPUQuotaPerSecUSec", 375_000), ("MemoryMax", 256 * MI)])
    ]


def test_a_refused_call_is_counted_and_the_next_unit_still_set(
    bus: str, root: Path, tree: FakeTree
) -> None:
    manager = FakeManager()  # knows no slice: refuses it
    manager.add_unit(SCOPE, root / SLICE_DIR / SCOPE, Held(10, 380_000, 256 * MI))
    plugin, units = systemd_plugin(root)
    pod = PodView("uid_batch", "jobs", "batch", {}, {}, SLICE)
    tree.write(SLICE_DIR, BESTEFFORT)
    change = ContainerChange(
        pod,
        ContainerView("c1", "app"),
        CgroupValues(256, 37_500, 256 * MI),
        f"{SLICE}:cri-containerd:c1",
    )

    async def scenario() -> None:
        async with serve_manager(bus, manager), running(units):
            # A reload's file pass: the pod goes down after its container (writes.py), so its
            # unit is set after the container's: wait for both.
            failed = plugin.reconcile.follow.write_plan(
                Plan((change,), (PodChange(pod, change.values),))
            )
            assert failed == Plan((), ())
            sets = units.property_sets
            await until(
                lambda: sets[("container", "ok")] > 0 and sets[("pod", "failed")] > 0,
                "both units set",
            )

    run(scenario(), timeout=20)
    assert manager.calls == [
        (SCOPE, True, [("CPUWeight", 10), ("CPUQuotaPerSecUSec", 375_000), ("MemoryMax", 256 * MI)])
    ]
    assert units.property_sets == {
        ("pod", "ok"): 0,
        ("pod", "failed"): 1,
        ("container", "ok"): 1,
        ("container", "failed"): 0,
    }
    assert tree.read(SLICE_DIR) == tree.read(SLICE_DIR, SCOPE) == Values(10, 37500, 256 * MI)


def test_what_is_remembered_is_bounded_by_the_pods_known(root: Path) -> None:
    # No task runs: everything stays queued, as while D-Bus is away.
    units = SystemdUnits(root, list)
    values = CgroupValues(256, 37_500, 256 * MI)
    for i in range(1000):
        pod = CgroupLocation(CgroupDriver.SYSTEMD, f"kubepods-podu{i}.slice")
        container = CgroupLocation(CgroupDriver.SYSTEMD, pod.cgroup_parent, f"c{i}")
        units.hold(UnitTarget(pod, values, f"u{i}", "ns", f"p{i}"))
        units.hold(UnitTarget(container, values, f"u{i}", "ns", f"p{i}", "app"))
        # A newer value for the same unit replaces the queued one.
        units.hold(UnitTarget(pod, values, f"u{i}", "ns", f"p{i}"))
    assert units.held == (1000, 2000)
    for i in range(500):
        units.forget_container(f"u{i}", f"c{i}")
    assert units.held == (1000, 1500)
    for i in range(1000):
        units.forget_pod(f"u{i}")
    assert units.held == (0, 0)


def test_the_cgroupfs_path_never_loads_dbus_fast() -> None:
    # Importing it costs about 130 ms and a few MB: only the systemd task may.
    code = (
        "import sys\n"
        "from nri_midbatch.process.app import App\n"
        "from nri_midbatch.config.validator import load_startup_settings\n"
        "App(load_startup_settings(None), name='midbatch', idx='10', config_path=None)\n"
        "print(sorted(m for m in sys.modules if m.startswith('dbus_fast')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"
