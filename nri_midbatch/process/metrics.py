"""Every count of the process, gathered in one place for the metrics.

Two kinds of families make a scrape:
- what happens, as it happens: the session's observers are told (nri/session.py,
  `SessionObserver`), and the App's own (session_watch.py) feeds the series of obs/metrics.py
  (calls, their latency, registration, Synchronize, reconnects);
- what the rooms count: each owner describes its counts next to its counting
  (nri_midbatch/counts.py, `Counted`), and `Gathered` reads them all at each scrape, from
  the one list `App.counted` gives. Nothing else reads them for the metrics.

And the mode in force, a gauge (`ModeCollector`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from nri_midbatch.counts import Counted


class Gathered(Collector):
    """The counter families of every owner `owners()` gives, read at each scrape.

    `owners` is asked at each scrape: some owners are replaced while the process runs (a
    Synchronize starts a new memory of pods).
    """

    def __init__(self, owners: Callable[[], Iterable[Counted]]) -> None:
        self._owners = owners

    def collect(self) -> Iterator[CounterMetricFamily]:
        for owner in self._owners():
            for counted in owner.counter_families():
                family = CounterMetricFamily(counted.name, counted.help, labels=counted.labels)
                for labels, count in counted.values.items():
                    family.add_metric(labels, count)
                yield family


class ModeCollector(Collector):
    """`nri_midbatch_mode{mode}`: 1 for the mode in force (enforce or observe), else 0."""

    def __init__(self, mode: Callable[[], str]) -> None:
        self._mode = mode

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self._mode()
        family = GaugeMetricFamily(
            "nri_midbatch_mode",
            "1 for the mode in force: enforce sets values, observe only reports them",
            labels=("mode",),
        )
        for mode in ("enforce", "observe"):
            family.add_metric((mode,), int(mode == now))
        yield family
