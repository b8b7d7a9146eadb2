"""Redacting what a recording must not carry: the values a container is started with.

Environment values (a container's, an OCI hook's, an adjustment's) and mount sources often
hold secrets or name them, and no decision reads them. Keys stay, values become REDACTED,
so a redacted recording still shows what was there and replays to the same replies.

The walk follows the message descriptors, and only into the message types that can hold a
redacted field, so a large Synchronize costs little more than its conversion to JSON.
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


def _holding_secrets() -> frozenset[str]:
    """The message types that hold a redacted field, directly or through their fields."""
    holders = {message for message, _ in _REDACT}
    messages = list(nri_pb2.DESCRIPTOR.message_types_by_name.values())
    grew = True
    while grew:  # until no type is added: the NRI types are few
        grew = False
        for message in messages:
            if message.full_name not in holders and any(
                field.message_type is not None and field.message_type.full_name in holders
                for field in message.fields
            ):
                holders.add(message.full_name)
                grew = True
    return frozenset(holders)


_HOLDING_SECRETS = _holding_secrets()


def redact(message: Message, document: dict[str, Any]) -> None:
    """Redact `document`, the protobuf JSON of `message` with proto field names, in place."""
    owner = message.DESCRIPTOR.full_name
    for field, value in message.ListFields():
        replace = _REDACT.get((owner, field.name))
        if replace is not None:
            document[field.name] = replace(document[field.name])
            continue
        nested = field.message_type
        if nested is None or nested.full_name not in _HOLDING_SECRETS:
            continue
        if field.is_repeated:
            for item, item_document in zip(value, document[field.name], strict=True):
                redact(item, item_document)
        else:
            redact(value, document[field.name])
