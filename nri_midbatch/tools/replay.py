"""Replaying a recording through the plugin, and comparing what it answers now.

Each recorded request goes to a fresh Session and MidBatchPlugin with the configuration given:
in process, straight into the Session's Plugin service; or `via_socket`, from a LoopbackRuntime
over a socket pair, through the same mux and ttrpc code a runtime talks to. The plugin runs in
dry-run mode, so pod-level cgroup values are decided and reported, never written.

A line that cannot be replayed (bad JSON, unknown method, protobuf JSON that does not parse,
longer than MAX_LINE_BYTES, nested deeper than MAX_NESTING, a request too large for ttrpc) is
reported with its file and line and skipped; the rest still replays. Lines are read, replayed
and reported one at a time, so memory does not grow with the recording. Lines are read by their
format version `v` (absent: 1); unknown keys and unknown protobuf fields are ignored, so older
recordings keep replaying.

Golden files (`--expect`) are JSON lines of {"method", "response", "error"} in call order, as
`write_expected` writes them; a recording is a valid golden file too (its other keys are
ignored). Responses are compared as serialized protobuf.

Longer than the house's 400 lines: reading, running, comparing and reporting are one
streaming pipeline, a line at a time; the golden-file section is the first to move out when
replay next grows.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import json
import socket
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from google.protobuf.json_format import ParseDict, ParseError
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.config.compile import settings_of
from nri_midbatch.config.model import Config
from nri_midbatch.nri.events import Event
from nri_midbatch.nri.session import PLUGIN_SERVICE, Session
from nri_midbatch.nri.testing import LoopbackRuntime
from nri_midbatch.plugin.codec import current_values
from nri_midbatch.plugin.handlers import MidBatchPlugin
from nri_midbatch.policy import CgroupValues
from nri_midbatch.policy.calculate import UNLIMITED
from nri_midbatch.process.record import (
    RECORD_VERSION,
    Call,
    CallRecord,
    NotedDecision,
    decision_json,
    json_line,
    message_json,
    note_decision,
    values_json,
)
from nri_midbatch.rpc.errors import RpcError, error_status
from nri_midbatch.rpc.service import CallContext
from nri_midbatch.tools.explain import memory_short
from nri_midbatch.wire.ttrpc import MESSAGE_LENGTH_MAX

#: Plugin-service method -> (request type, response type), from the NRI proto itself.
PLUGIN_METHODS: Mapping[str, tuple[type[Message], type[Message]]] = {
    method.name: (GetMessageClass(method.input_type), GetMessageClass(method.output_type))
    for method in api.DESCRIPTOR.services_by_name["Plugin"].methods
}

#: Sent first when a recording does not start with Configure (a rotated-out start, say): the
#: session serves nothing until it is configured. Not part of the results.
SYNTHETIC_CONFIGURE = api.ConfigureRequest(runtime_name="replay", runtime_version="v0.0.0")

REGISTRATION_WAIT = 5.0

#: The longest recording or golden line read; a longer one is skipped without being held.
MAX_LINE_BYTES = 16 << 20
#: The deepest JSON nesting of a line; NRI's deepest message needs about a dozen levels.
MAX_NESTING = 64
#: The largest request replayed: what fits in a ttrpc message with its envelope (service and
#: method names, a timeout), which a runtime cannot exceed either.
MAX_REQUEST_BYTES = MESSAGE_LENGTH_MAX - 1024
_REASON_MAX = 200

Status = tuple[int, str]


class LineError(ValueError):
    """Why one recording line cannot be replayed."""


@dataclass(frozen=True, slots=True)
class Problem:
    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


@dataclass(frozen=True, slots=True)
class Entry:
    """One replayable line of a recording."""

    line: int
    method: str
    request: Message
    response: Message | None
    error: Status | None
    #: The recorded decisions; None when the line has none (older recordings).
    decisions: tuple[Mapping[str, Any], ...] | None


# -- reading -------------------------------------------------------------------


def read_lines(lines: BinaryIO) -> Iterator[tuple[int, dict[str, Any] | LineError]]:
    """(line number, JSON object or why not) for every non-blank line.

    A line over MAX_LINE_BYTES is skipped without being held, and JSON nested deeper than
    MAX_NESTING is refused, so no line can exhaust memory or the stack.
    """
    number = 0
    while raw := lines.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while (rest := lines.readline(1 << 20)) and not rest.endswith(b"\n"):
                pass
            yield number, LineError(f"longer than {MAX_LINE_BYTES} bytes")
            continue
        text = raw.decode("utf-8", errors="replace")
        if text.strip():
            yield number, _parse_line(text)


def _parse_line(text: str) -> dict[str, Any] | LineError:
    try:
        document = json.loads(text)
    except RecursionError:
        return LineError(f"nested deeper than {MAX_NESTING} levels")
    except ValueError as exc:
        return LineError(f"not valid JSON: {exc}")
    if _too_deep(document):
        return LineError(f"nested deeper than {MAX_NESTING} levels")
    if not isinstance(document, dict):
        return LineError("not a JSON object")
    return document


def _too_deep(document: object) -> bool:
    stack: list[tuple[Any, int]] = [(document, 1)] if isinstance(document, dict | list) else []
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, dict | list):
                if depth >= MAX_NESTING:
                    return True
                stack.append((child, depth + 1))
    return False


def read_recording(lines: BinaryIO, name: str) -> Iterator[Entry | Problem]:
    """Each line of a recording, as an entry to replay or the problem that keeps it out."""
    for number, document in read_lines(lines):
        try:
            if isinstance(document, LineError):
                raise document
            entry = parse_entry(number, document)
        except LineError as exc:
            yield Problem(name, number, str(exc))
            continue
        yield entry


def load_recording(path: Path) -> tuple[list[Entry], list[Problem]]:
    entries: list[Entry] = []
    problems: list[Problem] = []
    with path.open("rb") as lines:
        for item in read_recording(lines, str(path)):
            if isinstance(item, Problem):
                problems.append(item)
            else:
                entries.append(item)
    return entries, problems


def parse_entry(number: int, document: Mapping[str, Any]) -> Entry:
    version = document.get("v", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise LineError(f"format version {version!r} is not a positive integer")
    if version > RECORD_VERSION:
        raise LineError(f"format version {version} is newer than this replay ({RECORD_VERSION})")
    method = document.get("method")
    if not isinstance(method, str) or method not in PLUGIN_METHODS:
        raise LineError(f"unknown method {method!r}")
    request_type, response_type = PLUGIN_METHODS[method]
    if "request" not in document:
        raise LineError("no request")
    decisions = document.get("decisions")
    if decisions is not None and not (
        isinstance(decisions, list) and all(isinstance(d, dict) for d in decisions)
    ):
        raise LineError("decisions must be a list of objects")
    request = _message(document["request"], request_type, "request")
    size = request.ByteSize()
    if size > MAX_REQUEST_BYTES:
        raise LineError(
            f"request is {size} bytes, over ttrpc's message limit ({MAX_REQUEST_BYTES} for a "
            "request): no runtime can have sent it"
        )
    return Entry(
        line=number,
        method=method,
        request=request,
        response=None
        if document.get("response") is None
        else _message(document["response"], response_type, "response"),
        error=_status(document.get("error")),
        decisions=None if decisions is None else tuple(decisions),
    )


def _message(value: object, message_type: type[Message], what: str) -> Message:
    if not isinstance(value, dict):
        raise LineError(f"{what} is not a JSON object")
    try:
        return ParseDict(value, message_type(), ignore_unknown_fields=True)
    except ParseError as exc:
        reason = str(exc)
        if len(reason) > _REASON_MAX:  # the reason can quote the value, of any size
            reason = reason[:_REASON_MAX] + "..."
        raise LineError(f"{what} is not a valid {message_type.__name__}: {reason}") from None


def _status(value: object) -> Status | None:
    if value is None:
        return None
    if isinstance(value, dict):
        code, message = value.get("code"), value.get("message", "")
        if isinstance(code, int) and not isinstance(code, bool) and isinstance(message, str):
            return code, message
    raise LineError('error must be null or {"code": int, "message": str}')


# -- running -------------------------------------------------------------------


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
        return self.error != recorded.error or _wire(self.response) != _wire(recorded.response)


def _wire(message: Message | None) -> bytes | None:
    return None if message is None else message.SerializeToString(deterministic=True)


class _Collector:
    """The replay's CallRecorder: holds the records of the call being replayed."""

    def __init__(self) -> None:
        self._records: list[CallRecord] = []

    def begin(self, method: str, request: Message) -> Call:
        return Call(method, request, self._records.append)

    def take(self) -> list[CallRecord]:
        records, self._records = self._records, []
        return records


Reply = tuple[Message | None, Status | None]
Caller = Callable[[str, Message], Awaitable[Reply]]


def replay(
    entries: Iterable[Entry], config: Config, *, runtime_config: bool, via_socket: bool
) -> list[Outcome]:
    """Replay the entries through a fresh plugin.

    runtime_config: apply the config string of recorded Configure requests, as the plugin would
    have; false when the caller's configuration must stand.
    """
    outcomes: list[Outcome] = []

    def keep(item: Outcome | Problem) -> None:
        if isinstance(item, Outcome):
            outcomes.append(item)

    asyncio.run(replay_each(entries, config, keep, runtime_config, via_socket))
    return outcomes


async def replay_each(
    items: Iterable[Entry | Problem],
    config: Config,
    report: Callable[[Outcome | Problem], None],
    runtime_config: bool,
    via_socket: bool,
) -> None:
    """Replay each entry in turn and hand its outcome (or a problem, as met) to report.

    Nothing of a call is kept once it is reported, so memory stays flat in the length of
    the recording.
    """
    collector = _Collector()
    plugin = MidBatchPlugin(settings_of(config), dry_run=True, on_decision=note_decision)
    # In process, a recording that starts anywhere in a session is served as it comes.
    session = Session(
        plugin, "midbatch", "10", recorders=(collector,), enforce_lifecycle=via_socket
    )
    drive = _through_socket if via_socket else _in_process
    async with drive(session) as call:
        configured = False
        for item in items:
            if isinstance(item, Problem):
                report(item)
                continue
            if not configured and item.method != "Configure":
                await call("Configure", SYNTHETIC_CONFIGURE)
                collector.take()
            configured = True
            response, error = await call(item.method, _request(item, runtime_config))
            decisions = tuple(d for record in collector.take() for d in record.decisions)
            report(Outcome(item, response, error, decisions))
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
    plugin_end, runtime_end = socket.socketpair()
    serving = asyncio.create_task(session.run(plugin_end))
    runtime = await LoopbackRuntime.over(runtime_end)

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


# -- comparing -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Row:
    """One decision of one replayed call, next to what the recording says."""

    entry: Entry
    noted: NotedDecision
    #: What the reply (container) or the recorded decision (pod) held before; None: untouched.
    recorded: CgroupValues | None
    #: False when nothing was recorded to compare with (pod level of an older recording).
    comparable: bool
    #: What the reply carries now (container) or the decision's values (pod).
    now: CgroupValues | None

    @property
    def changed(self) -> bool:
        return self.comparable and self.recorded != self.now


def rows(outcome: Outcome) -> list[Row]:
    entry = outcome.entry
    result = []
    for noted in outcome.decisions:
        if noted.container is None:
            recorded_pod = _recorded_pod_values(entry, noted)
            result.append(
                Row(
                    entry,
                    noted,
                    recorded=recorded_pod[1],
                    comparable=recorded_pod[0],
                    now=noted.decision.values,
                )
            )
            continue
        container_id = noted.container.id
        result.append(
            Row(
                entry,
                noted,
                recorded=sent_values(entry.response, container_id),
                comparable=outcome.response_changed is not None,
                now=sent_values(outcome.response, container_id),
            )
        )
    return result


def sent_values(response: Message | None, container_id: str) -> CgroupValues | None:
    """The values a reply sets for a container, or None if it leaves the container alone."""
    if isinstance(response, api.CreateContainerResponse):
        adjust = response.adjust
        has = response.HasField("adjust") and adjust.HasField("linux")
        if has and adjust.linux.HasField("resources"):
            return _reply_values(adjust.linux.resources)
        return None
    if isinstance(response, api.UpdateContainerResponse | api.SynchronizeResponse):
        for update in response.update:
            if update.container_id == container_id and update.linux.HasField("resources"):
                return _reply_values(update.linux.resources)
    return None


def _reply_values(resources: api.LinuxResources) -> CgroupValues:
    """current_values, with a field the reply does not set as None (a quota-only reply)."""
    values = current_values(resources)
    return CgroupValues(
        values.cpu_shares if resources.cpu.HasField("shares") else None,
        values.cpu_quota,
        values.memory_limit if resources.memory.HasField("limit") else None,
    )


def _recorded_pod_values(entry: Entry, noted: NotedDecision) -> tuple[bool, CgroupValues | None]:
    if entry.decisions is None:
        return False, None
    for recorded in entry.decisions:
        if recorded.get("level") == "pod" and recorded.get("pod_uid") == noted.pod.uid:
            values = recorded.get("values")
            if not isinstance(values, dict):
                return True, None
            try:
                shares, memory = values["cpu_shares"], values["memory_limit"]
                return True, CgroupValues(
                    None if shares is None else int(shares),
                    int(values["cpu_quota"]),
                    None if memory is None else int(memory),
                )
            except (KeyError, TypeError, ValueError):
                return False, None
    return True, None


def change_text(row: Row) -> str:
    if not row.comparable:
        return "?"
    if not row.changed:
        return "="
    before, after = row.recorded, row.now
    if before is None:
        return "was untouched"
    if after is None:
        return "now untouched"
    parts = []
    for label, old, new in (
        ("shares", before.cpu_shares, after.cpu_shares),
        ("quota", before.cpu_quota, after.cpu_quota),
        ("memory", before.memory_limit, after.memory_limit),
    ):
        if old != new:
            parts.append(f"{label} {old} -> {new}")
    return ", ".join(parts)


# -- output --------------------------------------------------------------------

TABLE_LEGEND = (
    "CHANGE: = as recorded; a -> b what this configuration changes; ? nothing recorded to "
    "compare.\nContainers compare the values in the reply; pods, the recorded decision."
)
_HEADER = (
    "LINE",
    "METHOD",
    "LEVEL",
    "POD",
    "CONTAINER",
    "TIER",
    "SHARES",
    "QUOTA",
    "MEMORY",
    "CHANGE",
    "NOTE",
)


def method_label(entry: Entry) -> str:
    """The method, with the event a StateChange carries (NRI before v0.12 sends events so)."""
    request = entry.request
    if not isinstance(request, api.StateChangeEvent):
        return entry.method
    try:
        event = Event(request.event)
    except ValueError:
        return f"StateChange({request.event})"
    return "".join(word.capitalize() for word in event.name.split("_")) + " (StateChange)"


def _table_row(row: Row) -> tuple[str, ...]:
    noted = row.noted
    decision = noted.decision
    values = decision.values
    if decision.error is not None:
        note = f"invalid: {decision.error}"
    elif values is None:
        note = "no tier" if decision.tier is None else "left untouched"
    elif noted.container is None:
        note = "dry run: not written"
    else:
        note = ""
    return (
        str(row.entry.line),
        method_label(row.entry),
        "pod" if noted.container is None else "container",
        f"{noted.pod.namespace}/{noted.pod.name}",
        "-" if noted.container is None else noted.container.name,
        decision.tier or "-",
        "-" if values is None or values.cpu_shares is None else str(values.cpu_shares),
        "-" if values is None else _quota(values.cpu_quota),
        "-" if values is None or values.memory_limit is None else memory_short(values.memory_limit),
        change_text(row),
        note,
    )


def _quota(quota: int) -> str:
    return "unlimited" if quota == UNLIMITED else str(quota)


def _call_row(outcome: Outcome, note: str) -> tuple[str, ...]:
    entry = outcome.entry
    changed = outcome.response_changed
    change = "?" if changed is None else ("=" if not changed else "reply differs")
    return (str(entry.line), method_label(entry), "-", "-", "-", "-", "-", "-", "-", change, note)


SUMMARY_KEYS = (
    "calls",
    "malformed_lines",
    "replies_changed",
    "errors",
    "containers_changed",
    "pods_changed",
)


def summary_text(counts: Mapping[str, int]) -> str:
    return (
        f"{counts['calls']} calls replayed, {counts['malformed_lines']} malformed lines skipped; "
        f"{counts['replies_changed']} replies differ from the recording "
        f"({counts['containers_changed']} container and {counts['pods_changed']} pod decisions "
        f"changed); {counts['errors']} calls answered with an error.\n"
    )


def call_json(outcome: Outcome, call_rows: Sequence[Row]) -> dict[str, Any]:
    """One call of `--format json`."""
    entry = outcome.entry
    decisions = []
    for row in call_rows:
        document = decision_json(row.noted)
        document["recorded_values"] = values_json(row.recorded) if row.comparable else None
        document["sent_values"] = values_json(row.now)
        document["changed"] = row.changed if row.comparable else None
        decisions.append(document)
    return {
        "line": entry.line,
        "method": entry.method,
        "response": None if outcome.response is None else message_json(outcome.response),
        "error": _status_json(outcome.error),
        "recorded_error": _status_json(entry.error),
        "response_changed": outcome.response_changed,
        "decisions": decisions,
    }


def _status_json(status: Status | None) -> dict[str, Any] | None:
    return None if status is None else {"code": status[0], "message": status[1]}


# -- golden files --------------------------------------------------------------


def expected_json(outcome: Outcome) -> dict[str, Any]:
    response = outcome.response
    return {
        "v": RECORD_VERSION,
        "method": outcome.entry.method,
        "response": None if response is None else message_json(response),
        "error": _status_json(outcome.error),
    }


def write_expected(path: Path, outcomes: Iterable[Outcome]) -> None:
    with path.open("wb") as out:
        for outcome in outcomes:
            out.write(json_line(expected_json(outcome)))


@dataclass(frozen=True, slots=True)
class _Reply:
    method: str
    response: Message | None
    error: Status | None

    def same(self, other: _Reply) -> bool:
        return (
            self.method == other.method
            and self.error == other.error
            and _wire(self.response) == _wire(other.response)
        )


def _parse_expected(document: Mapping[str, Any]) -> _Reply:
    method = document.get("method")
    if not isinstance(method, str) or method not in PLUGIN_METHODS:
        raise LineError(f"unknown method {method!r}")
    response = document.get("response")
    return _Reply(
        method,
        None if response is None else _message(response, PLUGIN_METHODS[method][1], "response"),
        _status(document.get("error")),
    )


def _canonical(reply: _Reply | None) -> list[str]:
    """Indented, key-sorted JSON, so the diff points at the field that moved."""
    if reply is None:
        return []
    document = {
        "method": reply.method,
        "response": None if reply.response is None else message_json(reply.response),
        "error": _status_json(reply.error),
    }
    return [f"{line}\n" for line in json.dumps(document, indent=2, sort_keys=True).split("\n")]


class GoldenComparison:
    """Compares each reply with the next one of a golden file, as the replies come.

    Golden lines that cannot be read are reported on `err` and skipped. Each differing call
    gets a unified diff of its own on `err`, named by its position and recording line.
    """

    def __init__(self, lines: BinaryIO, name: str, err: TextIO) -> None:
        self._golden = read_lines(lines)
        self._name = name
        self._err = err
        self._calls = 0
        self.differs = False

    def add(self, outcome: Outcome) -> None:
        self._calls += 1
        want = self._next()
        got = _Reply(outcome.entry.method, outcome.response, outcome.error)
        if want is None or not want.same(got):
            self._diff(want, got, outcome.entry.line)

    def finish(self) -> None:
        """Golden replies left over when the recording is done differ too."""
        while (want := self._next()) is not None:
            self._calls += 1
            self._diff(want, None, None)

    def _next(self) -> _Reply | None:
        for number, document in self._golden:
            try:
                if isinstance(document, LineError):
                    raise document
                return _parse_expected(document)
            except LineError as exc:
                self._err.write(f"{Problem(self._name, number, str(exc))}\n")
        return None

    def _diff(self, want: _Reply | None, got: _Reply | None, line: int | None) -> None:
        if not self.differs:
            self._err.write(f"replies differ from {self._name}:\n")
            self.differs = True
        where = f"call {self._calls}"
        at = "" if line is None else f", recording line {line}"
        self._err.writelines(
            difflib.unified_diff(
                _canonical(want),
                _canonical(got),
                fromfile=f"{self._name} ({where}: {want.method if want else 'missing'})",
                tofile=f"replay ({where}: {got.method if got else 'missing'}{at})",
            )
        )


class GoldenWriter:
    """`--write-expected`: one golden line per reply, as they come; keeps the first error."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self.error: OSError | None = None

    def add(self, outcome: Outcome) -> None:
        if self.error is None:
            try:
                self._file.write(json_line(expected_json(outcome)))
            except OSError as exc:
                self.error = exc

    def close(self) -> None:
        try:
            self._file.close()
        except OSError as exc:
            self.error = self.error or exc


# -- the command ---------------------------------------------------------------

#: Exit status bits; 2 stays argparse's "cannot run".
EXIT_EXPECT_DIFFERS = 1
EXIT_CANNOT_RUN = 2
EXIT_MALFORMED_LINES = 4


#: Problems listed in `--format json` (stderr names them all; the summary counts them all).
MAX_LISTED_PROBLEMS = 1000
#: Table rows held to size the columns; a longer table is printed in blocks this long.
TABLE_BLOCK_ROWS = 1000


class _JsonReport:
    """`--format json`, written call by call: the same text as json.dumps(indent=2) of the
    whole document, without ever holding it."""

    def __init__(self, out: TextIO, via_socket: bool) -> None:
        self._out = out
        self._calls = 0
        self._problems: list[dict[str, Any]] = []
        mode = "socket" if via_socket else "in-process"
        out.write(f'{{\n  "mode": {json.dumps(mode)},\n  "calls": [')

    def add(self, outcome: Outcome, call_rows: Sequence[Row]) -> None:
        call = _indented(call_json(outcome, call_rows), 2)
        self._out.write(("," if self._calls else "") + "\n    " + call)
        self._calls += 1

    def problem(self, problem: Problem) -> None:
        if len(self._problems) < MAX_LISTED_PROBLEMS:
            self._problems.append({"line": problem.line, "message": problem.message})

    def finish(self, counts: Mapping[str, int]) -> None:
        problems, summary = _indented(self._problems, 1), _indented(counts, 1)
        self._out.write(
            ("\n  ]" if self._calls else "]")
            + f',\n  "problems": {problems},\n  "summary": {summary}\n}}\n'
        )


def _indented(value: object, depth: int) -> str:
    """value as json.dumps(indent=2) prints it `depth` levels into a document."""
    return json.dumps(value, indent=2).replace("\n", "\n" + "  " * depth)


class _TableReport:
    """The table: each column as wide as its widest cell, in blocks of TABLE_BLOCK_ROWS
    (a later block keeps the widths of the earlier ones and may widen them)."""

    def __init__(self, out: TextIO, recording: Path, via_socket: bool) -> None:
        self._out = out
        self._rows: list[tuple[str, ...]] = [_HEADER]
        self._widths = [0] * len(_HEADER)
        mode = "through a socket pair (mux + ttrpc)" if via_socket else "in process"
        out.write(f"Replay of {recording}, {mode}; pod-level values are decided, not written.\n\n")

    def add(self, outcome: Outcome, call_rows: Sequence[Row]) -> None:
        self._rows.extend(_table_row(row) for row in call_rows)
        if outcome.error is not None:
            code, message = outcome.error
            self._rows.append(_call_row(outcome, f"error {code}: {message}"))
        elif not call_rows and outcome.response_changed:
            self._rows.append(_call_row(outcome, "reply differs from the recording"))
        if len(self._rows) >= TABLE_BLOCK_ROWS:
            self._flush()

    def problem(self, _problem: Problem) -> None:
        pass  # on stderr only

    def _flush(self) -> None:
        for cells in self._rows:
            self._widths = [max(w, len(cell)) for w, cell in zip(self._widths, cells, strict=True)]
        self._out.writelines(
            "  ".join(cell.ljust(w) for cell, w in zip(cells, self._widths, strict=True)).rstrip()
            + "\n"
            for cells in self._rows
        )
        self._rows = []

    def finish(self, counts: Mapping[str, int]) -> None:
        self._flush()
        self._out.write(f"\n{TABLE_LEGEND}\n" + summary_text(counts))


class _Report:
    """What replay_command makes of each outcome and problem, as they come; it keeps no call."""

    def __init__(
        self,
        err: TextIO,
        output: _JsonReport | _TableReport,
        comparison: GoldenComparison | None,
        writer: GoldenWriter | None,
    ) -> None:
        self._err = err
        self._output = output
        self._comparison = comparison
        self._writer = writer
        self.counts = dict.fromkeys(SUMMARY_KEYS, 0)

    def __call__(self, item: Outcome | Problem) -> None:
        if isinstance(item, Problem):
            self._err.write(f"{item}: line skipped\n")
            self.counts["malformed_lines"] += 1
            self._output.problem(item)
            return
        call_rows = rows(item)
        self._count(item, call_rows)
        self._output.add(item, call_rows)
        if self._comparison is not None:
            self._comparison.add(item)
        if self._writer is not None:
            self._writer.add(item)

    def _count(self, outcome: Outcome, call_rows: Sequence[Row]) -> None:
        counts = self.counts
        counts["calls"] += 1
        counts["replies_changed"] += bool(outcome.response_changed)
        counts["errors"] += outcome.error is not None
        for row in call_rows:
            if row.changed:
                counts["containers_changed" if row.noted.container else "pods_changed"] += 1


def replay_command(
    recording: Path,
    config: Config,
    *,
    runtime_config: bool,
    via_socket: bool,
    fmt: str,
    expect: Path | None,
    write_expected_to: Path | None,
    out: TextIO,
    err: TextIO,
) -> int:
    """`nri-midbatch replay`: the table (or JSON) on `out`, problems and the diff on `err`."""
    with contextlib.ExitStack() as files:
        try:
            lines = files.enter_context(recording.open("rb"))
            golden = None if expect is None else files.enter_context(expect.open("rb"))
        except OSError as exc:
            err.write(f"nri-midbatch: {exc.filename}: cannot read: {exc.strerror or exc}\n")
            return EXIT_CANNOT_RUN
        try:
            writer = (
                None if write_expected_to is None else GoldenWriter(write_expected_to.open("wb"))
            )
        except OSError as exc:
            err.write(f"nri-midbatch: {write_expected_to}: cannot write: {exc.strerror or exc}\n")
            return EXIT_CANNOT_RUN
        comparison = None if golden is None else GoldenComparison(golden, str(expect), err)
        output = (
            _JsonReport(out, via_socket)
            if fmt == "json"
            else _TableReport(out, recording, via_socket)
        )
        report = _Report(err, output, comparison, writer)
        try:
            asyncio.run(
                replay_each(
                    read_recording(lines, str(recording)),
                    config,
                    report,
                    runtime_config,
                    via_socket,
                )
            )
        finally:
            if writer is not None:
                writer.close()
        if comparison is not None:
            comparison.finish()
    output.finish(report.counts)
    status = EXIT_MALFORMED_LINES if report.counts["malformed_lines"] else 0
    if comparison is not None and comparison.differs:
        status |= EXIT_EXPECT_DIFFERS
    if writer is not None and writer.error is not None:
        problem = writer.error.strerror or writer.error
        err.write(f"nri-midbatch: {write_expected_to}: cannot write: {problem}\n")
        status |= EXIT_CANNOT_RUN
    return status
