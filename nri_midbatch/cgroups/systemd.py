"""Pod and container values held by systemd, for the systemd cgroup driver on cgroup v2.

Under the systemd driver every pod cgroup is a slice and every container
cgroup a scope, and systemd writes into their files, whenever it reloads
(`systemctl daemon-reload`), the values it holds for the unit. Values written
only into the files are then lost. So the plugin, after writing the files as
it does under any driver (they take effect at once, exactly), also sets the
same values as unit properties (SetUnitProperties over D-Bus), and repairs
what a reload put back anyway: systemd 252 keeps a CPU quota in its runtime
drop-in as whole percent of a CPU (`CPUQuota=37%`), so a quota that is not a
multiple of 1 ms per 100 ms period comes back truncated from every reload,
and containers come back with the quota the runtime rounded up (runc) when
it passed it to systemd.

The D-Bus side runs as one background task (`run`); the plugin only queues
(`hold`), so neither a slow systemd nor a missing bus ever delays a pod:
without D-Bus the values are in the files, as under the cgroupfs driver, and
the task keeps trying to connect. dbus-fast is imported by that task only,
so the cgroupfs path never loads it.

Only systemd's own signals count: any client on the system bus can send a
unicast `Reloading` to the plugin, which the bus delivers whatever the match
rules say. So the sender must be the unique name that owns
`org.freedesktop.systemd1` (asked with GetNameOwner, followed through
NameOwnerChanged), and a burst of reloads gives one repair pass after it
(reload_burst.py).

Longer than the house's 400 lines: the D-Bus task, its reconnect backoff, the queue it
drains and the drift repair share one connection and one queue.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from nri_midbatch.cgroups.files import CgroupVersion
from nri_midbatch.cgroups.fs import KERNEL_FILES, CgroupFiles, detect_version
from nri_midbatch.cgroups.paths import CgroupLocation, CgroupPathError, Level
from nri_midbatch.cgroups.reload_burst import DEFAULT_TIMINGS, ReloadBurst, RepairTimings
from nri_midbatch.cgroups.report import WriteReport
from nri_midbatch.cgroups.values import UNLIMITED, CgroupValues, cpu_shares_to_weight
from nri_midbatch.counts import CounterFamily, family, single

if TYPE_CHECKING:
    from dbus_fast import Message
    from dbus_fast.aio import MessageBus

log = structlog.get_logger(__name__)

LEVELS: tuple[Level, ...] = ("pod", "container")

#: systemd's "no limit" for CPUQuotaPerSecUSec (USEC_INFINITY) and MemoryMax
#: (CGROUP_LIMIT_MAX): both are UINT64_MAX.
INFINITY = (1 << 64) - 1

#: The CFS period systemd writes into cpu.max unless a unit sets
#: CPUQuotaPeriodUSec; kubelet sets none unless its CustomCPUCFSQuotaPeriod
#: gate is on. systemd writes quota_per_sec * period / 1 s, so at this period
#: a quota of Q microseconds is exactly Q * 10 per second.
CFS_PERIOD_US = 100_000
_USEC_PER_SEC = 1_000_000

SYSTEMD = "org.freedesktop.systemd1"
MANAGER_PATH = "/org/freedesktop/systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"
BUS = "org.freedesktop.DBus"
BUS_PATH = "/org/freedesktop/DBus"
# The bus filters broadcasts by these rules (sender= by the well-known name
# means its owner at the time); unicast signals reach us whatever they say.
_RELOADING_RULE = (
    f"type='signal',sender='{SYSTEMD}',path='{MANAGER_PATH}',interface='{MANAGER}',"
    "member='Reloading'"
)
_OWNER_RULE = (
    f"type='signal',sender='{BUS}',path='{BUS_PATH}',interface='{BUS}',"
    f"member='NameOwnerChanged',arg0='{SYSTEMD}'"
)

#: Bounds in time: one D-Bus call, and the wait between connection attempts.
CALL_TIMEOUT = 10.0
RETRY_MIN = 1.0
RETRY_MAX = 60.0


@dataclass(frozen=True, slots=True)
class UnitTarget:
    """A pod slice or a container scope, and the values the plugin gives it."""

    #: Its cgroup, as the plugin writes it under the systemd driver.
    location: CgroupLocation
    values: CgroupValues
    pod_uid: str
    namespace: str
    pod: str
    container: str = ""  # name, for logs

    @property
    def level(self) -> Level:
        return self.location.level

    @property
    def key(self) -> tuple[str, str]:
        return self.pod_uid, self.location.container_id or ""

    def apply_files(self, root: Path, files: CgroupFiles) -> WriteReport:
        """Write what differs in the unit's files (blocking; see cgroups.fs)."""
        return files.apply_values(root, self.location, self.values)

    def where(self) -> dict[str, str]:
        where = {"namespace": self.namespace, "pod": self.pod}
        if self.level == "container":
            where["container"] = self.container
        return where


def unit_properties(values: CgroupValues) -> list[tuple[str, int]]:
    """The unit properties (all of D-Bus type `t`) that make systemd write these values.

    Weight by the same linear formula as the cgroupfs path. The quota per
    second at systemd's default period; systemd 252 writes cpu.max as
    `max(quota_per_sec * period / 1 s, 1000) period`, i.e. exactly the quota,
    which the kernel never lets below 1000 anyway.
    """
    quota = values.cpu_quota
    shares, memory = values.cpu_shares, values.memory_limit
    properties: list[tuple[str, int]] = []
    # A value left None (a quota-only tier) is not the plugin's: no property for it.
    if shares is not None:
        properties.append(("CPUWeight", cpu_shares_to_weight(shares)))
    properties.append(
        (
            "CPUQuotaPerSecUSec",
            INFINITY if quota == UNLIMITED else quota * (_USEC_PER_SEC // CFS_PERIOD_US),
        )
    )
    if memory is not None:
        properties.append(("MemoryMax", INFINITY if memory == UNLIMITED else memory))
    return properties


#: What every live container holds of the plugin's values, as the plugin remembers them:
#: asked at each repair pass. A source the plugin gives the units (a dependency), not a
#: callback that tells of something.
HeldContainers = Callable[[], Iterable[UnitTarget]]


class SystemdUnits:
    """Keeps the plugin's values in systemd's units, and puts them back after a reload.

    Remembered: the pods whose slice the plugin wrote (one entry per pod,
    dropped with `forget_pod`, or when its cgroup is gone); containers come
    from `held_containers`, the plugin's own memory of live containers. Queued
    property sets are one per unit at most (a newer value replaces an older
    one), for known pods and containers only.
    """

    def __init__(
        self,
        root: Path,
        held_containers: HeldContainers,
        timings: RepairTimings = DEFAULT_TIMINGS,
        files: CgroupFiles = KERNEL_FILES,
    ) -> None:
        """`files`: what writes the units' files back, the cgroup writer's (cgroups/fs.py)."""
        self._root = root
        self._files = files
        self._held_containers = held_containers
        self._pods: dict[str, UnitTarget] = {}
        self._pending: dict[tuple[str, str], UnitTarget] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._repair_due = False
        self._burst = ReloadBurst(timings)
        self._repair_timer: asyncio.TimerHandle | None = None
        #: The unique bus name of systemd, on this connection; None: no owner now.
        self._systemd: str | None = None
        #: systemd has a new owner, to be subscribed to (it restarted or re-executed).
        self._resubscribe = False
        #: Whether this connection has logged an ignored signal yet.
        self._ignored_logged = False
        self._enabled = True
        #: ended reloads announced by systemd, and repair passes they led to
        self.reloads = 0
        self.repair_passes = 0
        #: Reloading signals ignored: not from systemd's unique name
        self.signals_ignored = 0
        #: level -> units whose files a reload of systemd had changed, and that were put back
        self.drift_repaired: dict[Level, int] = dict.fromkeys(LEVELS, 0)
        #: failed attempts to connect to systemd; queued sets wait for the next one
        self.unreachable = 0
        #: (level, result) -> SetUnitProperties calls
        self.property_sets: dict[tuple[Level, str], int] = {
            (level, result): 0 for level in LEVELS for result in ("ok", "failed")
        }

    def counter_families(self) -> Iterator[CounterFamily]:
        return _counter_families(self)

    @property
    def held(self) -> tuple[int, int]:
        """Pods remembered, and unit sets queued, now: what pods make it hold."""
        return len(self._pods), len(self._pending)

    # -- from the plugin (any thread) ----------------------------------------

    def hold(self, target: UnitTarget) -> None:
        """Have systemd hold `target`'s values, whose files were just written."""
        if not self._enabled:
            return
        loop = self._loop
        if loop is None:  # before run(): nothing else runs yet
            self._queue(target)
        else:
            # write_plan runs in a worker thread; the queue belongs to the loop.
            loop.call_soon_threadsafe(self._queue, target)

    def forget_pod(self, pod_uid: str) -> None:
        """The pod is gone: drop its slice and anything queued for its units (loop thread)."""
        self._pods.pop(pod_uid, None)
        for key in [key for key in self._pending if key[0] == pod_uid]:
            del self._pending[key]

    def forget_container(self, pod_uid: str, container_id: str) -> None:
        self._pending.pop((pod_uid, container_id), None)

    def _queue(self, target: UnitTarget) -> None:
        if target.level == "pod":
            self._pods[target.pod_uid] = target
        self._pending.pop(target.key, None)  # to the back: the newest value goes last
        self._pending[target.key] = target
        self._wake.set()

    # -- the D-Bus task -------------------------------------------------------

    async def run(self) -> None:
        """Connect, serve, reconnect; returns only on cgroup v1 (not handled here)."""
        self._loop = asyncio.get_running_loop()
        if detect_version(self._root) is not CgroupVersion.V2:
            log.warning(
                "cgroup v1: pod values are not set through systemd, only written to cgroup files",
                root=str(self._root),
            )
            self._enabled = False
            self._pending.clear()
            self._pods.clear()
            return
        delay = RETRY_MIN
        while True:
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
                # cancellation that arrives as the call fails, and the task would
                # never stop.
                async with asyncio.timeout(CALL_TIMEOUT):
                    bus = await self._connect()
            except Exception as exc:  # any way of not reaching systemd: files only, for now
                self.unreachable += 1
                log.warning(
                    "systemd not reachable over D-Bus: values are in the cgroup files only, "
                    "and a daemon-reload will undo them",
                    error=_describe(exc),
                    retry_in=delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
                continue
            delay = RETRY_MIN
            log.info("setting cgroup values through systemd", systemd=self._systemd)
            # A reload may have gone by unseen while there was no connection.
            self._repair_due = True
            try:
                await self._serve(bus)
            except Exception as exc:
                error = _describe(exc)
            else:
                error = "closed"
            finally:
                bus.disconnect()
            log.warning("D-Bus connection to systemd lost", error=error, retry_in=RETRY_MIN)
            await asyncio.sleep(RETRY_MIN)

    async def _connect(self) -> MessageBus:
        from dbus_fast import BusType
        from dbus_fast.aio import MessageBus

        # The system bus: DBUS_SYSTEM_BUS_ADDRESS, else /var/run/dbus/system_bus_socket.
        bus = MessageBus(bus_type=BusType.SYSTEM)
        await bus.connect()
        self._systemd, self._resubscribe, self._ignored_logged = None, False, False
        try:
            bus.add_message_handler(self._on_message)
            for rule in (_OWNER_RULE, _RELOADING_RULE):
                _check_reply(await bus.call(_bus_call("AddMatch", rule)))
            # After the owner rule: a change from here on arrives after this reply.
            reply = await bus.call(_bus_call("GetNameOwner", SYSTEMD))
            _check_reply(reply)
            self._systemd = reply.body[0]
            await self._subscribe(bus)
        except BaseException:
            bus.disconnect()
            raise
        return bus

    async def _subscribe(self, bus: MessageBus) -> None:
        from dbus_fast import Message

        # systemd sends its manager's signals only while someone is subscribed.
        message = Message(
            destination=SYSTEMD, path=MANAGER_PATH, interface=MANAGER, member="Subscribe"
        )
        async with asyncio.timeout(CALL_TIMEOUT):
            _check_reply(await bus.call(message))

    async def _serve(self, bus: MessageBus) -> None:
        # dbus-fast leaves this one unannotated.
        disconnected = asyncio.ensure_future(bus.wait_for_disconnect())  # type: ignore[no-untyped-call]
        try:
            while not disconnected.done():
                if self._resubscribe:
                    self._resubscribe = False
                    await self._subscribe(bus)
                    # A new systemd may have rewritten every unit's files.
                    self._repair_due = True
                if self._repair_due:
                    self._repair_due = False
                    await self._repair()
                while self._pending and not disconnected.done():
                    key = next(iter(self._pending))
                    await self._set(bus, self._pending.pop(key))
                if self._resubscribe or self._repair_due or self._pending:
                    continue
                self._wake.clear()
                waiting = asyncio.ensure_future(self._wake.wait())
                await asyncio.wait({waiting, disconnected}, return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
            disconnected.result()
        finally:
            disconnected.cancel()

    def _on_message(self, message: Message) -> None:
        from dbus_fast import MessageType

        if message.message_type is not MessageType.SIGNAL:
            return
        if message.member == "NameOwnerChanged" and message.interface == BUS:
            # Only the bus itself can send as its own name.
            if message.sender == BUS and message.body[:1] == [SYSTEMD]:
                self._owner_changed(message.body[2])
        elif message.member == "Reloading" and message.interface == MANAGER:
            if message.sender != self._systemd or message.path != MANAGER_PATH:
                self._ignore(message)
            elif message.body == [False]:
                self._reload_ended()

    def _owner_changed(self, owner: str) -> None:
        log.info("systemd's bus name has a new owner", systemd=owner or None)
        self._systemd = owner or None
        if owner:
            self._resubscribe = True
            self._wake.set()

    def _ignore(self, message: Message) -> None:
        self.signals_ignored += 1
        if not self._ignored_logged:  # one line per connection: the count is in the metrics
            self._ignored_logged = True
            log.warning(
                "Reloading signal not from systemd ignored; further ones are only counted",
                sender=message.sender,
                path=message.path,
                systemd=self._systemd,
            )

    def _reload_ended(self) -> None:
        self.reloads += 1
        loop = self._loop
        assert loop is not None
        due = self._burst.note(loop.time())
        if self._repair_timer is not None:
            self._repair_timer.cancel()
        self._repair_timer = loop.call_at(due, self._start_repair)

    def _start_repair(self) -> None:
        self._repair_timer = None
        self.repair_passes += 1
        log.info(
            "systemd reloaded: checking the values of pod and container cgroups",
            reloads=self._burst.end(),
        )
        self._repair_due = True
        self._wake.set()

    async def _set(self, bus: MessageBus, target: UnitTarget) -> None:
        from dbus_fast import Message, Variant

        try:
            unit = target.location.relpath().name
        except CgroupPathError as exc:  # the file write said so already
            self._count_set(target, ok=False)
            log.warning("unit not set through systemd", reason=str(exc), **target.where())
            return
        properties = [[name, Variant("t", value)] for name, value in unit_properties(target.values)]
        message = Message(
            destination=SYSTEMD,
            path=MANAGER_PATH,
            interface=MANAGER,
            member="SetUnitProperties",
            signature="sba(sv)",
            body=[unit, True, properties],
        )
        try:
            async with asyncio.timeout(CALL_TIMEOUT):
                reply = await bus.call(message)
            _check_reply(reply)
        except Exception as exc:
            self._count_set(target, ok=False)
            log.warning(
                "unit not set through systemd: its values are in the cgroup files only",
                unit=unit,
                error=_describe(exc),
                **target.where(),
            )
            if not bus.connected:
                # Lost with the connection, not refused: try it again on the next one.
                self._pending.setdefault(target.key, target)
                raise
            return
        self._count_set(target, ok=True)
        if target.key in self._pending:
            return  # a newer value is queued; its own files are written already
        # systemd has just written the files itself: put back exactly what the
        # cgroupfs path writes, should its arithmetic differ (a unit with a
        # CFS period of its own) or a reload have come in between.
        self._put_back(target, await asyncio.to_thread(target.apply_files, self._root, self._files))

    async def _repair(self) -> None:
        """Put back, file by file, what a reload of systemd changed; then have systemd hold it."""
        targets = [*self._pods.values(), *self._held_containers()]
        reports = await asyncio.to_thread(_apply_all, targets, self._root, self._files)
        for target, report in zip(targets, reports, strict=True):
            if isinstance(report, CgroupPathError):
                continue
            if target.level == "pod" and _gone(report):
                # The pod went while the plugin was not told (a new Synchronize).
                if self._pods.get(target.pod_uid) is target:
                    del self._pods[target.pod_uid]
                continue
            if self._put_back(target, report) and target.key not in self._pending:
                self._pending[target.key] = target  # for systemd to hold ours again

    def _put_back(self, target: UnitTarget, report: WriteReport) -> bool:
        """Count and log files found changed (and already rewritten); whether there were any."""
        if not report.written:
            return False
        self.drift_repaired[target.level] += 1
        log.warning(
            "cgroup values changed by systemd, put back",
            files=[f"{w.path.name}: {w.old} -> {w.new}" for w in report.written],
            **target.where(),
        )
        return True

    def _count_set(self, target: UnitTarget, *, ok: bool) -> None:
        key = (target.level, "ok" if ok else "failed")
        self.property_sets[key] += 1


class NoSystemd:
    """systemd's families under the cgroupfs driver: all at 0, present from the start."""

    def counter_families(self) -> Iterator[CounterFamily]:
        return _counter_families(None)


def _counter_families(units: SystemdUnits | None) -> Iterator[CounterFamily]:
    yield family(
        "nri_midbatch_cgroup_drift_repaired",
        "Pod and container cgroups whose values a systemd reload changed and the "
        "plugin put back, by level",
        ("level",),
        {(level,): 0 if units is None else units.drift_repaired[level] for level in LEVELS},
    )
    yield family(
        "nri_midbatch_systemd_property_sets",
        "SetUnitProperties calls to systemd, by level and result",
        ("level", "result"),
        {
            (level, result): 0 if units is None else units.property_sets[level, result]
            for level in LEVELS
            for result in ("ok", "failed")
        },
    )
    yield single(
        "nri_midbatch_systemd_unreachable",
        "Failed attempts to connect to systemd over D-Bus",
        0 if units is None else units.unreachable,
    )
    yield single(
        "nri_midbatch_systemd_repair_passes",
        "Passes over pod and container cgroups after a burst of systemd reloads",
        0 if units is None else units.repair_passes,
    )
    yield single(
        "nri_midbatch_systemd_signals_ignored",
        "Reloading signals ignored because systemd did not send them",
        0 if units is None else units.signals_ignored,
    )


def _apply_all(
    targets: list[UnitTarget], root: Path, files: CgroupFiles
) -> list[WriteReport | CgroupPathError]:
    results: list[WriteReport | CgroupPathError] = []
    for target in targets:
        try:
            results.append(target.apply_files(root, files))
        except CgroupPathError as exc:
            results.append(exc)
    return results


def _gone(report: WriteReport) -> bool:
    return bool(report.failed) and all(f.errno == errno.ENOENT for f in report.failed)


def _bus_call(member: str, argument: str) -> Message:
    from dbus_fast import Message

    return Message(
        destination=BUS, path=BUS_PATH, interface=BUS, member=member, signature="s", body=[argument]
    )


def _check_reply(reply: Message) -> None:
    from dbus_fast import MessageType

    if reply.message_type is MessageType.ERROR:
        detail = reply.body[0] if reply.body else ""
        raise RuntimeError(f"{reply.error_name}: {detail}")


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
