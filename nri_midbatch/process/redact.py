"""Redacting what a recording must not carry: the values a container is started with.

Environment values (a container's, an OCI hook's, an adjustment's) and mount sources often
hold secrets or name them, and no decision reads them. Keys stay, values become REDACTED,
so a redacted recording still shows what was there and replays to the same replies.

The walk follows the JSON document, guided by paths worked out once from the message
descriptors, and only into the fields that can lead to a redacted one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf.message import Message

from nri_midbatch.api import nri_pb2

REDACTED = "<redacted>"


def _redact_env(entries: list[str]) -> list[str]:
    """Each KEY=VALUE becomes KEY=<redacted>; an entry without "=" is only a key, kept."""
    return [
        f"{key}={REDACTED}" if sep else key
        for key, sep, _ in (entry.partition("=") for entry in entries)
    ]


def _redact_key_values(pairs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**pair, "value": REDACTED} if "value" in pair else pair for pair in pairs]


def _redact_value(_value: object) -> str:
    return REDACTED


_PACKAGE = "nri.pkg.api.v1alpha1"
#: (message, field) -> how its JSON value is redacted: what a container is started with that
#: may carry secrets and that no decision reads.
_REDACT: dict[tuple[str, str], Callable[[Any], Any]] = {
    (f"{_PACKAGE}.Container", "env"): _redact_env,
    (f"{_PACKAGE}.Hook", "env"): _redact_env,
    (f"{_PACKAGE}.ContainerAdjustment", "env"): _redact_key_values,
    (f"{_PACKAGE}.Mount", "source"): _redact_value,
}


#: message type -> its fields whose message type holds a redacted field, at any depth:
#: (field name, that type, repeated). Map fields are left out: none holds one.
_Paths = dict[str, list[tuple[str, str, bool]]]


def _paths_to_secrets() -> _Paths:
    messages = list(nri_pb2.DESCRIPTOR.message_types_by_name.values())
    holders = {message for message, _ in _REDACT}
    paths: _Paths = {}
    grew = True
    while grew:  # until no type is added: the NRI types are few
        grew = False
        for message in messages:
            found = [
                (field.name, field.message_type.full_name, field.is_repeated)
                for field in message.fields
                if field.message_type is not None
                and not field.message_type.GetOptions().map_entry
                and field.message_type.full_name in holders
            ]
            if len(found) > len(paths.get(message.full_name, [])):
                paths[message.full_name] = found
                holders.add(message.full_name)
                grew = True
    return paths


_PATHS = _paths_to_secrets()
_RULES: dict[str, list[tuple[str, Callable[[Any], Any]]]] = {}
for (_owner, _field), _replace in _REDACT.items():
    _RULES.setdefault(_owner, []).append((_field, _replace))


def redact(message: Message, document: dict[str, Any]) -> None:
    """Redact `document`, the protobuf JSON of `message` with proto field names, in place."""
    _redact(message.DESCRIPTOR.full_name, document)


def _redact(message_type: str, document: dict[str, Any]) -> None:
    # Only the JSON is walked, and only along the paths that lead to a redacted field.
    for name, replace in _RULES.get(message_type, ()):
        if name in document:
            document[name] = replace(document[name])
    for name, nested, repeated in _PATHS.get(message_type, ()):
        value = document.get(name)
        if value is None:
            continue
        for item in value if repeated else (value,):
            _redact(nested, item)
