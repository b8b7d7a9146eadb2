"""What the plugin's observers are told: the session's news, and every decision taken.

One list of observers serves both the session and the plugin (process/app.py): a recorder
ties each decision to the call being served, the deferred work follows the connection.
"""

from __future__ import annotations

from nri_midbatch.nri.session import SessionObserver
from nri_midbatch.policy import ContainerView, Decision, PodView


class Observer(SessionObserver):
    def decided(self, pod: PodView, container: ContainerView | None, decision: Decision) -> None:
        """The plugin took `decision` (container None: at pod level), in the call's task."""
