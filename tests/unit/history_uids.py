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
        self._forgotten = (self._forgotten | (set(node.pods) - remembered(node))) & set(node.pods)
        return self._forgotten
