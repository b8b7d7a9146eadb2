"""Reading a recording back: each line as an entry to replay, or the problem that keeps it out.

A line that cannot be replayed (bad JSON, unknown method, protobuf JSON that does not parse,
longer than MAX_LINE_BYTES, nested deeper than MAX_NESTING, a request too large for ttrpc) is
a Problem with its file and line; the lines after it still read. Lines are read one at a time,
so memory does not grow with the recording. Lines are read by their format version `v`
(absent: 1); unknown keys and unknown protobuf fields are ignored, so older recordings keep
replaying. Golden files are read with the same lines and the same checks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

from google.protobuf.json_format import ParseDict, ParseError
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.recording.call import Status
from nri_midbatch.recording.format import RECORD_VERSION
from nri_midbatch.wire.ttrpc import MESSAGE_LENGTH_MAX

#: Plugin-service method -> (request type, response type), from the NRI proto itself.
PLUGIN_METHODS: Mapping[str, tuple[type[Message], type[Message]]] = {
    method.name: (GetMessageClass(method.input_type), GetMessageClass(method.output_type))
    for method in api.DESCRIPTOR.services_by_name["Plugin"].methods
}

#: The longest recording or golden line read; a longer one is skipped without being held.
MAX_LINE_BYTES = 16 << 20
#: The deepest JSON nesting of a line; NRI's deepest message needs about a dozen levels.
MAX_NESTING = 64
#: The largest request replayed: what fits in a ttrpc message with its envelope (service and
#: method names, a timeout), which a runtime cannot exceed either.
MAX_REQUEST_BYTES = MESSAGE_LENGTH_MAX - 1024
_REASON_MAX = 200


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
    request = parse_message(document["request"], request_type, "request")
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
        else parse_message(document["response"], response_type, "response"),
        error=parse_status(document.get("error")),
        decisions=None if decisions is None else tuple(decisions),
    )


def parse_message(value: object, message_type: type[Message], what: str) -> Message:
    if not isinstance(value, dict):
        raise LineError(f"{what} is not a JSON object")
    try:
        return ParseDict(value, message_type(), ignore_unknown_fields=True)
    except ParseError as exc:
        reason = str(exc)
        if len(reason) > _REASON_MAX:  # the reason can quote the value, of any size
            reason = reason[:_REASON_MAX] + "..."
        raise LineError(f"{what} is not a valid {message_type.__name__}: {reason}") from None


def parse_status(value: object) -> Status | None:
    if value is None:
        return None
    if isinstance(value, dict):
        code, message = value.get("code"), value.get("message", "")
        if isinstance(code, int) and not isinstance(code, bool) and isinstance(message, str):
            return code, message
    raise LineError('error must be null or {"code": int, "message": str}')
