"""The running process: configuration, plugin, session, metrics and health.

Besides keeping the session connected, the process watches its configuration
file: a valid change applies at once and triggers the one pass
(plugin/reconcile/) that brings running workloads to the new values; an
invalid one is logged with the field at fault, counted, and the previous
configuration stays in force.

Longer than the house's 400 lines: it composes the plugin, session and reload pass, and
names every owner of counts the metrics read (`counted`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import structlog

from nri_midbatch.cgroups.fs import KERNEL_FILES, CgroupFiles
from nri_midbatch.cgroups.systemd import NoSystemd
from nri_midbatch.config.settings import ConfigError, Settings
from nri_midbatch.config.validator import load_settings_file
from nri_midbatch.counts import Counted, CounterFamily, family, single
from nri_midbatch.deferred import AfterReply, DeferredTimings
from nri_midbatch.nri.runner import run_external, run_prelaunched
from nri_midbatch.nri.session import DEFAULT_REGISTRATION_TIMEOUT, DEFAULT_UPDATE_TIMEOUT, Session
from nri_midbatch.nri.version import Version
from nri_midbatch.obs.health import HealthServer
from nri_midbatch.obs.logging import set_level
from nri_midbatch.obs.metrics import Metrics
from nri_midbatch.plugin.handlers import MidBatchPlugin
from nri_midbatch.plugin.lowering import LoweringTimings
from nri_midbatch.plugin.observer import AfterReplyListener, Observer
from nri_midbatch.plugin.reconcile import ConvergenceTimings
from nri_midbatch.process.metrics import Gathered, ModeCollector
from nri_midbatch.process.reload import FileWatch
from nri_midbatch.process.session_watch import SessionWatch
from nri_midbatch.process.status import StatusServer, StatusSource
from nri_midbatch.recording.writer import Recorder
from nri_midbatch.state.store import BaselineStore

__all__ = ["App"]

log = structlog.get_logger(__name__)

RELOAD_INTERVAL = 1.0
#: How often a metrics address that was taken (or not yet there) is tried again.
METRICS_RETRY_SECONDS = 5.0
#: Bind errors that may go away: another process holds the port, or the address is not up yet.
_PASSING_BIND_ERRORS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL})
#: Reload results are exposed from the start, at 0 (nri_midbatch/counts.py says why).
RELOAD_RESULTS = ("applied", "unchanged", "invalid", "failed")
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

        deferred_timings: those of the work left for after replies (deferred.py);
        lowering_timings, convergence_timings, cgroup_files: the plugin's (MidBatchPlugin).
        """
        self.metrics = Metrics()
        self.recorder = recorder
        # Pod cgroups and log lines left for after a reply wait while a request
        # is in progress (until the connection is idle again), and give the
        # runtime its turn after our writes: the work hears the session.
        self._after_reply = after_reply = AfterReply(timings=deferred_timings)
        self._store = store = BaselineStore(state_dir)
        observers: list[Observer] = [SessionWatch(self.metrics), AfterReplyListener(after_reply)]
        if recorder is not None:
            observers.append(recorder)
        self.plugin = MidBatchPlugin(
            config,
            observers=observers,
            after_reply=after_reply,
            store=store,
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
        self.metrics.add_collector(Gathered(self.counted))
        live = self.plugin.live
        self.metrics.add_collector(ModeCollector(lambda: str(live.in_force.config.mode)))
        self.health: HealthServer | None = None
        self._metrics_address = metrics_address
        self._metrics_retry_seconds = metrics_retry_seconds
        #: Attempts to serve metrics that found the address taken.
        self.metrics_bind_failures = 0
        if metrics_address:
            self._bind_metrics()
        self.reloads: dict[str, int] = {}
        self.config_path = config_path
        self._watch = FileWatch(config_path) if config_path else None
        self._reload_interval = reload_interval
        self._update_containers_timeout = update_containers_timeout
        self._log_level = log_level
        self._debug = False
        self._prelaunched = False
        self._syncs_seen = 0
        self._stop = asyncio.Event()
        #: What `nri-midbatch status` shows.
        self.status_source = StatusSource(live, self.plugin.reconcile, store.keeping, after_reply)
        self._status = (
            None
            if status_socket is None
            else StatusServer(self.status_source, status_socket, self.readiness)
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
            await run_external(self.session, socket_path, self._stop)
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
            if self._after_reply.flush():
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

    def counted(self) -> Iterator[Counted]:
        """Every owner of counts, as it is now (a Synchronize replaces the plugin's `known`):
        the one list the metrics read (process/metrics.py)."""
        plugin = self.plugin
        yield plugin.counters
        yield plugin.live.known
        yield self._store
        yield plugin.reconcile
        yield self
        yield self.session
        yield NoSystemd() if plugin.systemd is None else plugin.systemd
        if self.recorder is not None:
            yield self.recorder

    def counter_families(self) -> Iterator[CounterFamily]:
        """The App's own: reloads (with the drop-ins the runtime sent that the plugin
        refused), and the metrics address's bind failures (a reload's writes are the
        one pass's to count)."""
        yield family(
            "nri_midbatch_config_reloads",
            "Configuration reloads, by result",
            ("result",),
            {
                **{(result,): n for result, n in dict(self.reloads).items()},
                ("rejected_from_runtime",): self.plugin.counters.config_rejected,
            },
            zeros=[(result,) for result in RELOAD_RESULTS],
        )
        yield single(
            "nri_midbatch_metrics_bind_failures",
            "Attempts to serve metrics and health that found the address taken",
            self.metrics_bind_failures,
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
        await self._after_reply.settle()
        unchanged = config == self.plugin.live.in_force.config
        plan = self.plugin.catch_up() if unchanged else self.plugin.reconfigure(config)
        if unchanged and not plan:
            self._count_reload("unchanged")
        else:
            self._count_reload("unchanged" if unchanged else "applied")
            log.info(
                "configuration reloaded"
                if not unchanged
                else "configuration unchanged, catching up",
                reason=reason,
                mode=config.mode,
                containers_to_update=len(plan.containers),
                pods_to_update=len(plan.pods),
            )
        # The reload's trigger of the one pass (plugin/reconcile/): the plan, then a check
        # of every workload.
        runtime = self.plugin.runtime
        safe = runtime is not None and runtime.update_containers_safe
        timeout = self._update_containers_timeout
        update = (
            functools.partial(self.session.update_containers, timeout=timeout) if safe else None
        )
        await self.plugin.reconcile.reload(plan, update, timeout)

    def _count_reload(self, result: str) -> None:
        self.reloads[result] = self.reloads.get(result, 0) + 1
