"""A signal while the plugin starts does not end it (issue 30: SIGHUP or SIGUSR1 0.2-0.5 s
after exec killed it, and a runtime does not restart a pre-launched plugin).

The plugin is started as a runtime pre-launches it, with Python's import-time report on
its standard error: the signals are sent once it has imported structlog, in the middle of
loading the command line, and at delays after that.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any

import pytest

from nri_midbatch.nri.testing import LoopbackRuntime

from .nri_fixtures import STARTUP_TIMEOUT, plugin_command, run, start_prelaunched

LAUNCHER = Path(__file__).resolve().parents[2] / "examples" / "prelaunched" / "launcher.sh"

#: The import-time line of structlog itself, once its modules are loaded.
LOADING = re.compile(rb"\|\s+structlog$")


def run_args(log: Path) -> tuple[str, ...]:
    """`run` logging to `log`, serving nothing but NRI."""
    return ("run", "--log-file", str(log), "--metrics-address", "", "--state-dir", "",
            "--status-socket", "")  # fmt: skip


def registers(runtime_end: Any) -> None:
    """The runtime's end: the plugin registers, then the runtime goes away."""

    async def scenario() -> None:
        runtime = await LoopbackRuntime.over(runtime_end)
        try:
            await runtime.start(registration_timeout=STARTUP_TIMEOUT)
            assert runtime.record.registrations
        finally:
            await runtime.close()

    run(scenario(), timeout=2 * STARTUP_TIMEOUT)


def started(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Any, Path]:
    """The plugin, pre-launched, once it is loading its modules; its runtime end and log."""
    log = tmp_path / "plugin.log"
    process, runtime_end = start_prelaunched(
        *run_args(log),
        stderr=subprocess.PIPE,
        env={"PYTHONPROFILEIMPORTTIME": "1"},
    )
    assert process.stderr is not None
    loading = threading.Event()
    threading.Thread(target=_drain, args=(process.stderr, loading), daemon=True).start()
    assert loading.wait(STARTUP_TIMEOUT), "structlog never imported"
    return process, runtime_end, log


def _drain(stderr: IO[bytes], loading: threading.Event) -> None:
    for line in stderr:
        if LOADING.search(line.rstrip()):
            loading.set()


def events(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.parametrize("delay", [0.0, 0.01, 0.05, 0.2])
def test_sighup_and_sigusr1_while_loading_are_acted_on_once_serving(
    tmp_path: Path, delay: float
) -> None:
    process, runtime_end, log = started(tmp_path)
    try:
        time.sleep(delay)
        process.send_signal(signal.SIGHUP)
        process.send_signal(signal.SIGUSR1)
        registers(runtime_end)
        assert process.wait(timeout=STARTUP_TIMEOUT) == 0
        said = [e["event"] for e in events(log)]
        # Each acted on once: a reload asked (no configuration file here) and debug on.
        assert said.count("reload asked, but no configuration file was given") == 1
        assert said.count("log level changed") == 1
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_sigterm_while_loading_ends_the_plugin_cleanly_before_it_serves(tmp_path: Path) -> None:
    process, runtime_end, log = started(tmp_path)
    try:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=STARTUP_TIMEOUT) == 0
        assert runtime_end.recv(1) == b""  # it never registered
        (line,) = [e for e in events(log) if e["event"] == "signals from before serving"]
        assert line["signals"] == ["SIGTERM"]
    finally:
        runtime_end.close()
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_prelaunched_launcher_keeps_the_plugin_through_signals_from_its_first_instant(
    tmp_path: Path,
) -> None:
    """examples/prelaunched/install.sh links the plugin directory's NN-name to launcher.sh:
    SIGHUP and SIGUSR1 from 10 ms after exec on, through the interpreter's own start (before
    any of the plugin's lines run), end neither the launcher nor the plugin."""
    command = plugin_command()
    if len(command) != 1:
        pytest.skip("the nri-midbatch command is not installed beside this interpreter")
    launcher = tmp_path / "10-midbatch"
    launcher.write_text(LAUNCHER.read_text().replace("@NRI_MIDBATCH@", command[0]))
    launcher.chmod(0o755)
    log = tmp_path / "plugin.log"
    process, runtime_end = start_prelaunched(*run_args(log), command=[str(launcher)])
    try:
        for _ in range(30):  # every 10 ms for the first 0.3 s, as an unlucky runtime might
            time.sleep(0.01)
            process.send_signal(signal.SIGHUP)
            process.send_signal(signal.SIGUSR1)
        registers(runtime_end)
        assert process.wait(timeout=STARTUP_TIMEOUT) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
