"""A real Prometheus (Debian 12's 2.42) scrapes the plugin on a real containerd, and a webhook.

Prometheus runs from the test, not as a service: a loopback port, a storage directory in
the test's tmp dir, a 1 s scrape of the plugin's /metrics and of a running webhook's (over
HTTPS, with the test's CA), and the rules of examples/monitoring/ evaluated every second.
Pods of every kind go through containerd, and reviews through the webhook; then Prometheus's
HTTP API must show them: both targets up, decisions by tier, the latency histogram's calls,
the bad annotation as an invalid input and as a firing alert, the webhook's reviews by
result, both processes' memory, and data for every query of the dashboard. Prometheus asks
for OpenMetrics, so that is the format it reads here.
"""

from __future__ import annotations

import json
import math
import socket
import ssl
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.admission import container, mid_pod, pod, review
from tests.e2e.containerd import Containerd
from tests.e2e.plugin_process import EXECUTABLE, PluginProcess
from tests.e2e.pods import BE_NATIVE, run, run_batch, spec
from tests.factory import SPEC, labels
from tests.prometheus_tools import DASHBOARD, RULES, binary
from tests.tls import Tls, issue_tls

JOB = "nri-midbatch"
WEBHOOK_JOB = "nri-midbatch-webhook"
#: What the dashboard's variables stand for here: every job and instance, and Grafana's
#: $__rate_interval at a 1 s scrape (it is at least four scrape intervals).
DASHBOARD_VARIABLES = {"$job": ".+", "$instance": ".+", "$__rate_interval": "1m"}
#: Generous for a loaded 2-core machine: Prometheus scrapes and evaluates every second.
WAIT = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[str]
    log_path: Path
    started: float

    def get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
        """An instant query's vector: {sorted labels: value}."""
        data = self.get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", data
        return {
            tuple(sorted(sample["metric"].items())): float(sample["value"][1])
            for sample in data["result"]
        }

    def by(self, label: str, expr: str) -> dict[str, float]:
        return {dict(key)[label]: value for key, value in self.query(expr).items()}

    def wait_for(self, what: str, condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + WAIT
        while not condition():
            if self.process.poll() is not None:
                pytest.fail(f"prometheus exited ({self.process.returncode}):\n{self.log_tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"prometheus: not within {WAIT}s: {what}\n{self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self) -> str:
        return "\n".join(self.log_path.read_text().splitlines()[-20:])


def start_prometheus(workdir: Path, target: str, webhook: Webhook) -> Prometheus:
    workdir.mkdir(parents=True, exist_ok=True)
    ca_file = workdir / "ca.pem"
    ca_file.write_bytes(webhook.tls.ca_pem)
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": JOB, "static_configs": [{"targets": [target]}]},
            {
                "job_name": WEBHOOK_JOB,
                "scheme": "https",
                "tls_config": {"ca_file": str(ca_file)},
                "static_configs": [{"targets": [webhook.address]}],
            },
        ],
    }
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    address = f"127.0.0.1:{free_port()}"
    log_path = workdir / "prometheus.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                binary("prometheus"),
                f"--config.file={config_path}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address={address}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
    prom = Prometheus(f"http://{address}", process, log_path, time.time())

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    prom.wait_for("ready", ready)
    return prom


@pytest.fixture
def plugin(containerd: Containerd, tmp_path: Path) -> Iterator[PluginProcess]:
    # With a recording, so that the recorder's family is exported too.
    process = PluginProcess(
        tmp_path / "plugin",
        containerd.nri_socket,
        extra_args=["--record", str(tmp_path / "calls.jsonl")],
    )
    process.wait_for("synchronized")
    yield process
    assert process.stop() == 0


@dataclass
class Webhook:
    """`nri-midbatch webhook` as a process, on a loopback port, with the test's certificate."""

    address: str
    tls: Tls
    process: subprocess.Popen[bytes]

    def call(self, method: str, path: str, body: bytes | None = None) -> int:
        request = urllib.request.Request(
            f"https://{self.address}{path}",
            data=body,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10, context=self.tls.client()) as answer:
            status: int = answer.status
            return status

    def admit(self, document: dict[str, Any]) -> None:
        assert self.call("POST", "/mutate", json.dumps(document).encode()) == 200


@pytest.fixture
def webhook(tmp_path: Path) -> Iterator[Webhook]:
    tls = issue_tls(tmp_path / "tls")
    address = f"127.0.0.1:{free_port()}"
    log = (tmp_path / "webhook.log").open("wb")
    process = subprocess.Popen(
        [
            str(EXECUTABLE),
            "webhook",
            "--address",
            address,
            "--tls-cert",
            str(tls.cert),
            "--tls-key",
            str(tls.key),
            "--shutdown-delay",
            "0",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    served = Webhook(address, tls, process)
    deadline = time.monotonic() + WAIT
    while True:
        try:
            if served.call("GET", "/readyz") == 200:
                break
        except (OSError, ssl.SSLError):
            pass
        assert process.poll() is None, (tmp_path / "webhook.log").read_text()
        assert time.monotonic() < deadline, "the webhook did not become ready"
        time.sleep(0.2)
    try:
        yield served
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0
        log.close()


@pytest.fixture
def prometheus(plugin: PluginProcess, webhook: Webhook, tmp_path: Path) -> Iterator[Prometheus]:
    prom = start_prometheus(tmp_path / "prometheus", f"127.0.0.1:{plugin.metrics_port()}", webhook)
    try:
        yield prom
    finally:
        prom.process.terminate()
        try:
            prom.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            prom.process.kill()
            prom.process.wait()


def test_prometheus_scrapes_the_plugin_on_real_containerd_and_the_webhook(
    containerd: Containerd, plugin: PluginProcess, webhook: Webhook, prometheus: Prometheus
) -> None:
    prom = prometheus

    # Both targets are up, and every rule file loaded.
    def targets_up() -> bool:
        targets = prom.get("/api/v1/targets", state="active")["activeTargets"]
        return [t["health"] for t in targets] == ["up", "up"]

    prom.wait_for("targets up", targets_up)
    assert prom.by("job", "up") == {JOB: 1.0, WEBHOOK_JOB: 1.0}

    # Reviews through the webhook: a mid pod patched twice, a pod in no tier allowed.
    webhook.admit(review(mid_pod()))
    webhook.admit(review(mid_pod()))
    webhook.admit(review(pod(container("c"))))

    # Pods of every kind, created while Prometheus watches.
    run_batch(containerd, "batch")
    run(
        containerd,
        "mid",
        "besteffort",
        labels("BE", "koord-mid"),
        {SPEC: spec("mid", "2k", "4k", "1Gi")},
        BE_NATIVE,
    )
    run(
        containerd,
        "prod",
        "burstable",
        labels("LS", "koord-prod"),
        {},
        {"cpu_shares": 1536, "cpu_period": 100000, "cpu_quota": 150000},
    )
    run(
        containerd,
        "broken",
        "besteffort",
        labels("BE", "koord-batch"),
        {SPEC: '{"containers": {"main": {"limits": {"kubernetes.io/batch-cpu": "1.2.3"}}}}'},
        BE_NATIVE,
    )

    # Decisions by tier: one per pod at RunPodSandbox and one per container at
    # CreateContainer; prod is in no tier, and the broken pod counts under its tier.
    expected_tiers = {"batch": 4.0, "mid": 2.0, "none": 2.0}
    decisions = "sum by (tier) (nri_midbatch_decisions_total)"
    prom.wait_for(
        f"decisions {expected_tiers}", lambda: prom.by("tier", decisions) == expected_tiers
    )

    # The latency histogram has every call the runtime made: four pods, four containers.
    # containerd 1.7 and 2.1 deliver RunPodSandbox as a StateChange (both series exist at 0).
    calls = prom.by("method", "sum by (method) (nri_midbatch_event_duration_seconds_count)")
    assert calls["RunPodSandbox"] + calls["StateChange"] == 4, calls
    assert calls["CreateContainer"] == 4, calls
    assert calls == prom.by("method", "sum by (method) (nri_midbatch_events_total)")
    assert calls == prom.by(
        "method", 'sum by (method) (nri_midbatch_event_duration_seconds_bucket{le="+Inf"})'
    )
    answered_in_2s = prom.by(
        "method", 'sum by (method) (nri_midbatch_event_duration_seconds_bucket{le="2.0"})'
    )
    assert answered_in_2s == calls

    # The bad annotation: once for its pod, once for its container.
    invalid = prom.by("reason", "nri_midbatch_invalid_inputs_total")
    assert invalid == {"spec": 2.0, "overflow": 0.0, "internal": 0.0, "runtime_values": 0.0}

    # The webhook's reviews, by result; its other series there at 0.
    reviews = 'sum by (result) (nri_midbatch_webhook_requests_total{endpoint="mutate"})'
    expected_reviews = {"patched": 2.0, "allowed": 1.0, "denied": 0.0, "error": 0.0}
    prom.wait_for(
        f"webhook reviews {expected_reviews}",
        lambda: prom.by("result", reviews) == expected_reviews,
    )
    assert prom.by("endpoint", "nri_midbatch_webhook_request_duration_seconds_count") == {
        "mutate": 3.0,
        "validate": 0.0,
    }
    assert prom.by("result", "nri_midbatch_webhook_certificate_reloads_total") == {
        "ok": 0.0,
        "failed": 0.0,
    }

    # Both processes' memory, from the library's process collector, far below the limit.
    memory = prom.by("job", "process_resident_memory_bytes")
    assert set(memory) == {JOB, WEBHOOK_JOB}, memory
    assert all(10 * 2**20 < rss < 0.8 * 128 * 2**20 for rss in memory.values()), memory

    # The rules: every one evaluates without error, and the bad pod fires its alert, alone.
    def rules_evaluated() -> bool:
        groups = prom.get("/api/v1/rules")["groups"]
        return bool(groups) and all(
            not r["lastEvaluation"].startswith("0001") for g in groups for r in g["rules"]
        )

    prom.wait_for("rules evaluated", rules_evaluated)
    groups = prom.get("/api/v1/rules")["groups"]
    rule_names = yaml.safe_load(RULES.read_text())["groups"]
    assert len([r for g in groups for r in g["rules"]]) == sum(len(g["rules"]) for g in rule_names)
    assert [
        (r["name"], r["health"], r.get("lastError", ""))
        for g in groups
        for r in g["rules"]
        if r["health"] != "ok"
    ] == []

    def firing() -> set[tuple[str, str]]:
        alerts = prom.get("/api/v1/alerts")["alerts"]
        return {(a["labels"]["alertname"], a["state"]) for a in alerts}

    prom.wait_for(
        "NriMidbatchInvalidAnnotations firing",
        lambda: ("NriMidbatchInvalidAnnotations", "firing") in firing(),
    )
    assert firing() == {("NriMidbatchInvalidAnnotations", "firing")}

    # rate() needs two samples of a series in its window: on a loaded machine let
    # a few scrapes follow the events before the panels are asked.
    def scraped_thrice() -> bool:
        counts = prom.query("min(count_over_time(nri_midbatch_events_total[1m]))")
        return bool(counts) and min(counts.values()) >= 3

    prom.wait_for("three scrapes of every event series", scraped_thrice)

    # Every panel's query returns data over the run, as Grafana would ask for it.
    board = json.loads(DASHBOARD.read_text())
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            label = variable["name"]
            values = prom.get(
                f"/api/v1/label/{label}/values", **{"match[]": "nri_midbatch_build_info"}
            )
            assert values, label
    empty = []
    for panel in board["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for name, value in DASHBOARD_VARIABLES.items():
                expr = expr.replace(name, value)
            if not panel_has_data(prom, expr, instant=target.get("instant", False)):
                empty.append((panel["title"], expr))
    assert empty == []


def panel_has_data(prom: Prometheus, expr: str, *, instant: bool) -> bool:
    """At least one number that is not NaN, at the end of the run or anywhere in it."""
    if instant:
        values = list(prom.query(expr).values())
    else:
        data = prom.get(
            "/api/v1/query_range",
            query=expr,
            start=f"{prom.started:.3f}",
            end=f"{time.time():.3f}",
            step="1",
        )
        values = [float(v) for series in data["result"] for _, v in series["values"]]
    return any(not math.isnan(v) for v in values)
