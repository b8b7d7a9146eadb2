"""`nri-midbatch replay`: read a recording, replay it, report each call and compare the replies.

Lines are read, replayed and reported one at a time (reader, runner, report, golden), so
memory does not grow with the recording.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Sequence
from pathlib import Path
from typing import TextIO

from nri_midbatch.config.model import Config
from nri_midbatch.recording.reader import Problem, read_recording
from nri_midbatch.tools.replay.compare import Row, rows
from nri_midbatch.tools.replay.golden import GoldenComparison, GoldenWriter
from nri_midbatch.tools.replay.report import SUMMARY_KEYS, JsonReport, TableReport
from nri_midbatch.tools.replay.runner import Outcome, replay

#: Exit status bits; 2 stays argparse's "cannot run".
EXIT_EXPECT_DIFFERS = 1
EXIT_CANNOT_RUN = 2
EXIT_MALFORMED_LINES = 4


class _Report:
    """What replay_command makes of each outcome and problem, as they come; it keeps no call."""

    def __init__(
        self,
        err: TextIO,
        output: JsonReport | TableReport,
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
            JsonReport(out, via_socket)
            if fmt == "json"
            else TableReport(out, recording, via_socket)
        )
        report = _Report(err, output, comparison, writer)
        items = read_recording(lines, str(recording))
        try:
            asyncio.run(
                _report_each(
                    replay(items, config, runtime_config=runtime_config, via_socket=via_socket),
                    report,
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


async def _report_each(
    replayed: AsyncGenerator[Outcome | Problem], report: Callable[[Outcome | Problem], None]
) -> None:
    # Closed here even when a report fails, so the replayed plugin's socket and tasks end first.
    async with contextlib.aclosing(replayed):
        async for item in replayed:
            report(item)
