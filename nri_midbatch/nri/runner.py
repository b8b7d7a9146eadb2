"""Keeping a session connected: external plugins reconnect, pre-launched ones do not.

External: the runtime never reconnects to a plugin, so we do, as a fresh
registration each time, one connection at a time. The socket path is polled
cheaply while the runtime is away; a socket that reappears (a new inode) is
tried at once, so a restarted runtime sees us again within a poll interval,
while a socket that stays broken is retried with capped exponential backoff.

Pre-launched: the runtime started us with one end of a socketpair on an
inherited fd. When that connection ends, the runtime is gone or has dropped
us, and it never restarts a plugin on the same fd, so we are done.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
from dataclasses import dataclass

import structlog

from nri_midbatch.nri.session import RegistrationError, Session

log = structlog.get_logger(__name__)

POLL_INTERVAL = 0.1


@dataclass(frozen=True, slots=True)
class Backoff:
    initial: float = 0.5
    maximum: float = 10.0
    factor: float = 2.0
    jitter: float = 0.1

    def next(self, delay: float) -> float:
        return min(delay * self.factor, self.maximum)

    def jittered(self, delay: float) -> float:
        return delay * (1 + random.uniform(-self.jitter, self.jitter))


def _socket_identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_ctime_ns


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        pass


async def _wait_for_socket(
    path: str, stale: tuple[int, int] | None, delay: float, stop: asyncio.Event
) -> None:
    """Wait `delay`, or less if a new socket appears at `path`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + delay
    while not stop.is_set():
        identity = _socket_identity(path)
        if identity is not None and identity != stale:
            return
        if identity is not None and loop.time() >= deadline:
            return
        await _wait(stop, POLL_INTERVAL)


async def _connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, path)
    except BaseException:
        sock.close()
        raise
    return sock


async def run_external(
    session: Session,
    socket_path: str,
    stop: asyncio.Event,
    backoff: Backoff | None = None,
) -> None:
    """Stay registered with the runtime at `socket_path` until `stop` is set.

    Each connection attempt after the first is told to the session's observers
    (`SessionObserver.reconnecting`)."""
    backoff = backoff or Backoff()
    delay = backoff.initial
    stale: tuple[int, int] | None = None
    attempts = 0
    said_missing = False
    while not stop.is_set():
        identity = _socket_identity(socket_path)
        if identity is None and not said_missing:
            # Once per absence: NRI disabled, a wrong path, or a directory we
            # may not enter (the runtime makes it 0700, root only) all look so.
            log.warning(
                "waiting for the runtime's NRI socket",
                socket=socket_path,
                hint="is NRI enabled, the path right, and are we root?",
            )
            said_missing = True
        elif identity is not None:
            said_missing = False
        if identity is None or identity == stale:
            await _wait_for_socket(socket_path, stale, backoff.jittered(delay), stop)
            if stop.is_set():
                return
            if _socket_identity(socket_path) == stale:
                delay = backoff.next(delay)
            stale = None
            continue
        attempts += 1
        if attempts > 1:
            session.reconnecting()
        try:
            sock = await _connect(socket_path)
        except OSError as exc:
            log.warning("cannot connect to runtime", socket=socket_path, error=str(exc))
            stale = identity
            continue
        run = asyncio.create_task(session.run(sock))
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait((run, stopping), return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not run.done():
            session.close()
        try:
            reason = await run
        except RegistrationError as exc:
            log.warning("registration failed", socket=socket_path, error=str(exc))
            stale = identity
            continue
        except Exception:
            # Whatever broke this session, the next one starts clean: only a
            # stop signal ends the runner.
            log.exception("session failed", socket=socket_path)
            stale = identity
            continue
        delay = backoff.initial
        # The same socket may still be there (the runtime dropped us but kept
        # running): do not hammer it; a new socket is tried at once.
        stale = identity
        if not stop.is_set():
            log.warning("connection to runtime lost", socket=socket_path, reason=reason)


@dataclass(frozen=True, slots=True)
class Ended:
    """How a pre-launched session ended; `failed` makes the process exit non-zero."""

    reason: str
    failed: bool


#: Close reasons of a session that ended as it should: the runtime hung up on a
#: registered plugin (it stops, or drops us), or we were told to stop.
_CLEAN_ENDS = frozenset({"closed by peer", "session closed"})


async def run_prelaunched(session: Session, fd: int) -> Ended:
    """Serve the runtime on the inherited socket `fd` until it closes.

    The runtime never restarts a pre-launched plugin on a new fd, so there is no
    retry: a failed registration or a broken session ends it, as a failure.
    """
    try:
        reason = await session.run(socket.socket(fileno=fd))
    except RegistrationError as exc:
        return Ended(str(exc), failed=True)
    except Exception as exc:
        log.exception("session failed")
        return Ended(f"{type(exc).__name__}: {exc}", failed=True)
    return Ended(reason, failed=reason not in _CLEAN_ENDS)
