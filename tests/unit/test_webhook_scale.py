"""Issue 24: admission in linear time, and a budget per review.

Linearity is proved by counting, not timing: the spec the node's policy reads is parsed and
the pod classified once per review, whatever the number of containers. The budget is driven
by a clock that ticks once per reading, so a review runs out after a known number of checks.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nri_midbatch.config.compile import compile_policy
from nri_midbatch.config.model import Config
from nri_midbatch.policy import decision, spec
from nri_midbatch.tools.webhook import admission
from nri_midbatch.tools.webhook.admission import MAX_LISTED_ERRORS, handle
from nri_midbatch.tools.webhook.budget import Budget
from tests.admission import (
    mid_pod_of,
    mutated,
    review,
)
from tests.factory import MID_CPU, MID_MEMORY, PRIORITY, SPEC

POLICY = compile_policy(Config())


def body(document: dict[str, Any]) -> bytes:
    return json.dumps(document).encode()


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every spec the node's policy loads and every pod it classifies, in this test.

    A second one in a review fails at once: the quadratic code took hours at 20,000
    containers, and the test should say why instead of hanging.
    """
    seen: list[str] = []
    # The name decision.py calls: the spec module's, as imported there.
    load_spec, classify_pod = spec.load_spec, decision.classify_pod

    def once(what: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def spy(*args: Any) -> Any:
            seen.append(what)
            assert seen.count(what) == 1, f"{what} called again in one review"
            return real(*args)

        return spy

    monkeypatch.setattr(decision, "load_spec", once("load_spec", load_spec))
    classify = once("classify_pod", classify_pod)
    monkeypatch.setattr(decision, "classify_pod", classify)
    # Where admission classifies the pod itself, for all its containers.
    monkeypatch.setattr(admission, "classify_pod", classify, raising=False)
    yield seen


def test_a_pod_of_20000_containers_is_mutated_parsing_its_spec_once(parses: list[str]) -> None:
    obj = mid_pod_of(20_000)
    answer = handle(body(review(obj)), "mutate", POLICY)
    assert answer.verdict is not None and answer.verdict.allowed
    assert parses == ["classify_pod", "load_spec"]
    patched = mutated(obj, answer.body)
    assert patched["metadata"]["labels"][PRIORITY] == "koord-mid"
    containers = json.loads(patched["metadata"]["annotations"][SPEC])["containers"]
    assert len(containers) == 20_000
    assert containers["c19999"] == {
        "limits": {MID_CPU: "2k", MID_MEMORY: "1Gi"},
        "requests": {MID_CPU: "1k", MID_MEMORY: "1Gi"},
    }


def test_a_pod_of_20000_containers_is_validated_parsing_its_spec_once(parses: list[str]) -> None:
    answer = handle(body(review(mid_pod_of(20_000))), "validate", POLICY)
    assert answer.verdict is not None
    assert (answer.verdict.allowed, answer.verdict.message) == (True, "")
    assert parses == ["classify_pod", "load_spec"]


def test_a_denial_lists_a_bounded_number_of_the_nodes_errors(parses: list[str]) -> None:
    # 1e18 mid-cpu: every container's CFS quota, and the pod's, is beyond int64.
    count = 2_000
    answer = handle(body(review(mid_pod_of(count, cpu_limit="1e18"))), "validate", POLICY)
    verdict = answer.verdict
    assert verdict is not None and not verdict.allowed and verdict.code == 400
    problems = verdict.message.split("; ")
    assert len(problems) == MAX_LISTED_ERRORS + 1
    # Containers in name order (c0, c1, c10, c100, ...), then the count of the rest.
    assert problems[0].startswith(
        "the node cannot use the tier resources: container 'c0': computed CgroupValues("
    )
    more = count + 1 - MAX_LISTED_ERRORS  # every container and the pod level
    assert problems[-1] == f"and {more} more errors of the node's"
    assert parses == ["classify_pod", "load_spec"]


# -- the budget ------------------------------------------------------------------


def ticking(ticks: list[int]) -> Callable[[], float]:
    """A clock one second later at every reading."""

    def clock() -> float:
        ticks.append(len(ticks))
        return float(len(ticks))

    return clock


def spent_after(checks: int) -> tuple[Budget, list[int]]:
    """A budget that runs out at its `checks`-th check (the first reading starts it)."""
    ticks: list[int] = []
    return Budget(checks, ticking(ticks)), ticks


def test_validating_a_create_over_budget_fails_closed_and_says_why() -> None:
    budget, ticks = spent_after(50)
    answer = handle(body(review(mid_pod_of(1_000))), "validate", POLICY, budget)
    verdict = answer.verdict
    assert verdict is not None and answer.over_budget
    assert (verdict.allowed, verdict.code, verdict.reason) == (False, 504, "Timeout")
    assert verdict.message == (
        "nri-midbatch webhook: the review took more than its budget of 50 s; "
        "pod creation is refused (validation fails closed)"
    )
    # It stopped where the budget ran out, not after the 1,000 containers.
    assert len(ticks) == 51
    assert answer.body["response"]["status"]["code"] == 504


def test_mutating_over_budget_admits_the_pod_unchanged_with_a_warning() -> None:
    budget, _ = spent_after(10)
    answer = handle(body(review(mid_pod_of(1_000))), "mutate", POLICY, budget)
    verdict = answer.verdict
    assert verdict is not None and answer.over_budget
    assert (verdict.allowed, verdict.patch) == (True, ())
    assert verdict.warnings == (
        "nri-midbatch webhook: the review took more than its budget of 10 s; "
        "the pod is admitted without its tier label and resources",
    )
    assert "patch" not in answer.body["response"]


def test_validating_an_update_over_budget_admits_it_unchecked() -> None:
    budget, _ = spent_after(10)
    wide = mid_pod_of(1_000)
    document = review(wide, operation="UPDATE", old=wide)
    answer = handle(body(document), "validate", POLICY, budget)
    assert answer.verdict is not None and answer.over_budget
    assert answer.verdict.allowed
    assert answer.verdict.warnings == (
        "nri-midbatch webhook: the review took more than its budget of 10 s; "
        "the update is admitted unchecked",
    )


def test_a_review_within_its_budget_is_decided_in_full() -> None:
    budget, ticks = spent_after(1_000)
    answer = handle(body(review(mid_pod_of(100))), "mutate", POLICY, budget)
    assert answer.verdict is not None and not answer.over_budget
    assert len(answer.verdict.patch) == 2
    # One check per container read, derived and decided: linear, well within 1,000.
    assert len(ticks) == 1 + 3 * 100
