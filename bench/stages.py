"""`python -m bench.stages`: where one CreateContainer's time goes, stage by stage.

In this process, the plugin's own code as the App builds it (its observers, the
metrics, records in a temporary directory, the log to a file), fed the bench's
CreateContainer bytes (bench/workload.py: 10 labels, 20 annotations, a realistic
container) for pods it was told of by RunPodSandbox. Each stage is timed on its
own, `--rounds` times, each round a new pod, and reported as the minimum and the
median over rounds: the minimum is the stage's cost with nothing else on the
machine in its way, which is what a shared machine can still measure.

- decode: mux and ttrpc framing, the envelope and the request parsed (wire/);
- call: the Plugin service's way in (`Service.call`, `_around`: the observers'
  `call_begun` and `replied`, the lifecycle step), around a handler that returns at once;
- handler: `create_container` (plugin/handlers.py), and of it the pod's and the
  container's views (plugin/codec.py, state/known.py) and the decision with its
  line (plugin/decisions.py, policy/); the rest is what is remembered, counted,
  and the response message built;
- encode: the reply serialized and framed (wire/);
- in-process total: the bytes handed to the connection (`data_received`) to the
  reply handed to the transport, through the loop's turns, on a transport that
  only keeps what it is given: the stages above, the task and timeout of the
  request and the turns between them;
- the next, back to back: the same for another pod's request right after it, with the
  caches warm from the first (a runtime's requests come apart, after other work: the
  difference is what the first pays for code and data not in the CPU's caches).

`--clock calls` or `--clock opcodes` counts work instead of time: the functions entered
(Python and built-in) or the bytecode instructions run, per stage, figures the machine's
load does not change (once the caches are filled a stage's count varies by a few
instructions at most from round to round, and its median not from run to run): what a
change to the code takes away, stage by stage.

What is left of a round trip measured by `python -m bench` (its serial p50)
once this total is taken off is the socket and the loop's polling, on both
sides, and the benchmark's own runtime.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from bench import workload
from bench.runtime import Template
from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.config.settings import Settings
from nri_midbatch.config.validator import load_settings_text
from nri_midbatch.nri.events import Event
from nri_midbatch.nri.lifecycle import Phase
from nri_midbatch.obs.logging import configure_logging, open_sink
from nri_midbatch.plugin.codec import container_view, pod_view
from nri_midbatch.plugin.decision_log import DecisionLines
from nri_midbatch.process.app import App
from nri_midbatch.rpc.connection import MuxConnection
from nri_midbatch.rpc.service import CallContext
from nri_midbatch.wire import connection as wire
from nri_midbatch.wire.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN

STAGES = ("decode", "call", "handler", "encode")
#: Parts of the handler, timed on their own.
PARTS = ("views", "decide")
#: The whole request in-process, after other work (as a runtime's requests come), and
#: the same for the next request at once, with the caches warm.
TOTALS = ("in-process total", "the next, back to back")


class _Transport:
    """Keeps what is written; tells `written` of each write."""

    def __init__(self) -> None:
        self.written: Callable[[], None] = lambda: None

    def write(self, data: bytes) -> None:
        self.written()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def is_reading(self) -> bool:
        return True

    def close(self) -> None:
        pass


def _run(coro: Any) -> Any:
    """Run a coroutine that never suspends to its end, in this step of the loop."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise RuntimeError("the coroutine suspended")


class _Plugin:
    """The App's plugin and session, serving CreateContainer on a transport of our own."""

    def __init__(self, workdir: Path, clock: Callable[[], int]) -> None:
        self.clock = clock
        config: Settings = load_settings_text(
            f"cgroups:\n  root: {workdir / 'cgroup'}\n", "bench.stages"
        )
        self.cgroup_root = workdir / "cgroup"
        workload.make_cgroup_root(self.cgroup_root)
        app = App(config, name="midbatch", idx="90", config_path=None, state_dir=workdir / "state")
        self.plugin = app.plugin
        self.service = service = app.session.service()
        self.conn = MuxConnection({service.name: service}, name="bench")
        self.transport = _Transport()
        self.conn.connection_made(self.transport)  # type: ignore[arg-type]
        for observer in app.session._observers:
            observer.connected(self.conn)
        # Registered and synchronized: CreateContainer is then an event like any.
        app.session.state.phase = Phase.READY
        app.session.state.register_replied = True
        token = workload.TOKEN
        shape = workload.PodShape(token=token, memory_request=f"{token}Mi")
        self.create = Template.build(
            "CreateContainer",
            api.CreateContainerRequest(
                pod=workload.pod(shape), container=workload.container(shape)
            ).SerializeToString(),
            token,
        )
        self.decoder: wire.Connection[Any] = wire.Connection(
            {service.name: {m: x.request_type for m, x in service.methods.items()}},
            server_conn=PLUGIN_SERVICE_CONN,
            client_conn=RUNTIME_SERVICE_CONN,
        )
        self.times: dict[str, list[int]] = {name: [] for name in (*STAGES, *PARTS, *TOTALS)}

    async def stages(self, n: int) -> None:
        """Each stage on its own; each pod is new to the plugin's caches where it counts."""
        plugin, times = self.plugin, self.times
        counter = workload.counter_token(4 * n)
        data = b"".join(self.create.frames(2 * n + 1, counter))
        await self.run_pod(_pod(counter))
        started = self.clock()
        self.decoder.receive_data(data)
        event = self.decoder.next_event()
        times["decode"].append(self.clock() - started)
        assert isinstance(event, wire.Request)
        request = event.message
        assert isinstance(request, api.CreateContainerRequest)
        pod, container = request.pod, request.container
        ctx = CallContext(self.service.name, "CreateContainer", event.stream_id, 2.0, len(data))
        assert self.service.around is not None
        started = self.clock()
        _run(self.service.around(_nothing, request, ctx))
        times["call"].append(self.clock() - started)

        known = plugin.live.known
        started = self.clock()
        view = known.pods.get(pod.id)
        if view is None:
            view = known.add_pod(pod.id, pod_view(pod))
        ctr = container_view(container)
        known.set_container(ctr.id, pod.id, ctr, container.linux.cgroups_path)
        times["views"].append(self.clock() - started)
        lines = DecisionLines("CreateContainer")
        started = self.clock()
        plugin._decide.container(view, ctr, lines, refuse=False, applied=None, current=None)
        times["decide"].append(self.clock() - started)
        lines.write_after(plugin.after_reply)
        await self.settle(pod)

        # The handler whole, for another pod (that one is now in the caches).
        other = _pod(workload.counter_token(4 * n + 1))
        await self.run_pod(other)
        container.id = container.id.replace(pod.id[-12:], other.id[-12:])
        started = self.clock()
        response = _run(plugin.create_container(other, container))
        times["handler"].append(self.clock() - started)
        started = self.clock()
        self.decoder.reply(event.stream_id, response)
        times["encode"].append(self.clock() - started)
        await self.settle(other)

    async def run_pod(self, pod: api.PodSandbox) -> None:
        """As a runtime would: the pod's cgroup exists, with kubelet's values, before the event."""
        workload.create_pod_cgroup(self.cgroup_root, pod.linux.cgroup_parent)
        await self.plugin.pod_event(Event.RUN_POD_SANDBOX, pod)

    async def settle(self, pod: api.PodSandbox) -> None:
        """Forget the pod, and let the work left for after the reply run, untimed."""
        await self.plugin.pod_event(Event.REMOVE_POD_SANDBOX, pod)
        workload.remove_pod_cgroup(
            workload.pod_cgroup_dir(self.cgroup_root, pod.linux.cgroup_parent)
        )
        for _ in range(3):
            await asyncio.sleep(0)
        self.plugin.after_reply.flush()

    def _stamp(self, done: asyncio.Future[int]) -> None:
        done.set_result(self.clock())

    async def whole(self, n: int) -> None:
        """Bytes in to bytes out through the connection, for a third pod; then, back to
        back, for a fourth: the same work with the caches warm from the first."""
        pods = []
        for k in (2, 3):
            counter = workload.counter_token(4 * n + k)
            pods.append((_pod(counter), self.create.frames(4 * n + 2 * k - 3, counter)))
            await self.run_pod(pods[-1][0])
        for name, (_, frames) in zip(TOTALS, pods, strict=True):
            data = b"".join(frames)
            done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            self.transport.written = functools.partial(self._stamp, done)
            started = self.clock()
            self.conn.data_received(data)
            # Served in the read's step: done already, awaiting it does not yield.
            self.times[name].append(await done - started)
        self.transport.written = lambda: None
        for pod, _ in pods:
            await self.settle(pod)


_EMPTY = api.CreateContainerResponse()


async def _nothing(_request: Any, _ctx: CallContext) -> Any:
    return _EMPTY


class _Counter:
    """A clock that counts work, not time: the same on a loaded machine as on a quiet one.

    `calls` counts the functions entered (Python frames, a coroutine's each resumption,
    and built-in/C functions called), `opcodes` the bytecode instructions the Python frames
    run; the stages and the parts are counted as they are timed, the in-process total too.
    Each figure includes one reading of the counter (a call, a few instructions).
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self.count = 0

    def __call__(self) -> int:
        return self.count

    def start(self) -> None:
        if self.what == "calls":
            sys.setprofile(self._call)
        else:
            sys.settrace(self._trace)

    def stop(self) -> None:
        sys.setprofile(None)
        sys.settrace(None)

    def _call(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" or event == "c_call":
            self.count += 1

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call":
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
        elif event == "opcode":
            self.count += 1
        return self._trace


#: What each stage is measured by: the wall clock, the CPU time of the loop's thread (on a
#: machine others load, what the plugin itself spent, without the waits for a core), or the
#: work done (`_Counter`: calls or bytecode instructions, which no load changes).
CLOCKS: dict[str, Callable[[], int]] = {"wall": time.perf_counter_ns, "cpu": time.thread_time_ns}
COUNTS = ("calls", "opcodes")


async def _measure(rounds: int, workdir: Path, clock: str) -> dict[str, list[int]]:
    counter = _Counter(clock) if clock in COUNTS else None
    plugin = _Plugin(workdir, counter or CLOCKS[clock])
    if counter is not None:
        # The first rounds fill the caches and the lazily built parts: counted too, but
        # the median over rounds is a later round's.
        counter.start()
    try:
        for n in range(rounds):
            await plugin.stages(n)
            await plugin.whole(n)
    finally:
        if counter is not None:
            counter.stop()
    return plugin.times


def _pod(counter: bytes) -> api.PodSandbox:
    token = counter.decode()
    return workload.pod(workload.PodShape(token=token, memory_request=f"{token}Mi"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stages", description=__doc__)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument(
        "--clock",
        choices=(*CLOCKS, *COUNTS),
        default="wall",
        help="time the stages by the wall clock or by the loop thread's CPU time, or count "
        "the function calls or bytecode instructions each one runs (the same on any machine)",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nri-midbatch-stages-") as tmp:
        workdir = Path(tmp)
        configure_logging("info", "json", open_sink(str(workdir / "plugin.log"), False))
        if args.loop == "uvloop":
            import uvloop

            times = uvloop.run(_measure(args.rounds, workdir, args.clock))
        else:
            times = asyncio.run(_measure(args.rounds, workdir, args.clock))
    gc.collect()
    # Counts are shown as they are; times in microseconds.
    scale, unit = (1, args.clock) if args.clock in COUNTS else (1000, "us")
    total = statistics.median(times["in-process total"]) / scale
    heading = f"{'stage':<22} {'min ' + unit:>11} {'median ' + unit:>14} {'share':>6}"
    print(f"{heading}   ({args.loop}, {args.clock})")

    def row(name: str, values: list[int], label: str | None = None) -> None:
        low, mid = min(values) / scale, statistics.median(values) / scale
        print(f"{label or name:<22} {low:11.1f} {mid:14.1f} {mid / total:6.0%}")

    for name in STAGES:
        row(name, times[name])
        if name == "handler":
            for part in PARTS:
                row(part, times[part], f"  of which {part}")
    rest = total - sum(statistics.median(times[name]) for name in STAGES) / scale
    print(f"{'task, deadline, turns':<22} {'':11} {rest:14.1f} {rest / total:6.0%}")
    for name in TOTALS:
        row(name, times[name])
    return 0


if __name__ == "__main__":
    sys.exit(main())
