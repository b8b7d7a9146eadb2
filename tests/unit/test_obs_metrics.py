"""The App's metrics and readiness, scraped over HTTP while a runtime drives it over a socket.

Operability §7: events by type and result, a latency histogram per event, decisions by tier,
invalid inputs, adjusted fields, registration state and Synchronize size. §8: ready only after
Configure and Synchronize, not ready once the connection is gone.
"""

from __future__ import annotations

import asyncio
import json
import platform
import socket
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nri_midbatch import __version__
from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.config.compile import settings_of
from nri_midbatch.config.model import Config, load_config_text
from nri_midbatch.config.validator import load_startup_settings
from nri_midbatch.nri.testing import LoopbackRuntime
from nri_midbatch.process.app import App
from nri_midbatch.rpc.errors import RpcError

from .http_fixtures import http_get
from .nri_fixtures import STEP_TIMEOUT, run

QOS = "koordinator.sh/qosClass"
PRIORITY = "koordinator.sh/priority-class"
SPEC = "node.koordinator.sh/extended-resource-spec"
BATCH_SPEC = json.dumps(
    {
        "containers": {
            "app": {
                "requests": {"kubernetes.io/batch-cpu": "500"},
                "limits": {"kubernetes.io/batch-cpu": "1k", "kubernetes.io/batch-memory": "512Mi"},
            },
            "sidecar": {
                "requests": {"kubernetes.io/batch-cpu": "250"},
                "limits": {"kubernetes.io/batch-cpu": "500"},
            },
        }
    }
)


def make_pod(
    pod_id: str, labels: Mapping[str, str], annotations: Mapping[str, str] | None = None
) -> api.PodSandbox:
    qos_dir = "besteffort" if labels.get(QOS) == "BE" else "burstable"
    return api.PodSandbox(
        id=pod_id,
        name=f"{pod_id}-name",
        uid=f"uid-{pod_id}",
        namespace="default",
        labels=labels,
        annotations=annotations or {},
        linux=api.LinuxPodSandbox(cgroup_parent=f"/kubepods/{qos_dir}/poduid-{pod_id}"),
    )


def batch_pod(pod_id: str, annotation: str = BATCH_SPEC) -> api.PodSandbox:
    return make_pod(pod_id, {QOS: "BE", PRIORITY: "koord-batch"}, {SPEC: annotation})


def prod_pod(pod_id: str) -> api.PodSandbox:
    return make_pod(pod_id, {QOS: "LS", PRIORITY: "koord-prod"})


def make_container(container_id: str, pod: api.PodSandbox, name: str) -> api.Container:
    return api.Container(
        id=container_id, pod_sandbox_id=pod.id, name=name, state=api.CONTAINER_RUNNING
    )


def cgroup_root(tmp_path: Path, *pods: api.PodSandbox) -> Path:
    """A cgroup v1 tree holding the given pods' directories with kubelet's besteffort values."""
    root = tmp_path / "cgroup"
    for pod in pods:
        parent = pod.linux.cgroup_parent.strip("/")
        for controller, name, value in (
            ("cpu", "cpu.shares", "2"),
            ("cpu", "cpu.cfs_quota_us", "-1"),
            ("memory", "memory.limit_in_bytes", "9223372036854771712"),
        ):
            (root / controller / parent).mkdir(parents=True, exist_ok=True)
            (root / controller / parent / name).write_text(value + "\n")
    (root / "cpu").mkdir(parents=True, exist_ok=True)
    (root / "memory").mkdir(parents=True, exist_ok=True)
    return root


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


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------


def test_metrics_count_what_the_runtime_sent(tmp_path: Path) -> None:
    good = batch_pod("batch")
    malformed = batch_pod("bad", annotation="{not json")
    prods = [prod_pod("prod-a"), prod_pod("prod-b")]
    root = cgroup_root(tmp_path, good, malformed, *prods)
    synced = [
        make_container("c-prod-a", prods[0], "app"),
        make_container("c-prod-a2", prods[0], "sidecar"),
        make_container("c-prod-b", prods[1], "app"),
    ]

    async def scenario() -> None:
        async with running_app(make_config(root)) as r:
            await r.configure()
            status, _, body = await r.get("/readyz")
            assert (status, body) == (503, "registered, waiting for Synchronize\n")
            before = await r.scrape()
            assert before.value("nri_midbatch_registered") == 1
            assert before.value("nri_midbatch_synchronized") == 0

            await r.sync(prods, synced)
            assert (await r.get("/readyz"))[::2] == (200, "ok\n")

            sent = [
                (good, make_container("c-app", good, "app")),
                (good, make_container("c-sidecar", good, "sidecar")),
                (malformed, make_container("c-bad", malformed, "app")),
                (prods[0], make_container("c-prod-new", prods[0], "app")),
            ]
            replies = [await r.create(pod, ctr) for pod, ctr in sent]
            assert [reply.HasField("adjust") for reply in replies] == [True, True, False, False]
            await r.run_pod_sandbox(good)

            m = await r.scrape()
            assert m.value("nri_midbatch_events_total", method="CreateContainer", result="ok") == 4
            assert (
                m.value("nri_midbatch_events_total", method="CreateContainer", result="error") == 0
            )
            assert m.value("nri_midbatch_events_total", method="RunPodSandbox", result="ok") == 1
            assert m.value("nri_midbatch_events_total", method="Synchronize", result="ok") == 1
            assert m.value("nri_midbatch_events_total", method="Configure", result="ok") == 1
            duration = "nri_midbatch_event_duration_seconds"
            assert m.value(f"{duration}_count", method="CreateContainer") == 4
            assert m.value(f"{duration}_bucket", method="CreateContainer", le="+Inf") == 4
            assert m.value(f"{duration}_count", method="Synchronize") == 1

            # batch: 2 adjusted + the malformed one (its labels name the tier) + its pod level at
            # RunPodSandbox. none: 3 synchronized containers + their 2 pods + 1 created container.
            assert m.value("nri_midbatch_decisions_total", tier="batch") == 4
            assert m.value("nri_midbatch_decisions_total", tier="none") == 6
            # A tier with no decision yet is there at 0, so rate() sees its first rise.
            assert m.value("nri_midbatch_decisions_total", tier="mid") == 0
            assert m.value("nri_midbatch_invalid_inputs_total", reason="spec") == 1
            for field in ("cpu_shares", "cpu_quota", "memory_limit"):
                adjusted = m.value(
                    "nri_midbatch_adjusted_fields_total", method="CreateContainer", field=field
                )
                assert adjusted == 2, field
            assert m.value("nri_midbatch_pod_cgroup_writes_total", result="ok") == 1
            assert m.value("nri_midbatch_pod_cgroup_writes_total", result="failed") == 0

            assert m.value("nri_midbatch_registered") == 1
            assert m.value("nri_midbatch_synchronized") == 1
            assert m.value("nri_midbatch_synchronize_objects", kind="pods") == 2
            assert m.value("nri_midbatch_synchronize_objects", kind="containers") == 3
            assert m.value("nri_midbatch_synchronize_duration_seconds_count") == 1
            assert (
                m.value(
                    "nri_midbatch_build_info", version=__version__, python=platform.python_version()
                )
                == 1
            )

            # The runtime goes away: no longer registered, no longer ready.
            await r.runtime.close()
            async with asyncio.timeout(STEP_TIMEOUT):
                await asyncio.gather(r.task, return_exceptions=True)
            status, _, body = await r.get("/readyz")
            assert (status, body) == (503, "not registered with a runtime\n")
            after = await r.scrape()
            assert after.value("nri_midbatch_registered") == 0
            assert after.value("nri_midbatch_synchronized") == 0
            # Counters survive the connection.
            assert (
                after.value("nri_midbatch_events_total", method="CreateContainer", result="ok") == 4
            )

    run(scenario())


def test_refused_calls_count_as_errors(tmp_path: Path) -> None:
    malformed = batch_pod("bad", annotation="{not json")
    root = cgroup_root(tmp_path, malformed)

    async def scenario() -> None:
        async with running_app(make_config(root, failurePolicy="Fail")) as r:
            await r.configure()
            await r.sync([], [])
            for _ in range(2):
                try:
                    await r.create(malformed, make_container("c-bad", malformed, "app"))
                except RpcError:
                    pass
                else:
                    raise AssertionError("a malformed pod must be refused under Fail")
            m = await r.scrape()
            assert (
                m.value("nri_midbatch_events_total", method="CreateContainer", result="error") == 2
            )
            assert m.value("nri_midbatch_events_total", method="CreateContainer", result="ok") == 0
            assert (
                m.value("nri_midbatch_event_duration_seconds_count", method="CreateContainer") == 2
            )
            assert m.value("nri_midbatch_invalid_inputs_total", reason="spec") == 2

    run(scenario())


def test_every_metric_family_is_exposed_once(tmp_path: Path) -> None:
    # Two HELP/TYPE blocks for one name make strict parsers (promtool, client_golang's expfmt)
    # reject the whole scrape.
    async def scenario() -> str:
        async with running_app(make_config(cgroup_root(tmp_path))) as r:
            await r.configure()
            await r.sync([], [])
            return (await r.scrape()).text

    text = run(scenario())
    typed = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert typed, text
    assert sorted(typed) == sorted(set(typed)), [n for n in typed if typed.count(n) > 1]
    assert "nri_midbatch_config_reloads_total" in typed


def test_event_counters_are_present_at_zero_before_their_first_event(tmp_path: Path) -> None:
    # Prometheus's increase() only sees a rise within a series it already has: a series
    # born at 1 hides its first event, and an alert on invalid inputs or refused reloads
    # (examples/monitoring/) would miss a single bad pod or a single bad file.
    async def scenario() -> Scrape:
        async with running_app(make_config(cgroup_root(tmp_path))) as r:
            await r.configure()
            await r.sync([], [])
            return await r.scrape()

    m = run(scenario())
    for method in ("RunPodSandbox", "CreateContainer", "UpdateContainer", "StateChange"):
        assert m.value("nri_midbatch_event_duration_seconds_count", method=method) == 0, method
        assert m.value("nri_midbatch_events_total", method=method, result="ok") == 0, method
    for reason in ("spec", "overflow", "internal"):
        assert m.value("nri_midbatch_invalid_inputs_total", reason=reason) == 0, reason
    for result in ("applied", "unchanged", "invalid", "failed", "rejected_from_runtime"):
        assert m.value("nri_midbatch_config_reloads_total", result=result) == 0, result


class _GrowsWhileIterated(dict[Any, int]):
    """A counter dict that the loop's thread adds `key` to while a scrape walks its items."""

    def __init__(self, counts: Mapping[Any, int], key: Any) -> None:
        super().__init__(counts)
        self._key = key

    def items(self) -> Iterator[tuple[Any, int]]:  # type: ignore[override]
        walk = iter(super().items())
        first = next(walk)
        self[self._key] = 1
        yield first
        yield from walk


@pytest.mark.parametrize(
    ("owner", "attribute", "counts", "key", "family", "labels"),
    [
        ("counters", "decisions", {"batch": 2}, "mid", "decisions", {"tier": "batch"}),
        ("counters", "invalid", {"spec": 2}, "overflow", "invalid_inputs", {"reason": "spec"}),
        (
            "counters",
            "adjusted",
            {("CreateContainer", "cpu_quota"): 2},
            ("UpdateContainer", "cpu_quota"),
            "adjusted_fields",
            {"method": "CreateContainer", "field": "cpu_quota"},
        ),
        ("app", "reloads", {"applied": 2}, "invalid", "config_reloads", {"result": "applied"}),
        (
            "app",
            "followed",
            {("cgroup_files", "ok"): 2},
            ("cgroup_files", "failed"),
            "reload_writes",
            {"path": "cgroup_files", "result": "ok"},
        ),
    ],
)
def test_a_scrape_survives_a_counter_that_grows_meanwhile(
    owner: str,
    attribute: str,
    counts: Mapping[Any, int],
    key: Any,
    family: str,
    labels: dict[str, str],
) -> None:
    """The server's thread reads the plugin's counters while the loop adds a key to one."""
    app = App(load_startup_settings(None), name="midbatch", idx="10", config_path=None)
    target = app.plugin.counters if owner == "counters" else app
    setattr(target, attribute, _GrowsWhileIterated(counts, key))
    scrape = Scrape(generate_latest(app.metrics.registry).decode())
    assert scrape.value(f"nri_midbatch_{family}_total", **labels) == 2
