"""Counters, gauges and histograms, written in Prometheus's text format 0.0.4.

Our own rather than prometheus_client's: importing that package loads its HTTP
servers, `email`, `urllib.request` and three compressors whatever is used, about
2.6 MB of a plugin that must stay small on every node (docs/performance.md). What
the plugin needs is a few labelled families and one text rendering.

The families are changed on the plugin's loop and rendered on the metrics
server's thread, without a lock: only the loop's thread writes them, a read under
the GIL sees a whole int or float, and a rendering copies a histogram's counts
before it sums them, so its `+Inf` bucket and `_count` always agree. A scrape may see
one observation's count and not yet its sum; Prometheus's rate() of either does
not mind.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Generic, Literal, NamedTuple, Protocol, TypeVar

__all__ = [
    "CONTENT_TYPE",
    "Collector",
    "Counter",
    "CounterChild",
    "Family",
    "Gauge",
    "GaugeChild",
    "Histogram",
    "HistogramChild",
    "Registry",
]

#: The header that tells a scraper which parser to use for `Registry.render()`.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Kind = Literal["counter", "gauge", "histogram"]
Labels = tuple[str, ...]


class Family(NamedTuple):
    """One metric family at one scrape: what a `Collector` yields.

    For a counter, `name` is without `_total`, which the text gets. A
    histogram's samples are written by `Histogram` itself, not through here.
    """

    name: str
    documentation: str
    kind: Kind
    label_names: Labels
    samples: Mapping[Labels, float]


class Collector(Protocol):
    """Families made at scrape time from state kept elsewhere."""

    def collect(self) -> Iterable[Family]: ...


class Registry:
    """The families of one process, rendered together."""

    def __init__(self) -> None:
        self._names: set[str] = set()
        self._collectors: list[Collector | _Metric[Any]] = []

    def register(self, collector: Collector) -> None:
        self._collectors.append(collector)

    def _add(self, metric: _Metric[Any]) -> None:
        if metric.name in self._names:
            raise ValueError(f"metric {metric.name!r} registered twice")
        self._names.add(metric.name)
        self._collectors.append(metric)

    def render(self) -> bytes:
        lines: list[str] = []
        for collector in self._collectors:
            if isinstance(collector, _Metric):
                collector.write(lines)
            else:
                for family in collector.collect():
                    _write_family(lines, family)
        return "".join(lines).encode()


class _Child:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0


class CounterChild(_Child):
    __slots__ = ()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        self.value += amount


class GaugeChild(_Child):
    __slots__ = ()

    def set(self, value: float) -> None:
        self.value = float(value)


class HistogramChild(_Child):
    """`value` is the sum; `counts[i]` the observations in bucket i alone, not cumulative."""

    __slots__ = ("_bounds", "counts")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        super().__init__()
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)

    def observe(self, value: float) -> None:
        # Bucket `le` holds every value <= its bound: the first bound not below the value.
        self.counts[bisect_left(self._bounds, value)] += 1
        self.value += value


ChildT = TypeVar("ChildT", bound=_Child)


class _Metric(Generic[ChildT]):
    """A family whose values live here: one child per tuple of label values."""

    kind: Kind

    def __init__(
        self, name: str, documentation: str, label_names: Sequence[str], registry: Registry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.label_names: Labels = tuple(label_names)
        self._children: dict[Labels, ChildT] = {}
        if not self.label_names:
            # Made now, not at its first use: the server's thread may render it first.
            self.labels()
        registry._add(self)

    def _new_child(self) -> ChildT:
        raise NotImplementedError

    def labels(self, *values: str) -> ChildT:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.label_names):
                raise ValueError(f"{self.name} takes labels {self.label_names}, not {values}")
            child = self._children[values] = self._new_child()
        return child

    def _current(self) -> list[tuple[Labels, ChildT]]:
        """The children, copied: the loop may add one while the server's thread renders."""
        return list(self._children.items())

    def write(self, lines: list[str]) -> None:
        samples = {labels: child.value for labels, child in self._current()}
        _write_family(
            lines, Family(self.name, self.documentation, self.kind, self.label_names, samples)
        )


class Counter(_Metric[CounterChild]):
    """A counter; its samples are written as `<name>_total`."""

    kind: Kind = "counter"

    def _new_child(self) -> CounterChild:
        return CounterChild()

    def inc(self, amount: float = 1) -> None:
        self.labels().inc(amount)


class Gauge(_Metric[GaugeChild]):
    kind: Kind = "gauge"

    def _new_child(self) -> GaugeChild:
        return GaugeChild()

    def set(self, value: float) -> None:
        self.labels().set(value)


class Histogram(_Metric[HistogramChild]):
    kind: Kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        label_names: Sequence[str],
        registry: Registry,
        *,
        buckets: Sequence[float],
    ) -> None:
        bounds = tuple(float(b) for b in buckets)
        if not bounds or list(bounds) != sorted(set(bounds)) or math.inf in bounds:
            raise ValueError(f"{name}: buckets must rise, with +Inf left implicit: {buckets}")
        self._bounds = bounds
        super().__init__(name, documentation, label_names, registry)

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self._bounds)

    def observe(self, value: float) -> None:
        self.labels().observe(value)

    def write(self, lines: list[str]) -> None:
        _write_header(lines, self.name, self.documentation, "histogram")
        les = [*(_number(b) for b in self._bounds), "+Inf"]
        bucket_labels = (*self.label_names, "le")
        for labels, child in self._current():
            # One copy, so that +Inf and _count are the same number.
            counts = list(child.counts)
            total = 0
            for le, count in zip(les, counts, strict=True):
                total += count
                lines.append(_sample(f"{self.name}_bucket", bucket_labels, (*labels, le), total))
            lines.append(_sample(f"{self.name}_count", self.label_names, labels, total))
            lines.append(_sample(f"{self.name}_sum", self.label_names, labels, child.value))


def _write_family(lines: list[str], family: Family) -> None:
    name = f"{family.name}_total" if family.kind == "counter" else family.name
    _write_header(lines, name, family.documentation, family.kind)
    # A copy: the loop may add a key while the server's thread renders.
    for labels, value in list(family.samples.items()):
        lines.append(_sample(name, family.label_names, labels, value))


def _write_header(lines: list[str], name: str, documentation: str, kind: Kind) -> None:
    help_text = documentation.replace("\\", "\\\\").replace("\n", "\\n")
    lines.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")


def _sample(name: str, label_names: Labels, labels: Labels, value: float) -> str:
    if not label_names:
        return f"{name} {_number(value)}\n"
    pairs = ",".join(
        f'{key}="{_label_value(text)}"' for key, text in zip(label_names, labels, strict=True)
    )
    return f"{name}{{{pairs}}} {_number(value)}\n"


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)
