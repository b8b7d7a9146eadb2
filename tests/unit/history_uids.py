"""The history model's steps of issue 34 (defects 3 and 4): a pod is its uid, not its sandbox.

Mixed into the state machine of test_history_model.py: kubelet recreates a pod's sandbox
under the same uid (the old one removed before the new one runs, or at a later step), and
the bound on the pods the plugin remembers is made small. A pod the plugin forgot to stay
within the bound is not reached by reloads until the runtime lists it again; from the next
Synchronize that lists it, its files must equal the oracle's again, as its baseline was kept.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from .history_harness import (
    HistoryNode,
    bound_the_table,
    recreate_sandbox,
    remembered,
    remove_stale_sandbox,
)

T = TypeVar("T")


class SandboxSteps:
    node: HistoryNode | None
    next_pod: int

    def __init__(self) -> None:
        super().__init__()
        #: Pods forgotten since the last Synchronize, and how many Synchronizes were sent then.
        self._forgotten: set[str] = set()
        self._synchronized = 0
        #: forgotten pod -> the (cgroup, field) the plugin held of it when it was forgotten
        self._held_when_forgotten: dict[str, set[tuple[str, str]]] = {}

    def _held_by_the_oracle(self) -> list[tuple[str, str]]:
        raise NotImplementedError  # the state machine's

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError  # the state machine's

    def _node(self) -> HistoryNode:
        assert self.node is not None
        return self.node

    @precondition(lambda self: self.node is not None and self.node.pods)
    @rule(data=st.data(), old_removed_first=st.booleans())
    def recreate_sandbox(self, data: st.DataObject, old_removed_first: bool) -> None:
        node = self._node()
        pod_id = data.draw(st.sampled_from(sorted(node.pods)), label="pod")
        new_id = f"p{self.next_pod}"
        self.next_pod += 1
        self._run(recreate_sandbox(node, pod_id, new_id, old_removed_first=old_removed_first))

    @precondition(lambda self: self.node is not None and self.node.stale)
    @rule(data=st.data())
    def remove_stale_sandbox(self, data: st.DataObject) -> None:
        node = self._node()
        pod_id = data.draw(st.sampled_from(sorted(node.stale)), label="sandbox")
        self._run(remove_stale_sandbox(node, pod_id))

    @rule(max_pods=st.integers(1, 3))
    def bound_the_table(self, max_pods: int) -> None:
        bound_the_table(self._node(), max_pods)

    def forgotten(self) -> set[str]:
        """The pods forgotten since the last Synchronize: their files are not checked."""
        node = self._node()
        if node.app is None:
            return set()
        if node.containerd.synchronized != self._synchronized:
            self._synchronized = node.containerd.synchronized
            self._forgotten = set()
        gone = set(node.pods) - remembered(node)
        self._forgotten = (self._forgotten | gone) & set(node.pods)
        # Taken when the plugin forgets the pod, and kept while it stays forgotten (a
        # Synchronize may list it and forget it again without writing it).
        unseen = gone - self._held_when_forgotten.keys()
        if unseen:
            held = self._held_by_the_oracle()
            for pod_id in unseen:
                parent = node.pods[pod_id].cgroup_parent
                self._held_when_forgotten[pod_id] = {
                    (path, name)
                    for path, name in held
                    if path == parent or path.startswith(f"{parent}/{pod_id}-")
                }
        self._held_when_forgotten = {
            pod_id: held for pod_id, held in self._held_when_forgotten.items() if pod_id in gone
        }
        return self._forgotten

    def held_while_forgotten(self, held: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Of `held`, leave out what the plugin does not hold of the pods it forgot: a field it
        came to claim while the pod or container was forgotten (a reload does not reach them)
        is not the plugin's until the runtime shows it again, and may be anyone's."""
        node = self._node()
        assert node.app is not None
        known = node.app.plugin.live.known
        parents = {node.pods[pod_id].cgroup_parent: pod_id for pod_id in self.forgotten()}
        kept = []
        for path, name in held:
            parent, _, container_id = path.rpartition("/")
            pod_id = parents.get(path, parents.get(parent))
            shown = pod_id in known.pods if path in parents else container_id in known.containers
            if pod_id is None or shown or (path, name) in self._held_when_forgotten.get(pod_id, ()):
                kept.append((path, name))
        return kept
