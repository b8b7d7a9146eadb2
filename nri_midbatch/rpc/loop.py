"""The event loop the plugin runs on: uvloop when it is installed, else asyncio's own.

The image and `pip install nri-midbatch` have no uvloop: they run asyncio's loop,
and docs/performance.md gives its figures. uvloop (`pip install
nri-midbatch[uvloop]`) answers faster on an idle loop but keeps about 1.8 MB more
resident, which takes the plugin past its memory target on a 1,000-pod node; nothing
else changes. `NRI_MIDBATCH_EVENT_LOOP` chooses explicitly: `auto` (the default),
`asyncio` or `uvloop` (which then must be installed).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

ENV = "NRI_MIDBATCH_EVENT_LOOP"
CHOICES = ("auto", "asyncio", "uvloop")

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def loop_factory(choice: str | None = None) -> LoopFactory | None:
    """The factory for `choice` (default: from the environment); None is asyncio's loop."""
    if choice is None:
        choice = os.environ.get(ENV, "").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ValueError(f"{ENV}={choice!r}: must be one of {', '.join(CHOICES)}")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ValueError(f"{ENV}=uvloop, but uvloop is not installed") from None
        return None
    factory: LoopFactory = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T], factory: LoopFactory | None = None) -> T:
    """asyncio.run(main) on the loop `factory` makes (None: asyncio's)."""
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
