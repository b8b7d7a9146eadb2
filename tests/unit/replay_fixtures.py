"""A recording read and replayed whole, for tests that look at every call at the end."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path

from nri_midbatch.config.model import Config
from nri_midbatch.recording.reader import Entry, Problem, read_recording
from nri_midbatch.tools.replay.runner import Outcome, replay


def read_whole(path: Path) -> tuple[list[Entry], list[Problem]]:
    """The entries of a recording, and the problems of the lines that are none."""
    with path.open("rb") as lines:
        items = list(read_recording(lines, str(path)))
    entries = [item for item in items if isinstance(item, Entry)]
    return entries, [item for item in items if isinstance(item, Problem)]


def replay_whole(
    entries: Iterable[Entry], config: Config, *, runtime_config: bool, via_socket: bool = False
) -> list[Outcome]:
    async def outcomes() -> list[Outcome]:
        replayed = replay(entries, config, runtime_config=runtime_config, via_socket=via_socket)
        return [item async for item in replayed if isinstance(item, Outcome)]

    return asyncio.run(outcomes())
