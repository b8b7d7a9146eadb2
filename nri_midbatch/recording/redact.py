"""Redacting a recording by allowlist: it keeps the strings replay needs and no other.

A container is started with strings that often hold secrets (arguments, environment,
mount options, hook arguments, annotations such as kubectl's last-applied-configuration,
which repeats the pod's environment). No decision reads them. So every string field is
replaced by REDACTED unless it is listed here as one that decisions rest on or that names
what a decision is about: ids, names, uids, namespaces, labels, the annotations the policy
reads, linux resources, cgroup paths, the runtime's name and version and the plugin's own
replies. Numbers, booleans and enums are kept: they are not free text. A field the NRI
protocol adds later is redacted until it is allowlisted here.

Maps: labels keep keys and values; annotations keep their keys (a reader sees what was
there) and the values of the annotations the policy reads; any other map's text keys and
values are redacted (its entries then collapse into one).

The walk follows the JSON document of a message (protobuf JSON with proto field names),
guided by the message's descriptor.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, cast

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from nri_midbatch.plugin.codec import NATIVE_LIMITS_ANNOTATION
from nri_midbatch.policy.cpuset import RESOURCE_STATUS_ANNOTATION

REDACTED = "<redacted>"

#: The extended-resource-spec annotation's default name (classification may rename it).
DEFAULT_SPEC_ANNOTATION = "node.koordinator.sh/extended-resource-spec"
#: Annotation values a recording keeps by default: the ones the policy reads.
DEFAULT_KEPT_ANNOTATIONS = frozenset(
    {DEFAULT_SPEC_ANNOTATION, RESOURCE_STATUS_ANNOTATION, NATIVE_LIMITS_ANNOTATION}
)


def kept_annotations(spec_annotation: str) -> frozenset[str]:
    """The annotations the policy reads, with the spec annotation's configured name.

    The default name stays too: a reload may go back to it, and the recorder keeps its set.
    """
    return DEFAULT_KEPT_ANNOTATIONS | {spec_annotation}


_PACKAGE = "nri.pkg.api.v1alpha1"
_STRING_TYPES = (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES)

#: message -> its string (or map) fields kept as they are.
_KEPT_FIELDS: dict[str, frozenset[str]] = {
    f"{_PACKAGE}.{message}": frozenset(fields)
    for message, fields in {
        "PodSandbox": {"id", "name", "uid", "namespace", "labels"},
        "LinuxPodSandbox": {"cgroup_parent", "cgroups_path"},
        "Container": {"id", "pod_sandbox_id", "name", "labels"},
        "LinuxContainer": {"cgroups_path"},
        "LinuxContainerAdjustment": {"cgroups_path"},
        # The runtime's name and version; its config string is the plugin's configuration,
        # which replay can apply (--runtime-config).
        "ConfigureRequest": {"runtime_name", "runtime_version", "config", "NRI_version"},
        "RegisterPluginRequest": {"plugin_name", "plugin_idx", "NRI_version"},
        # The plugin's own replies.
        "ContainerUpdate": {"container_id"},
        "ContainerEviction": {"container_id", "reason"},
    }.items()
}
#: Messages kept whole, wherever they appear: what the plugin reads and writes.
_KEPT_MESSAGES = frozenset({f"{_PACKAGE}.LinuxResources"})
_ANNOTATIONS = "annotations"


def redact(
    message: Message,
    document: dict[str, Any],
    kept_annotations: Collection[str] = DEFAULT_KEPT_ANNOTATIONS,
) -> None:
    """Redact `document`, the protobuf JSON of `message` with proto field names, in place.

    kept_annotations: the annotations whose values stay (the others keep only their keys).
    """
    # The C implementation's descriptor type stands in for the Python one.
    _redact(cast(Descriptor, message.DESCRIPTOR), document, kept_annotations)


def _redact(descriptor: Descriptor, document: dict[str, Any], kept: Collection[str]) -> None:
    if descriptor.full_name in _KEPT_MESSAGES:
        return
    allowed = _KEPT_FIELDS.get(descriptor.full_name, frozenset())
    for name, value in document.items():
        field = descriptor.fields_by_name.get(name)
        if field is None or name in allowed:
            continue
        nested = field.message_type
        if nested is not None and nested.GetOptions().map_entry:
            document[name] = _redact_map(name, nested, value, kept)
        elif nested is not None:
            for item in value if field.is_repeated else (value,):
                _redact(nested, item, kept)
        elif field.type in _STRING_TYPES:
            document[name] = [REDACTED] * len(value) if field.is_repeated else REDACTED


def _redact_map(
    name: str, entry: Descriptor, entries: dict[str, Any], kept: Collection[str]
) -> dict[str, Any]:
    value_field = entry.fields_by_name["value"]
    # A key of another type (a field number, say) is not free text; JSON spells it as a string.
    keys_are_text = entry.fields_by_name["key"].type in _STRING_TYPES
    result: dict[str, Any] = {}
    for key, value in entries.items():
        if name == _ANNOTATIONS:
            result[key] = value if key in kept else REDACTED
            continue
        if value_field.message_type is not None:
            _redact(value_field.message_type, value, kept)
        elif value_field.type in _STRING_TYPES:
            value = REDACTED
        result[REDACTED if keys_are_text else key] = value
    return result
