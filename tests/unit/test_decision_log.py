"""DecisionLines: a call's decision lines, written in order once its reply is out."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog

from nri_midbatch.deferred import AfterReply
from nri_midbatch.obs.logging import configure_logging, set_level
from nri_midbatch.plugin.decision_log import LINES_PER_WRITE, DecisionLines
from nri_midbatch.policy import CgroupValues, ContainerView, PodView
from nri_midbatch.policy.trace import NoTier

POD = PodView("u", "jobs", "spark-1", {}, {}, "/kubepods/besteffort/podu")
VALUES = CgroupValues(512, 100_000, 512 * 2**20)


@pytest.fixture
def sink() -> Iterator[io.StringIO]:
    out = io.StringIO()
    configure_logging("info", "json", out)
    yield out
    structlog.reset_defaults()


class CountingAfterReply(AfterReply):
    deferred = 0

    def defer(self, work: Callable[..., Any], *args: Any) -> None:
        self.deferred += 1
        super().defer(work, *args)


def lines_of(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_nothing_is_written_before_the_after_reply_work_runs(sink: io.StringIO) -> None:
    lines = DecisionLines("CreateContainer")
    lines.add("batch", POD, ContainerView("c1", "app"), VALUES)

    async def scenario() -> str:
        after_reply = AfterReply()
        lines.write_after(after_reply)
        before = sink.getvalue()
        await after_reply.settle()
        return before

    assert asyncio.run(scenario()) == ""
    (line,) = lines_of(sink)
    assert line["event"] == "decision"
    assert (line["method"], line["tier"], line["namespace"], line["pod"], line["container"]) == (
        "CreateContainer",
        "batch",
        "jobs",
        "spark-1",
        "app",
    )
    assert (line["cpu_shares"], line["cpu_quota"], line["memory_limit"]) == (
        512,
        100_000,
        512 * 2**20,
    )


def test_many_lines_keep_their_order_across_slices(sink: io.StringIO) -> None:
    count = LINES_PER_WRITE * 2 + 5
    lines = DecisionLines("Synchronize")
    for n in range(count):
        lines.add("batch", POD, ContainerView(f"c{n}", f"worker-{n}"), VALUES)
    after_reply = CountingAfterReply()

    async def scenario() -> None:
        lines.write_after(after_reply)
        await after_reply.settle()

    asyncio.run(scenario())
    # Three pieces of work: a request arriving meanwhile waits for one, not all.
    assert after_reply.deferred == 3
    assert [line["container"] for line in lines_of(sink)] == [f"worker-{n}" for n in range(count)]


def test_untouched_containers_are_written_at_debug_only(sink: io.StringIO) -> None:
    lines = DecisionLines("CreateContainer")
    lines.add(None, POD, ContainerView("c1", "app"), NoTier())

    async def write() -> None:
        after_reply = AfterReply()
        lines.write_after(after_reply)
        await after_reply.settle()

    asyncio.run(write())
    assert lines_of(sink) == []
    set_level("debug")
    asyncio.run(write())
    (line,) = lines_of(sink)
    assert (line["event"], line["level"]) == ("untouched", "debug")
    assert line["why"] == "no tier matched: pod left alone"
    assert (line["pod"], line["container"]) == ("spark-1", "app")


class CountedReason(NoTier):
    """A reason that counts how often it is made text."""

    rendered = 0

    def __str__(self) -> str:
        CountedReason.rendered += 1
        return super().__str__()


def test_a_debug_line_is_not_built_while_debug_is_off(sink: io.StringIO) -> None:
    """A Synchronize's reasons made text for nothing held up requests behind them."""
    lines = DecisionLines("Synchronize")
    for n in range(3):
        lines.add(None, POD, ContainerView(f"c{n}", "app"), CountedReason())

    async def write() -> None:
        after_reply = AfterReply()
        lines.write_after(after_reply)
        await after_reply.settle()

    CountedReason.rendered = 0
    asyncio.run(write())
    assert (CountedReason.rendered, lines_of(sink)) == (0, [])
    set_level("debug")
    asyncio.run(write())
    assert CountedReason.rendered == 3
    assert [line["why"] for line in lines_of(sink)] == ["no tier matched: pod left alone"] * 3


def test_a_level_change_reaches_lines_not_yet_written(sink: io.StringIO) -> None:
    lines = DecisionLines("CreateContainer")
    lines.add("batch", POD, ContainerView("c1", "app"), VALUES)

    async def scenario() -> None:
        after_reply = AfterReply()
        lines.write_after(after_reply)
        set_level("warning")
        await after_reply.settle()

    asyncio.run(scenario())
    assert lines_of(sink) == []
