"""Reading YAML no one vouches for, within bounds in bytes, nesting and values.

Both the configuration (a file, or the text of NRI's Configure) and the pod files `explain`
reads come from outside. Each bound turns a way to hang or crash the reader into a refusal
with a reason: a FIFO or a device as the file (an endless or blocking read), more than
MAX_BYTES of text, nesting past MAX_DEPTH (PyYAML composes recursively: a RecursionError),
and more than MAX_NODES values, aliases expanded (an alias bomb, or a long flow list that
costs seconds of CPU). With these, a load costs at most about a second of CPU.

JSON is read as the YAML it is, as kubectl reads it.
"""

from __future__ import annotations

import io
import os
import re
import stat
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "DECIMAL_SYNTAX",
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_NODES",
    "UntrustedInputError",
    "load_yaml",
    "read_file",
]

#: The most a document may hold: a ConfigMap's own limit, and far above any real
#: configuration (the defaults are 1.5 KB) or Pod manifest.
MAX_BYTES = 1024 * 1024
#: The deepest nesting a document may have (the configuration goes 4 levels deep, a Pod
#: manifest with its managed fields about 12).
MAX_DEPTH = 32
#: The most YAML nodes a document may stand for once every alias is expanded, so an alias
#: bomb (a few lines that reference each other into billions of nodes) is refused while
#: it is still a few lines; a configuration with 100 tiers has about 2,000.
MAX_NODES = 20_000


class UntrustedInputError(ValueError):
    """The text cannot be read within the bounds; the message starts with its source."""


def read_file(path: str | Path) -> str:
    """The file's text, if it is a regular file of at most MAX_BYTES of UTF-8.

    The path may be a symlink (a mounted ConfigMap is one), so what it resolves to is
    checked: a FIFO would block the reader and a device (/dev/zero) never ends. The
    open does not block either way, and the file is checked again once open, in case
    it was swapped in between.
    """
    try:
        _check_regular(path, os.stat(path).st_mode)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise UntrustedInputError(f"{path}: cannot read: {error.strerror or error}") from None
    try:
        _check_regular(path, os.fstat(fd).st_mode)
        data = _read_at_most(fd, MAX_BYTES + 1)
    except OSError as error:
        raise UntrustedInputError(f"{path}: cannot read: {error.strerror or error}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise UntrustedInputError(f"{path}: larger than {MAX_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UntrustedInputError(f"{path}: not UTF-8 text: {error}") from None


def load_yaml(text: str, source: str) -> Any:
    """The document `text` holds (None when empty); `source` names it in errors.

    Every way the text can fail to load is an UntrustedInputError.
    """
    if len(text) > MAX_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise UntrustedInputError(f"{source}: larger than {MAX_BYTES} bytes")
    stream = io.StringIO(text)
    stream.name = source  # PyYAML quotes the stream name in error marks
    try:
        return yaml.load(stream, Loader=_StrictLoader)
    except _NumberRefused as error:
        message = f"{source}: valid YAML, but a number is refused: {error}"
        raise UntrustedInputError(message) from None
    except yaml.YAMLError as error:
        raise UntrustedInputError(f"{source}: not valid YAML: {error}") from None
    except Exception as error:  # e.g. an integer of 5,000 digits (ValueError)
        raise UntrustedInputError(f"{source}: not valid YAML: {reason(error)}") from None


def reason(error: Exception) -> str:
    """The error's type and message, for an error no rule foresaw."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _check_regular(path: str | Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a special file (FIFO, socket or device)"
        raise UntrustedInputError(f"{path}: cannot read: {kind}, not a regular file")


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = os.read(fd, limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _refusal(bound: str, mark: Any, *, expanded: bool) -> yaml.composer.ComposerError:
    once = " once its aliases are expanded" if expanded else ""
    return yaml.composer.ComposerError(None, None, bound + once, mark)


_TOO_DEEP = f"nested more than {MAX_DEPTH} levels deep"
_TOO_MANY = f"stands for more than {MAX_NODES} values"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that bounds the document's shape and rejects a key written twice.

    PyYAML composes nested nodes recursively: nesting thousands deep would end in a
    RecursionError, so depth is counted as nodes are composed, and so are the nodes,
    so that a long list is refused before it has cost seconds of CPU (an alias counts
    as one: it stands for at least one). Aliases share nodes, so the document is then
    measured as if every alias were expanded, in one pass over its distinct nodes.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        self._nodes += 1
        try:
            bound = _TOO_DEEP if self._depth > MAX_DEPTH else None
            bound = _TOO_MANY if self._nodes > MAX_NODES else bound
            if bound:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise _refusal(bound, mark, expanded=False)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> yaml.Node | None:
        node = super().compose_document()
        if node is not None:
            _expanded_size(node, {}, set())
        return node


def _expanded_size(
    node: yaml.Node, sizes: dict[int, tuple[int, int]], open_: set[int]
) -> tuple[int, int]:
    """(nodes, depth) of `node` with every alias expanded; raises past the bounds."""
    key = id(node)
    known = sizes.get(key)
    if known is not None:
        return known
    if key in open_:
        raise yaml.composer.ComposerError(
            None, None, "an alias refers to a node that contains it", node.start_mark
        )
    open_.add(key)
    count, depth = 1, 0
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    for child in children:
        child_count, child_depth = _expanded_size(child, sizes, open_)
        count += child_count
        depth = max(depth, child_depth)
        if count > MAX_NODES:
            raise _refusal(_TOO_MANY, node.start_mark, expanded=True)
    depth += 1
    if depth > MAX_DEPTH:
        raise _refusal(_TOO_DEEP, node.start_mark, expanded=True)
    open_.discard(key)
    sizes[key] = (count, depth)
    return count, depth


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


# -- numbers ------------------------------------------------------------------------------
#: How the configuration writes a number, for error messages and docs.
DECIMAL_SYNTAX = "digits with an optional sign, fraction and exponent: 2, 1.2, .5, 12e-1, 1e300"
#: The one grammar of numbers here: a decimal. YAML 1.1, which PyYAML reads, also takes
#: 0x10, 0o17, 010 (octal), 1_000 and 1:30 (base 60) for numbers, and reads 1e300 (an
#: exponent without a dot) as text; none of those is what "the decimal written" means.
_DECIMAL = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?\Z")
_INTEGER = re.compile(r"[-+]?[0-9]+\Z")
_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"


class _NumberRefused(yaml.constructor.ConstructorError):
    """Valid YAML whose number is not one this reader takes."""


def _construct_number(loader: _StrictLoader, node: yaml.ScalarNode) -> int | float:
    """A decimal as the double that is exactly it (compile reads the ratio back by repr).

    Explicit `!!int` and `!!float` tags come here too, so no other spelling gets in.
    """
    text = loader.construct_scalar(node)
    if not _DECIMAL.match(text):
        raise _NumberRefused(
            None, None, f"{text!r} is not a decimal number ({DECIMAL_SYNTAX})", node.start_mark
        )
    value = float(text)
    # Decimal compares exponents as numbers: no power of ten is built for 1e999999.
    if Decimal(repr(value)) != Decimal(text):
        raise _NumberRefused(
            None,
            None,
            f"{text} cannot be held exactly as a double (any decimal of up to 15 "
            "significant digits between 1e-308 and 1e308 can)",
            node.start_mark,
        )
    return int(text) if _INTEGER.match(text) else value


_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag not in (_INT_TAG, _FLOAT_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(_FLOAT_TAG, _DECIMAL, list("-+.0123456789"))
_StrictLoader.add_constructor(_INT_TAG, _construct_number)
_StrictLoader.add_constructor(_FLOAT_TAG, _construct_number)
