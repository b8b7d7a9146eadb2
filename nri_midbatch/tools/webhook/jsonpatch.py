"""RFC 6902 JSON Patch operations, with RFC 6901 pointers."""

from __future__ import annotations

from typing import Any

__all__ = ["Op", "add", "pointer", "remove", "replace"]

Op = dict[str, Any]


def pointer(*tokens: str) -> str:
    """A JSON pointer: '~' becomes '~0' and then '/' becomes '~1' in every token (RFC 6901 §3)."""
    return "".join("/" + token.replace("~", "~0").replace("/", "~1") for token in tokens)


def add(path: str, value: Any) -> Op:
    return {"op": "add", "path": path, "value": value}


def replace(path: str, value: Any) -> Op:
    return {"op": "replace", "path": path, "value": value}


def remove(path: str) -> Op:
    return {"op": "remove", "path": path}
