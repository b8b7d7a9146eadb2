"""The node.koordinator.sh/extended-resource-spec annotation.

Shape (Koordinator apis/extension ExtendedResourceSpec):
    {"containers": {"<name>": {"requests": {<resource>: <qty>}, "limits": {...}}}}
Decoding follows Go's encoding/json into those structs: unknown keys are ignored, null means
"absent", a quantity may be a JSON string (whitespace trimmed) or a bare JSON number, field names
(`containers`, `requests`, `limits`) match case-insensitively, and a field written twice merges
its maps. Map keys (container and resource names) match exactly; a repeated one replaces.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
import string
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from .bounded_cache import BoundedCache
from .quantity import INT64_MAX, INT64_MIN, QuantityError, quantity_value

__all__ = [
    "SPEC_CACHE_BYTES",
    "SPEC_CACHE_ENTRIES",
    "ContainerSpec",
    "ExtendedSpec",
    "SpecError",
    "load_spec",
    "parse_spec",
    "spec_cache",
]

# Go's strings.TrimSpace (unicode.IsSpace), which Quantity.UnmarshalJSON applies.
_GO_SPACE = " \t\n\v\f\r\x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000" + "".join(
    chr(c) for c in range(0x2000, 0x200B)
)


class SpecError(ValueError):
    """The annotation is present but unusable; names the container and resource if known."""

    def __init__(
        self,
        message: str,
        container: str | None = None,
        field: str | None = None,
        resource: str | None = None,
    ) -> None:
        where = "" if container is None else f"container {container!r}"
        if field is not None:
            where += f" {field}"
        if resource is not None:
            where += f" {resource!r}"
        super().__init__(
            f"extended-resource spec: {where}: {message}"
            if where
            else f"extended-resource spec: {message}"
        )
        self.container = container
        self.resource = resource


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """Quantity.Value() of every listed resource (milli-cores for *-cpu, bytes for memory)."""

    requests: Mapping[str, int]
    limits: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class ExtendedSpec:
    containers: Mapping[str, ContainerSpec]
    # Every resource named anywhere, so priority inference need not walk the containers.
    resource_names: frozenset[str]


class _Number(str):
    """The source text of a JSON number, kept because Go hands it to ParseQuantity as is."""


#: Specs kept parsed, at most: a pod's containers are decided one after another (and
#: its pod cgroup just before), so a few hundred hold every spec in use on a node.
SPEC_CACHE_ENTRIES = 256
#: ... and at most this many bytes, by `_footprint`'s count of the annotation text and
#: the maps parsed from it (objects shared between maps are counted at each use, so
#: it counts high): a 250 KB annotation, near the 256 KB limit of all of a pod's
#: annotations, counts about 1.4 MB, and 256 of them held hundreds of MB. A spec
#: costing more than this is parsed for each decision instead.
SPEC_CACHE_BYTES = 4 * 1024 * 1024
#: Quantity strings longer than this (no real one is) are parsed each time, not cached.
QUANTITY_CACHE_TEXT = 64


spec_cache: BoundedCache[str, ExtendedSpec | SpecError | None] = BoundedCache(
    SPEC_CACHE_ENTRIES, SPEC_CACHE_BYTES
)


class _Escaped(str):
    """A JSON string written with a backslash escape.

    Quantity.UnmarshalJSON parses the raw bytes between the quotes without unescaping them,
    and a backslash is never part of a quantity: Go rejects every such quantity.
    """


class _Object(list[tuple[str, object]]):
    """A JSON object as its (key, value) pairs in order, duplicates kept, as Go decodes it."""


# Go's encoding/json folds field names with unicode.ToUpper(unicode.ToLower(r)); the only runes
# that fold onto the ASCII letters of our field names, besides the letters, are these four.
_GO_FOLD = str.maketrans(
    string.ascii_uppercase + "\u017f\u212a\u0130\u0131", string.ascii_lowercase + "skii"
)


def _field(key: str) -> str:
    """The key as Go matches it against a struct's field names."""
    return key.translate(_GO_FOLD)


def _outcome(text: str) -> ExtendedSpec | SpecError | None:
    """parse_spec's outcome, an error included."""
    try:
        return parse_spec(text)
    except SpecError as error:
        return error


def _footprint(text: str, outcome: ExtendedSpec | SpecError | None) -> int:
    """About what a cache entry keeps alive: the text, and the maps parsed from it."""
    sizeof = sys.getsizeof
    size = sizeof(text)
    if isinstance(outcome, SpecError):
        return size + sizeof(outcome) + sizeof(str(outcome))
    if outcome is None:
        return size
    size += sizeof(outcome.containers) + sizeof(outcome.resource_names)
    for name, entry in outcome.containers.items():
        size += sizeof(name) + _ENTRY_BYTES
        for resources in (entry.requests, entry.limits):
            # Each value as the largest int64 takes: sys.getsizeof was a third of the cost of
            # parsing a small spec.
            size += sizeof(resources) + _VALUE_BYTES * len(resources)
            for resource in resources:
                size += sizeof(resource)
    return size


_ENTRY_BYTES = sys.getsizeof(ContainerSpec({}, {}))
#: Every value is in int64's range; none takes more than its extremes.
_VALUE_BYTES = max(sys.getsizeof(INT64_MAX), sys.getsizeof(INT64_MIN))

#: parse_spec with the outcome (error included) cached per annotation string.
load_spec = spec_cache.memoize(_outcome, _footprint)


def parse_spec(text: str) -> ExtendedSpec | None:
    """Parse the annotation value; None when it carries no containers map (Koordinator: no spec)."""
    try:
        document = _decode(text)
    except (ValueError, RecursionError) as error:
        raise SpecError(f"not valid JSON: {error}") from None
    if document is None:
        return None
    containers: dict[str, ContainerSpec] | None = None
    for key, value in _object(document, "the annotation"):
        if _field(key) != "containers":
            continue
        if value is None:
            containers = None  # Go sets a map field to nil on null
            continue
        if containers is None:
            containers = {}
        for name, entry in _object(value, '"containers"'):
            # Go decodes each map element from zero: a repeated container replaces.
            containers[name] = _container(entry, name)
    if containers is None:
        return None
    names: set[str] = set()
    for entry in containers.values():
        names.update(entry.requests, entry.limits)
    return ExtendedSpec(containers, frozenset(names))


def _decode(text: str) -> object:
    decoders = _DECODERS
    if "\\" in text:
        return decoders.escape_aware.decode(text)
    if text.startswith("\ufeff"):
        return json.loads(text)  # refuses it, with json.loads' own message for a BOM
    return decoders.plain.decode(text)  # no escapes: the fast C scanner


def _reject_constant(token: str) -> object:
    raise ValueError(f"{token} is not JSON")


def _scan_string(text: str, end: int, strict: bool = True) -> tuple[str, int]:
    value, after = json.decoder.scanstring(text, end, strict)  # type: ignore[attr-defined]
    return (_Escaped(value) if "\\" in text[end:after] else value), after


def _decoder() -> json.JSONDecoder:
    return json.JSONDecoder(
        object_pairs_hook=_Object,
        parse_int=_Number,
        parse_float=_Number,
        parse_constant=_reject_constant,
    )


def _escape_aware_decoder() -> json.JSONDecoder:
    """A decoder whose string values remember whether they were written with escapes.

    Only the pure-Python scanner calls `parse_string`; it is used for the rare annotation
    holding a backslash. json offers no supported hook for strings, and parsing JSON here
    would be slower and a second parser to keep right, so this builds on two internals of
    CPython's json module. A test in tests/unit/test_policy_spec.py (the escape-aware
    decoder still finds the json internals it builds on) fails if a Python upgrade
    changes either.
    """
    decoder = _decoder()
    decoder.parse_string = _scan_string  # type: ignore[attr-defined]
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    return decoder


class _Decoders(threading.local):
    """Each thread's own decoders, made once per thread (json.loads with arguments builds a
    decoder and its scanner for every text). A decoder is not shared between threads: its
    scanner keeps a memo of the keys it has read, filled and cleared at every document, and
    the webhook's workers parse specs at once.
    """

    def __init__(self) -> None:
        self.plain = _decoder()
        self.escape_aware = _escape_aware_decoder()


_DECODERS = _Decoders()


def _container(entry: object, name: str) -> ContainerSpec:
    if entry is None:
        return ContainerSpec({}, {})
    lists: dict[str, dict[str, int]] = {"requests": {}, "limits": {}}
    for key, value in _object(entry, "the entry", name):
        field = _field(key)
        if field not in lists:
            continue
        if value is None:
            lists[field] = {}  # nil map
            continue
        # A field written twice decodes into the map it already has: the entries merge.
        lists[field].update(_resource_list(value, name, field))
    return ContainerSpec(lists["requests"], lists["limits"])


def _object(
    value: object, what: str, container: str | None = None, field: str | None = None
) -> _Object:
    if isinstance(value, _Object):
        return value
    raise SpecError(f"{what} must be a JSON object, not {_json_type(value)}", container, field)


def _resource_list(value: object, container: str, field: str) -> dict[str, int]:
    result: dict[str, int] = {}
    for resource, raw in _object(value, "the resource list", container, field):
        result[resource] = _quantity_value(raw, container, field, resource)
    return result


def _quantity_value(raw: object, container: str, field: str, resource: str) -> int:
    # By exact type, the common ones first: the decoders make only these str classes.
    if type(raw) is str:
        text = raw.strip(_GO_SPACE)
    elif type(raw) is _Number:
        text = raw
    elif raw is None:
        return 0  # Quantity.UnmarshalJSON turns null into a zero quantity.
    elif type(raw) is _Escaped:
        raise SpecError(
            f"quantity {raw!r} is written with a JSON escape; Kubernetes reads a quantity's "
            "raw text, unescaped, and rejects it",
            container,
            field,
            resource,
        )
    else:
        raise SpecError(
            f"quantity must be a string or number, not {_json_type(raw)}",
            container,
            field,
            resource,
        )
    value = _quantity_int(text)
    if isinstance(value, QuantityError):
        raise SpecError(str(value), container, field, resource)
    if not INT64_MIN <= value <= INT64_MAX:
        raise SpecError(f"quantity {text!r} does not fit in int64", container, field, resource)
    return value


def _quantity_int(text: str) -> int | QuantityError:
    """A quantity's value, or why it has none; short texts (all real ones) are cached."""
    if len(text) > QUANTITY_CACHE_TEXT:
        return _parse_quantity_int(text)
    return _cached_quantity_int(text)


def _parse_quantity_int(text: str) -> int | QuantityError:
    try:
        return quantity_value(text)
    except QuantityError as error:
        return error


# Parsing one takes about 20 us (exact fractions), and a node's specs repeat a few
# dozen quantities ("1k", "512Mi"): each is parsed once. Keys are at most
# QUANTITY_CACHE_TEXT characters, so the entries bound holds first, at about 300 KB.
QUANTITY_CACHE_ENTRIES = 1024
QUANTITY_CACHE_BYTES = 1024 * 1024
quantity_cache: BoundedCache[str, int | QuantityError] = BoundedCache(
    QUANTITY_CACHE_ENTRIES, QUANTITY_CACHE_BYTES
)
_cached_quantity_int = quantity_cache.memoize(_parse_quantity_int)


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, _Number):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, _Object):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return "null" if value is None else "an object"
