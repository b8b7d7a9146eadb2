"""LoweringWait: a node's worth of pods waiting for their containers, read a few at a time."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from nri_midbatch.deferred import CGROUP_READS_PER_PIECE, AfterReply
from nri_midbatch.plugin.lowering import LoweringWait

from .nri_fixtures import STEP_TIMEOUT, run


def test_a_piece_of_work_reads_a_few_containers_however_many_are_lowered_at_once() -> None:
    """A request arriving meanwhile waits for one piece: a few reads, not a time slice of them."""
    after_reply = AfterReply()
    #: Containers read in each piece of work run after the reply, in order.
    pieces: list[int] = []
    written: list[str] = []
    queue = after_reply.defer

    def counted(work: Any, *args: Any) -> None:
        def piece() -> None:
            pieces.append(0)
            work(*args)

        queue(piece)

    after_reply.defer = counted  # type: ignore[method-assign]

    def lowered() -> bool:  # every pod's containers already lowered, and quick to tell
        pieces[-1] += 1
        return True

    async def scenario() -> None:
        wait = LoweringWait(after_reply)
        for pod in range(40):
            name = f"pod-{pod}"
            wait.add(name, lowered, functools.partial(written.append, name))
        wait.start()
        await asyncio.wait_for(after_reply.settle(), STEP_TIMEOUT)

    run(scenario())
    assert written == [f"pod-{pod}" for pod in range(40)]
    assert sum(pieces) == 40
    assert max(pieces) == CGROUP_READS_PER_PIECE
