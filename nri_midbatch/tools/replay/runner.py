"""Driving a fresh plugin with the calls of a recording, and what it answers now.

Each recorded request goes to a fresh Session and MidBatchPlugin with the configuration given:
in process, straight into the Session's Plugin service; or `via_socket`, from a LoopbackRuntime
over a socket pair, through the same mux and ttrpc code a runtime talks to. The plugin runs in
dry-run mode, so pod-level cgroup values are decided and reported, never written.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from google.protobuf.message import Message

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.config.compile import settings_of
from nri_midbatch.config.model import Config
from nri_midbatch.nri.session import PLUGIN_SERVICE, Session
from nri_midbatch.nri.testing import LoopbackRuntime, socketpair_streams
from nri_midbatch.plugin.handlers import MidBatchPlugin
from nri_midbatch.recording.call import CallRecord, CallRecorder, NotedDecision, Status
from nri_midbatch.recording.reader import PLUGIN_METHODS, Entry, Problem
from nri_midbatch.rpc.errors import RpcError, error_status
from nri_midbatch.rpc.service import CallContext

#: Sent first when a recording does not start with Configure (a rotated-out start, say): the
#: session serves nothing until it is configured. Not part of the results.
SYNTHETIC_CONFIGURE = api.ConfigureRequest(runtime_name="replay", runtime_version="v0.0.0")

REGISTRATION_WAIT = 5.0


@dataclass(frozen=True, slots=True)
class Outcome:
    entry: Entry
    response: Message | None
    error: Status | None
    decisions: tuple[NotedDecision, ...]

    @property
    def response_changed(self) -> bool | None:
        """Whether the reply differs from the recorded one; None when none was recorded."""
        recorded = self.entry
        if recorded.response is None and recorded.error is None:
            return None
        return not same_reply((self.response, self.error), (recorded.response, recorded.error))


Reply = tuple[Message | None, Status | None]
Caller = Callable[[str, Message], Awaitable[Reply]]


def same_reply(one: Reply, other: Reply) -> bool:
    """Responses compare as serialized protobuf, errors as (code, message)."""
    (response, error), (other_response, other_error) = one, other
    return error == other_error and _wire(response) == _wire(other_response)


def _wire(message: Message | None) -> bytes | None:
    return None if message is None else message.SerializeToString(deterministic=True)


class _Collector(CallRecorder):
    """The replay's recorder: holds the records of the call being replayed."""

    def __init__(self) -> None:
        self._records: list[CallRecord] = []

    def keep(self, record: CallRecord) -> None:
        self._records.append(record)

    def take(self) -> list[CallRecord]:
        records, self._records = self._records, []
        return records


async def replay(
    items: Iterable[Entry | Problem], config: Config, *, runtime_config: bool, via_socket: bool
) -> AsyncGenerator[Outcome | Problem]:
    """Replay each entry in turn through a fresh plugin: its outcome, or a problem, as met.

    runtime_config: apply the config string of recorded Configure requests, as the plugin would
    have; false when the caller's configuration must stand. Nothing of a call is kept once it
    is yielded, so memory stays flat in the length of the recording.
    """
    collector = _Collector()
    plugin = MidBatchPlugin(settings_of(config), dry_run=True, observers=(collector,))
    # In process, a recording that starts anywhere in a session is served as it comes.
    session = Session(
        plugin, "midbatch", "10", observers=(collector,), enforce_lifecycle=via_socket
    )
    drive = _through_socket if via_socket else _in_process
    async with drive(session) as call:
        configured = False
        for item in items:
            if isinstance(item, Problem):
                yield item
                continue
            if not configured and item.method != "Configure":
                await call("Configure", SYNTHETIC_CONFIGURE)
                collector.take()
            configured = True
            response, error = await call(item.method, _request(item, runtime_config))
            decisions = tuple(d for record in collector.take() for d in record.decisions)
            yield Outcome(item, response, error, decisions)
        await plugin.after_reply.settle()


def _request(entry: Entry, runtime_config: bool) -> Message:
    if entry.method != "Configure" or runtime_config:
        return entry.request
    request: Message = api.ConfigureRequest()
    request.CopyFrom(entry.request)
    request.ClearField("config")
    return request


@asynccontextmanager
async def _in_process(session: Session) -> AsyncIterator[Caller]:
    service = session.service()

    async def call(method: str, request: Message) -> Reply:
        context = CallContext(PLUGIN_SERVICE, method, 0, None, request.ByteSize())
        try:
            # A task per call, as the connection runs them: each call gets its own context.
            return await asyncio.ensure_future(service.call(request, context)), None
        except Exception as exc:
            code, message = error_status(exc)
            return None, (int(code), message)

    yield call


@asynccontextmanager
async def _through_socket(session: Session) -> AsyncIterator[Caller]:
    (plugin_reader, plugin_writer), (runtime_reader, runtime_writer) = await socketpair_streams()
    serving = asyncio.create_task(session.run(plugin_reader, plugin_writer))
    runtime = LoopbackRuntime(runtime_reader, runtime_writer)

    async def call(method: str, request: Message) -> Reply:
        try:
            return await runtime.call(method, request, PLUGIN_METHODS[method][1]), None
        except RpcError as exc:
            return None, (int(exc.code), exc.message)

    try:
        async with asyncio.timeout(REGISTRATION_WAIT):
            await runtime.record.registered.wait()
        yield call
    finally:
        await runtime.close()
        await asyncio.gather(serving, return_exceptions=True)
