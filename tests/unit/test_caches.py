"""Every cache of the package is bounded: in bytes where its keys come from outside.

Pods, the runtime and network clients bring the texts that caches are keyed by; a cache
bounded only by entries then holds entries times the largest text (1,024 native-limits
annotations of 200 KB held 226 MB after their containers were gone). Such caches are
BoundedCaches. functools' caches are kept only for keys of small values, listed below.
"""

from __future__ import annotations

import ast
import gc
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.plugin import codec as views
from nri_midbatch.policy import (
    NativeLimits,
    PriorityClass,
    QoSClass,
    Rules,
    Tier,
    calculate,
    cpuset,
    spec,
)
from nri_midbatch.policy.bounded_cache import INPUT_CACHE_BYTES, BoundedCache
from nri_midbatch.policy.spec import ContainerSpec
from nri_midbatch.policy.trace import Step

PACKAGE = Path(__file__).resolve().parents[2] / "nri_midbatch"

#: functools caches allowed, by (module, name): each is keyed by a few ints or by
#: instances made of them (a protobuf int64 is at most 36 bytes as a Python int), or by
#: names from the configuration, never by text a pod, the runtime or a client wrote. Each
#: holds at most its maxsize entries of a few hundred bytes.
VALUE_KEYED = {
    # three int64 fields of a container's resources
    ("plugin/codec.py", "_native_limits"): "ints",
    ("plugin/codec.py", "_current_values"): "ints",
    # NativeLimits / CgroupValues: three ints (or None) each
    ("plugin/codec.py", "encode_native_limits"): "NativeLimits",
    ("plugin/codec.py", "_resources_holding"): "CgroupValues",
    ("cgroups/values.py", "set_fields"): "CgroupValues",
    ("policy/calculate.py", "shared_values"): "ints",
    # a Field, ints, "request"/"limit" and a resource name of the configuration's tiers
    ("policy/calculate.py", "_value_from"): "ints and configuration names",
}

_FUNCTOOLS_CACHES = {"lru_cache", "cache"}


def _is_functools_cache(node: ast.expr) -> bool:
    """`lru_cache`, `functools.lru_cache`, `cache`, ... (called or not)."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return (
            isinstance(node.value, ast.Name)
            and node.value.id == "functools"
            and node.attr in _FUNCTOOLS_CACHES
        )
    return isinstance(node, ast.Name) and node.id in _FUNCTOOLS_CACHES


def _bounded(node: ast.expr) -> bool:
    """Whether the cache expression gives a maxsize that is not None."""
    if not isinstance(node, ast.Call):
        return False  # bare @cache or @lru_cache: unbounded or the default 128 by accident
    sizes = list(node.args[:1]) + [k.value for k in node.keywords if k.arg == "maxsize"]
    return bool(sizes) and not (isinstance(sizes[0], ast.Constant) and sizes[0].value is None)


def _takes_text(function: ast.FunctionDef) -> bool:
    arguments = function.args
    for argument in arguments.posonlyargs + arguments.args + arguments.kwonlyargs:
        annotation = argument.annotation
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            annotation = ast.parse(annotation.value, mode="eval").body  # a quoted annotation
        if annotation is not None and any(
            isinstance(node, ast.Name) and node.id in {"str", "bytes"}
            for node in ast.walk(annotation)
        ):
            return True
    return False


def functools_caches(source: str) -> Iterator[tuple[str, ast.expr, ast.FunctionDef | None]]:
    """(name, cache expression, the decorated function if any) of each functools cache."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for decorator in node.decorator_list:
                if _is_functools_cache(decorator):
                    yield node.name, decorator, node  # type: ignore[misc]
        elif (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and _is_functools_cache(node.value.func)
        ):
            # name = lru_cache(maxsize=...)(function_or_class)
            name = node.targets[0]
            yield (name.id if isinstance(name, ast.Name) else "?"), node.value.func, None


def cache_problems(path: str, source: str) -> list[str]:
    problems = []
    for name, expression, function in functools_caches(source):
        where = f"{path}: {name}"
        if function is not None and _takes_text(function):
            problems.append(f"{where} is keyed by str/bytes: make it a BoundedCache")
        elif (path, name) not in VALUE_KEYED:
            problems.append(f"{where} is not a listed value-keyed cache: use a BoundedCache")
        if not _bounded(expression):
            problems.append(f"{where} has no maxsize bound")
    return problems


def package_sources() -> Iterator[tuple[str, str]]:
    for file in sorted(PACKAGE.rglob("*.py")):
        yield file.relative_to(PACKAGE).as_posix(), file.read_text()


def test_no_functools_cache_is_keyed_by_text_or_unlisted_or_unbounded() -> None:
    problems = [
        problem for path, source in package_sources() for problem in cache_problems(path, source)
    ]
    assert problems == []


def test_every_listed_value_keyed_cache_exists() -> None:
    found = {
        (path, name)
        for path, source in package_sources()
        for name, _, _ in functools_caches(source)
    }
    assert set(VALUE_KEYED) <= found


def test_the_audit_catches_what_it_is_for() -> None:
    """The checks above on sources as the package had them before its caches were bounded."""
    source = """
import functools
from functools import lru_cache

@functools.lru_cache(maxsize=1024)
def decode_native_limits(text: str) -> object: ...

@lru_cache(maxsize=256)
def _cpuset(text: "str | None") -> str | None: ...

@functools.cache
def _native_limits(quota: int) -> object: ...

_cached_quantity_int = lru_cache(maxsize=1024)(print)
"""
    assert cache_problems("plugin/codec.py", source) == [
        "plugin/codec.py: decode_native_limits is keyed by str/bytes: make it a BoundedCache",
        "plugin/codec.py: _cpuset is keyed by str/bytes: make it a BoundedCache",
        "plugin/codec.py: _native_limits has no maxsize bound",
        "plugin/codec.py: _cached_quantity_int is not a listed value-keyed cache: "
        "use a BoundedCache",
    ]


# -- driven past each bound ---------------------------------------------------------------


def retained_after(run: Callable[[], None]) -> int:
    """Bytes still allocated once `run` is done and its garbage collected."""
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        run()
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return after - before


def drive(
    cache: BoundedCache[str, Any], texts: Iterator[str], read: Callable[[str], object]
) -> int:
    """Read every text (each is gone after); the bytes the cache still holds of them."""
    cache.clear()

    def run() -> None:
        for text in texts:
            read(text)
            assert cache.bytes <= cache.max_bytes and len(cache) <= cache.max_entries

    retained = retained_after(run)
    cache.clear()
    return retained


def test_native_limits_annotations_are_held_within_the_bound() -> None:
    """2,000 containers with a 200 KB annotation each, synchronized and gone."""
    padding = 200_000

    def texts() -> Iterator[str]:
        for n in range(2000):  # distinct texts, all decoding to the same limits
            yield '{"cpuQuota":100000' + " " * n + "}" + " " * (padding - n)

    cache = views.native_limits_texts
    retained = drive(cache, texts(), views.decode_native_limits)
    assert views.decode_native_limits(next(texts())) == NativeLimits(cpu_quota=100000)
    assert cache.max_bytes == INPUT_CACHE_BYTES == 1024 * 1024
    assert retained <= cache.max_bytes


def test_resource_status_annotations_are_held_within_the_bound() -> None:
    """2,000 pods with a 250 KB resource-status annotation each, the most an author can write."""

    def texts() -> Iterator[str]:
        for n in range(2000):
            yield f'{{"cpuset":"0-{n}","note":"' + "x" * 250_000 + '"}'

    cache = cpuset.resource_status_cache
    retained = drive(
        cache, texts(), lambda text: cpuset.bound_cpuset({cpuset.RESOURCE_STATUS_ANNOTATION: text})
    )
    assert cpuset.bound_cpuset({cpuset.RESOURCE_STATUS_ANNOTATION: '{"cpuset":"0-3"}'}) == "0-3"
    assert retained <= cpuset.RESOURCE_STATUS_CACHE_BYTES == 1024 * 1024


def test_pod_sum_steps_naming_long_containers_are_held_within_the_bound() -> None:
    """A pod-sum step names the container that makes the pod unlimited, as the author wrote it."""
    tier = Tier(
        name="batch",
        priority_classes=(PriorityClass.BATCH,),
        qos_classes=frozenset({QoSClass.BE}),
        cpu_resource="kubernetes.io/batch-cpu",
        memory_resource="kubernetes.io/batch-memory",
    )
    cache = calculate.pod_sum_cache
    cache.clear()

    def run() -> None:
        for n in range(2000):
            name = f"c{n}-" + "x" * 200_000
            trace: list[Step] = []
            calculate.pod_values(
                {name: ContainerSpec({}, {})}, tier, Rules(), NativeLimits(), trace
            )
            assert cache.bytes <= calculate.POD_SUM_CACHE_BYTES

    retained = retained_after(run)
    cache.clear()
    assert retained <= calculate.POD_SUM_CACHE_BYTES == 1024 * 1024


def test_remembered_resources_and_quantities_are_bounded_in_entries() -> None:
    """Short keys (at most 256 bytes, 64 characters): the entries bound holds first."""
    resources = views.remembered_resources
    resources.clear()
    for n in range(3 * views.DISTINCT_LIMITS):
        views.native_limits(
            api.LinuxResources(cpu=api.LinuxCPU(quota=api.OptionalInt64(value=n + 1)))
        )
    assert len(resources) == views.DISTINCT_LIMITS
    assert resources.bytes <= resources.max_bytes
    resources.clear()

    quantities = spec.quantity_cache
    quantities.clear()
    for n in range(3 * spec.QUANTITY_CACHE_ENTRIES):
        assert spec._quantity_int(f"{n}Mi") == n * 2**20
    assert len(quantities) == spec.QUANTITY_CACHE_ENTRIES
    assert quantities.bytes <= quantities.max_bytes
    quantities.clear()
