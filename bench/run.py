"""`python -m bench`: the plugin as a real process, the benchmark as its runtime.

Phases, in order, against one plugin process (after `--launches` - 1 extra
launches that measure only the first two, whose medians are reported):

1. start-up: Popen -> accept -> RegisterPlugin -> Configure answered;
2. Synchronize of a large node, split into < 4 MiB chunks as the runtime splits it;
3. CreateContainer round trips, one at a time, in a realistic pod lifecycle
   (RunPodSandbox, CreateContainer, later RemoveContainer and RemovePodSandbox);
4. the same with 8 requests in flight;
5. memory: 100,000 more pod lifecycles, resident memory sampled as they go;
then, in this process with the plugin stopped, the policy core alone, and the admission
webhook's decision (bench/webhook.py). `--only-webhook` runs that last part alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from bench import workload
from bench.runtime import SUBSCRIBED_EVENTS, BenchError, Kind, Runtime, Template
from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.api import ttrpc_pb2

MAX_MESSAGE = 4 << 20  # ttrpc's messageLengthMax
#: How long CreateContainer probes go on after the Synchronize reply, and their first pod.
PROBE_SECONDS = 1.0
PROBE_FIRST_POD = 90_000_000
#: A probe slower than this misses issue 14's target, and is listed with who waited.
SLOW_PROBE_SECONDS = 0.002
#: The plugin's last line for a Synchronize, once its deferred work is done.
SYNC_SUMMARY = b'"event": "synchronized"'
#: Seconds between convergence passes while they are measured: they run back to back.
CONVERGENCE_INTERVAL = 0.05
MB = 1 << 20
#: Resident memory after the Synchronize and after the events: issue 26's goal with
#: prometheus_client and the standard library it loads (issue 14's was 45 MB without it).
STEADY_RSS_MB = 48
#: A Go plugin's Synchronize time over the floor's (bench/floor.py): issue 14 measured
#: the Go plugin at 0.81-0.85 of commit 25cd8d8's plugin in the same runs, and
#: 25cd8d8's plugin took 2.72 and 3.24 times the floor here (docs/performance-history.md,
#: "Synchronize floor").
GO_OVER_FLOOR = 2.5
#: Issue 32's Go plugin (NRI v0.12.2's stub, the same values) on its quiet 2-core machine,
#: driven by the runtime side of NRI v0.12.2: the best of its runs, the targets of ours.
#: There is no Go toolchain for that stub here; the figures are the issue's.
GO_CREATE_P50_MS = 0.182
GO_CREATE_P99_MS = 0.539
GO_PEAK_RSS_MB = 96.6
#: The event loop the plugin runs on where it is deployed: the image and the default
#: install have no uvloop (an extra: 1.8 MB more resident memory, docs/performance.md).
#: What the benchmark measures unless told otherwise.
SHIPPED_LOOP = "asyncio"
#: The checkout this benchmark is part of.
REPO = Path(__file__).resolve().parents[1]


# -- options -------------------------------------------------------------------


@dataclass
class Options:
    events: int = 5000
    concurrency: int = 8
    memory_events: int = 100_000
    sync_pods: int = 1000
    sync_containers_per_pod: int = 10
    sync_chunk_max: int = MAX_MESSAGE
    decisions: int = 200_000
    webhook_reviews: int = 2000
    only_webhook: bool = False
    launches: int = 3
    live_pods: int = 100
    check_every: int = 64
    nri: str = "v0.12"  # "v0.12": dedicated RPCs; "1.7": StateChange, as containerd 1.7
    loop: str = SHIPPED_LOOP
    plugin_module: str = "nri_midbatch.tools.cli"
    plugin_path: str | None = None
    json_path: str | None = "bench-results.json"
    keep: bool = False
    profile: str | None = None
    quick: bool = False
    #: Serve `nri-midbatch status` at workdir/status.sock (bench/status.py).
    status_socket: bool = False
    #: The plugin has the convergence pass: its configuration names it, and its figures are
    #: measured. Off for code from before it (2c7d6f7), which refuses the key.
    convergence: bool = True


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts (smoke test)")
    parser.add_argument("--json", dest="json_path", default="bench-results.json", metavar="PATH")
    parser.add_argument("--events", type=int, help="CreateContainer events per latency phase")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--memory-events", type=int, help="CreateContainer events, memory phase")
    parser.add_argument("--sync-pods", type=int)
    parser.add_argument("--sync-containers-per-pod", type=int)
    parser.add_argument(
        "--decisions", type=int, help="decide_container calls per policy figure (0: none)"
    )
    parser.add_argument(
        "--webhook-reviews",
        type=int,
        help="admission reviews per pod size and endpoint (0: no webhook figures)",
    )
    parser.add_argument(
        "--only-webhook",
        action="store_true",
        help="only the webhook's admission figures: no plugin process",
    )
    parser.add_argument(
        "--launches",
        type=int,
        help="plugin processes started; start-up and Synchronize are the median over them",
    )
    parser.add_argument(
        "--nri",
        choices=("v0.12", "1.7"),
        default="v0.12",
        help="remove events as NRI v0.12 RPCs or as containerd 1.7 StateChange",
    )
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default=SHIPPED_LOOP,
        help="event loop of the plugin (NRI_MIDBATCH_EVENT_LOOP); default: asyncio's, the one "
        "the image and `pip install nri-midbatch` run (uvloop is an extra)",
    )
    parser.add_argument("--profile", metavar="FILE", help="py-spy the plugin's event phases")
    parser.add_argument(
        "--plugin-path",
        metavar="DIR",
        help="run the plugin code in DIR (e.g. an earlier commit's, from git archive) "
        "instead of this checkout's",
    )
    parser.add_argument(
        "--plugin-module",
        default=Options.plugin_module,
        metavar="MODULE",
        help="the plugin's command line, run as `python -m MODULE` (an earlier commit's code "
        "has its own)",
    )
    parser.add_argument(
        "--no-convergence",
        dest="convergence",
        action="store_false",
        help="plugin code from before the convergence pass (e.g. 2c7d6f7's, which refuses the "
        "`convergence` key): its configuration leaves the key out, no convergence figures",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    opts = Options(
        quick=args.quick,
        nri=args.nri,
        loop=args.loop,
        keep=args.keep,
        plugin_module=args.plugin_module,
        plugin_path=args.plugin_path,
        convergence=args.convergence,
    )
    if args.quick:
        opts.events, opts.memory_events = 300, 1000
        opts.sync_pods, opts.sync_containers_per_pod = 40, 10
        # Small chunks, so that the quick run still exercises split Synchronize.
        opts.sync_chunk_max = 256 * 1024
        opts.decisions, opts.launches, opts.live_pods = 20_000, 1, 20
        opts.webhook_reviews = 100
        opts.check_every = 8
    for name in (
        "events",
        "concurrency",
        "memory_events",
        "sync_pods",
        "sync_containers_per_pod",
        "decisions",
        "webhook_reviews",
        "launches",
    ):
        value = getattr(args, name)
        if value is not None:
            if value < 1 and name not in ("decisions", "webhook_reviews"):
                parser.error(f"--{name.replace('_', '-')} must be positive")
            setattr(opts, name, value)
    opts.json_path = args.json_path or None
    opts.only_webhook = args.only_webhook
    if opts.only_webhook and not opts.webhook_reviews:
        parser.error("--only-webhook needs --webhook-reviews of at least 1")
    opts.profile = args.profile
    return opts


# -- results -------------------------------------------------------------------


@dataclass
class Figure:
    name: str
    value: float
    unit: str
    target: str
    ok: bool | None  # None: reported for information, no target

    def shown(self) -> str:
        if self.unit == "ms":
            return f"{self.value:.3f} ms"
        if self.unit == "s":
            return f"{self.value:.3f} s"
        if self.unit == "MB":
            return f"{self.value:.1f} MB"
        if self.unit == "/s":
            return f"{self.value:,.0f}/s"
        if self.unit == "x":
            return f"{self.value:.2f}x"
        return f"{self.value:,.0f}{' ' + self.unit if self.unit else ''}"


@dataclass
class Results:
    figures: list[Figure] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def add(
        self, name: str, value: float, unit: str, target: str = "", ok: bool | None = None
    ) -> None:
        self.figures.append(Figure(name, value, unit, target, ok))

    def latency(self, label: str, latencies: Sequence[float], *, targets: bool) -> None:
        ms = sorted(x * 1000 for x in latencies)
        p50, p99, top = _percentile(ms, 50), _percentile(ms, 99), ms[-1]
        self.add(
            f"{label} p50",
            p50,
            "ms",
            f"<= {GO_CREATE_P50_MS} ms (Go)" if targets else "",
            p50 <= GO_CREATE_P50_MS if targets else None,
        )
        self.add(
            f"{label} p99",
            p99,
            "ms",
            f"<= {GO_CREATE_P99_MS} ms (Go)" if targets else "",
            p99 <= GO_CREATE_P99_MS if targets else None,
        )
        self.add(
            f"{label} max", top, "ms", "< 10 ms" if targets else "", top < 10.0 if targets else None
        )

    def table(self) -> str:
        width = max(len(f.name) for f in self.figures)
        lines = [f"{'figure':<{width}}  {'measured':>14}  {'target':<12}  ok"]
        lines.append("-" * len(lines[0]))
        for f in self.figures:
            ok = "" if f.ok is None else ("yes" if f.ok else "NO")
            lines.append(f"{f.name:<{width}}  {f.shown():>14}  {f.target:<12}  {ok}")
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {
            "figures": {
                f.name: {"value": f.value, "unit": f.unit, "target": f.target or None, "ok": f.ok}
                for f in self.figures
            },
            "details": self.details,
        }


def _percentile(ordered: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of sorted values."""
    rank = max(1, -(-len(ordered) * pct // 100))
    return ordered[int(rank) - 1]


# -- the plugin process --------------------------------------------------------


@dataclass
class Plugin:
    process: subprocess.Popen[bytes]
    runtime: Runtime
    startup: float
    stderr: Path

    def rss_mb(self) -> float:
        return self._status_mb("VmRSS:")

    def peak_rss_mb(self) -> float:
        """The most resident memory the process has had (VmHWM): what a memory limit must allow."""
        return self._status_mb("VmHWM:")

    def _status_mb(self, key: str) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) / 1024
        raise BenchError(f"no {key} for the plugin")

    @property
    def schedstat(self) -> Path:
        """The plugin's main thread, the one its event loop runs on."""
        return Path(f"/proc/{self.process.pid}/schedstat")

    def cpu_seconds(self) -> float:
        fields = self._stat()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def minor_faults(self) -> int:
        """Pages the plugin has touched for the first time (or again, after returning them)."""
        return int(self._stat()[7])

    def _stat(self) -> list[str]:
        # After the command's ")": minflt is the 10th field, utime and stime the 14th and 15th.
        return Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()

    def wait_idle(self, quiet: float = 0.1, timeout: float = 30.0) -> float:
        """Seconds until the plugin last used CPU before `quiet` seconds without any.

        Its CPU time moves in clock ticks (10 ms), so that is the resolution.
        """
        start = last_change = time.perf_counter()
        last = self.cpu_seconds()
        while True:
            time.sleep(0.005)
            now, cpu = time.perf_counter(), self.cpu_seconds()
            if cpu != last:
                last, last_change = cpu, now
            elif now - last_change >= quiet:
                return last_change - start
            if now - start > timeout:
                raise BenchError(f"the plugin was still busy {timeout:.0f} s after the reply")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.runtime.sock.close()


class Bench:
    def __init__(self, opts: Options, workdir: Path) -> None:
        self.opts = opts
        self.workdir = workdir
        self.cgroup_root = workdir / "cgroup"
        workload.make_cgroup_root(self.cgroup_root)
        self.config = workdir / "config.yaml"
        # The convergence pass is measured on its own (`convergence`), off until then.
        self.config.write_text(self.config_text(0))
        self.log_file = workdir / "plugin.log"
        self.socket_path = str(workdir / "nri.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.socket_path)
        self.listener.listen(4)
        self.results = Results()
        if opts.nri == "1.7":
            self.runtime_version, self.nri_version = "v1.7.24", ""
        else:
            self.runtime_version, self.nri_version = "v2.3.0", "v0.12.0"
        self.configure = Template.build(
            "Configure",
            api.ConfigureRequest(
                runtime_name="containerd",
                runtime_version=self.runtime_version,
                registration_timeout=5000,
                request_timeout=2000,
                NRI_version=self.nri_version,
            ).SerializeToString(),
        )

    def config_text(self, convergence_interval: float) -> str:
        text = f"cgroups:\n  root: {self.cgroup_root}\n"
        if not self.opts.convergence:
            return text
        return text + f"convergence:\n  intervalSeconds: {convergence_interval}\n"

    def launch(self, *, floor: tuple[str, ...] | None = None) -> Plugin:
        """Start the plugin and register it.

        floor: start `bench.floor`, the plugin with no policy, instead, with these
        arguments of its own.
        """
        env = dict(os.environ)
        env["NRI_MIDBATCH_EVENT_LOOP"] = self.opts.loop
        stderr = self.workdir / "plugin.stderr"
        # `python -m` imports from its working directory first.
        code = Path(self.opts.plugin_path or REPO)
        if floor is not None:
            command = [
                sys.executable,
                "-m",
                "bench.floor",
                "--socket-path",
                self.socket_path,
                *floor,
            ]
            # The floor is this checkout's code, whichever plugin code is measured.
            code = REPO
        else:
            command = [
                sys.executable,
                "-m",
                self.opts.plugin_module,
                "run",
                "--socket-path",
                self.socket_path,
                "--log-file",
                str(self.log_file),
                "--metrics-address",
                "",
                "--config",
                str(self.config),
                # Records are part of what a Synchronize costs; no status socket unless asked.
                "--state-dir",
                str(self.log_file.parent / "state"),
                "--status-socket",
                str(self.workdir / "status.sock") if self.opts.status_socket else "",
            ]
        self.listener.settimeout(10)
        started = time.perf_counter()
        with stderr.open("ab") as err:
            process = subprocess.Popen(
                command,
                env=env,
                cwd=code,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
            )
        try:
            sock, _ = self.listener.accept()
        except TimeoutError:
            process.kill()
            raise BenchError(f"the plugin did not connect; see {stderr}") from None
        sock.settimeout(None)
        runtime = Runtime(sock)
        runtime.wait_registered(5.0)
        registration = api.RegisterPluginRequest.FromString(runtime.registrations[0])
        reply, _seconds = runtime.call(self.configure)
        startup = time.perf_counter() - started
        configured = api.ConfigureResponse.FromString(_payload(reply, "Configure"))
        if configured.events != SUBSCRIBED_EVENTS:
            raise BenchError(
                f"Configure: events {configured.events:#x}, expected {SUBSCRIBED_EVENTS:#x}"
            )
        self.results.details.setdefault(
            "plugin", f"{registration.plugin_idx}-{registration.plugin_name}"
        )
        return Plugin(process, runtime, startup, stderr)

    # -- phases ----------------------------------------------------------------

    def run(self) -> Results:
        if self.opts.only_webhook:
            self.webhook()
            return self.results
        node = SyncNode.build(self.opts, self.cgroup_root)
        applier = ReplyApplier(node.container_dirs)
        try:
            self.phases(node, applier)
        finally:
            applier.close()
        if self.opts.decisions:
            self.decisions()
        if self.opts.webhook_reviews:
            self.webhook()
        return self.results

    def phases(self, node: SyncNode, applier: ReplyApplier) -> None:
        r = self.results
        startups: list[float] = []
        syncs: list[SyncRun] = []
        floors: list[FloorRun] = []
        heap_floors: list[FloorRun] = []
        for _ in range(self.opts.launches - 1):
            extra = self.launch()
            startups.append(extra.startup)
            syncs.append(self.synchronize(extra, node, applier, probe=False))
            extra.stop()
            floors.append(self.synchronize_floor(node))
            heap_floors.append(self.synchronize_floor(node, heap=True))
        floors.append(self.synchronize_floor(node))
        heap_floors.append(self.synchronize_floor(node, heap=True))
        plugin = self.launch()
        startups.append(plugin.startup)
        r.details["rss_after_startup_mb"] = plugin.rss_mb()
        profiler = None
        try:
            profiler = self.start_profiler(plugin)
            syncs.append(self.synchronize(plugin, node, applier, probe=True))
            rss_sync = plugin.rss_mb()
            self.report_launches(startups, syncs, node, self.probe(plugin, applier))
            self.report_floor(floors, heap_floors, syncs)
            self.events(plugin, rss_sync)
            if self.opts.convergence:
                self.convergence(plugin, node, applier)
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)
                profiler.wait(60)
        finally:
            plugin.stop()

    def synchronize(
        self, plugin: Plugin, node: SyncNode, applier: ReplyApplier, *, probe: bool
    ) -> SyncRun:
        """One Synchronize of `node`, its pod cgroups reset to kubelet's values first.

        probe: right after the reply, send CreateContainer requests one at a
        time while the plugin does its deferred work, and time them; the time
        until the plugin is idle is then not measured (the probes use CPU).
        """
        workload.reset_sync_cgroups(self.cgroup_root, node.pods, node.containers)
        log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        more = ttrpc_pb2.Response(
            payload=api.SynchronizeResponse(more=True).SerializeToString()
        ).SerializeToString()
        runtime = plugin.runtime
        faults = plugin.minor_faults()
        started = time.perf_counter()
        for chunk in node.chunks[:-1]:
            reply, _ = runtime.call(chunk)
            if reply != more:
                raise BenchError(f"Synchronize: a more=true chunk answered {reply[:80]!r}")
        reply, _ = runtime.call(node.chunks[-1], timeout=30)
        replied = time.perf_counter()
        seconds = replied - started
        faults = plugin.minor_faults() - faults
        applier.start(reply)
        # Every launch times the first request after its reply; one goes on probing.
        probes = self.probe(plugin, applier, once=not probe)
        applier.wait(60)
        # The plugin writes pod cgroups and log lines once the reply is out;
        # the next phases start when it is done, as after a node's start-up.
        # Its last line is the Synchronize's summary: on a loaded machine the
        # plugin can go 0.1 s without CPU before that, so idle alone is not enough.
        self.wait_for_log_line(log_offset, SYNC_SUMMARY)
        aftermath = time.perf_counter() - replied + plugin.wait_idle()
        peak = plugin.peak_rss_mb()
        response = api.SynchronizeResponse.FromString(_payload(reply, "Synchronize"))
        check_sync_updates(response, node.containers, node.expected_updates)
        written = check_sync_pod_files(
            self.cgroup_root,
            node.pods,
            workload.expected_pod_files(self.opts.sync_containers_per_pod),
        )
        return SyncRun(
            seconds,
            None if probe else aftermath,
            len(response.update),
            written,
            len(reply),
            probes,
            peak,
            faults,
        )

    def synchronize_floor(self, node: SyncNode, *, heap: bool = False) -> FloorRun:
        """The same Synchronize answered by `bench.floor`, the plugin with no policy.

        heap: the floor with the plugin's heap settings (process/heap.py).
        """
        floor = self.launch(floor=("--reuse-large-buffers",) if heap else ())
        try:
            runtime = floor.runtime
            faults = floor.minor_faults()
            started = time.perf_counter()
            for chunk in node.chunks:
                reply, _ = runtime.call(chunk, timeout=30)
            seconds = time.perf_counter() - started
            faults = floor.minor_faults() - faults
        finally:
            floor.stop()
        response = api.SynchronizeResponse.FromString(_payload(reply, "Synchronize"))
        if response.more or response.update:
            raise BenchError(f"the floor answered the Synchronize with {response}")
        return FloorRun(seconds, faults)

    def report_floor(
        self, floors: list[FloorRun], heap_floors: list[FloorRun], syncs: list[SyncRun]
    ) -> None:
        """The floor under the plugin's Synchronize, and the Go plugin's time estimated from it.

        heap_floors: the floor with the plugin's heap settings, which the
        estimate is not made from (its constant was measured with the floor as
        it is) but which shows what of the plugin's lead those settings are.
        """
        floor = statistics.median(run.seconds for run in floors)
        plugin = statistics.median(run.seconds for run in syncs)
        go = floor * GO_OVER_FLOOR
        r = self.results
        r.add("Synchronize floor: a plugin with no policy (median)", floor, "s", "")
        faults = statistics.median(run.page_faults for run in floors)
        r.add("Synchronize floor: its page faults (median)", faults, "")
        r.add("Synchronize: the plugin's time over the floor's", plugin / floor, "x", "")
        heap_floor = statistics.median(run.seconds for run in heap_floors)
        r.add("Synchronize floor, with the plugin's heap settings (median)", heap_floor, "s", "")
        r.add("Synchronize: the plugin's time over that floor's", plugin / heap_floor, "x", "")
        r.add(f"Synchronize: a Go plugin's, estimated (floor x {GO_OVER_FLOOR})", go, "s", "")
        r.add(
            "Synchronize: the plugin's time over the Go plugin's estimate",
            plugin / go,
            "x",
            "<= 1",
            plugin <= go,
        )
        r.details["sync"]["floor_runs_s"] = [run.seconds for run in floors]
        r.details["sync"]["floor_page_faults"] = [run.page_faults for run in floors]
        r.details["sync"]["heap_floor_runs_s"] = [run.seconds for run in heap_floors]

    def wait_for_log_line(self, offset: int, marker: bytes, timeout: float = 60.0) -> None:
        """Wait until the plugin's log, from `offset` on, holds `marker`."""
        deadline = time.perf_counter() + timeout
        tail = b""
        with self.log_file.open("rb") as log:
            log.seek(offset)
            while True:
                tail = tail[-len(marker) :] + log.read()
                if marker in tail:
                    return
                if time.perf_counter() > deadline:
                    raise BenchError(f"no {marker!r} in the plugin's log within {timeout:.0f} s")
                time.sleep(0.02)

    def probe(self, plugin: Plugin, applier: ReplyApplier, *, once: bool = False) -> list[Probe]:
        """CreateContainer round trips, one at a time, 1 ms apart, for `PROBE_SECONDS`.

        once: only the first.

        Sent from the Synchronize's reply on, they time requests while the
        plugin works through what it deferred (longer than that work takes);
        sent once it is idle, the same requests show this machine's own tail.
        Each is for a pod of its own, removed afterwards so that the plugin
        remembers only the node. Around each, the kernel's count of the time
        the benchmark's thread and the plugin's spent runnable but waiting for
        a core (schedstat) says which of them a slow one waited on, and the
        reply applier's time on a core whether it was the one that held it.
        """
        kinds = self.kinds()
        create = kinds["CreateContainer"]
        runtime = plugin.runtime
        tokens: list[bytes] = []
        probes: list[Probe] = []
        mine, theirs = Path("/proc/thread-self/schedstat"), plugin.schedstat
        ends = time.perf_counter() + (PROBE_SECONDS / 5 if self.opts.quick else PROBE_SECONDS)
        while time.perf_counter() < ends:
            token = workload.counter_token(PROBE_FIRST_POD + len(tokens))
            tokens.append(token)
            before = _schedstat(mine), _schedstat(theirs), _schedstat(applier.schedstat)
            sent = time.perf_counter()
            stream_id = runtime.send(create.template, token)
            replies: list[Any] = []
            while not replies:
                now, replies = runtime.receive(10.0)
            (sid, data, start, stop), *_ = replies
            if sid != stream_id:
                raise BenchError(f"probe: reply on stream {sid}, expected {stream_id}")
            probes.append(
                Probe(
                    now - sent,
                    (_schedstat(mine).waiting_ns - before[0].waiting_ns) / 1e9,
                    (_schedstat(theirs).waiting_ns - before[1].waiting_ns) / 1e9,
                    (_schedstat(applier.schedstat).on_core_ns - before[2].on_core_ns) / 1e9,
                )
            )
            create.check(data[start:stop])
            if once:
                break
            time.sleep(0.001)
        removals = [
            (kind, token)
            for token in tokens
            for kind in (kinds["RemoveContainer"], kinds["RemovePodSandbox"])
        ]
        runtime.stream(removals, 1)
        return probes

    def report_launches(
        self, startups: list[float], syncs: list[SyncRun], node: SyncNode, idle: list[Probe]
    ) -> None:
        """idle: the probes again once the plugin is idle, to compare the tails with."""
        r = self.results
        startup = statistics.median(startups)
        r.add(
            "start-up: Popen to Configure answered (median)", startup, "s", "< 0.5 s", startup < 0.5
        )
        seconds = statistics.median(run.seconds for run in syncs)
        label = f"Synchronize {len(node.pods):,} pods / {len(node.containers):,} containers"
        r.add(
            f"{label}: first chunk to last reply (median)", seconds, "s", "< 0.35 s", seconds < 0.35
        )
        aftermaths = [run.aftermath for run in syncs if run.aftermath is not None]
        if aftermaths:
            aftermath = statistics.median(aftermaths)
            r.add(
                "Synchronize: after the reply, until the plugin is idle (median)",
                aftermath,
                "s",
                "",
            )
        faults = statistics.median(run.page_faults for run in syncs)
        r.add("Synchronize: the plugin's page faults, first chunk to reply (median)", faults, "")
        probes = [p.seconds for run in syncs for p in run.probes]
        slow = [p for run in syncs for p in run.probes if p.seconds > SLOW_PROBE_SECONDS]
        firsts = [run.probes[0].seconds * 1000 for run in syncs if run.probes]
        if probes:
            first, worst = max(firsts), max(probes) * 1000
            r.add(
                "CreateContainer just after the Synchronize reply: "
                f"max of {len(firsts)}, one a launch",
                first,
                "ms",
                "< 2 ms",
                first < 2,
            )
            r.add(
                f"CreateContainer during the deferred work: max of {len(probes)}",
                worst,
                "ms",
                "< 2 ms",
                worst < 2,
            )
            r.add("the same: probes over 2 ms", len(slow), "")
            # Which side was kept off a core for a millisecond or more, if either.
            r.add(
                "the same: of those, the benchmark waiting for a core",
                sum(p.benchmark_waited >= 0.001 for p in slow),
                "",
            )
            r.add(
                "the same: of those, the plugin waiting for a core",
                sum(p.plugin_waited >= 0.001 for p in slow),
                "",
            )
            # The runtime's own work on the cores (see ReplyApplier), or another task's.
            r.add(
                "the same: of those, the reply applier running meanwhile",
                sum(p.applier_ran >= 0.001 for p in slow),
                "",
            )
            idle_worst = max(p.seconds for p in idle) * 1000
            r.add(f"the same, the plugin idle: max of {len(idle)}", idle_worst, "ms", "")
            idle_slow = sum(p.seconds > SLOW_PROBE_SECONDS for p in idle)
            r.add("the same, the plugin idle: probes over 2 ms", idle_slow, "")
        last = syncs[-1]
        peak = max(run.peak_rss_mb for run in syncs)
        r.add(
            "peak RSS: start-up and Synchronize (VmHWM, max)",
            peak,
            "MB",
            f"<= {GO_PEAK_RSS_MB} MB (Go)",
            peak <= GO_PEAK_RSS_MB,
        )
        r.add("Synchronize: updates returned", last.updates, "")
        r.add("Synchronize: pod cgroups written", last.pods_written, "")
        r.add("Synchronize: chunks sent", len(node.chunks), "")
        r.details["startup_runs_s"] = startups
        r.details["sync"] = {
            "pods": len(node.pods),
            "containers": len(node.containers),
            "chunk_bytes": [c.size for c in node.chunks],
            "updates": last.updates,
            "reply_bytes": last.reply_bytes,
            "runs_s": [run.seconds for run in syncs],
            "after_reply_runs_s": aftermaths,
            "probes_ms": [p * 1000 for p in probes],
            "first_after_reply_ms": firsts,
            "idle_probes_ms": [p.seconds * 1000 for p in idle],
            "slow_probes": [p.as_json() for p in slow],
            "peak_rss_mb": [run.peak_rss_mb for run in syncs],
            "page_faults": [run.page_faults for run in syncs],
        }

    def convergence(self, plugin: Plugin, node: SyncNode, applier: ReplyApplier) -> None:
        """Convergence passes over the node back to back: one pass's cost, as the plugin logs
        it (SIGUSR1: debug), and CreateContainer round trips while passes run. The first pass
        after the reload that turns them on locates every cgroup afresh (a reload may move
        the root), so it is given apart; the medians are the passes after it."""
        r = self.results
        offset = self.log_file.stat().st_size
        plugin.process.send_signal(signal.SIGUSR1)
        self.config.write_text(self.config_text(CONVERGENCE_INTERVAL))  # the watch reloads it
        try:
            first = self.pass_lines(offset, 1)
            probes = self.probe(plugin, applier)
            passes = self.pass_lines(offset, len(first) + 2)
        finally:
            self.config.write_text(self.config_text(0))
            plugin.process.send_signal(signal.SIGUSR1)
        label = (
            f"convergence pass over {len(node.pods):,} pods / {len(node.containers):,} containers"
        )
        steady = passes[1:]
        cpu = statistics.median(p["cpu_seconds"] for p in steady)
        wall = statistics.median(p["seconds"] for p in steady)
        r.add(f"{label}: CPU time, first pass after a reload", passes[0]["cpu_seconds"], "s", "")
        r.add(f"{label}: CPU time (median)", cpu, "s", "")
        r.add(f"{label}: duration, yielding to requests (median)", wall, "s", "")
        r.add(f"{label}: cgroup files read", passes[-1]["files_read"], "")
        r.latency(
            "CreateContainer while convergence passes run",
            [p.seconds for p in probes],
            targets=False,
        )
        r.details["convergence_passes"] = passes

    def pass_lines(self, offset: int, count: int, timeout: float = 120.0) -> list[dict[str, Any]]:
        """The plugin's `convergence pass` log lines from `offset` on, once there are `count`."""
        deadline = time.perf_counter() + timeout
        while True:
            with self.log_file.open("rb") as log:
                log.seek(offset)
                lines = [json.loads(line) for line in log if b'"event": "convergence pass"' in line]
            if len(lines) >= count:
                return lines
            if time.perf_counter() > deadline:
                raise BenchError(f"fewer than {count} convergence passes in {timeout:.0f} s")
            time.sleep(0.05)

    def events(self, plugin: Plugin, rss_sync: float) -> None:
        opts, r = self.opts, self.results
        kinds = self.kinds()
        runtime = plugin.runtime
        next_pod = 0

        def phase(
            count: int, window: int, on_pod: Callable[[int], None] | None = None
        ) -> tuple[int, float]:
            nonlocal next_pod
            for kind in kinds.values():
                kind.latencies.clear()
            events = lifecycle(kinds, next_pod, count, opts.live_pods, self.cgroup_root, on_pod)
            next_pod += count
            return runtime.stream(events, window)

        # Serial: one request at a time, as containerd sends them.
        phase(opts.events, 1)
        create = kinds["CreateContainer"]
        r.latency("CreateContainer serial", create.latencies, targets=True)
        r.details["serial_other_p50_ms"] = {
            name: statistics.median(k.latencies) * 1000
            for name, k in kinds.items()
            if name != "CreateContainer"
        }
        # Concurrent: `concurrency` requests in flight.
        requests, seconds = phase(opts.events, opts.concurrency)
        label = f"CreateContainer {opts.concurrency} in flight"
        r.latency(label, create.latencies, targets=False)
        r.add(f"{label}: throughput", opts.events / seconds, "/s", "", None)
        r.details["concurrent_requests_per_s"] = requests / seconds
        rss_before = plugin.rss_mb()
        # Memory: many more pods come and go.
        samples: list[tuple[int, float]] = []
        every = max(1, opts.memory_events // 20)

        def sample(index: int) -> None:
            if index % every == 0:
                samples.append((index, plugin.rss_mb()))

        base = next_pod
        requests, seconds = phase(opts.memory_events, opts.concurrency, lambda i: sample(i - base))
        rss_end = plugin.rss_mb()
        samples.append((opts.memory_events, rss_end))
        half = [rss for index, rss in samples if index >= opts.memory_events // 2]
        steady_target = f"< {STEADY_RSS_MB} MB"
        r.add("RSS after Synchronize", rss_sync, "MB", steady_target, rss_sync < STEADY_RSS_MB)
        total = opts.events * 2 + opts.memory_events
        r.add(
            f"RSS after {total:,} more CreateContainer",
            rss_end,
            "MB",
            steady_target,
            rss_end < STEADY_RSS_MB,
        )
        # The first events after the Synchronize's trimmed heap fill pools and
        # bounded caches (warm-up): within the noise of the heap, a couple of
        # MB. After that, across the memory phase (which starts after the
        # 2 x `events` of the latency phases), the RSS must not move.
        warm = rss_end - rss_sync
        r.add(
            "RSS growth from the Synchronize to the end (warm-up included)",
            warm,
            "MB",
            "< 2 MB",
            warm < 2.0,
        )
        growth = rss_end - rss_before
        r.add(
            f"RSS growth over the {opts.memory_events:,} events of the memory phase",
            growth,
            "MB",
            "< 1 MB",
            growth < 1.0,
        )
        steady = half[-1] - half[0]
        r.add(
            f"RSS growth over the last {opts.memory_events - opts.memory_events // 2:,} events",
            steady,
            "MB",
            "< 1 MB",
            steady < 1.0,
        )
        r.details["rss_mb"] = {
            "after_sync": rss_sync,
            "before_memory_phase": rss_before,
            "samples": samples,
        }
        r.details["memory_phase"] = {"requests": requests, "seconds": seconds}
        r.details["known_at_end"] = (
            "the Synchronize's pods and containers (every later pod removed)"
        )

    def decisions(self) -> None:
        from bench.policy import decisions_per_second

        warm, cold = decisions_per_second(self.opts.decisions)
        r = self.results
        r.add("decide_container, spec cached (per s)", warm, "/s", "> 50,000/s", warm > 50_000)
        r.add("decide_container, every spec new (per s)", cold, "/s", "", None)

    def webhook(self) -> None:
        from bench.webhook import admission

        measured = admission(self.opts.webhook_reviews)
        r = self.results
        for containers, endpoints in measured["sizes"].items():
            noun = "container" if containers == 1 else "containers"
            for endpoint, seconds in endpoints.items():
                ms = sorted(x * 1000 for x in seconds)
                label = f"admission /{endpoint}, {containers} {noun}"
                r.add(f"{label} p50", _percentile(ms, 50), "ms")
                r.add(f"{label} p99", _percentile(ms, 99), "ms")
        largest = measured["largest"]
        # No target: beyond the review budget (2 s) the server answers as the failure
        # policy says instead; this is how far from it the largest review is.
        for endpoint in ("mutate", "validate"):
            r.add(
                f"admission /{endpoint}, largest body ({largest['containers']:,} containers)",
                largest[endpoint],
                "s",
            )
        r.details["webhook"] = {
            "reviews_per_size": self.opts.webhook_reviews,
            "largest": largest,
            "sizes_ms": {
                str(c): {e: [round(x * 1000, 4) for x in s] for e, s in endpoints.items()}
                for c, endpoints in measured["sizes"].items()
            },
        }

    def kinds(self) -> dict[str, Kind]:
        token = workload.TOKEN
        shape = workload.PodShape(token=token, memory_request=f"{token}Mi")
        pod = workload.pod(shape)
        ctr = workload.container(shape)
        every = self.opts.check_every
        empty_reply = 0  # Empty / Remove*Response: the whole Response is zero bytes

        def empty(name: str) -> Callable[[bytes], None]:
            def check(data: bytes) -> None:
                if data:
                    raise BenchError(f"{name}: expected an empty reply, got {data!r}")

            return check

        if self.opts.nri == "1.7":
            run = Template.build(
                "StateChange",
                api.StateChangeEvent(event=api.RUN_POD_SANDBOX, pod=pod).SerializeToString(),
                token,
            )
            remove_ctr = Template.build(
                "StateChange",
                api.StateChangeEvent(
                    event=api.REMOVE_CONTAINER, pod=pod, container=ctr
                ).SerializeToString(),
                token,
            )
            remove_pod = Template.build(
                "StateChange",
                api.StateChangeEvent(event=api.REMOVE_POD_SANDBOX, pod=pod).SerializeToString(),
                token,
            )
        else:
            run = Template.build(
                "RunPodSandbox", api.RunPodSandboxRequest(pod=pod).SerializeToString(), token
            )
            remove_ctr = Template.build(
                "RemoveContainer",
                api.RemoveContainerRequest(pod=pod, container=ctr).SerializeToString(),
                token,
            )
            remove_pod = Template.build(
                "RemovePodSandbox", api.RemovePodSandboxRequest(pod=pod).SerializeToString(), token
            )
        create = Template.build(
            "CreateContainer",
            api.CreateContainerRequest(pod=pod, container=ctr).SerializeToString(),
            token,
        )
        self.results.details["create_request_bytes"] = create.size

        def check_create(data: bytes) -> None:
            adjust = api.CreateContainerResponse.FromString(
                _payload(data, "CreateContainer")
            ).adjust
            values = adjust.linux.resources
            got = (values.cpu.shares.value, values.cpu.quota.value, values.memory.limit.value)
            if got != workload.MAIN_VALUES:
                raise BenchError(f"CreateContainer: got {got}, expected {workload.MAIN_VALUES}")
            for name in ("shares", "quota"):
                if not values.cpu.HasField(name):
                    raise BenchError(f"CreateContainer: cpu {name} not set")
            if not values.memory.HasField("limit"):
                raise BenchError("CreateContainer: memory limit not set")

        reply_size = None  # that of the first reply, which is checked in full
        return {
            "RunPodSandbox": Kind("RunPodSandbox", run, empty_reply, empty("RunPodSandbox"), every),
            "CreateContainer": Kind("CreateContainer", create, reply_size, check_create, every),
            "RemoveContainer": Kind(
                "RemoveContainer", remove_ctr, empty_reply, empty("RemoveContainer"), every
            ),
            "RemovePodSandbox": Kind(
                "RemovePodSandbox", remove_pod, empty_reply, empty("RemovePodSandbox"), every
            ),
        }

    def start_profiler(self, plugin: Plugin) -> subprocess.Popen[bytes] | None:
        if self.opts.profile is None:
            return None
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        fmt = "raw" if self.opts.profile.endswith(".txt") else "flamegraph"
        profiler = subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(plugin.process.pid),
                "--rate",
                "500",
                "--format",
                fmt,
                "--output",
                self.opts.profile,
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # let it attach
        return profiler


def _payload(reply: bytes, method: str) -> bytes:
    response = ttrpc_pb2.Response.FromString(reply)
    if response.HasField("status") and response.status.code:
        raise BenchError(f"{method} failed: {response.status.code} {response.status.message}")
    payload: bytes = response.payload
    return payload


def check_sync_updates(
    response: api.SynchronizeResponse, containers: Sequence[api.Container], expected: int
) -> None:
    if response.more:
        raise BenchError("Synchronize: the final reply says more=true")
    if len(response.update) != expected:
        raise BenchError(f"Synchronize: {len(response.update)} updates, expected {expected}")
    by_id = {c.id: c for c in containers}
    for update in response.update:
        ctr = by_id.get(update.container_id)
        if ctr is None:
            raise BenchError(f"Synchronize: update for unknown container {update.container_id}")
        index = 0 if ctr.name == "main" else int(ctr.name.rsplit("-", 1)[1])
        shares, quota, memory = workload.expected_values(ctr.name, index)
        res = update.linux.resources
        got = (res.cpu.shares.value, res.cpu.quota.value, res.memory.limit.value)
        if got != (shares, quota, memory):
            raise BenchError(
                f"Synchronize: {ctr.name} got {got}, expected {(shares, quota, memory)}"
            )


@dataclass(frozen=True)
class SyncNode:
    """The node every launch synchronizes: its objects, and the request chunks sent."""

    pods: list[api.PodSandbox]
    containers: list[api.Container]
    expected_updates: int
    chunks: list[Template]

    #: Each container's cgroup directory, by id.
    container_dirs: dict[str, Path]

    @classmethod
    def build(cls, opts: Options, cgroup_root: Path) -> SyncNode:
        pods, containers, expected = workload.sync_objects(
            opts.sync_pods, opts.sync_containers_per_pod
        )
        chunks = split_sync(pods, containers, opts.sync_chunk_max)
        dirs = {ctr.id: workload.container_cgroup_dir(cgroup_root, ctr) for ctr in containers}
        return cls(pods, containers, expected, chunks, dirs)


class ReplyApplier:
    """Applies Synchronize replies to the container cgroups, as the runtime does once it has one.

    In a process of its own: the runtime does this while the plugin goes on
    with its own work, and the probes must not wait for it. Spawned before
    any Synchronize and idle until a reply comes: forked at the reply
    instead, it made the benchmark's own first requests after it pay for the
    fork's copy-on-write faults (a first probe of 4 ms).
    """

    def __init__(self, directories: dict[str, Path]) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        self._process = context.Process(
            target=_apply_replies, args=(child, directories), daemon=True
        )
        self._process.start()
        child.close()

    @property
    def schedstat(self) -> Path:
        return Path(f"/proc/{self._process.pid}/schedstat")

    def start(self, reply: bytes) -> None:
        self._pipe.send_bytes(reply)

    def wait(self, timeout: float) -> None:
        if not self._pipe.poll(timeout):
            raise BenchError(f"applying the Synchronize reply took more than {timeout:.0f} s")
        try:
            error = self._pipe.recv()
        except EOFError:
            error = f"the applier ended (exit code {self._process.exitcode})"
        if error:
            raise BenchError(f"applying the Synchronize reply failed: {error}")

    def close(self) -> None:
        with contextlib.suppress(OSError):  # already gone: wait() said why
            self._pipe.send_bytes(b"")
        self._process.join(10)


def _apply_replies(pipe: Connection, directories: dict[str, Path]) -> None:
    # Only on a core that neither the plugin nor the probes want: the figures
    # time the plugin, not how two cores are shared with the runtime's work.
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    while reply := pipe.recv_bytes():
        try:
            response = api.SynchronizeResponse.FromString(_payload(reply, "Synchronize"))
            updates = ((u.container_id, u.linux.resources) for u in response.update)
            workload.apply_updates(directories, giving_way(updates))
        except Exception as exc:
            pipe.send(f"{type(exc).__name__}: {exc}")
        else:
            pipe.send("")


T = TypeVar("T")


def giving_way(updates: Iterator[T], give_way: Callable[[], None] = os.sched_yield) -> Iterator[T]:
    """Each update after a `sched_yield`: at idle priority alone, the applier still
    held a core for 3 ms at a time while the plugin waited for one (round 8)."""
    for update in updates:
        give_way()
        yield update


class Probe(NamedTuple):
    seconds: float
    #: Runnable but not on a core meanwhile: the benchmark's thread, the plugin's.
    benchmark_waited: float
    plugin_waited: float
    #: On a core meanwhile: the reply applier, the one other task the benchmark runs.
    applier_ran: float

    def as_json(self) -> dict[str, float]:
        return {
            "ms": self.seconds * 1000,
            "benchmark_waited_ms": self.benchmark_waited * 1000,
            "plugin_waited_ms": self.plugin_waited * 1000,
            "applier_ran_ms": self.applier_ran * 1000,
        }


class SchedStat(NamedTuple):
    """A thread's time so far on a core, and runnable but waiting for one."""

    on_core_ns: int
    waiting_ns: int


def _schedstat(path: Path) -> SchedStat:
    on_core, waiting, _timeslices = path.read_text().split()
    return SchedStat(int(on_core), int(waiting))


@dataclass(frozen=True)
class SyncRun:
    seconds: float
    aftermath: float | None  # None when probed (see Bench.synchronize)
    updates: int
    pods_written: int
    reply_bytes: int
    probes: list[Probe]
    peak_rss_mb: float
    #: The plugin's minor page faults from the first chunk to the reply.
    page_faults: int


class FloorRun(NamedTuple):
    seconds: float
    page_faults: int


def check_sync_pod_files(
    root: Path, pods: Sequence[api.PodSandbox], expected: Mapping[str, str]
) -> int:
    """Every batch pod's cgroup holds the plugin's values; returns how many pods that is."""
    checked = 0
    for pod in pods:
        if pod.labels.get("koordinator.sh/priority-class") != "koord-batch":
            continue
        directory = workload.pod_cgroup_dir(root, pod.linux.cgroup_parent)
        for name, text in expected.items():
            found = (directory / name).read_text()
            if found.split()[:1] != [text]:
                raise BenchError(f"Synchronize: {directory}/{name} holds {found!r}, not {text!r}")
        checked += 1
    return checked


def split_sync(
    pods: Sequence[api.PodSandbox], containers: Sequence[api.Container], limit: int
) -> list[Template]:
    """SynchronizeRequest chunks the way NRI's runtime makes them (containerd/nri PR #111).

    It first tries everything in one message; when that is over the limit it
    scales both object counts by min(limit / size, 0.9) (at least 8 objects)
    and retries, then sends chunks of that many pods and containers with
    more=true, the last one with more=false.
    """
    chunks: list[Template] = []
    pods_per, ctrs_per = len(pods), len(containers)
    p = c = 0
    while True:
        req = api.SynchronizeRequest(
            pods=pods[p : p + pods_per], containers=containers[c : c + ctrs_per]
        )
        req.more = p + pods_per < len(pods) or c + ctrs_per < len(containers)
        template = Template.build("Synchronize", req.SerializeToString())
        if template.size > limit:
            factor = min(limit / template.size, 0.9)
            pods_per = max(8, int(pods_per * factor)) if pods_per else 0
            ctrs_per = max(8, int(ctrs_per * factor)) if ctrs_per else 0
            continue
        chunks.append(template)
        if not req.more:
            return chunks
        p, c = p + pods_per, c + ctrs_per
        pods_per = min(pods_per, len(pods) - p)
        ctrs_per = min(ctrs_per, len(containers) - c)


def lifecycle(
    kinds: dict[str, Kind],
    first: int,
    count: int,
    live: int,
    cgroup_root: Path,
    on_pod: Callable[[int], None] | None = None,
) -> Iterator[tuple[Kind, bytes]]:
    """Pods `first` .. `first + count - 1`, each run and given one container; `live` stay.

    As a runtime would: the pod cgroup exists before RunPodSandbox; a pod is
    removed (container first) once `live` newer pods run; the phase ends
    with every pod it started removed.
    """
    run, create = kinds["RunPodSandbox"], kinds["CreateContainer"]
    remove_ctr, remove_pod = kinds["RemoveContainer"], kinds["RemovePodSandbox"]
    running: deque[tuple[bytes, Path]] = deque()
    token = workload.counter_token

    def retire() -> Iterator[tuple[Kind, bytes]]:
        old, directory = running.popleft()
        yield remove_ctr, old
        workload.remove_pod_cgroup(directory)
        yield remove_pod, old

    for n in range(first, first + count):
        if on_pod is not None:
            on_pod(n)
        tok = token(n)
        parent = workload.be_cgroup_parent(workload.pod_uid(tok.decode()))
        directory = workload.create_pod_cgroup(cgroup_root, parent)
        yield run, tok
        yield create, tok
        running.append((tok, directory))
        if len(running) > live:
            yield from retire()
    while running:
        yield from retire()


# -- entry point -----------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    # tmpfs when there is one: the pod cgroup files stand in for cgroupfs,
    # which lives in memory too (an ext4 close after O_TRUNC flushes, and
    # would bill the plugin for a disk that real cgroups do not have).
    shm = Path("/dev/shm")
    base = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
    workdir = Path(tempfile.mkdtemp(prefix="nri-midbatch-bench-", dir=base))
    bench = Bench(opts, workdir)
    try:
        results = bench.run()
    except BenchError as exc:
        stderr = workdir / "plugin.stderr"
        tail = stderr.read_text()[-2000:] if stderr.exists() else ""
        print(f"bench: {exc}\n{tail}", file=sys.stderr)
        return 1
    finally:
        bench.listener.close()
        if bench.log_file.exists():
            with bench.log_file.open("rb") as log:
                lines = sum(1 for _ in log)
            bench.results.details["plugin_log"] = {
                "lines": lines,
                "bytes": bench.log_file.stat().st_size,
            }
        if not opts.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    results.details["environment"] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "nri": opts.nri,
        "loop": opts.loop,
        "quick": opts.quick,
    }
    print(f"the plugin's event loop: {opts.loop}\n")
    print(results.table())
    if opts.keep:
        print(f"\nkept {workdir}")
    if opts.json_path:
        Path(opts.json_path).write_text(json.dumps(results.as_json(), indent=2) + "\n")
        print(f"\nwrote {opts.json_path}")
    return 0
