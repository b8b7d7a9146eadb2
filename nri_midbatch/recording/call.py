"""A call as the session served it, with the decisions the plugin took while serving it.

A recorder observes the session and the plugin (plugin/observer.py): the session shows it each
call (`call_begun`, then `replied` or `failed`), the plugin each decision it takes (`decided`),
which it files under the call being served: every call runs in a task of its own, so a context
variable set at `call_begun` is that call's alone, and the plugin never learns about files.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

from google.protobuf.message import Message

from nri_midbatch.plugin.observer import Observer
from nri_midbatch.policy import ContainerView, Decision, PodView
from nri_midbatch.rpc.errors import error_status

#: A call's error: its ttrpc status code and message.
Status = tuple[int, str]


@dataclass(frozen=True, slots=True)
class NotedDecision:
    pod: PodView
    container: ContainerView | None  # None: the pod-level decision
    decision: Decision


@dataclass(slots=True)
class CallRecord:
    """One call as the session served it; protobuf messages stay unconverted until written."""

    method: str
    request: Message
    started: float  # time.time()
    decisions: list[NotedDecision]
    response: Message | None = None
    error: Status | None = None


_decisions: ContextVar[list[NotedDecision] | None] = ContextVar(
    "nri_midbatch_call_decisions", default=None
)


class Call:
    """A call in flight; `replied` or `failed` completes it and hands the record on."""

    __slots__ = ("_done", "record")

    def __init__(self, method: str, request: Message, done: Callable[[CallRecord], None]) -> None:
        decisions: list[NotedDecision] = []
        _decisions.set(decisions)
        self.record = CallRecord(method, request, time.time(), decisions)
        self._done = done

    def replied(self, response: Message) -> None:
        self.record.response = response
        self._done(self.record)

    def failed(self, error: BaseException) -> None:
        code, message = error_status(error)
        self.record.error = int(code), message
        self._done(self.record)


class CallRecorder(Observer):
    """Records each call with the decisions taken while serving it, and `keep`s the record."""

    def call_begun(self, method: str, request: Message) -> Call:
        return Call(method, request, self.keep)

    def decided(self, pod: PodView, container: ContainerView | None, decision: Decision) -> None:
        decisions = _decisions.get()
        if decisions is not None:
            decisions.append(NotedDecision(pod, container, decision))

    def keep(self, record: CallRecord) -> None:
        """The call has ended: its record is complete."""
        raise NotImplementedError
