"""What the plugin's observers are told: the session's news, and every decision taken.

One list of observers serves both the session and the plugin (process/app.py): a recorder
ties each decision to the call being served; the work left for after replies, which knows
nothing of NRI (deferred.py), follows the connection through `AfterReplyListener`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from nri_midbatch.deferred import AfterReply
from nri_midbatch.nri.session import Link, SessionObserver
from nri_midbatch.policy import ContainerView, Decision, PodView


class Observer(SessionObserver):
    def decided(self, pod: PodView, container: ContainerView | None, decision: Decision) -> None:
        """The plugin took `decision` (container None: at pod level), in the call's task."""


def told_of_decisions(observers: Iterable[Observer]) -> tuple[Observer, ...]:
    """Those of `observers` that take note of decisions: telling the others would cost a
    call each per decision, for nothing (a Synchronize takes one per container)."""
    return tuple(o for o in observers if type(o).decided is not Observer.decided)


class AfterReplyListener(Observer):
    """The session's news the work after replies needs: the connection to yield to, and
    when it has answered what it was serving."""

    #: The work's own method, bound once: the session tells `idle` after every request's
    #: last reply, and a forwarding call would cost a frame each time.
    idle: Callable[[], None]

    def __init__(self, work: AfterReply) -> None:
        self._work = work
        self.idle = work.idle

    def connected(self, link: Link) -> None:
        self._work.connected(link)
