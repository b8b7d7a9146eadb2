"""The `nri-midbatch` command line.

Longer than the house's 400 lines: every subcommand's flags and their checks sit in one
parser, so the flag table of the docs is checked against one place; each command's work lives
in the module it calls.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TextIO, TypeVar

import structlog

from nri_midbatch import __version__
from nri_midbatch.nri.session import DEFAULT_REGISTRATION_TIMEOUT
from nri_midbatch.obs.logging import (
    FALLBACK_LOG_FILE,
    LEVELS,
    JournalWriter,
    configure_logging,
    open_sink,
)
from nri_midbatch.process import early_signals, heap
from nri_midbatch.recording.redact import kept_annotations
from nri_midbatch.recording.writer import DEFAULT_BACKUPS, DEFAULT_MAX_BYTES, Recorder, RotatingFile

if TYPE_CHECKING:  # loaded by the commands that need it: `--version` stays fast
    from nri_midbatch.config.model import Config

_T = TypeVar("_T")

DEFAULT_SOCKET = "/var/run/nri/nri.sock"
DEFAULT_NAME = "midbatch"
#: After koordlet (00), before the nri-plugins resource policies (90).
DEFAULT_IDX = "10"

DEFAULT_METRICS_ADDRESS = "127.0.0.1:9464"
DEFAULT_WEBHOOK_ADDRESS = "0.0.0.0:9443"

_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")
_IDX = re.compile(r"^[0-9]{2}$")


#: On the host, so that a new plugin container finds what the last one kept.
DEFAULT_STATE_DIR = "/var/lib/nri-midbatch/pods"
#: Beside the records: on the host in the DaemonSet, so a shell on the node reaches it too.
DEFAULT_STATUS_SOCKET = "/var/lib/nri-midbatch/status.sock"


#: The longest any duration flag may be: longer is a typo (minutes for seconds), not a wish.
MAX_SECONDS = 3600


def _seconds(value: str, *, zero_allowed: bool) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan  # fails both comparisons below
    above = seconds >= 0 if zero_allowed else seconds > 0
    if not (above and seconds < MAX_SECONDS):
        least = "0 or more" if zero_allowed else "above 0"
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a number of seconds {least} and below {MAX_SECONDS}"
        )
    return seconds


def _positive_seconds(value: str) -> float:
    return _seconds(value, zero_allowed=False)


def _non_negative_seconds(value: str) -> float:
    return _seconds(value, zero_allowed=True)


def _metrics_address(value: str) -> str:
    from nri_midbatch.obs.health import parse_address

    if value:
        try:
            parse_address(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _webhook_address(value: str) -> str:
    from nri_midbatch.obs.health import parse_address

    try:
        parse_address(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"address {value!r} must be HOST:PORT") from None
    return value


def _plugin_name(value: str) -> str:
    if not _NAME.match(value):
        raise argparse.ArgumentTypeError(
            f"plugin name {value!r} must be letters, digits and _ . + - only"
        )
    return value


def _plugin_idx(value: str) -> str:
    if not _IDX.match(value):
        raise argparse.ArgumentTypeError(f"plugin index {value!r} must be exactly two digits")
    return value


#: The help of a flag whose choices say what it is: its default.
_DEFAULT = "(default %(default)s)"


def command_line() -> argparse.ArgumentParser:
    """The parser of the command line (the docs, manifests and packaging are checked against
    its options)."""
    parser = argparse.ArgumentParser(
        prog="nri-midbatch",
        description="NRI plugin setting cgroup values for Koordinator batch and mid-tier pods.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="connect to the runtime and serve NRI events")
    run.add_argument(
        "--socket-path",
        default=DEFAULT_SOCKET,
        help="NRI socket of the runtime (default %(default)s)",
    )
    run.add_argument(
        "--name",
        type=_plugin_name,
        default=None,
        help=f"plugin name (default: $NRI_PLUGIN_NAME, else {DEFAULT_NAME})",
    )
    run.add_argument(
        "--idx",
        type=_plugin_idx,
        default=None,
        help=f"plugin index, two digits (default: $NRI_PLUGIN_IDX, else {DEFAULT_IDX})",
    )
    run.add_argument(
        "--config",
        metavar="FILE",
        help="YAML configuration file, reloaded when it changes (default: none, the built-in "
        "defaults; a pre-launched plugin takes the runtime's drop-in)",
    )
    run.add_argument("--log-level", choices=LEVELS, default="info", help=_DEFAULT)
    run.add_argument("--log-format", choices=("json", "console"), default="json", help=_DEFAULT)
    run.add_argument(
        "--log-file",
        metavar="FILE",
        help="log here (default: stderr; a pre-launched plugin the journal, else "
        f"{FALLBACK_LOG_FILE})",
    )
    run.add_argument(
        "--registration-timeout",
        type=_positive_seconds,
        default=DEFAULT_REGISTRATION_TIMEOUT,
        metavar="SECONDS",
        help="how long to wait for the runtime to take our registration "
        "(keep it at least the runtime's plugin_registration_timeout; default %(default)s)",
    )
    run.add_argument(
        "--metrics-address",
        default=DEFAULT_METRICS_ADDRESS,
        type=_metrics_address,
        metavar="HOST:PORT",
        help="serve /metrics, /healthz and /readyz here; empty to disable (default %(default)s)",
    )
    run.add_argument(
        "--record",
        metavar="FILE",
        help="append every NRI request and reply to FILE (JSON lines; default: none)",
    )
    run.add_argument(
        "--record-max-bytes",
        type=_positive_int,
        default=DEFAULT_MAX_BYTES,
        metavar="N",
        help="rotate the recording before it grows past N bytes (default %(default)s)",
    )
    run.add_argument(
        "--record-backups",
        type=_non_negative_int,
        default=DEFAULT_BACKUPS,
        metavar="K",
        help="keep FILE.1 .. FILE.K when rotating (default %(default)s)",
    )

    run.add_argument(
        "--state-dir",
        metavar="DIR",
        default=DEFAULT_STATE_DIR,
        help="keep kubelet's values of the pods here, so a restart finds them "
        "(default %(default)s; empty: keep nothing)",
    )
    run.add_argument(
        "--status-socket",
        metavar="PATH",
        default=DEFAULT_STATUS_SOCKET,
        help="serve `nri-midbatch status` on this Unix socket, root only "
        "(default %(default)s; empty: not served)",
    )
    run.add_argument(
        "--record-raw",
        action="store_true",
        help="record every string as it came (default: redact what replay does not need)",
    )

    check = commands.add_parser("check-config", help="validate a configuration file")
    check.add_argument("file", metavar="FILE")

    replay = commands.add_parser(
        "replay",
        help="run a recording through the plugin and show what it decides now",
        epilog="exit status: 0 all replayed; 1 replies differ from --expect; 2 cannot run; "
        "4 malformed lines skipped (ORed with 1)",
    )
    replay.add_argument("recording", metavar="FILE", help="a recording made with run --record")
    replay.add_argument(
        "--config",
        metavar="FILE",
        help="configuration (wins over a recorded Configure's; default: the recorded "
        "Configure's, else the built-in defaults)",
    )
    replay.add_argument("--expect", metavar="GOLDEN", help="compare the replies with GOLDEN")
    replay.add_argument(
        "--write-expected", metavar="GOLDEN", help="write the replies as a golden file"
    )
    replay.add_argument(
        "--via-socket",
        action="store_true",
        help="drive the plugin through a socket pair, mux and ttrpc, as a runtime does",
    )
    replay.add_argument("--format", choices=("table", "json"), default="table", help=_DEFAULT)
    replay.add_argument("--log-level", choices=LEVELS, default="error", help=_DEFAULT)

    explain = commands.add_parser("explain", help="explain the decision for a pod")
    explain.add_argument(
        "--pod", metavar="FILE", required=True, help="Pod manifest or NRI PodSandbox (YAML/JSON)"
    )
    explain.add_argument(
        "--config", metavar="FILE", help="YAML configuration file (default: the built-in defaults)"
    )
    explain.add_argument("--format", choices=("text", "json"), default="text", help=_DEFAULT)

    status = commands.add_parser(
        "status",
        help="show each workload's tier, kubelet's values, target and cgroup files, "
        "from a running plugin",
    )
    status.add_argument(
        "--socket",
        metavar="PATH",
        default=DEFAULT_STATUS_SOCKET,
        help="the plugin's status socket, its run --status-socket (default %(default)s)",
    )
    status.add_argument("--format", choices=("table", "json"), default="table", help=_DEFAULT)

    webhook = commands.add_parser(
        "webhook",
        help="serve the admission webhook (priority-class label and extended-resource spec)",
    )
    webhook.add_argument("--tls-cert", metavar="FILE", required=True, help="PEM certificate chain")
    webhook.add_argument("--tls-key", metavar="FILE", required=True, help="PEM private key")
    webhook.add_argument(
        "--address",
        default=DEFAULT_WEBHOOK_ADDRESS,
        type=_webhook_address,
        metavar="HOST:PORT",
        help="listen here (default %(default)s)",
    )
    webhook.add_argument(
        "--config",
        metavar="FILE",
        help="YAML configuration file, the plugin's (default: the built-in defaults)",
    )
    webhook.add_argument(
        "--shutdown-delay",
        type=_non_negative_seconds,
        default=5.0,
        metavar="SECONDS",
        help="on SIGTERM, fail readiness and keep serving this long first (default %(default)s)",
    )
    webhook.add_argument("--log-level", choices=LEVELS, default="info", help=_DEFAULT)
    webhook.add_argument("--log-format", choices=("json", "console"), default="json", help=_DEFAULT)
    return parser


def _positive_int(value: str) -> int:
    number = _non_negative_int(value)
    if number == 0:
        raise argparse.ArgumentTypeError("must be positive")
    return number


def _non_negative_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return number


class Served(Protocol):
    """What `run` does with the App it makes (process/app.py)."""

    def stop(self) -> None: ...
    def toggle_debug(self) -> None: ...
    async def reload(self, reason: str) -> None: ...
    async def run_prelaunched(self, fd: int) -> int: ...
    async def run_external(self, socket_path: str) -> int: ...


@dataclass(frozen=True)
class Launch:
    """What `run` starts the plugin with: the real ones, unless a test gives its own
    (tests/unit/test_cli.py)."""

    #: Called before anything else.
    reuse_large_buffers: Callable[[], object] = heap.reuse_large_buffers
    open_sink: Callable[[str | None, bool], TextIO | JournalWriter] = open_sink
    #: Makes the App from the settings and App's keywords; None: process/app.py's App,
    #: imported only by `run` (the other commands and `--version` stay fast).
    app: Callable[..., Served] | None = None


def main(argv: Sequence[str] | None = None, launch: Launch = Launch()) -> int:
    """`launch`: what `run` starts with (the real ones by default)."""
    parser = command_line()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv and early_signals.runs_plugin(argv, os.environ):
        # The runtime execs a pre-launched plugin without arguments.
        argv = ["run"]
    args = parser.parse_args(argv)
    if args.command == "run":
        return _run(parser, args, launch)
    if args.command == "check-config":
        return _check_config(args.file)
    if args.command == "replay":
        return _replay(args)
    if args.command == "explain":
        return _explain(args)
    if args.command == "webhook":
        return _webhook(args)
    if args.command == "status":
        from nri_midbatch.tools.status import status_command

        return status_command(Path(args.socket), fmt=args.format, out=sys.stdout, err=sys.stderr)
    parser.error(f"unknown command {args.command}")
    return 2


def _identity(
    parser: argparse.ArgumentParser, args: argparse.Namespace, prelaunched: bool
) -> tuple[str, str]:
    """Name and index: flags win, then NRI's environment, then our defaults."""
    name = args.name or os.environ.get("NRI_PLUGIN_NAME") or DEFAULT_NAME
    idx = args.idx or os.environ.get("NRI_PLUGIN_IDX") or DEFAULT_IDX
    # NRI v0.3 runtimes pass the file name ("10-midbatch") as the name.
    if prelaunched and name.startswith(f"{idx}-"):
        name = name[len(idx) + 1 :]
    for value, check in ((name, _plugin_name), (idx, _plugin_idx)):
        try:
            check(value)
        except argparse.ArgumentTypeError as exc:
            parser.error(str(exc))
    return name, idx


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace, launch: Launch) -> int:
    launch.reuse_large_buffers()  # before the first large buffer
    socket_env = os.environ.get("NRI_PLUGIN_SOCKET")
    prelaunched_fd = None
    if socket_env is not None:
        if not socket_env.isdigit():
            parser.error(f"NRI_PLUGIN_SOCKET {socket_env!r} must be a file descriptor number")
        prelaunched_fd = int(socket_env)
    name, idx = _identity(parser, args, prelaunched_fd is not None)
    try:
        sink = launch.open_sink(args.log_file, prelaunched_fd is not None)
    except OSError as exc:
        if args.log_file:
            print(
                f"nri-midbatch: --log-file {args.log_file}: {exc.strerror or exc}", file=sys.stderr
            )
            return 2
        # Pre-launched, no journal and no fallback log file: serving the node
        # matters more than where its logs go.
        sink = sys.stderr
    configure_logging(args.log_level, args.log_format, sink)
    from nri_midbatch.config.validator import Validation

    # The configuration is validated in a child, which works while the plugin loads.
    validation = Validation.startup(args.config)
    from nri_midbatch.process.app import App

    config = _loaded(validation.result)
    if config is None:
        return 2
    recorder = None
    if args.record:
        try:
            recording = RotatingFile(Path(args.record), args.record_max_bytes, args.record_backups)
        except OSError as exc:
            print(f"nri-midbatch: {args.record}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        recorder = Recorder(
            recording,
            raw=args.record_raw,
            kept_annotations=kept_annotations(config.classification.spec_annotation),
        )

    make = App if launch.app is None else launch.app

    def make_app(metrics_address: str | None) -> Served:
        return make(
            config,
            name=name,
            idx=idx,
            config_path=args.config,
            recorder=recorder,
            metrics_address=metrics_address,
            log_level=args.log_level,
            registration_timeout=args.registration_timeout,
            state_dir=Path(args.state_dir) if args.state_dir else None,
            status_socket=Path(args.status_socket) if args.status_socket else None,
        )

    try:
        app = make_app(args.metrics_address or None)
    except OSError as exc:
        problem = f"cannot serve metrics on {args.metrics_address}: {exc.strerror or exc}"
        if prelaunched_fd is None:
            print(f"nri-midbatch: {problem}", file=sys.stderr)
            return 2
        # A pre-launched plugin that does not register can stop the runtime
        # from starting at all (containerd 1.7): serve the node, not metrics.
        structlog.get_logger(__name__).error(problem + "; running without metrics")
        app = make_app(None)

    async def serve() -> int:
        loop = asyncio.get_running_loop()
        handlers: dict[signal.Signals, Callable[[], object]] = {
            signal.SIGTERM: app.stop,
            signal.SIGINT: app.stop,
            signal.SIGHUP: lambda: loop.create_task(app.reload("SIGHUP")),
            signal.SIGUSR1: app.toggle_debug,
        }
        for sig, handler in handlers.items():
            loop.add_signal_handler(sig, handler)
        # Those that came while the plugin loaded, now that it can act on them.
        if early := early_signals.take():
            log = structlog.get_logger(__name__)
            log.info("signals from before serving", signals=[sig.name for sig in early])
            if {signal.SIGTERM, signal.SIGINT} & set(early):
                app.stop()
                return 0
            for sig in early:
                handlers[sig]()
        # The recorder flushes on the way out, whatever ended the run.
        async with recorder or contextlib.nullcontext():
            if prelaunched_fd is not None:
                return await app.run_prelaunched(prelaunched_fd)
            return await app.run_external(args.socket_path)

    from nri_midbatch.rpc import loop as event_loop

    try:
        factory = event_loop.loop_factory()
    except ValueError as exc:
        print(f"nri-midbatch: {exc}", file=sys.stderr)
        return 2
    return event_loop.run(serve(), factory)


def _replay(args: argparse.Namespace) -> int:
    from nri_midbatch.tools.replay.command import EXIT_CANNOT_RUN, replay_command

    configure_logging(args.log_level, "console")
    config = _startup_config(args.config)
    if config is None:
        return EXIT_CANNOT_RUN
    return replay_command(
        Path(args.recording),
        config,
        runtime_config=args.config is None,
        via_socket=args.via_socket,
        fmt=args.format,
        expect=None if args.expect is None else Path(args.expect),
        write_expected_to=None if args.write_expected is None else Path(args.write_expected),
        out=sys.stdout,
        err=sys.stderr,
    )


def _explain(args: argparse.Namespace) -> int:
    from nri_midbatch.tools.explain import explain_command

    config = _startup_config(args.config)
    if config is None:
        return 2
    return explain_command(Path(args.pod), config, fmt=args.format, out=sys.stdout, err=sys.stderr)


def _webhook(args: argparse.Namespace) -> int:
    import ssl
    import threading

    from nri_midbatch.tools.webhook.server import WebhookServer, load_tls_context

    configure_logging(args.log_level, args.log_format)
    config = _startup_config(args.config)
    if config is None:
        return 2
    try:
        load_tls_context(args.tls_cert, args.tls_key)
    except (OSError, ssl.SSLError) as exc:
        problem = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        print(f"nri-midbatch: TLS {args.tls_cert}, {args.tls_key}: {problem}", file=sys.stderr)
        return 2
    try:
        server = WebhookServer(
            args.address, args.tls_cert, args.tls_key, config, config_path=args.config
        )
    except OSError as exc:
        print(
            f"nri-midbatch: cannot serve on {args.address}: {exc.strerror or exc}", file=sys.stderr
        )
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    while not stop.wait(1.0):
        pass
    # Endpoints are removed asynchronously: keep answering while readiness fails.
    server.drain()
    time.sleep(args.shutdown_delay)
    server.stop()
    return 0


def _startup_config(path: str | None) -> Config | None:
    """The configuration a command starts with; None, once the reason is printed, if unusable."""
    from nri_midbatch.config.model import load_startup_config

    return _loaded(lambda: load_startup_config(path))


def _loaded(load: Callable[[], _T]) -> _T | None:
    """What `load` gives; None, once the reason is printed, if the configuration is unusable."""
    from nri_midbatch.config.settings import ConfigError

    try:
        return load()
    except ConfigError as exc:
        print(f"nri-midbatch: {exc}", file=sys.stderr)
        return None


def _check_config(path: str) -> int:
    from nri_midbatch.config.model import effective_config_yaml

    config = _startup_config(path)
    if config is None:
        return 1
    sys.stdout.write(effective_config_yaml(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
