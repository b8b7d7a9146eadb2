"""The running process: configuration, plugin, session, metrics and health.

Besides keeping the session connected, the process watches its configuration
file: a valid change applies at once and is followed by a pass that brings
running workloads to the new values; an invalid one is logged with the field
at fault, counted, and the previous configuration stays in force.

Longer than the house's 400 lines: it composes the plugin, session, reload pass and the
metric families, each family beside the state it reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path

import structlog
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from nri_midbatch.cgroups.fs import KERNEL_FILES, CgroupFiles
from nri_midbatch.cgroups.systemd import LEVELS
from nri_midbatch.cgroups.values import VALUE_FIELDS
from nri_midbatch.config.settings import ConfigError, Settings
from nri_midbatch.config.validator import load_settings_file
from nri_midbatch.nri.runner import run_external, run_prelaunched
from nri_midbatch.nri.session import DEFAULT_REGISTRATION_TIMEOUT, DEFAULT_UPDATE_TIMEOUT, Session
from nri_midbatch.nri.version import Version
from nri_midbatch.obs.health import HealthServer
from nri_midbatch.obs.logging import set_level
from nri_midbatch.obs.metrics import CounterFamily, CountersCollector, Metrics
from nri_midbatch.plugin.codec import container_update
from nri_midbatch.plugin.decisions import RUNTIME_VALUES
from nri_midbatch.plugin.deferred import AfterReply, DeferredTimings
from nri_midbatch.plugin.handlers import MidBatchPlugin
from nri_midbatch.plugin.lowering import LoweringTimings
from nri_midbatch.plugin.observer import Observer
from nri_midbatch.plugin.reconcile import ConvergenceTimings
from nri_midbatch.policy import ErrorKind
from nri_midbatch.process.reload import FileWatch
from nri_midbatch.process.session_watch import SessionWatch
from nri_midbatch.process.status import StatusServer
from nri_midbatch.recording.writer import Recorder
from nri_midbatch.rpc.errors import RpcError
from nri_midbatch.state.plan import Plan, split_pods
from nri_midbatch.state.store import REFUSALS, BaselineStore
from nri_midbatch.wire.status import Code

__all__ = ["App"]

log = structlog.get_logger(__name__)

RELOAD_INTERVAL = 1.0
#: How often a metrics address that was taken (or not yet there) is tried again.
METRICS_RETRY_SECONDS = 5.0
#: Bind errors that may go away: another process holds the port, or the address is not up yet.
_PASSING_BIND_ERRORS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL})
#: Reload results and invalid-input reasons are exposed from the start, at 0:
#: Prometheus's increase() misses the first rise of a series it did not have,
#: and the alerts in examples/monitoring/ use increase().
RELOAD_RESULTS = ("applied", "unchanged", "invalid", "failed")
INVALID_REASONS = (*(kind.value for kind in ErrorKind), "internal", RUNTIME_VALUES)
ADJUSTING_METHODS = ("CreateContainer", "UpdateContainer", "Synchronize")
#: Runtimes before this never synchronize pre-launched plugins.
PRELAUNCHED_SYNC_FROM: Version = (0, 7, 0)


class App:
    def __init__(
        self,
        config: Settings,
        *,
        name: str,
        idx: str,
        config_path: str | None,
        recorder: Recorder | None = None,
        metrics_address: str | None = None,
        log_level: str = "info",
        reload_interval: float = RELOAD_INTERVAL,
        registration_timeout: float = DEFAULT_REGISTRATION_TIMEOUT,
        update_containers_timeout: float = DEFAULT_UPDATE_TIMEOUT,
        state_dir: Path | None = None,
        status_socket: Path | None = None,
        metrics_retry_seconds: float = METRICS_RETRY_SECONDS,
        deferred_timings: DeferredTimings = DeferredTimings(),
        lowering_timings: LoweringTimings = LoweringTimings(),
        convergence_timings: ConvergenceTimings = ConvergenceTimings(),
        cgroup_files: CgroupFiles = KERNEL_FILES,
    ) -> None:
        """metrics_retry_seconds: the wait before a taken metrics address is tried again.

        deferred_timings: those of the work left for after replies (plugin/deferred.py);
        lowering_timings, convergence_timings, cgroup_files: the plugin's (MidBatchPlugin).
        """
        self.metrics = Metrics()
        self.recorder = recorder
        # Pod cgroups and log lines left for after a reply wait while a request
        # is in progress (until the connection is idle again), and give the
        # runtime its turn after our writes: the work observes the session.
        after_reply = AfterReply(timings=deferred_timings)
        observers: list[Observer] = [SessionWatch(self.metrics), after_reply]
        if recorder is not None:
            observers.append(recorder)
        self.plugin = MidBatchPlugin(
            config,
            observers=observers,
            after_reply=after_reply,
            store=BaselineStore(state_dir),
            lowering_timings=lowering_timings,
            convergence_timings=convergence_timings,
            cgroup_files=cgroup_files,
        )
        self.session = Session(
            self.plugin,
            name,
            idx,
            observers=observers,
            registration_timeout=registration_timeout,
        )
        self.metrics.add_collector(CountersCollector(self._counter_families))
        self.metrics.add_collector(ModeCollector(lambda: str(self.plugin.config.mode)))
        self.health: HealthServer | None = None
        self._metrics_address = metrics_address
        self._metrics_retry_seconds = metrics_retry_seconds
        #: Attempts to serve metrics that found the address taken.
        self.metrics_bind_failures = 0
        if metrics_address:
            self._bind_metrics()
        self.reloads: dict[str, int] = {}
        #: (path, result) -> workloads brought to a reloaded configuration
        self.followed: dict[tuple[str, str], int] = {
            key: 0
            for key in (
                ("update_containers", "ok"),
                ("update_containers", "refused"),
                ("cgroup_files", "ok"),
                ("cgroup_files", "failed"),
            )
        }
        self.config_path = config_path
        self._watch = FileWatch(config_path) if config_path else None
        self._reload_interval = reload_interval
        self._update_containers_timeout = update_containers_timeout
        self._log_level = log_level
        self._debug = False
        self._prelaunched = False
        self._syncs_seen = 0
        self._stop = asyncio.Event()
        self._status = (
            None
            if status_socket is None
            else StatusServer(self.plugin, status_socket, self.readiness)
        )
        #: Reload requests made, and those a pass has read the file for; one pass at a time.
        self._reloads_asked = 0
        self._reloads_served = 0
        self._reloading = asyncio.Lock()

    # -- running -------------------------------------------------------------

    def stop(self) -> None:
        log.info("stopping")
        self._stop.set()
        self.session.close()

    async def run_external(self, socket_path: str) -> int:
        log.info("starting", mode="external", socket=socket_path)
        async with self._services():
            await run_external(
                self.session, socket_path, self._stop, on_reconnect=self.metrics.reconnects.inc
            )
        return 0

    async def run_prelaunched(self, fd: int) -> int:
        log.info("starting", mode="pre-launched", fd=fd)
        self._prelaunched = True
        async with self._services():
            ended = await run_prelaunched(self.session, fd)
        if not ended.failed:
            log.info("runtime connection ended", reason=ended.reason)
            return 0
        # A pre-launched plugin cannot reconnect: say why, and exit non-zero.
        log.error(
            "runtime connection failed; a pre-launched plugin cannot reconnect", reason=ended.reason
        )
        return 1

    @contextlib.asynccontextmanager
    async def _services(self) -> AsyncIterator[None]:
        tasks: list[asyncio.Task[None]] = []
        if self.health is not None:
            self._start_health(self.health)
        if self._metrics_address:
            tasks.append(asyncio.create_task(self._serve_metrics()))
        if self._watch is not None:
            tasks.append(asyncio.create_task(self._watch_config()))
        if self.plugin.systemd is not None:
            tasks.append(asyncio.create_task(self.plugin.systemd.run()))
        tasks.append(asyncio.create_task(self.plugin.reconcile.run()))
        if self._status is not None:
            try:
                await self._status.start()
            except OSError as exc:  # status is for people: the node goes on without it
                log.warning("status not served", socket=str(self._status.path), error=str(exc))
                self._status = None
        try:
            yield
        finally:
            if self._status is not None:
                await self._status.close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.plugin.reconcile.close()  # not a whole pass at shutdown
            # Log lines and pod cgroups still queued behind replies are not lost.
            # Pods still waiting for their containers to be lowered are not:
            # the next Synchronize decides them anew.
            if self.plugin.after_reply.flush():
                log.warning("pods waiting for their containers to be lowered abandoned at shutdown")
            if self.health is not None:
                self.health.stop()

    # -- health --------------------------------------------------------------

    def _bind_metrics(self) -> None:
        """Bind the metrics address; one that is taken is logged and tried again later.

        NRI comes first: a plugin that exits because a port is taken leaves
        every pod of the node without its values. Any other error (an address
        that cannot be parsed or resolved) is the caller's.
        """
        assert self._metrics_address
        try:
            self.health = HealthServer(self._metrics_address, self.metrics, self.readiness)
        except OSError as exc:
            if exc.errno not in _PASSING_BIND_ERRORS:
                raise
            self.metrics_bind_failures += 1
            # Once: the probes that fail meanwhile say it again.
            if self.metrics_bind_failures == 1:
                log.error(
                    "cannot serve metrics, retrying",
                    address=self._metrics_address,
                    error=exc.strerror or str(exc),
                    retry_seconds=self._metrics_retry_seconds,
                )

    def _start_health(self, health: HealthServer) -> None:
        health.start()
        log.info("serving metrics and health", port=health.port)

    async def _serve_metrics(self) -> None:
        while self.health is None:
            await asyncio.sleep(self._metrics_retry_seconds)
            self._bind_metrics()
            if self.health is not None:
                self._start_health(self.health)
        await self.health.heartbeat()

    def readiness(self) -> tuple[bool, str]:
        state = self.session.state
        if not state.configured or state.runtime is None:
            return False, "not registered with a runtime"
        if state.synchronized:
            return True, "ok"
        if self._prelaunched and state.runtime.nri_version < PRELAUNCHED_SYNC_FROM:
            return True, "ok"
        return False, "registered, waiting for Synchronize"

    def _counter_families(self) -> Iterable[CounterFamily]:
        """Read on the metrics server's thread while the loop counts: each dict the loop may
        add keys to is copied whole first (one C call, under the GIL) and then iterated."""
        counters = self.plugin.counters
        # Every configured tier from 0: rate() and increase() miss the first
        # rise of a series that did not exist at the scrape before.
        decisions: dict[tuple[str, ...], int] = {(t.name,): 0 for t in self.plugin.config.tiers}
        decisions[("none",)] = 0
        decisions.update({(tier,): n for tier, n in dict(counters.decisions).items()})
        yield (
            "nri_midbatch_decisions",
            "Decisions made, by tier (none: the pod is in no tier)",
            ("tier",),
            decisions,
        )
        invalid: dict[tuple[str, ...], int] = {(r,): 0 for r in INVALID_REASONS}
        invalid.update({(r,): n for r, n in dict(counters.invalid).items()})
        yield (
            "nri_midbatch_invalid_inputs",
            "Pods or containers left alone (or refused) because of bad input, by reason",
            ("reason",),
            invalid,
        )
        adjusted: dict[tuple[str, ...], int] = {
            (method, name): 0 for method in ADJUSTING_METHODS for name in VALUE_FIELDS
        }
        adjusted.update({tuple(key): n for key, n in dict(counters.adjusted).items()})
        yield (
            "nri_midbatch_adjusted_fields",
            "Container cgroup fields set through NRI, by method and field",
            ("method", "field"),
            adjusted,
        )
        yield (
            "nri_midbatch_observed",
            "Values decided but not set (mode: observe), by level and whether they differ "
            "from what the container or pod has (differs, same, unknown)",
            ("level", "result"),
            {
                (level, result): counters.observed.get((level, result), 0)
                for level in ("pod", "container")
                for result in ("differs", "same", "unknown")
            },
        )
        yield (
            "nri_midbatch_pod_cgroup_writes",
            "Pod-level cgroup updates, by result",
            ("result",),
            {("ok",): counters.pod_writes_ok, ("failed",): counters.pod_writes_failed},
        )
        yield (
            "nri_midbatch_container_repairs",
            "Containers whose cgroup files did not hold what the runtime reported at Synchronize,"
            " written by the plugin, by result",
            ("result",),
            {("ok",): counters.containers_repaired, ("failed",): counters.container_repairs_failed},
        )
        yield (
            "nri_midbatch_known_evictions",
            "Pods forgotten because the plugin remembered more than it believes a node runs"
            " (a runtime that sends no removals)",
            (),
            {(): self.plugin.known.evicted},
        )
        yield (
            "nri_midbatch_baseline_record_failures",
            "Pod records of kubelet's values (--state-dir) that could not be read, written or"
            " removed",
            (),
            {(): self.plugin.store.failures},
        )
        records_refused: dict[tuple[str, ...], int] = {(r,): 0 for r in REFUSALS}
        records_refused.update({(r,): n for r, n in dict(self.plugin.store.refused).items()})
        yield (
            "nri_midbatch_baseline_records_refused",
            "Pod records under --state-dir read and not taken (as if the pod had none), by reason",
            ("reason",),
            records_refused,
        )
        yield (
            "nri_midbatch_pods_lowered_unconfirmed",
            "Pods a Synchronize lowered without seeing the runtime lower their containers first",
            (),
            {(): counters.pods_lowered_unconfirmed},
        )
        yield (
            "nri_midbatch_drift_found",
            "Pod and container cgroups found holding other values than the plugin keeps in"
            " force, by level and writer (kubelet: its known value, as after a resize; unknown:"
            " anyone else)",
            ("level", "writer"),
            {tuple(key): n for key, n in dict(counters.drift_found).items()},
        )
        yield (
            "nri_midbatch_drift_repaired",
            "Pod and container cgroups put back to the values in force, by level and writer",
            ("level", "writer"),
            {tuple(key): n for key, n in dict(counters.drift_repaired).items()},
        )
        yield (
            "nri_midbatch_convergence_passes",
            "Convergence passes over every known pod and container",
            (),
            {(): self.plugin.reconcile.passes},
        )
        reloads: dict[tuple[str, ...], int] = {(r,): 0 for r in RELOAD_RESULTS}
        reloads.update({(r,): n for r, n in dict(self.reloads).items()})
        reloads[("rejected_from_runtime",)] = counters.config_rejected
        yield (
            "nri_midbatch_config_reloads",
            "Configuration reloads, by result",
            ("result",),
            reloads,
        )
        yield (
            "nri_midbatch_reload_writes",
            "Containers and pods brought to a reloaded configuration, by path and result",
            ("path", "result"),
            {tuple(key): n for key, n in dict(self.followed).items()},
        )
        refused, ignored = self.session.protocol_violations()
        yield (
            "nri_midbatch_runtime_protocol_violations",
            "Messages from the runtime the wire layer answered itself (refused: malformed or"
            " unknown requests) or dropped (ignored: stray replies, unknown message types)",
            ("kind",),
            {("refused",): refused, ("ignored",): ignored},
        )
        yield (
            "nri_midbatch_runtime_protocol_disconnects",
            "Connections to the runtime dropped because it broke the protocol (framing garbage,"
            " or a flood of messages to refuse or ignore); the plugin then registers again",
            (),
            {(): self.session.protocol_disconnects},
        )
        yield (
            "nri_midbatch_metrics_bind_failures",
            "Attempts to serve metrics and health that found the address taken",
            (),
            {(): self.metrics_bind_failures},
        )
        # Zero unless the plugin runs under the systemd driver (present from the start).
        systemd = self.plugin.systemd
        yield (
            "nri_midbatch_cgroup_drift_repaired",
            "Pod and container cgroups whose values a systemd reload changed and the "
            "plugin put back, by level",
            ("level",),
            {(level,): 0 if systemd is None else systemd.drift_repaired[level] for level in LEVELS},
        )
        yield (
            "nri_midbatch_systemd_property_sets",
            "SetUnitProperties calls to systemd, by level and result",
            ("level", "result"),
            {
                (level, result): 0 if systemd is None else systemd.property_sets[level, result]
                for level in LEVELS
                for result in ("ok", "failed")
            },
        )
        yield (
            "nri_midbatch_systemd_unreachable",
            "Failed attempts to connect to systemd over D-Bus",
            (),
            {(): 0 if systemd is None else systemd.unreachable},
        )
        yield (
            "nri_midbatch_systemd_repair_passes",
            "Passes over pod and container cgroups after a burst of systemd reloads",
            (),
            {(): 0 if systemd is None else systemd.repair_passes},
        )
        yield (
            "nri_midbatch_systemd_signals_ignored",
            "Reloading signals ignored because systemd did not send them",
            (),
            {(): 0 if systemd is None else systemd.signals_ignored},
        )
        if self.recorder is not None:
            yield (
                "nri_midbatch_records_dropped",
                "Recording lines lost: queue full, over the size cap, or a failed write",
                (),
                {(): self.recorder.dropped},
            )

    # -- reload --------------------------------------------------------------

    def toggle_debug(self) -> None:
        self._debug = not self._debug
        level = "debug" if self._debug else self._log_level
        set_level(level)
        log.warning("log level changed", level=level)

    async def _watch_config(self) -> None:
        assert self._watch is not None
        while True:
            await asyncio.sleep(self._reload_interval)
            if self._watch.changed():
                await self.reload("file changed")

    async def reload(self, reason: str) -> None:
        """Load the file and apply it if it changed; never raises, so watching goes on.

        One pass at a time, each to the end (its workloads followed): a request made while a
        pass runs is served by one pass after it, which reads the file then, so a burst of
        requests costs two passes at most and the last file wins.
        """
        if self.config_path is None:
            log.warning("reload asked, but no configuration file was given", reason=reason)
            return
        self._reloads_asked += 1
        asked = self._reloads_asked
        async with self._reloading:
            if self._reloads_served >= asked:
                return  # a pass that started after this request has read the file
            self._reloads_served = self._reloads_asked
            try:
                await self._reload(self.config_path, reason)
            except Exception as exc:  # a bug here must not end the watch: say so, count it
                self._count_reload("failed")
                log.exception("configuration reload failed", reason=reason, error=str(exc))

    async def _reload(self, path: str, reason: str) -> None:
        try:
            # In a thread: the file is validated in a child process (0.3 s), which
            # must not hold up events.
            config = await asyncio.to_thread(load_settings_file, path)
        except ConfigError as exc:
            self._count_reload("invalid")
            log.error(
                "configuration rejected, the previous one stays in force",
                reason=reason,
                error=str(exc),
            )
            return
        # A Synchronize's pod writes still pending were decided under the old
        # configuration: let them land first, for the plan to follow them.
        await self.plugin.after_reply.settle()
        unchanged = config == self.plugin.config
        plan = self.plugin.catch_up() if unchanged else self.plugin.reconfigure(config)
        if unchanged and not plan:
            self._count_reload("unchanged")
            return
        self._count_reload("unchanged" if unchanged else "applied")
        log.info(
            "configuration reloaded" if not unchanged else "configuration unchanged, catching up",
            reason=reason,
            mode=config.mode,
            containers_to_update=len(plan.containers),
            pods_to_update=len(plan.pods),
        )
        if plan:
            await self._follow(plan)

    def _count_reload(self, result: str) -> None:
        self.reloads[result] = self.reloads.get(result, 0) + 1

    async def _follow(self, plan: Plan) -> None:
        """Bring running workloads to a new configuration's values."""
        runtime = self.plugin.runtime
        if plan.containers and runtime is not None and runtime.update_containers_safe:
            # Pods go up before their containers; down only after the reply to
            # UpdateContainers, by which the runtime has applied the updates.
            raised_first, rest_of_pods = split_pods(plan)
            raised = Plan((), raised_first)
            await self._write_files(raised)
            updates = [container_update(c.container.id, c.values) for c in plan.containers]
            try:
                # A runtime that never answers must not hold the reload, and with
                # it the watch, for good: the call's deadline ends the wait.
                failed = await self.session.update_containers(
                    updates, timeout=self._update_containers_timeout
                )
            except Exception as exc:  # a lost connection must not lose the pass
                self._count_followed("update_containers", "failed", len(updates))
                if isinstance(exc, RpcError) and exc.code is Code.DEADLINE_EXCEEDED:
                    error = f"no answer within {self._update_containers_timeout:g} s"
                else:
                    error = str(exc) or type(exc).__name__
                log.warning(
                    "UpdateContainers failed, writing cgroup files",
                    error=error,
                    containers=len(updates),
                )
                await self._write_files(Plan(plan.containers, rest_of_pods))
                return
            refused = {u.container_id for u in failed}
            for change in plan.containers:
                if change.container.id in refused:
                    log.warning(
                        "runtime could not update the container, writing its cgroup files",
                        namespace=change.pod.namespace,
                        pod=change.pod.name,
                        container=change.container.name,
                    )
            self._count_followed("update_containers", "ok", len(updates) - len(refused))
            self._count_followed("update_containers", "refused", len(refused))
            updated = tuple(c for c in plan.containers if c.container.id not in refused)
            self.plugin.applied(Plan(updated, ()))
            rest = tuple(c for c in plan.containers if c.container.id in refused)
            await self._write_files(Plan(rest, rest_of_pods))
            return
        await self._write_files(plan)

    async def _write_files(self, plan: Plan) -> None:
        if not plan:
            return
        failed = await asyncio.to_thread(self.plugin.write_plan, plan)
        failures = len(failed.containers) + len(failed.pods)
        self.plugin.applied(plan, failed, by_files=True)
        self._count_followed("cgroup_files", "ok", len(plan.containers) + len(plan.pods) - failures)
        self._count_followed("cgroup_files", "failed", failures)
        if failures:
            log.warning("some cgroups did not take the new configuration", failures=failures)

    def _count_followed(self, path: str, result: str, count: int) -> None:
        key = (path, result)
        self.followed[key] = self.followed.get(key, 0) + count


class ModeCollector(Collector):
    """`nri_midbatch_mode{mode}`: 1 for the mode in force (enforce or observe), else 0."""

    def __init__(self, mode: Callable[[], str]) -> None:
        self._mode = mode

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self._mode()
        family = GaugeMetricFamily(
            "nri_midbatch_mode",
            "1 for the mode in force: enforce sets values, observe only reports them",
            labels=("mode",),
        )
        for mode in ("enforce", "observe"):
            family.add_metric((mode,), int(mode == now))
        yield family
