"""Decoding the extended-resource-spec annotation as Go's encoding/json does."""

from __future__ import annotations

import gc
import json
import json.decoder
import json.scanner
import tracemalloc

import pytest

from nri_midbatch.policy import spec as spec_module
from nri_midbatch.policy.spec import (
    SPEC_CACHE_BYTES,
    SPEC_CACHE_ENTRIES,
    ContainerSpec,
    ExtendedSpec,
    SpecError,
    load_spec,
    parse_spec,
    spec_cache,
)
from tests.factory import BATCH_CPU as CPU
from tests.factory import BATCH_MEMORY as MEMORY


def test_canonical_annotation() -> None:
    text = (
        '{"containers": {"main": {"limits": {"kubernetes.io/batch-cpu": "1k", '
        '"kubernetes.io/batch-memory": "2Gi"}, "requests": {"kubernetes.io/batch-cpu": "500"}}}}'
    )
    spec = parse_spec(text)
    assert spec is not None
    assert spec.containers == {
        "main": ContainerSpec(requests={CPU: 500}, limits={CPU: 1000, MEMORY: 2 * 2**30})
    }
    assert spec.resource_names == {CPU, MEMORY}


@pytest.mark.parametrize("text", ["null", "{}", '{"containers": null}', '{"other": 1}'])
def test_no_containers_means_no_spec(text: str) -> None:
    assert parse_spec(text) is None


def test_go_json_leniency() -> None:
    text = (
        '{"containers": {"a": null, "b": {"requests": null, "limits": {'
        '"kubernetes.io/batch-cpu": 1500, "kubernetes.io/batch-memory": " 1Gi\u00a0", "x": null}, '
        '"unknown": [1, 2]}}, "extra": true}'
    )
    spec = parse_spec(text)
    assert spec is not None
    assert spec.containers["a"] == ContainerSpec({}, {})
    assert spec.containers["b"] == ContainerSpec({}, {CPU: 1500, MEMORY: 2**30, "x": 0})


def test_json_numbers_keep_their_text() -> None:
    spec = parse_spec('{"containers": {"a": {"limits": {"x": 1.5e3, "y": 0.5, "z": -2}}}}')
    assert spec is not None
    assert spec.containers["a"].limits == {"x": 1500, "y": 1, "z": -2}


@pytest.mark.parametrize(
    ("text", "container", "resource", "message"),
    [
        ("{", None, None, "not valid JSON"),
        ('{"containers": {"a": {"limits": {"x": NaN}}}}', None, None, "not valid JSON"),
        ("[]", None, None, "the annotation must be a JSON object, not an array"),
        ('{"containers": "a"}', None, None, "must be a JSON object, not a string"),
        ('{"containers": {"a": 1}}', "a", None, "container 'a': the entry must be"),
        ('{"containers": {"a": {"limits": [1]}}}', "a", None, "container 'a' limits: the"),
        (
            '{"containers": {"a": {"requests": {"kubernetes.io/batch-cpu": "1.2.3"}}}}',
            "a",
            CPU,
            f"container 'a' requests '{CPU}': invalid quantity '1.2.3'",
        ),
        (
            '{"containers": {"a": {"limits": {"kubernetes.io/batch-cpu": {"v": 1}}}}}',
            "a",
            CPU,
            "must be a string or number, not an object",
        ),
        (
            '{"containers": {"a": {"limits": {"kubernetes.io/batch-memory": "10E"}}}}',
            "a",
            MEMORY,
            "does not fit in int64",
        ),
        ("[" * 100_000, None, None, "not valid JSON"),
    ],
)
def test_errors_name_container_and_resource(
    text: str, container: str | None, resource: str | None, message: str
) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(text)
    assert message in str(caught.value)
    assert (caught.value.container, caught.value.resource) == (container, resource)


def test_load_spec_caches_results_and_errors() -> None:
    text = '{"containers": {"a": {"limits": {"kubernetes.io/batch-cpu": "1k"}}}}'
    assert load_spec(text) is load_spec(text)
    error = load_spec("{broken")
    assert isinstance(error, SpecError)
    assert load_spec("{broken") is error


def test_a_quantity_parsed_once_is_reported_where_each_spec_has_it() -> None:
    """Quantities are cached by their text; an error still names its own container and field."""
    first = f'{{"containers": {{"a": {{"requests": {{"{CPU}": "lots"}}}}}}}}'
    second = f'{{"containers": {{"b": {{"limits": {{"{MEMORY}": "lots"}}}}}}}}'
    errors = []
    for text in (first, second):
        with pytest.raises(SpecError) as caught:
            parse_spec(text)
        errors.append((caught.value.container, caught.value.resource, str(caught.value)))
    assert [(container, resource) for container, resource, _ in errors] == [
        ("a", CPU),
        ("b", MEMORY),
    ]
    assert "requests" in errors[0][2] and "limits" in errors[1][2]
    # The same text as a JSON number and as a string is the same value.
    as_number = parse_spec(f'{{"containers": {{"a": {{"limits": {{"{CPU}": 1500}}}}}}}}')
    as_string = parse_spec(f'{{"containers": {{"a": {{"limits": {{"{CPU}": "1500"}}}}}}}}')
    assert (
        as_number
        == as_string
        == parse_spec(f'{{"containers": {{"a": {{"limits": {{"{CPU}": "1.5k"}}}}}}}}')
    )


def test_the_spec_cache_is_bounded() -> None:
    """A node sees ever new specs as jobs come and go: the cache must not keep them all."""
    for n in range(600):
        load_spec(f'{{"containers": {{"main": {{"requests": {{"{MEMORY}": "{n}Mi"}}}}}}}}')
    assert len(spec_cache) <= SPEC_CACHE_ENTRIES == 256


def _large_annotation(n: int, size: int = 250_000) -> str:
    """Distinct per n, about `size` bytes: containers with 20 long-named resources each."""
    prefix = "example.com/" + "x" * 200  # long names: many bytes, few objects to parse
    entry = {"limits": {f"{prefix}{j}": "1Gi" for j in range(20)}}
    per_container = len(json.dumps(entry)) + 20
    containers = {f"c{n}-{i}": entry for i in range(size // per_container)}
    return json.dumps({"containers": containers})


def test_the_spec_cache_is_bounded_in_bytes_and_keeps_nothing_of_gone_pods_beyond() -> None:
    """Pods with annotations near the size limit, created and deleted one after another."""
    spec_cache.clear()
    tracemalloc.start()
    try:
        gc.collect()
        before, _ = tracemalloc.get_traced_memory()
        for n in range(30):  # 30 x 250 KB: twice what the old cache kept past the bound
            spec = load_spec(_large_annotation(n))
            assert isinstance(spec, ExtendedSpec)
            assert spec_cache.bytes <= SPEC_CACHE_BYTES
        del spec
        gc.collect()
        retained, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert 0 < len(spec_cache) < 30
    # What the pods brought and the cache still holds, measured by the allocator's own
    # count: within the stated bound (the accounting counts high).
    assert retained - before <= SPEC_CACHE_BYTES
    # The most recent one is still cached.
    assert load_spec(_large_annotation(29)) is load_spec(_large_annotation(29))
    spec_cache.clear()


def test_a_spec_costing_more_than_the_whole_bound_is_not_cached() -> None:
    spec_cache.clear()
    text = _large_annotation(0, size=SPEC_CACHE_BYTES)
    assert isinstance(load_spec(text), ExtendedSpec)
    assert len(spec_cache) == 0 and spec_cache.bytes == 0


def test_long_quantity_texts_are_not_cached() -> None:
    """Each could be an annotation's worth; only texts a real quantity can have are kept."""
    cache = spec_module.quantity_cache
    long_text = "1" * (spec_module.QUANTITY_CACHE_TEXT + 1)
    before = len(cache)
    for n in range(3):
        with pytest.raises(SpecError):
            parse_spec(f'{{"containers": {{"a": {{"limits": {{"{CPU}": "{long_text}{n}x"}}}}}}}}')
    assert len(cache) == before
    parse_spec(f'{{"containers": {{"a": {{"limits": {{"{CPU}": "12345m"}}}}}}}}')
    assert len(cache) <= before + 1


def test_field_names_match_case_insensitively_as_in_go() -> None:
    # encoding/json matches struct fields case-insensitively, also through the runes that
    # fold onto ASCII letters (U+017F long s, U+212A Kelvin sign); map keys match exactly.
    text = (
        '{"Containers": {"a": {"LIMITS": {"kubernetes.io/batch-cpu": "1k"}, '
        '"Requests": {"kubernetes.io/batch-cpu": "500"}}, '
        '"b": {"limit\u017f": {"kubernetes.io/batch-cpu": "2k"}, '
        '"limits ": {"kubernetes.io/batch-cpu": "3k"}}}}'
    )
    spec = parse_spec(text)
    assert spec is not None
    assert spec.containers["a"] == ContainerSpec({CPU: 500}, {CPU: 1000})
    assert spec.containers["b"] == ContainerSpec({}, {CPU: 2000})
    upper = parse_spec('{"containers": {"a": {"limits": {"KUBERNETES.IO/BATCH-CPU": "1k"}}}}')
    assert upper is not None and CPU not in upper.resource_names


def test_a_repeated_field_merges_its_maps_as_in_go() -> None:
    # Go decodes a field written twice into the map it already holds; a repeated map key
    # (container or resource) replaces the earlier value, and null resets the map.
    text = (
        '{"containers": {"a": {"limits": {"kubernetes.io/batch-cpu": "1k"}, '
        '"Limits": {"kubernetes.io/batch-memory": "1Gi", "kubernetes.io/batch-cpu": "2k"}}}, '
        '"containers": {"b": {"requests": {"kubernetes.io/batch-cpu": "1"}}, '
        '"b": {"limits": {"kubernetes.io/batch-cpu": "3k"}}}}'
    )
    spec = parse_spec(text)
    assert spec is not None
    assert spec.containers == {
        "a": ContainerSpec({}, {CPU: 2000, MEMORY: 2**30}),
        "b": ContainerSpec({}, {CPU: 3000}),
    }
    assert parse_spec('{"containers": {"a": null}, "containers": null}') is None
    reset = parse_spec(
        '{"containers": {"a": {"limits": {"kubernetes.io/batch-cpu": "1k"}, "limits": null}}}'
    )
    assert reset is not None and reset.containers["a"] == ContainerSpec({}, {})


@pytest.mark.parametrize("quantity", ['"1\\u006b"', '"\\u00201k"', '"1k\\n"', '"\\"1k"'])
def test_an_escaped_quantity_is_refused_as_go_reads_it_raw(quantity: str) -> None:
    # Quantity.UnmarshalJSON hands the bytes between the quotes to ParseQuantity unescaped.
    text = f'{{"containers": {{"a": {{"limits": {{"{CPU}": {quantity}}}}}}}}}'
    with pytest.raises(SpecError, match="JSON escape"):
        parse_spec(text)


def test_escapes_elsewhere_are_decoded() -> None:
    spec = parse_spec(
        '{"containers": {"\\u0061": {"limits": {"kubernetes.io/batch\\u002dcpu": "1k"}}}}'
    )
    assert spec is not None
    assert spec.containers == {"a": ContainerSpec({}, {CPU: 1000})}


def test_an_array_is_not_an_object() -> None:
    with pytest.raises(SpecError, match="not an array"):
        parse_spec('{"containers": []}')


def test_the_escape_aware_decoder_still_finds_the_json_internals_it_builds_on() -> None:
    """Fails on a Python whose json module no longer works as the escape-aware decoder needs.

    policy/spec.py gives a decoder its own `parse_string` and rebuilds `scan_once` with
    json.scanner.py_make_scanner, the pure-Python scanner, which reads `parse_string` when it
    is made (the C scanner does not call it). Both are internals of CPython's json module.
    """
    made = getattr(json.scanner, "py_make_scanner", None)
    assert callable(made), "json.scanner.py_make_scanner is gone"
    # json.decoder.scanstring(text, index after the opening quote, strict) -> (value, end)
    value, end = json.decoder.scanstring('"1\\u006b" tail', 1, True)  # type: ignore[attr-defined]
    assert (value, end) == ("1k", 9), "json.decoder.scanstring changed its contract"
    document = spec_module._escape_aware_decoder().decode(
        '{"k\\u0065y": {"plain": "1k", "escaped": "1\\u006b", "list": ["a", "\\n"]}}'
    )
    assert document == [("key", [("plain", "1k"), ("escaped", "1k"), ("list", ["a", "\n"])])]
    inner = dict(document[0][1])
    assert type(inner["plain"]) is str, "unescaped strings must stay plain str"
    assert type(inner["escaped"]) is spec_module._Escaped, (
        "the pure-Python scanner no longer calls the decoder's parse_string: escaped "
        "quantities would be read as Go never reads them"
    )
    assert [type(item) for item in inner["list"]] == [str, spec_module._Escaped]
