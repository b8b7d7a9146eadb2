"""A stand-in for systemd's manager on a private dbus-daemon, for the systemd-driver tests.

It keeps, per unit, the values systemd 252 would: what SetUnitProperties set
(in memory, written into the unit's cgroup files at once) and what its runtime
drop-in says (the CPU quota in whole percent of a CPU, as systemd writes
`CPUQuota=%0.f%%`). `daemon_reload` writes the drop-in values back into every
unit's files between Reloading(true) and Reloading(false), as systemd does.

No `from __future__ import annotations` here: dbus-fast reads the D-Bus
signatures from the annotations.
"""

import asyncio
import contextlib
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

from dbus_fast import DBusError, Message, MessageType
from dbus_fast.aio import MessageBus
from dbus_fast.service import ServiceInterface, method
from dbus_fast.service import signal as dbus_signal

INFINITY = (1 << 64) - 1
PERIOD = 100_000


@dataclass
class Held:
    weight: int
    quota_per_sec: int  # INFINITY: no quota
    memory: int  # INFINITY: no limit


def percent_truncated(held: Held) -> Held:
    """What systemd 252 reads back from its own drop-in after a reload."""
    quota = held.quota_per_sec
    if quota != INFINITY:
        quota = quota // 10_000 * 10_000
    return Held(held.weight, quota, held.memory)


def write_files(directory: Path, held: Held) -> None:
    quota = held.quota_per_sec
    cpu_max = "max" if quota == INFINITY else str(max(quota * PERIOD // 1_000_000, 1000))
    (directory / "cpu.weight").write_text(f"{held.weight}\n")
    (directory / "cpu.max").write_text(f"{cpu_max} {PERIOD}\n")
    (directory / "memory.max").write_text(
        "max\n" if held.memory == INFINITY else f"{held.memory}\n"
    )


class FakeManager(ServiceInterface):
    def __init__(self) -> None:
        super().__init__("org.freedesktop.systemd1.Manager")
        self.units: dict[str, Path] = {}
        self.drop_ins: dict[str, Held] = {}
        self.calls: list[tuple[str, bool, list[tuple[str, object]]]] = []
        self.subscribers = 0
        self._changed = asyncio.Event()

    def add_unit(self, name: str, directory: Path, held: Held) -> None:
        """A unit as the runtime or kubelet created it, its files as systemd wrote them."""
        directory.mkdir(parents=True, exist_ok=True)
        self.units[name] = directory
        self.drop_ins[name] = percent_truncated(held)
        write_files(directory, held)

    async def wait_calls(self, count: int) -> None:
        while len(self.calls) < count:
            self._changed.clear()
            await self._changed.wait()

    async def wait_unit_calls(self, unit: str, count: int) -> None:
        while sum(call[0] == unit for call in self.calls) < count:
            self._changed.clear()
            await self._changed.wait()

    async def wait_subscribers(self, count: int) -> None:
        while self.subscribers < count:
            self._changed.clear()
            await self._changed.wait()

    def daemon_reload(self) -> None:
        self.Reloading(True)
        for name, directory in self.units.items():
            write_files(directory, self.drop_ins[name])
        self.Reloading(False)

    @method()
    def Subscribe(self) -> None:
        self.subscribers += 1
        self._changed.set()

    @method()
    def SetUnitProperties(self, name: "s", runtime: "b", properties: "a(sv)") -> None:  # type: ignore[name-defined,valid-type] # noqa: F821
        # Refusing unknown units stands for any error reply: real systemd 252
        # accepts properties for any unit name (measured).
        if name not in self.units:
            raise DBusError("org.freedesktop.systemd1.NoSuchUnit", f"Unit {name} not loaded.")
        values = [(key, variant.value) for key, variant in properties]
        self.calls.append((name, runtime, values))
        self._changed.set()
        held = self.drop_ins[name]
        now = Held(held.weight, held.quota_per_sec, held.memory)
        for key, value in values:
            if key == "CPUWeight":
                now.weight = value
            elif key == "CPUQuotaPerSecUSec":
                now.quota_per_sec = value
            elif key == "MemoryMax":
                now.memory = value
        self.drop_ins[name] = percent_truncated(now)
        write_files(self.units[name], now)

    @dbus_signal()
    def Reloading(self, active: bool) -> "b":  # type: ignore[name-defined] # noqa: F821
        return active


async def peers(bus: MessageBus) -> set[str]:
    """The unique names on the bus but `bus`'s own."""
    reply = await bus.call(
        Message(
            destination="org.freedesktop.DBus",
            path="/org/freedesktop/DBus",
            interface="org.freedesktop.DBus",
            member="ListNames",
        )
    )
    names: list[str] = reply.body[0]
    return {name for name in names if name.startswith(":") and name != bus.unique_name}


async def ping(bus: MessageBus, destination: str) -> None:
    """A round trip to `destination`: what `bus` sent it before has been handled."""
    reply = await bus.call(
        Message(
            destination=destination, path="/", interface="org.freedesktop.DBus.Peer", member="Ping"
        )
    )
    assert reply.message_type is MessageType.METHOD_RETURN, reply.body


def send_reloading(bus: MessageBus, destination: str | None, active: bool) -> None:
    """A `Reloading` signal that looks like systemd's, from whoever `bus` is."""
    bus.send(
        Message.new_signal(
            "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1.Manager",
            "Reloading",
            "b",
            [active],
        )
        if destination is None
        else Message(
            message_type=MessageType.SIGNAL,
            destination=destination,
            path="/org/freedesktop/systemd1",
            interface="org.freedesktop.systemd1.Manager",
            member="Reloading",
            signature="b",
            body=[active],
        )
    )


@contextlib.contextmanager
def private_bus(address: str | None = None) -> Iterator[str]:
    """A dbus-daemon of our own (at `address`, if given); yields its address."""
    listen = [] if address is None else [f"--address={address}"]
    daemon = subprocess.Popen(
        ["dbus-daemon", "--session", "--print-address", "--nofork", *listen],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert daemon.stdout is not None
        address = daemon.stdout.readline().strip()
        assert address, "dbus-daemon printed no address"
        yield address
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=10)


@contextlib.asynccontextmanager
async def serve_manager(address: str, manager: FakeManager) -> AsyncIterator[MessageBus]:
    """The fake manager on the bus, as org.freedesktop.systemd1, while in the block."""
    bus = await MessageBus(bus_address=address).connect()
    try:
        bus.export("/org/freedesktop/systemd1", manager)
        await bus.request_name("org.freedesktop.systemd1")
        yield bus
    finally:
        bus.disconnect()
        await bus.wait_for_disconnect()  # type: ignore[no-untyped-call]
