"""What the process takes from its session: metrics of every call and state, the heap's turn.

The App's own observer of the session (plugin/observer.py). Each Plugin-service call is
counted and timed, one clock read and one histogram observation per call; the session's
state sets the registration gauges and the figures of the last Synchronize; connection
attempts after the first are counted; and the
objects a large Synchronize leaves are frozen out of the collector's way (process/heap.py).
"""

from __future__ import annotations

import time
from typing import NamedTuple

from google.protobuf.message import Message
from prometheus_client import Counter, Histogram

from nri_midbatch.nri.session import SessionState
from nri_midbatch.obs.metrics import Metrics
from nri_midbatch.plugin.observer import Observer
from nri_midbatch.process.heap import (
    LARGE_SYNC,
    freeze_survivors,
    hold_collections,
    release_collections,
)


class _MethodSeries(NamedTuple):
    ok: Counter
    error: Counter
    duration: Histogram


class _ObservedCall:
    __slots__ = ("_series", "_start")

    def __init__(self, series: _MethodSeries) -> None:
        self._series = series
        self._start = time.perf_counter()

    def replied(self, response: Message) -> None:
        self._done(self._series.ok)

    def failed(self, error: BaseException) -> None:
        self._done(self._series.error)

    def _done(self, result: Counter) -> None:
        result.inc()
        self._series.duration.observe(time.perf_counter() - self._start)


class SessionWatch(Observer):
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        #: method -> its series, looked up once per method rather than twice per call
        self._series: dict[str, _MethodSeries] = {}
        self._syncs_seen = 0

    def call_begun(self, method: str, request: Message) -> _ObservedCall:
        series = self._series.get(method)
        if series is None:
            m = self._metrics
            series = self._series[method] = _MethodSeries(
                m.events.labels(method, "ok"),
                m.events.labels(method, "error"),
                m.event_duration.labels(method),
            )
        return _ObservedCall(series)

    def reconnecting(self) -> None:
        self._metrics.reconnects.inc()

    def state_changed(self, state: SessionState) -> None:
        metrics = self._metrics
        metrics.registered.set(1 if state.configured else 0)
        metrics.synchronized.set(1 if state.synchronized else 0)
        if state.sync_receiving >= LARGE_SYNC:
            freeze_survivors()  # a chunk taken in: its views are here to stay
            hold_collections()  # until it is answered (or fails, or the connection goes)
        if state.syncs > self._syncs_seen:
            self._syncs_seen = state.syncs
            if state.sync_pods + state.sync_containers >= LARGE_SYNC:
                # Now, before the work left for after the reply allocates.
                freeze_survivors()
            metrics.sync_duration.observe(state.last_sync_seconds)
            metrics.sync_objects.labels("pods").set(state.sync_pods)
            metrics.sync_objects.labels("containers").set(state.sync_containers)
        if not state.sync_receiving:
            release_collections()
