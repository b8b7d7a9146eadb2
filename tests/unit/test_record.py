"""Recording: one JSON line per call through the real transport, drops instead of delays,
rotation under a size cap."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import socket
import subprocess
import threading
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import structlog
from google.protobuf.json_format import ParseDict
from structlog.testing import capture_logs

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.config.compile import settings_of
from nri_midbatch.config.model import Config, load_config_text
from nri_midbatch.nri.session import Session
from nri_midbatch.nri.testing import LoopbackRuntime
from nri_midbatch.plugin.handlers import MidBatchPlugin
from nri_midbatch.recording.format import message_json, redacted_json
from nri_midbatch.recording.writer import Recorder, RotatingFile, Written
from nri_midbatch.rpc.errors import RpcError
from nri_midbatch.tools.cli import main
from nri_midbatch.wire.status import Code
from tests import factory
from tests.unit.nri_fixtures import STARTUP_TIMEOUT, STEP_TIMEOUT, run, start_prelaunched
from tests.unit.replay_fixtures import read_whole, replay_whole

SPEC = (
    '{"containers":{"main":{"requests":{"kubernetes.io/batch-cpu":"500",'
    '"kubernetes.io/batch-memory":"256Mi"},"limits":{"kubernetes.io/batch-cpu":"1k",'
    '"kubernetes.io/batch-memory":"512Mi"}}}}'
)


@pytest.fixture(autouse=True)
def _logging_reset() -> Iterator[None]:
    # The command line points structlog at the stderr pytest captures for one test; once that
    # stream is closed, a later test's log call would fail the handler it runs in.
    yield
    structlog.reset_defaults()


def main_container(pod: api.PodSandbox) -> api.Container:
    return api.Container(id=f"ctr-{pod.name}", pod_sandbox_id=pod.id, name="main")


@asynccontextmanager
async def recorded_plugin(
    recorder: Recorder, config: Config | None = None
) -> AsyncIterator[LoopbackRuntime]:
    """A MidBatchPlugin session recording to `recorder`, driven by a LoopbackRuntime."""
    plugin = MidBatchPlugin(settings_of(config or Config()), dry_run=True, observers=(recorder,))
    session = Session(plugin, "midbatch", "10", observers=(recorder,))
    plugin_end, runtime_end = socket.socketpair()
    serving = asyncio.create_task(session.run(plugin_end))
    runtime = await LoopbackRuntime.over(runtime_end)
    async with recorder:
        try:
            yield runtime
        finally:
            await runtime.close()
            await asyncio.gather(serving, return_exceptions=True)


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_call_is_one_line_with_request_reply_and_decisions(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    pod = factory.batch_pod("sandbox-batch", name="batch", namespace="jobs", annotation=SPEC)
    container = main_container(pod)
    create = api.CreateContainerRequest(pod=pod, container=container)

    async def scenario() -> api.CreateContainerResponse:
        async with recorded_plugin(Recorder(RotatingFile(path))) as runtime:
            await runtime.start(runtime_version="v1.7.24")
            await runtime.call(
                "StateChange",
                api.StateChangeEvent(event=api.RUN_POD_SANDBOX, pod=pod),
                api.Empty,
            )
            return await runtime.call("CreateContainer", create, api.CreateContainerResponse)

    reply = run(scenario())
    lines = read_lines(path)
    assert [line["method"] for line in lines] == [
        "Configure",
        "Synchronize",
        "StateChange",
        "CreateContainer",
    ]
    for line in lines:
        assert line["v"] == 1
        assert line["ts"].endswith("Z")
        datetime.fromisoformat(line["ts"])
        assert line["error"] is None
    created = lines[3]
    assert ParseDict(created["request"], api.CreateContainerRequest()) == create
    assert ParseDict(created["response"], api.CreateContainerResponse()) == reply
    assert created["request"]["container"]["pod_sandbox_id"] == "sandbox-batch"  # proto names
    (decision,) = created["decisions"]
    assert decision["level"] == "container"
    assert (decision["namespace"], decision["pod"], decision["container"]) == (
        "jobs",
        "batch",
        "main",
    )
    assert decision["tier"] == "batch"
    assert decision["values"] == {
        "cpu_shares": 512,
        "cpu_quota": 100000,
        "memory_limit": 512 * 1024 * 1024,
    }
    assert decision["error"] is None
    assert "cpu.shares 512 from request kubernetes.io/batch-cpu=500" in decision["trace"]
    # RunPodSandbox, through StateChange: the pod-level decision is filed with it.
    (pod_decision,) = lines[2]["decisions"]
    assert pod_decision["level"] == "pod"
    assert pod_decision["container"] is None
    assert pod_decision["values"]["cpu_shares"] == 512


def test_a_failed_call_is_recorded_with_its_status(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    pod = factory.batch_pod(
        "sandbox-batch",
        name="batch",
        namespace="jobs",
        annotation='{"containers":{"main":{"requests":{"kubernetes.io/batch-cpu":"x"}}}}',
    )
    config = load_config_text("failurePolicy: Fail\n", "test")

    async def scenario() -> RpcError:
        async with recorded_plugin(Recorder(RotatingFile(path)), config) as runtime:
            await runtime.start()
            with pytest.raises(RpcError) as failed:
                await runtime.call(
                    "CreateContainer",
                    api.CreateContainerRequest(pod=pod, container=main_container(pod)),
                    api.CreateContainerResponse,
                )
            return failed.value

    error = run(scenario())
    created = read_lines(path)[-1]
    assert created["method"] == "CreateContainer"
    assert created["response"] is None
    assert created["error"] == {"code": int(Code.INVALID_ARGUMENT), "message": error.message}
    assert created["decisions"][0]["error"].startswith("extended-resource spec:")


class BlockedSink:
    """A sink whose writes wait until released: a disk that has stopped answering."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.lines: list[bytes] = []

    def write(self, lines: Sequence[bytes]) -> Written:
        self.entered.set()
        self.release.wait(timeout=STEP_TIMEOUT)
        self.lines.extend(lines)
        return Written(len(lines), 0)

    def close(self) -> None:
        pass


def test_a_full_queue_drops_records_never_events() -> None:
    sink = BlockedSink()
    recorder = Recorder(sink, queue_size=1)
    pod = factory.batch_pod("sandbox-batch", name="batch", namespace="jobs", annotation=SPEC)
    create = api.CreateContainerRequest(pod=pod, container=main_container(pod))
    calls = 12

    async def scenario() -> tuple[
        list[api.CreateContainerResponse], bool, list[MutableMapping[str, Any]]
    ]:
        async with recorded_plugin(recorder) as runtime:
            await runtime.start()  # two calls: the writer takes the first and blocks
            await asyncio.to_thread(sink.entered.wait, STEP_TIMEOUT)
            replies = []
            with capture_logs() as logs:
                for _ in range(calls):
                    replies.append(
                        await runtime.call("CreateContainer", create, api.CreateContainerResponse)
                    )
                # The sink has not finished a write yet: every reply came while it was stuck.
                answered_while_stuck = not sink.lines
                dropped_while_blocked = recorder.dropped
                sink.release.set()
                # The writer drains; the queue has room again.
                await asyncio.wait_for(recorder.drained(), STEP_TIMEOUT)
                assert recorder.written + recorder.dropped == 2 + calls
                await runtime.call("CreateContainer", create, api.CreateContainerResponse)
            assert dropped_while_blocked > 0
            return replies, answered_while_stuck, logs

    replies, answered_while_stuck, logs = run(scenario(), timeout=3 * STEP_TIMEOUT)
    # Every event was answered, with the plugin's adjustment, while the writer was stuck.
    assert len(replies) == calls
    assert all(reply.adjust.linux.resources.cpu.shares.value == 512 for reply in replies)
    assert answered_while_stuck
    assert recorder.dropped >= calls - 1
    assert recorder.written + recorder.dropped == 2 + calls + 1
    assert len(sink.lines) == recorder.written
    # One warning for the whole burst, and one when recording resumes.
    events = [log["event"] for log in logs]
    assert events.count("recording queue full: dropping records, never events") == 1
    assert events.count("recording resumed") == 1


def write_ok(sink: RotatingFile, lines: Sequence[bytes]) -> int:
    """Write without an error; returns how many lines were refused."""
    written = sink.write(lines)
    assert written.error is None
    assert written.lines + written.refused == len(lines)
    return written.refused


def test_rotation_keeps_k_backups_under_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    sink = RotatingFile(path, max_bytes=100, backups=2)
    lines = [f"{n:039d}\n".encode() for n in range(20)]  # 40 bytes each: two per file
    for line in lines:
        assert write_ok(sink, [line]) == 0
    sink.close()
    files = [path, path.with_name("calls.jsonl.1"), path.with_name("calls.jsonl.2")]
    assert not path.with_name("calls.jsonl.3").exists()
    for file in files:
        assert 0 < file.stat().st_size <= 100
    # Oldest to newest, the files hold the last lines in order.
    kept = b"".join(file.read_bytes() for file in reversed(files))
    assert kept == b"".join(lines[-6:])


def test_rotation_refuses_a_line_over_the_cap_and_appends_to_an_existing_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "calls.jsonl"
    path.write_bytes(b"x" * 60 + b"\n")
    sink = RotatingFile(path, max_bytes=100, backups=0)
    assert write_ok(sink, [b"y" * 101 + b"\n", b"z" * 30 + b"\n"]) == 1
    assert path.read_bytes() == b"x" * 60 + b"\n" + b"z" * 30 + b"\n"
    # Without backups, rotation starts the file afresh.
    assert write_ok(sink, [b"w" * 50 + b"\n"]) == 0
    sink.close()
    assert path.read_bytes() == b"w" * 50 + b"\n"
    assert list(tmp_path.iterdir()) == [path]


def test_run_refuses_an_unwritable_recording(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["run", "--record", str(tmp_path / "missing" / "calls.jsonl")])
    assert status == 2
    assert "missing/calls.jsonl" in capsys.readouterr().err


def test_run_rejects_a_zero_size_cap(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "--record", "x", "--record-max-bytes", "0"])
    assert exited.value.code == 2
    assert "--record-max-bytes" in capsys.readouterr().err


# -- logrotate, full disks ---------------------------------------------------


def test_a_recording_renamed_away_is_reopened_at_its_path(tmp_path: Path) -> None:
    # logrotate without copytruncate: rename the file, and maybe create an empty one.
    path = tmp_path / "calls.jsonl"
    sink = RotatingFile(path, max_bytes=1000, backups=2)
    assert write_ok(sink, [b"first\n"]) == 0
    path.rename(tmp_path / "calls.jsonl-20261201")
    assert write_ok(sink, [b"second\n"]) == 0
    path.rename(tmp_path / "calls.jsonl-20261202")
    path.write_bytes(b"")  # logrotate's `create`, with its own mode
    assert write_ok(sink, [b"third\n"]) == 0
    sink.close()
    assert (tmp_path / "calls.jsonl-20261201").read_bytes() == b"first\n"
    assert (tmp_path / "calls.jsonl-20261202").read_bytes() == b"second\n"
    assert path.read_bytes() == b"third\n"


def test_a_rename_before_rotation_loses_no_backup(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    backups = [path.with_name(f"calls.jsonl.{n}") for n in (1, 2)]
    for n, backup in enumerate(backups, start=1):
        backup.write_bytes(f"backup {n}\n".encode())
    sink = RotatingFile(path, max_bytes=100, backups=3)
    line = b"x" * 39 + b"\n"
    assert write_ok(sink, [line, line]) == 0
    path.rename(tmp_path / "moved.jsonl")
    for _ in range(2):  # each would take the old file past the cap
        assert write_ok(sink, [line]) == 0
    sink.close()
    assert (tmp_path / "moved.jsonl").read_bytes() == line * 2
    assert path.read_bytes() == line * 2
    assert [backup.read_bytes() for backup in backups] == [b"backup 1\n", b"backup 2\n"]
    assert not path.with_name("calls.jsonl.3").exists()


def test_rotation_fills_a_gap_in_the_backups_before_dropping_one(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    # A rotation that failed half-way (or a backup removed by hand) leaves a gap at .1.
    path.with_name("calls.jsonl.2").write_bytes(b"two\n")
    path.with_name("calls.jsonl.3").write_bytes(b"three\n")
    sink = RotatingFile(path, max_bytes=10, backups=3)
    assert write_ok(sink, [b"now12345\n", b"next\n"]) == 0
    sink.close()
    assert path.read_bytes() == b"next\n"
    assert path.with_name("calls.jsonl.1").read_bytes() == b"now12345\n"
    assert path.with_name("calls.jsonl.2").read_bytes() == b"two\n"
    assert path.with_name("calls.jsonl.3").read_bytes() == b"three\n"


def _recorder_logs(logs: Sequence[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [log for log in logs if str(log["event"]).startswith("recording")]


def _create_calls(runtime: LoopbackRuntime, count: int) -> Any:
    pod = factory.batch_pod("sandbox-batch", name="batch", namespace="jobs", annotation=SPEC)
    create = api.CreateContainerRequest(pod=pod, container=main_container(pod))

    async def calls() -> None:
        for _ in range(count):
            await runtime.call("CreateContainer", create, api.CreateContainerResponse)

    return calls()


def test_a_full_disk_logs_once_counts_every_drop_and_closes_quietly() -> None:
    recorder = Recorder(RotatingFile(Path("/dev/full")))
    calls = 400

    async def scenario() -> list[MutableMapping[str, Any]]:
        with capture_logs() as logs:
            async with recorded_plugin(recorder) as runtime:
                await runtime.start()
                await _create_calls(runtime, calls)
        return logs

    logs = run(scenario(), timeout=30.0)
    assert recorder.written == 0
    assert recorder.dropped == 2 + calls
    recording_logs = _recorder_logs(logs)
    failures = [log for log in recording_logs if log["log_level"] == "error"]
    assert len(failures) == 1, failures
    assert "No space left on device" in failures[0]["error"]
    # The first failure, at most a summary, and the closing line: not one line per event.
    assert len(recording_logs) <= 4, recording_logs


def test_a_long_failure_is_summed_up_with_the_records_it_lost() -> None:
    recorder = Recorder(RotatingFile(Path("/dev/full")), failure_summary_every=0.0)

    async def scenario() -> list[MutableMapping[str, Any]]:
        with capture_logs() as logs:
            async with recorded_plugin(recorder) as runtime:
                await runtime.start()
                await recorder.drained()
                await _create_calls(runtime, 3)
        return logs

    logs = run(scenario())
    first = [log for log in logs if log["event"].startswith("recording write failed")]
    summaries = [log for log in logs if log["event"] == "recording writes still failing"]
    assert len(first) == 1 and summaries
    # Each summary counts every record lost since the failure began.
    assert summaries[-1]["lost"] == recorder.dropped == 2 + 3


def test_a_new_recording_is_private_to_the_plugin(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    RotatingFile(path).close()
    assert path.stat().st_mode & 0o777 == 0o600


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs, unmounted afterwards; needs root."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "recording-test", str(mount_point)], check=True
    )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)


def _fill(path: Path) -> None:
    with path.open("wb", buffering=0) as filler:
        try:
            while True:
                filler.write(b"f" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        try:
            while True:
                filler.write(b"f")
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def test_recording_resumes_with_whole_lines_when_space_returns(small_fs: Path) -> None:
    path = small_fs / "calls.jsonl"
    recorder = Recorder(RotatingFile(path))
    filler = small_fs / "filler"

    async def scenario() -> list[MutableMapping[str, Any]]:
        with capture_logs() as logs:
            async with recorded_plugin(recorder) as runtime:
                await runtime.start()
                await recorder.drained()
                _fill(filler)
                await _create_calls(runtime, 300)
                await recorder.drained()
                dropped_while_full = recorder.dropped
                filler.unlink()
                await _create_calls(runtime, 5)
        assert dropped_while_full >= 250  # the last page of the file still takes a few
        return logs

    logs = run(scenario(), timeout=30.0)
    events = [log["event"] for log in _recorder_logs(logs)]
    assert len(events) <= 5, events
    assert "recording resumed" in events
    # Every line in the file is whole, and each written record is there once.
    lines = read_lines(path)
    assert len(lines) == recorder.written
    assert [line["method"] for line in lines[:2]] == ["Configure", "Synchronize"]
    assert [line["method"] for line in lines[-5:]] == ["CreateContainer"] * 5
    assert recorder.written + recorder.dropped == 2 + 300 + 5


def run_plugin_process(
    tmp_path: Path,
    args: Sequence[str],
    scenario: Callable[[LoopbackRuntime, Path], Awaitable[None]],
) -> tuple[int, bytes, str]:
    """A pre-launched `nri-midbatch run ARGS` through scenario(runtime, log file), then SIGTERM.

    Metrics are served on an ephemeral port (see `metrics`). Returns the exit status, stderr
    and the plugin's log.
    """
    log_file = tmp_path / "plugin.log"
    process, runtime_end = start_prelaunched(
        "run",
        *args,
        "--metrics-address",
        "127.0.0.1:0",
        "--log-file",
        str(log_file),
        stderr=subprocess.PIPE,
    )

    async def drive() -> None:
        runtime = await LoopbackRuntime.over(runtime_end)
        await scenario(runtime, log_file)
        process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(process.wait, STARTUP_TIMEOUT)
        await runtime.close()

    try:
        run(drive(), timeout=3 * STARTUP_TIMEOUT)
        _, stderr = process.communicate(timeout=STARTUP_TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, stderr, log_file.read_text()


def metrics(log_file: Path) -> dict[str, float]:
    """The plugin's /metrics, unlabelled samples only, from the port its log names."""
    (port,) = [
        json.loads(line)["port"]
        for line in log_file.read_text().splitlines()
        if '"serving metrics and health"' in line
    ]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=STEP_TIMEOUT) as reply:
        text = reply.read().decode()
    samples = (line.split() for line in text.splitlines() if line and not line.startswith("#"))
    return {sample[0]: float(sample[1]) for sample in samples if len(sample) == 2}


def test_sigterm_with_the_recording_disk_full_exits_0(tmp_path: Path) -> None:
    calls = 20

    async def scenario(runtime: LoopbackRuntime, log_file: Path) -> None:
        await runtime.start(registration_timeout=STARTUP_TIMEOUT)
        await _create_calls(runtime, calls)
        # Every record is lost, and counted, once the writer has been through them. The
        # plugin is another process: only its metrics, asked again, show when.
        async with asyncio.timeout(STEP_TIMEOUT):
            while (await asyncio.to_thread(metrics, log_file)).get(
                "nri_midbatch_records_dropped_total"
            ) != 2 + calls:
                await asyncio.sleep(0.05)

    status, stderr, logged = run_plugin_process(tmp_path, ["--record", "/dev/full"], scenario)
    assert b"Traceback" not in stderr, stderr.decode()
    assert status == 0
    assert "Traceback" not in logged
    assert logged.count("recording write failed") == 1


# -- redaction ---------------------------------------------------------------

SECRETS = ("hunter2-db-password", "s3cr3t-token-value", "/var/lib/secret-volume-7f3a", "hook-key")


def secret_container(pod: api.PodSandbox) -> api.Container:
    return api.Container(
        id=f"ctr-{pod.name}",
        pod_sandbox_id=pod.id,
        name="main",
        env=["PATH=/usr/bin", "DB_PASSWORD=hunter2-db-password", "TOKEN=s3cr3t-token-value"],
        mounts=[
            api.Mount(destination="/etc/creds", type="bind", source="/var/lib/secret-volume-7f3a")
        ],
        hooks=api.Hooks(prestart=[api.Hook(path="/bin/hook", env=["HOOK_KEY=hook-key"])]),
    )


def record_secrets(path: Path, *, raw: bool) -> api.CreateContainerResponse:
    pod = factory.batch_pod("sandbox-batch", name="batch", namespace="jobs", annotation=SPEC)
    container = secret_container(pod)

    async def scenario() -> api.CreateContainerResponse:
        async with recorded_plugin(Recorder(RotatingFile(path), raw=raw)) as runtime:
            await runtime.start(pods=[pod], containers=[container])
            await runtime.call(
                "UpdateContainer",
                api.UpdateContainerRequest(pod=pod, container=container),
                api.UpdateContainerResponse,
            )
            return await runtime.call(
                "CreateContainer",
                api.CreateContainerRequest(pod=pod, container=container),
                api.CreateContainerResponse,
            )

    return run(scenario())


def test_recordings_keep_no_environment_or_mounts_but_what_decisions_rest_on(
    tmp_path: Path,
) -> None:
    path = tmp_path / "calls.jsonl"
    record_secrets(path, raw=False)
    recorded = path.read_bytes()
    for secret in SECRETS:
        assert secret.encode() not in recorded
    lines = read_lines(path)
    assert [line["method"] for line in lines] == [
        "Configure",
        "Synchronize",
        "UpdateContainer",
        "CreateContainer",
    ]
    for container in (
        lines[1]["request"]["containers"][0],
        lines[2]["request"]["container"],
        lines[3]["request"]["container"],
    ):
        assert container["env"] == ["<redacted>"] * 3
        assert container["mounts"] == [
            {"destination": "<redacted>", "type": "<redacted>", "source": "<redacted>"}
        ]
        assert container["hooks"]["prestart"][0] == {"path": "<redacted>", "env": ["<redacted>"]}
        assert (container["id"], container["name"]) == ("ctr-batch", "main")
    # What the decisions rest on is all there.
    assert (
        lines[3]["request"]["pod"]["annotations"]
        == factory.batch_pod(
            "sandbox-batch", name="batch", namespace="jobs", annotation=SPEC
        ).annotations
    )


def test_record_raw_keeps_the_values(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    record_secrets(path, raw=True)
    recorded = path.read_bytes()
    for secret in SECRETS:
        assert secret.encode() in recorded


def test_a_redacted_recording_replays_to_its_own_replies(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    reply = record_secrets(path, raw=False)
    assert reply.adjust.linux.resources.cpu.shares.value == 512
    entries, problems = read_whole(path)
    assert problems == []
    outcomes = replay_whole(entries, Config(), runtime_config=True)
    assert [outcome.response_changed for outcome in outcomes] == [False] * 4
    assert outcomes[-1].response == reply


@pytest.mark.parametrize("raw", [False, True], ids=["default", "--record-raw"])
def test_run_records_redacted_unless_asked_for_raw(tmp_path: Path, raw: bool) -> None:
    path = tmp_path / "calls.jsonl"
    pod = factory.batch_pod("sandbox-batch", name="batch", namespace="jobs", annotation=SPEC)

    async def scenario(runtime: LoopbackRuntime, _log_file: Path) -> None:
        await runtime.start(
            pods=[pod], containers=[secret_container(pod)], registration_timeout=STARTUP_TIMEOUT
        )

    args = ["--record", str(path), *(["--record-raw"] if raw else [])]
    status, _, _ = run_plugin_process(tmp_path, args, scenario)
    assert status == 0
    recorded = path.read_bytes()
    assert b'"containers":[' in recorded
    assert all((secret.encode() in recorded) == raw for secret in SECRETS)


def test_run_keeps_the_configured_spec_annotation(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    config = tmp_path / "config.yaml"
    config.write_text("classification:\n  extendedResourceSpecAnnotation: example.com/spec\n")
    pod = factory.batch_pod("sandbox-batch", name="batch", namespace="jobs", annotation=SPEC)
    pod.annotations["example.com/spec"] = SPEC
    pod.annotations["example.com/other"] = "s3cr3t-token-value"

    async def scenario(runtime: LoopbackRuntime, _log_file: Path) -> None:
        await runtime.start(
            pods=[pod], containers=[main_container(pod)], registration_timeout=STARTUP_TIMEOUT
        )

    status, _, _ = run_plugin_process(
        tmp_path, ["--config", str(config), "--record", str(path)], scenario
    )
    assert status == 0
    (recorded,) = read_lines(path)[1]["request"]["pods"]
    assert recorded["annotations"] == {
        "example.com/spec": SPEC,
        "example.com/other": "<redacted>",
        # The default name keeps its value too: a reload may go back to it.
        "node.koordinator.sh/extended-resource-spec": SPEC,
    }


def test_redaction_reaches_adjustments_and_keeps_the_plugins_own_values() -> None:
    reply = api.CreateContainerResponse(
        adjust=api.ContainerAdjustment(
            annotations={"nri-midbatch.io/native-limits": "cpu=1", "other": "s3cr3t-token-value"},
            env=[api.KeyValue(key="API_KEY", value="s3cr3t-token-value")],
            mounts=[api.Mount(destination="/d", source="/var/lib/secret-volume-7f3a")],
            hooks=api.Hooks(poststop=[api.Hook(path="/h", env=["HOOK_KEY=hook-key", "BARE"])]),
            args=["/bin/app", "--verbose"],
            linux=api.LinuxContainerAdjustment(
                resources=api.LinuxResources(cpu=api.LinuxCPU(cpus="0-3"))
            ),
        )
    )
    document = redacted_json(reply)
    adjust = document["adjust"]
    assert adjust["env"] == [{"key": "<redacted>", "value": "<redacted>"}]
    assert adjust["mounts"] == [{"destination": "<redacted>", "source": "<redacted>"}]
    assert adjust["hooks"]["poststop"][0]["env"] == ["<redacted>", "<redacted>"]
    assert adjust["annotations"] == {
        "nri-midbatch.io/native-limits": "cpu=1",
        "other": "<redacted>",
    }
    assert adjust["args"] == ["<redacted>", "<redacted>"]
    assert adjust["linux"]["resources"]["cpu"]["cpus"] == "0-3"
    # The message itself, which the plugin answered with, is untouched.
    assert message_json(reply)["adjust"]["env"][0]["value"] == "s3cr3t-token-value"
