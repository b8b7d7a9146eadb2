"""The session's lifecycle as one table: which step is legal in which phase, and where it leads.

The runtime's side is containerd/nri pkg/adaptation (adaptation.go, plugin.go); the Go
stub's (pkg/stub/stub.go) is what a plugin is expected to accept. Read as transitions:
- the runtime may send Configure before our RegisterPlugin reply arrives, so
  Configure is legal while connecting, and the reply is legal once configured;
- Configure comes once per registration; a second one is refused;
- Synchronize (possibly split into `more=true` chunks) follows Configure;
  runtimes before NRI v0.7 never send it to pre-launched plugins, so events
  are legal once configured, and a runtime may synchronize again;
- an event between the chunks of a split Synchronize is served, as the Go stub
  serves it (it only collects chunks, and checks nothing else): the runtime adds
  a plugin to its list after the sync, so none should come, but one that does is
  not the plugin's to refuse;
- the runtime never sends Shutdown; answering it is harmless anywhere.

A step missing from the table is illegal in that phase: the request gets
FAILED_PRECONDITION, and the phase stays as it was.
"""

from __future__ import annotations

from enum import Enum

from nri_midbatch.rpc.errors import RpcError
from nri_midbatch.wire.status import Code


class Phase(Enum):
    CLOSED = "closed"  # no connection (also before the first)
    CONNECTING = "connecting"  # serving conn 1, RegisterPlugin sent
    REGISTERED = "registered"  # the runtime answered RegisterPlugin
    CONFIGURED = "configured"  # Configure answered
    SYNCHRONIZING = "synchronizing"  # inside a split Synchronize
    READY = "ready"  # synchronized; events flow

    # Members are singletons compared by identity: hashing them by it keeps each request's
    # TRANSITIONS lookup in C, where Enum's own __hash__ is a Python call per member.
    __hash__ = object.__hash__


class Step(Enum):
    CONNECT = "connect"
    REGISTER_REPLY = "RegisterPlugin reply"
    CONFIGURE = "Configure"
    SYNC_CHUNK = "Synchronize chunk (more=true)"
    SYNC_DONE = "Synchronize"
    SYNC_FAILED = "Synchronize failed"
    EVENT = "event"
    SHUTDOWN = "Shutdown"
    CLOSE = "close"

    __hash__ = object.__hash__  # as Phase's


P, S = Phase, Step
_CONFIGURED = (P.CONFIGURED, P.SYNCHRONIZING, P.READY)

#: (phase, step) -> next phase. Everything not listed is illegal.
TRANSITIONS: dict[tuple[Phase, Step], Phase] = {
    (P.CLOSED, S.CONNECT): P.CONNECTING,
    (P.CONNECTING, S.REGISTER_REPLY): P.REGISTERED,
    **{(p, S.REGISTER_REPLY): p for p in _CONFIGURED},
    (P.CONNECTING, S.CONFIGURE): P.CONFIGURED,
    (P.REGISTERED, S.CONFIGURE): P.CONFIGURED,
    (P.CONFIGURED, S.SYNC_CHUNK): P.SYNCHRONIZING,
    (P.SYNCHRONIZING, S.SYNC_CHUNK): P.SYNCHRONIZING,
    (P.READY, S.SYNC_CHUNK): P.SYNCHRONIZING,
    (P.CONFIGURED, S.SYNC_DONE): P.READY,
    (P.SYNCHRONIZING, S.SYNC_DONE): P.READY,
    (P.READY, S.SYNC_DONE): P.READY,
    # A failed sync leaves nothing known about the node: not ready.
    (P.SYNCHRONIZING, S.SYNC_FAILED): P.CONFIGURED,
    (P.CONFIGURED, S.SYNC_FAILED): P.CONFIGURED,
    (P.READY, S.SYNC_FAILED): P.CONFIGURED,
    (P.CONFIGURED, S.EVENT): P.CONFIGURED,
    (P.SYNCHRONIZING, S.EVENT): P.SYNCHRONIZING,
    (P.READY, S.EVENT): P.READY,
    **{(p, S.SHUTDOWN): p for p in Phase if p is not P.CLOSED},
    **{(p, S.CLOSE): P.CLOSED for p in Phase},
}


def transition(phase: Phase, step: Step, what: str | None = None) -> Phase:
    """The phase after `step`; RpcError(FAILED_PRECONDITION) if the table has no such move.

    `what` names the request in the error (e.g. the event's method).
    """
    try:
        return TRANSITIONS[phase, step]
    except KeyError:
        raise RpcError(
            Code.FAILED_PRECONDITION,
            f"{what or step.value} is not allowed while the plugin is {phase.value}",
        ) from None
