"""The decision lines: a log line for each container decided.

"decision" (info) for a container given values that change it: the audit
trail of what was set where. At Synchronize, a container whose values are
already in place gets its "decision" line at debug (SIGUSR1), with
`unchanged=true`, and the call one info summary line ("synchronized") with
counts by tier and result, so that a node of 10,000 containers does not
bury the log. "untouched" (debug) for one left alone, with the reason.
A line costs about 15 us (JSON, timestamp, write), more than the decision
itself, so the lines are written once the call's reply is out (deferred.py).
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

from nri_midbatch.deferred import AfterReply
from nri_midbatch.policy import CgroupValues, ContainerView, PodView, TraceStep

log = structlog.get_logger(__name__)

#: Lines written in one piece of work after the reply: 0.1-0.3 ms, the
#: longest a request arriving meanwhile waits for them (deferred.py).
LINES_PER_WRITE = 8

#: The extra field of a decision line, by whether it changed anything.
_UNCHANGED_FIELD: dict[bool, dict[str, bool]] = {True: {}, False: {"unchanged": True}}

_FIELDS_PER_LINE = 5

#: Results counted in the summary line, by tier.
UPDATED, UNCHANGED, UNTOUCHED = "updated", "unchanged", "untouched"


class DecisionLines:
    """The decision lines of one call, held until its reply is out.

    Held flat, five list slots a line and no object of their own: a
    Synchronize's 10,000 lines held as a tuple each would be allocated among
    the objects the plugin keeps, and leave the heap fragmented for good
    (3.5 MB of resident memory) once freed.
    """

    __slots__ = ("_counts", "_fields", "method")

    def __init__(self, method: str) -> None:
        self.method = method
        self._fields: list[Any] = []
        #: Lines by tier ("none": in no tier) and result, kept as lines are added:
        #: counted at the end, a node's worth held a request up for 4 ms.
        self._counts: dict[str, dict[str, int]] = {}

    def add(
        self,
        tier: str | None,
        pod: PodView,
        container: ContainerView,
        outcome: CgroupValues | TraceStep,
    ) -> None:
        """A container given `outcome` values, or left alone for the reason `outcome` says.

        The reason is a trace step, made text only if the debug line is written.
        """
        self._fields += (tier, pod, container, outcome, True)
        self._count(tier, UPDATED if isinstance(outcome, CgroupValues) else UNTOUCHED, 1)

    def unchanged(self) -> None:
        """The container of the last line added already has its values: its line goes to debug."""
        self._fields[-1] = False
        tier = self._fields[-_FIELDS_PER_LINE]
        self._count(tier, UPDATED, -1)
        self._count(tier, UNCHANGED, 1)

    def _count(self, tier: str | None, result: str, change: int) -> None:
        by_result = self._counts.setdefault(tier or "none", {})
        by_result[result] = by_result.get(result, 0) + change

    def counts(self) -> dict[str, dict[str, int]]:
        """Lines by tier ("none": in no tier) and result (updated, unchanged, untouched)."""
        return {
            tier: {result: n for result, n in by_result.items() if n}
            for tier, by_result in self._counts.items()
        }

    def summarize_after(self, after_reply: AfterReply, event: str, **fields: Any) -> None:
        """Once the lines are written, one info line `event` with `fields` and the counts."""
        after_reply.defer(self._summarize, event, fields)

    def _summarize(self, event: str, fields: dict[str, Any]) -> None:
        log.info(event, method=self.method, **fields, tiers=self.counts())

    def write_after(self, after_reply: AfterReply) -> None:
        """Have the lines written once the reply is out, a slice at a time."""
        step = LINES_PER_WRITE * _FIELDS_PER_LINE
        for start in range(0, len(self._fields), step):
            after_reply.defer(self._write, start, start + step)

    def _write(self, start: int, end: int) -> None:
        # Logging is configured not to cache loggers, so that a level change
        # reaches every logger; binding once per slice, not per line, saves
        # 3 us a line and still follows a level change.
        logger = log.bind()
        # Lines at debug are not even built unless it is on: a reason made
        # text costs more than its line, and a Synchronize has one for every
        # container in no tier.
        debug = logger.is_enabled_for(logging.DEBUG)
        method, fields = self.method, self._fields
        for i in range(start, min(end, len(fields)), _FIELDS_PER_LINE):
            changed = fields[i + 4]
            values = fields[i + 3]
            if not (debug or (changed and isinstance(values, CgroupValues))):
                continue
            pod: PodView = fields[i + 1]
            container: ContainerView = fields[i + 2]
            if not isinstance(values, CgroupValues):
                logger.debug(
                    "untouched",
                    method=method,
                    namespace=pod.namespace,
                    pod=pod.name,
                    container=container.name,
                    why=str(values),
                )
                continue
            # Changes at info; a container that already had its values at debug.
            (logger.info if changed else logger.debug)(
                "decision",
                method=method,
                tier=fields[i],
                namespace=pod.namespace,
                pod=pod.name,
                container=container.name,
                cpu_shares=values.cpu_shares,
                cpu_quota=values.cpu_quota,
                memory_limit=values.memory_limit,
                **_UNCHANGED_FIELD[changed],
            )
