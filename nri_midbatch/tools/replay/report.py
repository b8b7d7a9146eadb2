"""The replay's report: a table of every decision next to the recorded one, or JSON.

Both are written call by call as the outcomes come, so neither grows with the recording; the
summary counts what the calls and lines came to.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.nri.events import Event
from nri_midbatch.policy.calculate import UNLIMITED
from nri_midbatch.recording.format import decision_json, message_json, status_json, values_json
from nri_midbatch.recording.reader import Entry, Problem
from nri_midbatch.tools.explain import memory_short
from nri_midbatch.tools.replay.compare import Row, change_text
from nri_midbatch.tools.replay.runner import Outcome

TABLE_LEGEND = (
    "CHANGE: = as recorded; a -> b what this configuration changes; ? nothing recorded to "
    "compare; now untouched: values were set then, none now (observe mode decides values "
    "but sets none), was untouched: the reverse.\n"
    "Containers compare the values in the reply; pods, the recorded decision."
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
        "error": status_json(outcome.error),
        "recorded_error": status_json(entry.error),
        "response_changed": outcome.response_changed,
        "decisions": decisions,
    }


#: Problems listed in `--format json` (stderr names them all; the summary counts them all).
MAX_LISTED_PROBLEMS = 1000
#: Table rows held to size the columns; a longer table is printed in blocks this long.
TABLE_BLOCK_ROWS = 1000


class JsonReport:
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


class TableReport:
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
