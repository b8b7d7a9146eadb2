"""Replaying a recording through the plugin, and comparing what it answers now.

Each recorded request goes to a fresh Session and MidBatchPlugin with the configuration given:
in process, straight into the Session's Plugin service; or `via_socket`, from a LoopbackRuntime
over a socket pair, through the same mux and ttrpc code a runtime talks to. The plugin runs in
dry-run mode, so pod-level cgroup values are decided and reported, never written.

A line that cannot be replayed (bad JSON, unknown method, protobuf JSON that does not parse) is
reported with its file and line and skipped; the rest still replays. Lines are read by their
format version `v` (absent: 1); unknown keys and unknown protobuf fields are ignored, so older
recordings keep replaying.

Golden files (`--expect`) are JSON lines of {"method", "response", "error"} in call order, as
`write_expected` writes them; a recording is a valid golden file too (its other keys are
ignored). Responses are compared as serialized protobuf.
"""

from __future__ import annotations

import asyncio
import difflib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from google.protobuf.json_format import ParseDict, ParseError
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.config import Config
from nri_midbatch.explain import memory_short
from nri_midbatch.nri.events import Event
from nri_midbatch.nri.loopback import LoopbackRuntime, socketpair_streams
from nri_midbatch.nri.session import PLUGIN_SERVICE, Session
from nri_midbatch.plugin import MidBatchPlugin, current_values
from nri_midbatch.policy import CgroupValues
from nri_midbatch.policy.calculate import UNLIMITED
from nri_midbatch.record import (
    RECORD_VERSION,
    Call,
    CallRecord,
    NotedDecision,
    decision_json,
    error_status,
    json_line,
    message_json,
    note_decision,
    values_json,
)
from nri_midbatch.rpc.errors import RpcError
from nri_midbatch.rpc.service import CallContext

#: Plugin-service method -> (request type, response type), from the NRI proto itself.
PLUGIN_METHODS: Mapping[str, tuple[type[Message], type[Message]]] = {
    method.name: (GetMessageClass(method.input_type), GetMessageClass(method.output_type))
    for method in api.DESCRIPTOR.services_by_name["Plugin"].methods
}

#: Sent first when a recording does not start with Configure (a rotated-out start, say): the
#: session serves nothing until it is configured. Not part of the results.
SYNTHETIC_CONFIGURE = api.ConfigureRequest(runtime_name="replay", runtime_version="v0.0.0")

REGISTRATION_WAIT = 5.0

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


def read_lines(path: Path) -> Iterator[tuple[int, dict[str, Any] | LineError]]:
    """(line number, JSON object or why not) for every non-blank line."""
    with path.open(encoding="utf-8", errors="replace") as lines:
        for number, text in enumerate(lines, start=1):
            if not text.strip():
                continue
            try:
                document = json.loads(text)
            except ValueError as exc:
                yield number, LineError(f"not valid JSON: {exc}")
                continue
            if not isinstance(document, dict):
                yield number, LineError("not a JSON object")
                continue
            yield number, document


def load_recording(path: Path) -> tuple[list[Entry], list[Problem]]:
    entries: list[Entry] = []
    problems: list[Problem] = []
    for number, document in read_lines(path):
        try:
            if isinstance(document, LineError):
                raise document
            entries.append(parse_entry(number, document))
        except LineError as exc:
            problems.append(Problem(str(path), number, str(exc)))
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
    return Entry(
        line=number,
        method=method,
        request=_message(document["request"], request_type, "request"),
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
        raise LineError(f"{what} is not a valid {message_type.__name__}: {exc}") from None


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
    """The replay's CallRecorder: keeps each call's decisions in memory."""

    def __init__(self) -> None:
        self.records: list[CallRecord] = []

    def begin(self, method: str, request: Message) -> Call:
        return Call(method, request, self.records.append)


def replay(
    entries: Sequence[Entry], config: Config, *, runtime_config: bool, via_socket: bool
) -> list[Outcome]:
    """Replay the entries through a fresh plugin.

    runtime_config: apply the config string of recorded Configure requests, as the plugin would
    have; false when the caller's configuration must stand.
    """
    return asyncio.run(_replay(entries, config, runtime_config, via_socket))


async def _replay(
    entries: Sequence[Entry], config: Config, runtime_config: bool, via_socket: bool
) -> list[Outcome]:
    collector = _Collector()
    plugin = MidBatchPlugin(config, dry_run=True, on_decision=note_decision)
    session = Session(plugin, "midbatch", "10", recorders=(collector,))
    calls = [(entry.method, _request(entry, runtime_config)) for entry in entries]
    if not entries or entries[0].method != "Configure":
        calls.insert(0, ("Configure", SYNTHETIC_CONFIGURE))
    drive = _through_socket if via_socket else _in_process
    replies = await drive(session, calls, collector)
    await plugin.after_reply.settle()
    synthetic = len(calls) - len(entries)
    outcomes = []
    for entry, (response, error, records) in zip(entries, replies[synthetic:], strict=True):
        decisions = tuple(d for record in records for d in record.decisions)
        outcomes.append(Outcome(entry, response, error, decisions))
    return outcomes


def _request(entry: Entry, runtime_config: bool) -> Message:
    if entry.method != "Configure" or runtime_config:
        return entry.request
    request: Message = api.ConfigureRequest()
    request.CopyFrom(entry.request)
    request.ClearField("config")
    return request


Reply = tuple[Message | None, Status | None, list[CallRecord]]


async def _in_process(
    session: Session, calls: Sequence[tuple[str, Message]], collector: _Collector
) -> list[Reply]:
    service = session.service()
    replies: list[Reply] = []
    for method, request in calls:
        handler = service.methods[method].handler
        context = CallContext(PLUGIN_SERVICE, method, 0, None)
        seen = len(collector.records)
        try:
            # A task per call, as the connection runs them: each call gets its own context.
            response = await asyncio.ensure_future(handler(request, context))
            replies.append((response, None, collector.records[seen:]))
        except Exception as exc:
            replies.append((None, error_status(exc), collector.records[seen:]))
    return replies


async def _through_socket(
    session: Session, calls: Sequence[tuple[str, Message]], collector: _Collector
) -> list[Reply]:
    (plugin_reader, plugin_writer), (runtime_reader, runtime_writer) = await socketpair_streams()
    serving = asyncio.create_task(session.run(plugin_reader, plugin_writer))
    runtime = LoopbackRuntime(runtime_reader, runtime_writer)
    replies: list[Reply] = []
    try:
        async with asyncio.timeout(REGISTRATION_WAIT):
            await runtime.record.registered.wait()
        for method, request in calls:
            seen = len(collector.records)
            response_type = PLUGIN_METHODS[method][1]
            try:
                response = await runtime.call(method, request, response_type)
            except RpcError as exc:
                replies.append((None, (int(exc.code), exc.message), collector.records[seen:]))
            else:
                replies.append((response, None, collector.records[seen:]))
    finally:
        await runtime.close()
        await asyncio.gather(serving, return_exceptions=True)
    return replies


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
            return current_values(adjust.linux.resources)
        return None
    if isinstance(response, api.UpdateContainerResponse | api.SynchronizeResponse):
        for update in response.update:
            if update.container_id == container_id and update.linux.HasField("resources"):
                return current_values(update.linux.resources)
    return None


def _recorded_pod_values(entry: Entry, noted: NotedDecision) -> tuple[bool, CgroupValues | None]:
    if entry.decisions is None:
        return False, None
    for recorded in entry.decisions:
        if recorded.get("level") == "pod" and recorded.get("pod_uid") == noted.pod.uid:
            values = recorded.get("values")
            if not isinstance(values, dict):
                return True, None
            try:
                return True, CgroupValues(
                    int(values["cpu_shares"]), int(values["cpu_quota"]), int(values["memory_limit"])
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


def render_table(outcomes: Sequence[Outcome]) -> str:
    table: list[tuple[str, ...]] = [_HEADER]
    for outcome in outcomes:
        call_rows = rows(outcome)
        for row in call_rows:
            table.append(_table_row(row))
        if outcome.error is not None:
            code, message = outcome.error
            table.append(_call_row(outcome, f"error {code}: {message}"))
        elif not call_rows and outcome.response_changed:
            table.append(_call_row(outcome, "reply differs from the recording"))
    widths = [max(len(cells[i]) for cells in table) for i in range(len(table[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(cells, widths, strict=True)).rstrip()
        for cells in table
    ]
    return "\n".join(lines) + "\n"


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
        "-" if values is None else str(values.cpu_shares),
        "-" if values is None else _quota(values.cpu_quota),
        "-" if values is None else memory_short(values.memory_limit),
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


def summary(outcomes: Sequence[Outcome], problems: Sequence[Problem]) -> dict[str, int]:
    all_rows = [row for outcome in outcomes for row in rows(outcome)]
    return {
        "calls": len(outcomes),
        "malformed_lines": len(problems),
        "replies_changed": sum(1 for o in outcomes if o.response_changed),
        "errors": sum(1 for o in outcomes if o.error is not None),
        "containers_changed": sum(1 for r in all_rows if r.changed and r.noted.container),
        "pods_changed": sum(1 for r in all_rows if r.changed and r.noted.container is None),
    }


def summary_text(counts: Mapping[str, int]) -> str:
    return (
        f"{counts['calls']} calls replayed, {counts['malformed_lines']} malformed lines skipped; "
        f"{counts['replies_changed']} replies differ from the recording "
        f"({counts['containers_changed']} container and {counts['pods_changed']} pod decisions "
        f"changed); {counts['errors']} calls answered with an error.\n"
    )


def render_json(
    outcomes: Sequence[Outcome], problems: Sequence[Problem], *, via_socket: bool
) -> str:
    calls = []
    for outcome in outcomes:
        entry = outcome.entry
        decisions = []
        for row in rows(outcome):
            document = decision_json(row.noted)
            document["recorded_values"] = values_json(row.recorded) if row.comparable else None
            document["sent_values"] = values_json(row.now)
            document["changed"] = row.changed if row.comparable else None
            decisions.append(document)
        calls.append(
            {
                "line": entry.line,
                "method": entry.method,
                "response": None if outcome.response is None else message_json(outcome.response),
                "error": _status_json(outcome.error),
                "recorded_error": _status_json(entry.error),
                "response_changed": outcome.response_changed,
                "decisions": decisions,
            }
        )
    document = {
        "mode": "socket" if via_socket else "in-process",
        "calls": calls,
        "problems": [{"line": p.line, "message": p.message} for p in problems],
        "summary": summary(outcomes, problems),
    }
    return json.dumps(document, indent=2) + "\n"


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


def compare_expected(path: Path, outcomes: Sequence[Outcome]) -> tuple[list[Problem], str]:
    """Problems reading the golden file, and a unified diff; both empty when the replies match.

    Each differing call gets a diff of its own, named by its position and recording line.
    """
    expected: list[_Reply] = []
    problems: list[Problem] = []
    for number, document in read_lines(path):
        try:
            if isinstance(document, LineError):
                raise document
            expected.append(_parse_expected(document))
        except LineError as exc:
            problems.append(Problem(str(path), number, str(exc)))
    replayed = [_Reply(o.entry.method, o.response, o.error) for o in outcomes]
    diffs = []
    for index in range(max(len(expected), len(replayed))):
        want = expected[index] if index < len(expected) else None
        got = replayed[index] if index < len(replayed) else None
        if want is not None and got is not None and want.same(got):
            continue
        where = f"call {index + 1}"
        line = f", recording line {outcomes[index].entry.line}" if got is not None else ""
        diff = difflib.unified_diff(
            _canonical(want),
            _canonical(got),
            fromfile=f"{path} ({where}: {want.method if want else 'missing'})",
            tofile=f"replay ({where}: {got.method if got else 'missing'}{line})",
        )
        diffs.append("".join(diff))
    return problems, "".join(diffs)


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


# -- the command ---------------------------------------------------------------

#: Exit status bits; 2 stays argparse's "cannot run".
EXIT_EXPECT_DIFFERS = 1
EXIT_CANNOT_RUN = 2
EXIT_MALFORMED_LINES = 4


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
    try:
        entries, problems = load_recording(recording)
    except OSError as exc:
        err.write(f"nri-midbatch: {recording}: cannot read: {exc.strerror or exc}\n")
        return EXIT_CANNOT_RUN
    for problem in problems:
        err.write(f"{problem}: line skipped\n")
    outcomes = replay(entries, config, runtime_config=runtime_config, via_socket=via_socket)
    if fmt == "json":
        out.write(render_json(outcomes, problems, via_socket=via_socket))
    else:
        mode = "through a socket pair (mux + ttrpc)" if via_socket else "in process"
        out.write(f"Replay of {recording}, {mode}; pod-level values are decided, not written.\n\n")
        out.write(render_table(outcomes))
        out.write(f"\n{TABLE_LEGEND}\n" + summary_text(summary(outcomes, problems)))
    status = EXIT_MALFORMED_LINES if problems else 0
    if write_expected_to is not None:
        write_expected(write_expected_to, outcomes)
    if expect is not None:
        try:
            golden_problems, diff = compare_expected(expect, outcomes)
        except OSError as exc:
            err.write(f"nri-midbatch: {expect}: cannot read: {exc.strerror or exc}\n")
            return EXIT_CANNOT_RUN
        for problem in golden_problems:
            err.write(f"{problem}\n")
        if diff:
            err.write(f"replies differ from {expect}:\n{diff}")
            status |= EXIT_EXPECT_DIFFERS
    return status
