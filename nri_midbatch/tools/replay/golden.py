"""Golden files: the replies of a replay, written (`--write-expected`) or compared (`--expect`).

A golden file is JSON lines of {"v", "method", "response", "error"} in call order, as
GoldenWriter writes them; a recording is a valid golden file too (its other keys are ignored).
Responses are compared as serialized protobuf.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO, TextIO

from google.protobuf.message import Message

from nri_midbatch.recording.call import Status
from nri_midbatch.recording.format import RECORD_VERSION, json_line, message_json, status_json
from nri_midbatch.recording.reader import (
    PLUGIN_METHODS,
    LineError,
    Problem,
    parse_message,
    parse_status,
    read_lines,
)
from nri_midbatch.tools.replay.runner import Outcome, same_reply


@dataclass(frozen=True, slots=True)
class _Reply:
    method: str
    response: Message | None
    error: Status | None

    @classmethod
    def of(cls, outcome: Outcome) -> _Reply:
        return cls(outcome.entry.method, outcome.response, outcome.error)

    def same(self, other: _Reply) -> bool:
        return self.method == other.method and same_reply(
            (self.response, self.error), (other.response, other.error)
        )


def _reply_json(reply: _Reply) -> dict[str, Any]:
    return {
        "method": reply.method,
        "response": None if reply.response is None else message_json(reply.response),
        "error": status_json(reply.error),
    }


def _parse_expected(document: Mapping[str, Any]) -> _Reply:
    method = document.get("method")
    if not isinstance(method, str) or method not in PLUGIN_METHODS:
        raise LineError(f"unknown method {method!r}")
    response = document.get("response")
    return _Reply(
        method,
        None
        if response is None
        else parse_message(response, PLUGIN_METHODS[method][1], "response"),
        parse_status(document.get("error")),
    )


def _canonical(reply: _Reply | None) -> list[str]:
    """Indented, key-sorted JSON, so the diff points at the field that moved."""
    if reply is None:
        return []
    document = _reply_json(reply)
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
        got = _Reply.of(outcome)
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
                line = json_line({"v": RECORD_VERSION, **_reply_json(_Reply.of(outcome))})
                self._file.write(line)
            except OSError as exc:
                self.error = exc

    def close(self) -> None:
        try:
            self._file.close()
        except OSError as exc:
            self.error = self.error or exc
