"""Counts a room keeps, described for the metrics by the room that keeps them.

Each owner of counts (the plugin's `Counters`, the pod records' store, the session, the
systemd units, ...) says what it counts where it counts it: `counter_families()` gives
each family's name, help text, label names and values. The process gathers the owners in
one list and exposes them when scraped (process/metrics.py); nothing else reads them for
the metrics.

Owners are read on the metrics server's thread while the event loop counts. A dict the
loop may add keys to is copied whole before it is iterated (`dict(d)` is one C call, under
the GIL), and a family's values are a mapping of its own (`family` builds it), which the
loop never changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

#: The label values of one series of a family.
Labels = tuple[str, ...]
_Key = TypeVar("_Key", bound=Labels)


@dataclass(frozen=True, slots=True)
class CounterFamily:
    """A family of counters: `nri_midbatch_<...>`, its help text, its labels, its series."""

    name: str
    help: str
    labels: tuple[str, ...]
    values: Mapping[Labels, int]


class Counted(Protocol):
    """An owner of counts, as the metrics ask about it."""

    def counter_families(self) -> Iterable[CounterFamily]:
        """Every family this owner counts, read on the metrics server's thread."""
        ...


def family(
    name: str,
    help: str,
    labels: tuple[str, ...],
    counts: Mapping[_Key, int],
    *,
    zeros: Iterable[Labels] = (),
) -> CounterFamily:
    """A family of the series in `counts` (copied whole first: the loop may add keys).

    `zeros`: series shown at 0 until counted. Prometheus's rate() and increase() miss the
    first rise of a series that did not exist at the scrape before, and the alerts use
    increase().
    """
    values: dict[Labels, int] = dict.fromkeys(zeros, 0)
    for series, count in dict(counts).items():
        values[series] = count
    return CounterFamily(name, help, labels, values)


def single(name: str, help: str, count: int) -> CounterFamily:
    """A family of one unlabelled counter."""
    return CounterFamily(name, help, (), {(): count})
