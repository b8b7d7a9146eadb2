"""What a cache hit costs on the decision path: functools.lru_cache against BoundedCache.

`python -m bench.caches` prints nanoseconds per call, best of several rounds, for a hit of
each cache form, and for the plugin's calls of one CreateContainer that go through a
BoundedCache (the container's resources, the pod's resource-status annotation). Compare
them with the plugin's CreateContainer p50 in docs/performance.md.
"""

from __future__ import annotations

import functools
import timeit
from collections.abc import Callable

from bench import workload
from nri_midbatch.plugin.codec import container_view
from nri_midbatch.policy.bounded_cache import BoundedCache
from nri_midbatch.policy.cpuset import RESOURCE_STATUS_ANNOTATION, bound_cpuset

CALLS = 200_000
ROUNDS = 7


def per_call_ns(run: Callable[[], object]) -> float:
    timer = timeit.Timer(run)
    return min(timer.repeat(repeat=ROUNDS, number=CALLS)) / CALLS * 1e9


def main() -> None:
    text = '{"cpuset":"0-3"}'
    by_lru = functools.lru_cache(maxsize=256)(len)
    by_bounded = BoundedCache[str, int](256, 1024 * 1024).memoize(len)
    shape = workload.PodShape(token="0" * 12)
    container = workload.container(shape)
    annotations = {RESOURCE_STATUS_ANNOTATION: text}
    figures = {
        "lru_cache hit": per_call_ns(lambda: by_lru(text)),
        "BoundedCache.memoize hit": per_call_ns(lambda: by_bounded(text)),
        "container_view (remembered resources)": per_call_ns(lambda: container_view(container)),
        "bound_cpuset (resource-status cache)": per_call_ns(lambda: bound_cpuset(annotations)),
    }
    for name, ns in figures.items():
        print(f"{name}: {ns:.0f} ns")


if __name__ == "__main__":
    main()
