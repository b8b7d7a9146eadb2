"""Run nri-midbatch as a real process and watch its JSON log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.node import NODE, SLOWDOWN

ROOT = Path(__file__).resolve().parents[2]
EXECUTABLE = Path(sys.executable).with_name("nri-midbatch")

Record = dict[str, Any]


def read_log(path: Path) -> list[Record]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        if line.strip():
            records.append(json.loads(line))
    return records


def wait_for_record(
    path: Path,
    match: Callable[[Record], bool],
    *,
    timeout: float = 10.0,
    after: int = 0,
) -> tuple[int, Record]:
    """The first record past index `after` that matches; (index, record)."""
    timeout *= SLOWDOWN
    deadline = time.monotonic() + timeout
    while True:
        records = read_log(path)
        for index, record in enumerate(records[after:], start=after):
            if match(record):
                return index, record
        if time.monotonic() > deadline:
            tail = "\n".join(json.dumps(r) for r in records[-20:])
            raise AssertionError(f"no matching log record within {timeout}s; log tail:\n{tail}")
        time.sleep(0.02)


def event(name: str) -> Callable[[Record], bool]:
    return lambda record: record.get("event") == name


class PluginProcess:
    """`nri-midbatch run` against a socket, logging JSON to a file."""

    def __init__(
        self,
        workdir: Path,
        socket_path: Path,
        *,
        config: str | None = None,
        wrapper: Sequence[str] = (),
        metrics_address: str = "127.0.0.1:0",
        extra_args: Sequence[str] = (),
        state_dir: Path | None = None,
    ) -> None:
        """`wrapper`: a command that execs the rest (same pid), e.g. a mount namespace.

        `state_dir`: the pod records; default the workdir's, so one plugin restarted in the
        same workdir finds them.
        """
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / "plugin.log"
        # The test's own, kept across the plugin's restarts in the same workdir: never the
        # host's /var/lib/nri-midbatch, which other tests' plugins would share.
        self.state_dir = workdir / "state" if state_dir is None else state_dir
        self.status_socket = workdir / "status.sock"
        args = [
            *wrapper,
            str(EXECUTABLE),
            "run",
            "--socket-path",
            str(socket_path),
            "--log-file",
            str(self.log_path),
            "--log-level",
            "debug",
            # An ephemeral port, logged as "serving metrics and health".
            "--metrics-address",
            metrics_address,
            "--state-dir",
            str(self.state_dir),
            "--status-socket",
            str(self.status_socket),
            *extra_args,
        ]
        # On a systemd-driver node every configuration names the driver.
        text = NODE.plugin_config(config or "")
        if config is not None or text:
            config_path = workdir / "config.yaml"
            config_path.write_text(text)
            args += ["--config", str(config_path)]
        self.proc = subprocess.Popen(
            args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )

    def records(self) -> list[Record]:
        return read_log(self.log_path)

    def wait_for(self, name: str, *, timeout: float = 10.0, after: int = 0) -> tuple[int, Record]:
        try:
            return wait_for_record(self.log_path, event(name), timeout=timeout, after=after)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.exit_note()}") from None

    def exit_note(self) -> str:
        """Whether the plugin still runs, else its exit code and what it printed on stderr:
        what a plugin that never logs (a start-up error) has to say."""
        rc = self.proc.poll()
        if rc is None:
            return "the plugin is still running"
        stderr = self.proc.stderr.read() if self.proc.stderr is not None else ""
        return f"the plugin exited with {rc}; its stderr:\n{stderr[-4000:]}"

    def metrics_port(self, timeout: float = 10.0) -> int:
        """The ephemeral port the plugin serves /metrics on, once it says so."""
        _, serving = self.wait_for("serving metrics and health", timeout=timeout)
        return int(serving["port"])

    def wait_for_reload(self) -> None:
        """Until the reload has written everything it planned (each write is logged)."""
        index, reloaded = self.wait_for("configuration reloaded")
        planned = reloaded["containers_to_update"] + reloaded["pods_to_update"]

        def written() -> int:
            return sum(
                r.get("event")
                in ("cgroup set for new configuration", "cgroup not set for new configuration")
                for r in self.records()[index:]
            )

        assert wait_until(lambda: written() >= planned), (written(), reloaded)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10 * SLOWDOWN)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def prelaunched_wrapper(plugin_dir: Path, name: str, log_path: Path) -> Path:
    """An NN-name executable for containerd's plugin_path.

    The runtime starts it with an empty environment and no arguments; the
    wrapper only adds a log file so the test can read what happened.
    """
    path = plugin_dir / name
    state = log_path.parent / "state"
    path.write_text(
        f"#!/bin/sh\nexec {EXECUTABLE} run --log-file {log_path} --log-level debug"
        f" --metrics-address 127.0.0.1:0 --state-dir {state} --status-socket {state}.sock\n"
    )
    os.chmod(path, 0o755)
    return path


def status_document(plugin: PluginProcess) -> dict[str, Any]:
    """`nri-midbatch status --format json` of the running plugin, and its exit status."""
    answer = subprocess.run(
        [str(EXECUTABLE), "status", "--socket", str(plugin.status_socket), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60 * SLOWDOWN,
        check=False,
    )
    document: dict[str, Any] = json.loads(answer.stdout)
    document["exit_status"] = answer.returncode
    return document


def check_status_shows_no_drift(plugin: PluginProcess) -> None:
    """`nri-midbatch status` of the running plugin: every workload it set holds its target."""
    document = status_document(plugin)
    drifting = [w for w in document["workloads"] if w["drift"]]
    assert document["exit_status"] == 0 and not drifting, drifting
    # It answers of the pods it remembers, given back or not.
    assert document["workloads"], document


def iter_events(records: list[Record], name: str) -> Iterator[Record]:
    return (r for r in records if r.get("event") == name)


def scrape(port: int, name: str, **wanted: str) -> float:
    """The sum of the plugin's /metrics samples of `name` whose labels include `wanted`."""
    url = f"http://127.0.0.1:{port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in wanted.items())
    )


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout * SLOWDOWN
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()
