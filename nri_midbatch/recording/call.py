"""A call as the session served it, with the decisions the plugin took while serving it.

The session hands each call to a recorder (`begin`, then `replied` or `failed`). The plugin
publishes each decision it takes to `note_decision`, which files it under the call being served:
every call runs in a task of its own, so a context variable set at `begin` is that call's alone,
and the plugin never learns about recorders or files.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

from google.protobuf.message import Message

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


def note_decision(pod: PodView, container: ContainerView | None, decision: Decision) -> None:
    """The plugin's decision listener: file the decision under the call being served."""
    decisions = _decisions.get()
    if decisions is not None:
        decisions.append(NotedDecision(pod, container, decision))


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
