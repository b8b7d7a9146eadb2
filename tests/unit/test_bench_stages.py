"""`python -m bench.stages --clock calls|opcodes`: counts of work that no load changes.

No timing is asserted: the counts are what the tool promises to be the same on any
machine, round after round, for the same code.
"""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path

import pytest

from bench import stages
from nri_midbatch.obs.logging import configure_logging, open_sink

pytestmark = pytest.mark.bench

ROUNDS = 6


@pytest.fixture(scope="module", params=stages.COUNTS)
def counts(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[int]]:
    workdir: Path = tmp_path_factory.mktemp(request.param)
    configure_logging("info", "json", open_sink(str(workdir / "plugin.log"), False))
    return asyncio.run(stages._measure(ROUNDS, workdir, request.param))


def test_each_stage_counts_nearly_the_same_work_every_round_once_the_caches_are_filled(
    counts: dict[str, list[int]],
) -> None:
    # The first rounds fill the plugin's caches (and the interpreter's): left out. A
    # round now and then runs a few instructions more (a branch taken now and then: the
    # work after the reply found already scheduled, say), never a stage's worth.
    for name, values in counts.items():
        assert len(values) == ROUNDS
        later = values[2:]
        usual = statistics.median(later)
        assert usual > 0, name
        assert all(abs(value - usual) <= usual / 50 for value in later), (name, values)


def test_the_parts_and_stages_add_up_to_at_most_their_whole(counts: dict[str, list[int]]) -> None:
    last = {name: statistics.median(values) for name, values in counts.items()}
    assert last["views"] + last["decide"] < last["handler"]
    assert sum(last[name] for name in stages.STAGES) < last["in-process total"]
