"""Decisions per second of the pure policy core, on views built beforehand."""

from __future__ import annotations

import time

from bench import workload
from nri_midbatch.config.compile import compile_policy
from nri_midbatch.config.model import Config
from nri_midbatch.plugin.codec import container_view, pod_view
from nri_midbatch.policy import ContainerView, PodView, decide_container
from nri_midbatch.policy.spec import SPEC_CACHE_ENTRIES, spec_cache

Views = list[tuple[PodView, ContainerView]]


def views(count: int, *, distinct_specs: bool) -> Views:
    """`count` batch pods with their main container, as the plugin codec views them.

    distinct_specs: give every pod its own extended-resource spec text, so
    that no decision finds its parsed spec in the cache.
    """
    out: Views = []
    for n in range(count):
        shape = workload.PodShape(token=f"{n:012x}")
        pod = workload.pod(shape)
        if distinct_specs:
            spec = {
                "main": {
                    "requests": {workload.BATCH_CPU: f"{1000 + n}", workload.BATCH_MEMORY: "2Gi"},
                    "limits": {workload.BATCH_CPU: "2k", workload.BATCH_MEMORY: "4Gi"},
                }
            }
            pod.annotations[workload.SPEC_ANNOTATION] = workload.spec_annotation(spec)
        out.append((pod_view(pod), container_view(workload.container(shape))))
    return out


def rate(pairs: Views, decisions: int) -> float:
    policy = compile_policy(Config())
    spec_cache.clear()
    rounds = max(1, decisions // len(pairs))
    started = time.perf_counter()
    for _ in range(rounds):
        for pod, ctr in pairs:
            decision = decide_container(pod, ctr, policy)
    elapsed = time.perf_counter() - started
    if decision.values is None:
        raise AssertionError(f"the benchmark pods must get values: {decision}")
    return rounds * len(pairs) / elapsed


def decisions_per_second(decisions: int) -> tuple[float, float]:
    """(spec cached, every spec new): the second cycles through more specs than the cache holds."""
    cached = rate(views(1000, distinct_specs=False), decisions)
    fresh_views = views(SPEC_CACHE_ENTRIES + 904, distinct_specs=True)
    fresh = rate(fresh_views, max(len(fresh_views), decisions // 10))
    return cached, fresh
