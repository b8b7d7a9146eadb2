"""The App's metrics and readiness, scraped over HTTP while a runtime drives it over a socket.

Operability §7: events by type and result, a latency histogram per event, decisions by tier,
invalid inputs, adjusted fields, registration state and Synchronize size. §8: ready only after
Configure and Synchronize, not ready once the connection is gone.
"""

from __future__ import annotations

import asyncio
import json
import platform
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from nri_midbatch import __version__
from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.config.validator import load_startup_settings
from nri_midbatch.process.app import App
from nri_midbatch.rpc.errors import RpcError
from tests.factory import BATCH_CPU, BATCH_MEMORY, batch_pod, container, prod_pod
from tests.fake_cgroups import BESTEFFORT, FakeTree

from .app_node import Scrape, make_config, running_app
from .nri_fixtures import STEP_TIMEOUT, run

BATCH_SPEC = json.dumps(
    {
        "containers": {
            "app": {
                "requests": {BATCH_CPU: "500"},
                "limits": {BATCH_CPU: "1k", BATCH_MEMORY: "512Mi"},
            },
            "sidecar": {
                "requests": {BATCH_CPU: "250"},
                "limits": {BATCH_CPU: "500"},
            },
        }
    }
)


def cgroup_root(tmp_path: Path, *pods: api.PodSandbox) -> Path:
    """A cgroup v1 tree holding the given pods' directories with kubelet's besteffort values."""
    tree = FakeTree(tmp_path / "cgroup")
    for sandbox in pods:
        tree.write(sandbox.linux.cgroup_parent, BESTEFFORT)
    return tree.root


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------


def test_metrics_count_what_the_runtime_sent(tmp_path: Path) -> None:
    good = batch_pod("batch", annotation=BATCH_SPEC)
    malformed = batch_pod("bad", annotation="{not json")
    prods = [prod_pod("prod-a"), prod_pod("prod-b")]
    root = cgroup_root(tmp_path, good, malformed, *prods)
    synced = [
        container("c-prod-a", prods[0], "app"),
        container("c-prod-a2", prods[0], "sidecar"),
        container("c-prod-b", prods[1], "app"),
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
                (good, container("c-app", good, "app")),
                (good, container("c-sidecar", good, "sidecar")),
                (malformed, container("c-bad", malformed, "app")),
                (prods[0], container("c-prod-new", prods[0], "app")),
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

            # batch: 2 adjusted + the malformed one (its labels name the tier) + the pod level of
            # the good and the malformed pod, first met at their CreateContainer, + the good
            # one's again at its RunPodSandbox. none: 3 synchronized containers + their 2 pods +
            # 1 created container.
            assert m.value("nri_midbatch_decisions_total", tier="batch") == 6
            assert m.value("nri_midbatch_decisions_total", tier="none") == 6
            # A tier with no decision yet is there at 0, so rate() sees its first rise.
            assert m.value("nri_midbatch_decisions_total", tier="mid") == 0
            # The malformed annotation, once for its pod and once for its container.
            assert m.value("nri_midbatch_invalid_inputs_total", reason="spec") == 2
            for field in ("cpu_shares", "cpu_quota", "memory_limit"):
                adjusted = m.value(
                    "nri_midbatch_adjusted_fields_total", method="CreateContainer", field=field
                )
                assert adjusted == 2, field
            # The good pod's, at its first CreateContainer and again at its RunPodSandbox.
            assert m.value("nri_midbatch_pod_cgroup_writes_total", result="ok") == 2
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
                    await r.create(malformed, container("c-bad", malformed, "app"))
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
            "reload_follow",
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
    owners = {"counters": app.plugin.counters, "reload_follow": app.plugin.reconcile.follow}
    target = owners.get(owner, app)
    setattr(target, attribute, _GrowsWhileIterated(counts, key))
    scrape = Scrape(generate_latest(app.metrics.registry).decode())
    assert scrape.value(f"nri_midbatch_{family}_total", **labels) == 2


def test_reconnects_are_counted_from_the_sessions_event() -> None:
    """The runner tells the session's observers of each attempt after the first
    (`SessionObserver.reconnecting`); the App's metrics observer counts them."""
    app = App(load_startup_settings(None), name="midbatch", idx="10", config_path=None)
    app.session.reconnecting()
    app.session.reconnecting()
    scrape = Scrape(generate_latest(app.metrics.registry).decode())
    assert scrape.value("nri_midbatch_reconnects_total") == 2
