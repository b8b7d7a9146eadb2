"""A decision's trace is data: which filter, tier, rule and value; text only when rendered."""

from __future__ import annotations

from nri_midbatch.policy import (
    CgroupValues,
    Classified,
    NativeLimits,
    PriorityClass,
    QoSClass,
    decide_pod,
)
from nri_midbatch.policy.trace import (
    Field,
    Filter,
    NeverLoosen,
    NoTier,
    TierCheck,
    ValueFrom,
)
from nri_midbatch.tools.explain import _how, _tier_lines
from tests.factory import BATCH_CPU, BATCH_MEMORY, GI, batch_spec, decide
from tests.factory import DEFAULT_POLICY as DEFAULT
from tests.factory import pod_view as pod


def test_steps_say_which_filter_tier_rule_and_value() -> None:
    decision = decide(pod("BE", "koord-batch", batch_spec(main=("500", "1k", "1Gi"))))
    assert decision.values == CgroupValues(512, 100_000, GI)
    qos, priority, *steps = decision.trace
    assert isinstance(qos, Classified) and qos.value is QoSClass.BE
    assert isinstance(priority, Classified) and priority.value is PriorityClass.BATCH
    assert steps == [
        TierCheck("batch"),
        ValueFrom(Field.CPU_SHARES, 512, "request", BATCH_CPU, 500),
        ValueFrom(Field.CPU_QUOTA, 100_000, "limit", BATCH_CPU, 1000),
        ValueFrom(Field.MEMORY_LIMIT, GI, "limit", BATCH_MEMORY, GI),
    ]


def test_a_turned_down_tier_names_its_filter() -> None:
    decision = decide(pod("LS", "koord-batch", batch_spec(main=("500", "1k", None))))
    assert decision.trace[2:] == (
        TierCheck("batch", Filter.QOS, "LS", ("BE",)),
        TierCheck("mid", Filter.PRIORITY, "koord-batch", ("koord-mid",)),
        NoTier(),
    )


def test_never_loosen_keeps_the_native_value_and_the_computed_one() -> None:
    native = NativeLimits(cpu_quota=50_000, cpu_period=100_000, memory_limit=GI)
    decision = decide_pod(
        pod("BE", "koord-batch", batch_spec(main=("500", "1k", "2Gi")), native=native), DEFAULT
    )
    assert NeverLoosen(Field.CPU_QUOTA, 50_000, 100_000, 100_000) in decision.trace
    assert NeverLoosen(Field.MEMORY_LIMIT, GI, 2 * GI) in decision.trace


def test_explain_reads_the_walk_from_the_trace_and_checks_only_the_tiers_after_it() -> None:
    decision = decide(pod("BE", "koord-batch", batch_spec(main=("500", "1k", "1Gi"))))
    assert _tier_lines(decision, DEFAULT, "default") == (
        "tier batch: matched",
        "tier mid: priority koord-batch not in [koord-mid]",
    )
    # The values' steps only: classification and the walk are shown once per pod.
    assert _how(decision) == [
        f"cpu.shares 512 from request {BATCH_CPU}=500",
        f"cpu quota 100000 from limit {BATCH_CPU}=1000",
        f"memory limit {GI} from limit {BATCH_MEMORY}={GI}",
    ]
