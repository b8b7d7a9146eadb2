"""The `nri-midbatch` command line: arguments, NRI's environment, check-config, pre-launch.

NRI protocol §4.1 (name and index rules), §5.1 / §8 (a pre-launched plugin gets no arguments,
exactly NRI_PLUGIN_NAME, NRI_PLUGIN_IDX and NRI_PLUGIN_SOCKET, and stdio on /dev/null).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import socket
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pytest
import structlog
import yaml

import nri_midbatch.tools.cli
from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.config.compile import settings_of
from nri_midbatch.config.model import Config, load_config_file, load_config_text
from nri_midbatch.config.settings import Settings
from nri_midbatch.nri.testing import LoopbackRuntime
from nri_midbatch.obs.logging import FALLBACK_LOG_FILE, JOURNAL_SOCKET
from nri_midbatch.tools.cli import Launch, main
from tests.factory import BATCH_APP, SPEC, labels, spec

from .hostile_config import HOSTILE_YAML
from .nri_fixtures import STARTUP_TIMEOUT, run, start_prelaunched

NRI_ENV = ("NRI_PLUGIN_NAME", "NRI_PLUGIN_IDX", "NRI_PLUGIN_SOCKET")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No NRI variables unless a test sets them; structlog restored after `run`."""
    for name in NRI_ENV:
        monkeypatch.delenv(name, raising=False)
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


#: What `run` starts on a node: the App, the log sink and glibc's tuning.
ON_A_NODE = Launch()


def exit_code(argv: Sequence[str], launch: Launch = ON_A_NODE) -> int:
    """main's status, whether it returns it or raises SystemExit (argparse)."""
    try:
        return main(list(argv), launch)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1


class FakeApp:
    """Stands in for nri_midbatch.process.app.App: records how `run` set it up, serves nothing."""

    instances: ClassVar[list[FakeApp]] = []

    def __init__(
        self, config: Settings, *, name: str, idx: str, config_path: str | None, **_: Any
    ) -> None:
        self.config = config
        self.name = name
        self.idx = idx
        self.config_path = config_path
        self.served: tuple[str, object] | None = None
        FakeApp.instances.append(self)

    def stop(self) -> None:
        pass

    def toggle_debug(self) -> None:
        pass

    async def reload(self, reason: str) -> None:
        pass

    async def run_prelaunched(self, fd: int) -> int:
        self.served = ("pre-launched", fd)
        return 0

    async def run_external(self, socket_path: str) -> int:
        self.served = ("external", socket_path)
        return 0


class FakeRun:
    """`run` launched with FakeApp, and a log sink that only notes how it was opened (a
    pre-launched plugin would open /var/log/...)."""

    def __init__(self) -> None:
        FakeApp.instances = []
        #: The open_sink calls: (log_file, prelaunched).
        self.sinks: list[tuple[str | None, bool]] = []
        self.launch = Launch(open_sink=self._open_sink, app=FakeApp)

    def _open_sink(self, log_file: str | None, prelaunched: bool) -> io.StringIO:
        self.sinks.append((log_file, prelaunched))
        return io.StringIO()

    def exit_code(self, argv: Sequence[str]) -> int:
        return exit_code(argv, self.launch)


@pytest.fixture
def fake_app() -> FakeRun:
    return FakeRun()


# ---------------------------------------------------------------------------
# run: name and index
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["run", "--idx", "1"], "plugin index '1' must be exactly two digits"),
        (["run", "--idx", "123"], "plugin index '123' must be exactly two digits"),
        (["run", "--name", "a b"], "plugin name 'a b' must be letters, digits"),
        (["run", "--name", ""], "plugin name '' must be letters, digits"),
    ],
)
def test_run_rejects_bad_name_or_index(
    capsys: pytest.CaptureFixture[str], fake_app: FakeRun, argv: list[str], problem: str
) -> None:
    assert fake_app.exit_code(argv) == 2
    err = capsys.readouterr().err
    assert problem in err
    assert f"argument {argv[1]}" in err
    assert FakeApp.instances == []


def test_prelaunched_name_from_nri_v0_3_environment_drops_the_index(
    monkeypatch: pytest.MonkeyPatch, fake_app: FakeRun, tmp_path: Path
) -> None:
    # NRI v0.3 runtimes pass the plugin's file name, "10-midbatch", as the name.
    monkeypatch.setenv("NRI_PLUGIN_NAME", "10-midbatch")
    monkeypatch.setenv("NRI_PLUGIN_IDX", "10")
    monkeypatch.setenv("NRI_PLUGIN_SOCKET", "3")
    assert fake_app.exit_code(["run", "--log-file", str(tmp_path / "log")]) == 0
    (app,) = FakeApp.instances
    assert (app.name, app.idx) == ("midbatch", "10")
    assert app.served == ("pre-launched", 3)


def test_external_mode_keeps_an_nn_prefixed_name(
    monkeypatch: pytest.MonkeyPatch, fake_app: FakeRun
) -> None:
    # Without NRI_PLUGIN_SOCKET we are not pre-launched: the name is taken as given.
    monkeypatch.setenv("NRI_PLUGIN_NAME", "10-midbatch")
    monkeypatch.setenv("NRI_PLUGIN_IDX", "10")
    assert fake_app.exit_code(["run", "--socket-path", "/nonexistent/nri.sock"]) == 0
    (app,) = FakeApp.instances
    assert (app.name, app.idx) == ("10-midbatch", "10")
    assert app.served == ("external", "/nonexistent/nri.sock")


def test_run_has_glibc_reuse_large_buffers_before_anything_else(fake_app: FakeRun) -> None:
    # Before the log sink is opened and the app made: the first Synchronize is the one that counts.
    seen: list[tuple[int, int]] = []

    def reuse_large_buffers() -> bool:
        seen.append((len(fake_app.sinks), len(FakeApp.instances)))
        return True

    launch = replace(fake_app.launch, reuse_large_buffers=reuse_large_buffers)
    assert exit_code(["run", "--socket-path", "/nonexistent/nri.sock"], launch) == 0
    assert seen == [(0, 0)]
    assert FakeApp.instances[0].served == ("external", "/nonexistent/nri.sock")


@pytest.mark.parametrize("prelaunched", [True, False], ids=["pre-launched", "external"])
def test_bad_nri_plugin_idx_exits_2(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fake_app: FakeRun,
    prelaunched: bool,
) -> None:
    monkeypatch.setenv("NRI_PLUGIN_IDX", "x")
    if prelaunched:
        monkeypatch.setenv("NRI_PLUGIN_SOCKET", "3")
    assert fake_app.exit_code(["run"]) == 2
    assert "plugin index 'x' must be exactly two digits" in capsys.readouterr().err
    assert FakeApp.instances == []


def test_empty_argv_with_nri_plugin_socket_means_run_prelaunched(
    monkeypatch: pytest.MonkeyPatch, fake_app: FakeRun
) -> None:
    monkeypatch.setenv("NRI_PLUGIN_NAME", "midbatch")
    monkeypatch.setenv("NRI_PLUGIN_IDX", "10")
    monkeypatch.setenv("NRI_PLUGIN_SOCKET", "3")
    assert fake_app.exit_code([]) == 0
    (app,) = FakeApp.instances
    assert (app.name, app.idx, app.served) == ("midbatch", "10", ("pre-launched", 3))
    assert app.config == settings_of(Config())
    # stdio is /dev/null for a pre-launched plugin: logging goes elsewhere.
    assert fake_app.sinks == [(None, True)]


def test_prelaunched_without_a_usable_log_destination_still_serves(
    monkeypatch: pytest.MonkeyPatch, fake_app: FakeRun
) -> None:
    """No journal and no fallback log file: the node needs the plugin more than its logs."""

    def unopenable(log_file: str | None, prelaunched: bool) -> io.StringIO:
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setenv("NRI_PLUGIN_SOCKET", "3")
    assert exit_code([], replace(fake_app.launch, open_sink=unopenable)) == 0
    (app,) = FakeApp.instances
    assert app.served == ("pre-launched", 3)


def test_empty_argv_without_nri_plugin_socket_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], fake_app: FakeRun
) -> None:
    assert fake_app.exit_code([]) == 2
    assert "COMMAND" in capsys.readouterr().err
    assert FakeApp.instances == []


def test_run_with_missing_config_file_exits_2(
    capsys: pytest.CaptureFixture[str], fake_app: FakeRun, tmp_path: Path
) -> None:
    missing = tmp_path / "missing.yaml"
    assert fake_app.exit_code(["run", "--config", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"{missing}: cannot read: No such file or directory" in err
    assert FakeApp.instances == []


@pytest.mark.parametrize("value", ["0", "-1", "3600", "inf", "nan", "soon"])
def test_registration_timeout_out_of_range_names_both_bounds(
    capsys: pytest.CaptureFixture[str], fake_app: FakeRun, value: str
) -> None:
    assert fake_app.exit_code(["run", "--registration-timeout", value]) == 2
    err = capsys.readouterr().err
    assert f"{value!r} is not a number of seconds above 0 and below 3600" in err
    assert FakeApp.instances == []


@pytest.mark.parametrize("value", ["-1", "-0.5", "3600", "nan", "later"])
def test_webhook_refuses_a_negative_or_huge_shutdown_delay(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    assert exit_code(["webhook", "--shutdown-delay", value]) == 2
    err = capsys.readouterr().err
    assert "argument --shutdown-delay" in err
    assert f"{value!r} is not a number of seconds 0 or more and below 3600" in err


def test_webhook_takes_a_shutdown_delay_of_zero() -> None:
    argv = ["webhook", "--shutdown-delay", "0", "--tls-cert", "c", "--tls-key", "k"]
    args = nri_midbatch.tools.cli.command_line().parse_args(argv)
    assert args.shutdown_delay == 0.0


# ---------------------------------------------------------------------------
# check-config
# ---------------------------------------------------------------------------


def test_check_config_prints_effective_yaml_that_round_trips(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "failurePolicy: Fail\n"
        "rules:\n  cpuNormalizationRatio: 1.2\n"
        "cgroups:\n  podLevel: false\n  driver: systemd\n"
    )
    assert exit_code(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    document = yaml.safe_load(out)
    # Every setting, defaults included.
    assert document["failurePolicy"] == "Fail"
    assert document["rules"] == {"cfsQuota": True, "cpuNormalizationRatio": 1.2}
    assert document["cgroups"] == {
        "root": "/sys/fs/cgroup",
        "driver": "systemd",
        "kubeletCgroupRoot": "/",
        "podLevel": False,
    }
    assert [tier["name"] for tier in document["tiers"]] == ["batch", "mid"]
    assert document["classification"]["qosLabel"] == "koordinator.sh/qosClass"
    # Round trip: the output is a valid config meaning the same, and is a fixed point.
    assert load_config_text(out, "output") == load_config_file(path)
    again = tmp_path / "again.yaml"
    again.write_text(out)
    assert exit_code(["check-config", str(again)]) == 0
    assert capsys.readouterr().out == out


def test_check_config_names_the_path_of_an_unknown_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("rules:\n  cpuNormalisationRatio: 1.2\n")
    assert exit_code(["check-config", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"{path}: rules.cpuNormalisationRatio: unknown key" in captured.err


def test_check_config_of_a_missing_file_exits_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "missing.yaml"
    assert exit_code(["check-config", str(missing)]) == 1
    assert f"{missing}: cannot read" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "reason"), HOSTILE_YAML.values(), ids=HOSTILE_YAML.keys())
def test_check_config_refuses_hostile_text_with_a_reason_not_a_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, reason: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    assert exit_code(["check-config", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"nri-midbatch: {path}: ")
    assert reason in captured.err
    assert "Traceback" not in captured.err


@pytest.mark.parametrize("target", ["/dev/null", "/dev/zero", "directory", "fifo"])
def test_check_config_refuses_what_is_not_a_regular_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, target: str
) -> None:
    path = tmp_path / "config.yaml"
    if target == "directory":
        path.mkdir()
    elif target == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(target)
    assert exit_code(["check-config", str(path)]) == 1
    assert "not a regular file" in capsys.readouterr().err


def test_run_with_a_hostile_config_exits_2_with_the_reason(
    capsys: pytest.CaptureFixture[str], fake_app: FakeRun, tmp_path: Path
) -> None:
    path = tmp_path / "config.yaml"
    text, reason = HOSTILE_YAML["nested-20000-deep"]
    path.write_text(text)
    assert fake_app.exit_code(["run", "--config", str(path)]) == 2
    assert reason in capsys.readouterr().err
    assert FakeApp.instances == []


def test_run_with_a_log_file_in_a_missing_directory_exits_2_with_the_reason(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The real open_sink: the file cannot be created.
    FakeApp.instances = []
    log_file = tmp_path / "missing" / "plugin.log"
    assert exit_code(["run", "--log-file", str(log_file)], Launch(app=FakeApp)) == 2
    err = capsys.readouterr().err
    assert f"nri-midbatch: --log-file {log_file}: No such file or directory" in err
    assert "Traceback" not in err
    assert FakeApp.instances == []


# ---------------------------------------------------------------------------
# Pre-launched, end to end: a real process on an inherited socket
# ---------------------------------------------------------------------------


@pytest.fixture
def fallback_log() -> Iterator[None]:
    """With no journal, a pre-launched plugin logs to FALLBACK_LOG_FILE; clean up after."""
    if not os.path.exists(JOURNAL_SOCKET) and not os.access(
        os.path.dirname(FALLBACK_LOG_FILE), os.W_OK
    ):
        pytest.skip(f"no journal and {FALLBACK_LOG_FILE} not writable: the plugin cannot log")
    existed = os.path.exists(FALLBACK_LOG_FILE)
    yield
    if not existed and os.path.exists(FALLBACK_LOG_FILE):
        os.unlink(FALLBACK_LOG_FILE)


@pytest.fixture(params=["metrics port free", "metrics port taken"])
def metrics_port(request: pytest.FixtureRequest) -> Iterator[None]:
    """A pre-launched plugin binds 127.0.0.1:9464 by default; taken, it must still serve."""
    if request.param == "metrics port free":
        yield
        return
    blocker = socket.socket()
    try:
        blocker.bind(("127.0.0.1", 9464))
    except OSError:
        blocker.close()
        yield  # already taken by someone else: the same situation
        return
    blocker.listen()
    try:
        yield
    finally:
        blocker.close()


def test_prelaunched_process_registers_configures_and_exits_on_close(
    fallback_log: None, metrics_port: None
) -> None:
    process, runtime_end = start_prelaunched()
    # No cgroup parent: a process of its own must not reach for the host's pod cgroups.
    pod = api.PodSandbox(
        id="p",
        uid="uid-p",
        labels=labels("BE", "koord-batch"),
        annotations={SPEC: spec({"app": BATCH_APP})},
    )
    container = api.Container(id="c", pod_sandbox_id="p", name="app")

    async def scenario() -> None:
        runtime = await LoopbackRuntime.over(runtime_end)
        try:
            configured, synced = await runtime.start(
                runtime_name="containerd",
                runtime_version="v1.7.24",
                registration_timeout=STARTUP_TIMEOUT,
            )
            (registration,) = runtime.record.registrations
            assert (registration.plugin_name, registration.plugin_idx) == ("midbatch", "10")
            assert configured.events & 0x89 == 0x89
            assert configured.events & ~0x7FF == 0
            assert list(synced.update) == []
            reply = await runtime.call(
                "CreateContainer",
                api.CreateContainerRequest(pod=pod, container=container),
                api.CreateContainerResponse,
            )
            res = reply.adjust.linux.resources
            assert (res.cpu.shares.value, res.cpu.quota.value, res.memory.limit.value) == (
                512,
                100_000,
                536_870_912,
            )
        finally:
            await runtime.close()

    try:
        run(scenario(), timeout=2 * STARTUP_TIMEOUT)
        # The runtime closed the socket: a pre-launched plugin is done.
        assert process.wait(timeout=STARTUP_TIMEOUT) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = nri_midbatch.tools.cli.command_line()
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(commands.choices)


@pytest.mark.parametrize("command", sorted(_subcommands()))
def test_help_shows_the_default_of_every_flag_that_has_one(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sub = _subcommands()[command]
    with pytest.raises(SystemExit):
        sub.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for action in sub._actions:
        if not action.option_strings or action.nargs == 0 or action.default is None:
            continue  # positional, a switch (--help, --record-raw), or nothing by default
        assert f"default {action.default}" in text, f"{command} {action.option_strings[0]}"


def test_run_help_says_what_an_unset_identity_config_and_log_file_mean(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: $NRI_PLUGIN_NAME, else midbatch)" in text
    assert "(default: $NRI_PLUGIN_IDX, else 10)" in text
    assert "default: none, the built-in defaults" in text
    assert f"(default: stderr; a pre-launched plugin the journal, else {FALLBACK_LOG_FILE})" in text


def test_status_without_a_plugin_says_what_to_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--socket", str(tmp_path / "none.sock")]) == 2
    err = capsys.readouterr().err
    assert "none.sock: No such file or directory: no plugin serves it" in err
    assert "Is the plugin running, with this --status-socket" in err


def test_status_of_a_plugin_no_runtime_registered_says_so(tmp_path: Path) -> None:
    """It knows no workload: not "0 workloads" and exit 0, as if the node had none."""
    from nri_midbatch.process.app import App
    from nri_midbatch.tools.status import status_command

    socket_path = tmp_path / "status.sock"
    app = App(
        settings_of(Config()), name="midbatch", idx="10", config_path=None,
        status_socket=socket_path,
    )  # fmt: skip

    async def ask() -> tuple[int, str, str]:
        async with app._services():
            out, err = io.StringIO(), io.StringIO()
            code = await asyncio.to_thread(
                status_command, socket_path, fmt="json", out=out, err=err
            )
            return code, out.getvalue(), err.getvalue()

    code, out, err = asyncio.run(ask())
    assert code == 2
    assert yaml.safe_load(out)["readiness"] == "not registered with a runtime"
    assert "the plugin is not ready: not registered with a runtime" in err
