"""Checks that our NRI and ttrpc protobufs match the upstream wire format.

Facts come from shared/reference/nri-protocol.md: the byte examples of §1.6
and the message, service and enum tables of §3 (containerd/nri v0.12.2).
"""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor

from nri_midbatch.api import nri_pb2, rpc_status_pb2, ttrpc_pb2

pytestmark = pytest.mark.generated

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "nri.pkg.api.v1alpha1"


# ---------------------------------------------------------------------------
# Generated modules are up to date
# ---------------------------------------------------------------------------


def test_generated_modules_are_not_stale() -> None:
    proc = subprocess.run(
        [sys.executable, "scripts/gen_protos.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"


def test_file_level_names() -> None:
    assert nri_pb2.DESCRIPTOR.package == PACKAGE
    assert nri_pb2.DESCRIPTOR.GetOptions().go_package == "github.com/containerd/nri/pkg/api"
    assert ttrpc_pb2.DESCRIPTOR.package == "ttrpc"
    assert rpc_status_pb2.DESCRIPTOR.package == "google.rpc"


# ---------------------------------------------------------------------------
# Byte-exact encodings (reference §1.6 and the wrapper note in §3.3)
# ---------------------------------------------------------------------------

REGISTER_ENVELOPE_HEX = (
    "0a1c" + b"nri.pkg.api.v1alpha1.Runtime".hex() + "120e" + b"RegisterPlugin".hex() + "1a0a"
    "0a04" + b"demo".hex() + "1202" + b"10".hex() + "2080e497d012"
)


def _register_request() -> ttrpc_pb2.Request:
    payload = nri_pb2.RegisterPluginRequest(plugin_name="demo", plugin_idx="10")
    return ttrpc_pb2.Request(
        service=f"{PACKAGE}.Runtime",
        method="RegisterPlugin",
        payload=payload.SerializeToString(),
        timeout_nano=5_000_000_000,
    )


def test_register_plugin_envelope_bytes() -> None:
    data = _register_request().SerializeToString()
    assert data.hex() == REGISTER_ENVELOPE_HEX
    assert len(data) == 64


def test_register_plugin_full_frame_bytes() -> None:
    # mux header (conn 2, 74 bytes) + ttrpc header (len 64, stream 1, Request, flags 0).
    data = _register_request().SerializeToString()
    ttrpc_frame = struct.pack(">IIBB", len(data), 1, 0x01, 0x00) + data
    mux_frame = struct.pack(">II", 2, len(ttrpc_frame)) + ttrpc_frame
    expected = "000000020000004a00000040000000010100" + REGISTER_ENVELOPE_HEX
    assert mux_frame.hex() == expected


def test_register_plugin_payload_round_trip() -> None:
    req = ttrpc_pb2.Request.FromString(bytes.fromhex(REGISTER_ENVELOPE_HEX))
    inner = nri_pb2.RegisterPluginRequest.FromString(req.payload)
    assert (inner.plugin_name, inner.plugin_idx, inner.NRI_version) == ("demo", "10", "")
    assert req.timeout_nano == 5_000_000_000


def test_configure_response_events_is_field_2() -> None:
    events = (1 << (nri_pb2.CREATE_CONTAINER - 1)) | (1 << (nri_pb2.START_CONTAINER - 1))
    assert events == 0x28
    body = nri_pb2.ConfigureResponse(events=events).SerializeToString()
    assert body == b"\x10\x28"
    assert ttrpc_pb2.Response(payload=body).SerializeToString() == b"\x12\x02\x10\x28"


def test_error_response_bytes() -> None:
    resp = ttrpc_pb2.Response(status=rpc_status_pb2.Status(code=12, message="method Foo"))
    assert resp.SerializeToString() == bytes.fromhex("0a0e080c120a") + b"method Foo"


def test_empty_messages_encode_to_nothing() -> None:
    assert nri_pb2.Empty().SerializeToString() == b""
    assert ttrpc_pb2.Response().SerializeToString() == b""


def test_optional_wrapper_with_zero_is_present() -> None:
    assert nri_pb2.OptionalInt64(value=0).SerializeToString() == b""
    mem = nri_pb2.LinuxMemory(limit=nri_pb2.OptionalInt64(value=0))
    assert mem.HasField("limit")
    assert mem.SerializeToString() == b"\x0a\x00"
    assert not nri_pb2.LinuxMemory().HasField("limit")


# ---------------------------------------------------------------------------
# Every message: field numbers, names and types (reference §3.3)
# ---------------------------------------------------------------------------

# message -> "number name type; ..." in the notation of the reference:
# "repeated T", "map<K, V>", scalar or message/enum name relative to the package.
MESSAGES: dict[str, str] = {
    # registration, configuration, sync
    "RegisterPluginRequest": "1 plugin_name string; 2 plugin_idx string; 3 NRI_version string",
    "UpdateContainersRequest": (
        "1 update repeated ContainerUpdate; 2 evict repeated ContainerEviction"
    ),
    "UpdateContainersResponse": "1 failed repeated ContainerUpdate",
    "LogRequest": "1 msg string; 2 level LogRequest.Level",
    "ConfigureRequest": (
        "1 config string; 2 runtime_name string; 3 runtime_version string;"
        " 4 registration_timeout int64; 5 request_timeout int64; 6 NRI_version string"
    ),
    "ConfigureResponse": "2 events int32",
    "SynchronizeRequest": (
        "1 pods repeated PodSandbox; 2 containers repeated Container; 3 more bool"
    ),
    "SynchronizeResponse": "1 update repeated ContainerUpdate; 2 more bool",
    "Empty": "",
    # requests and responses
    "RunPodSandboxRequest": "1 pod PodSandbox",
    "RunPodSandboxResponse": "",
    "UpdatePodSandboxRequest": (
        "1 pod PodSandbox; 2 overhead_linux_resources LinuxResources;"
        " 3 linux_resources LinuxResources"
    ),
    "UpdatePodSandboxResponse": "",
    "PostUpdatePodSandboxRequest": "1 pod PodSandbox",
    "PostUpdatePodSandboxResponse": "",
    "StopPodSandboxRequest": "1 pod PodSandbox",
    "StopPodSandboxResponse": "",
    "RemovePodSandboxRequest": "1 pod PodSandbox",
    "RemovePodSandboxResponse": "",
    "CreateContainerRequest": "1 pod PodSandbox; 2 container Container",
    "CreateContainerResponse": (
        "1 adjust ContainerAdjustment; 2 update repeated ContainerUpdate;"
        " 3 evict repeated ContainerEviction"
    ),
    "PostCreateContainerRequest": "1 pod PodSandbox; 2 container Container",
    "PostCreateContainerResponse": "",
    "StartContainerRequest": "1 pod PodSandbox; 2 container Container",
    "StartContainerResponse": "",
    "PostStartContainerRequest": "1 pod PodSandbox; 2 container Container",
    "PostStartContainerResponse": "",
    "UpdateContainerRequest": (
        "1 pod PodSandbox; 2 container Container; 3 linux_resources LinuxResources"
    ),
    "UpdateContainerResponse": (
        "1 update repeated ContainerUpdate; 2 evict repeated ContainerEviction"
    ),
    "PostUpdateContainerRequest": "1 pod PodSandbox; 2 container Container",
    "PostUpdateContainerResponse": "",
    "StopContainerRequest": "1 pod PodSandbox; 2 container Container",
    "StopContainerResponse": "1 update repeated ContainerUpdate",
    "RemoveContainerRequest": "1 pod PodSandbox; 2 container Container",
    "RemoveContainerResponse": "",
    "StateChangeEvent": "1 event Event; 2 pod PodSandbox; 3 container Container",
    "ValidateContainerAdjustmentRequest": (
        "1 pod PodSandbox; 2 container Container; 3 adjust ContainerAdjustment;"
        " 4 update repeated ContainerUpdate; 5 owners OwningPlugins;"
        " 6 plugins repeated PluginInstance"
    ),
    "PluginInstance": "1 name string; 2 index string",
    "ValidateContainerAdjustmentResponse": "1 reject bool; 2 reason string",
    # pods and containers
    "PodSandbox": (
        "1 id string; 2 name string; 3 uid string; 4 namespace string;"
        " 5 labels map<string, string>; 6 annotations map<string, string>;"
        " 7 runtime_handler string; 8 linux LinuxPodSandbox; 9 pid uint32;"
        " 10 ips repeated string"
    ),
    "LinuxPodSandbox": (
        "1 pod_overhead LinuxResources; 2 pod_resources LinuxResources;"
        " 3 cgroup_parent string; 4 cgroups_path string;"
        " 5 namespaces repeated LinuxNamespace; 6 resources LinuxResources"
    ),
    "Container": (
        "1 id string; 2 pod_sandbox_id string; 3 name string; 4 state ContainerState;"
        " 5 labels map<string, string>; 6 annotations map<string, string>;"
        " 7 args repeated string; 8 env repeated string; 9 mounts repeated Mount;"
        " 10 hooks Hooks; 11 linux LinuxContainer; 12 pid uint32;"
        " 13 rlimits repeated POSIXRlimit; 14 created_at int64; 15 started_at int64;"
        " 16 finished_at int64; 17 exit_code int32; 18 status_reason string;"
        " 19 status_message string; 20 CDI_devices repeated CDIDevice; 21 user User;"
        " 22 image Image"
    ),
    "Image": "1 name string; 2 digest string; 3 config_digest string",
    "Mount": "1 destination string; 2 type string; 3 source string; 4 options repeated string",
    "Hooks": (
        "1 prestart repeated Hook; 2 create_runtime repeated Hook;"
        " 3 create_container repeated Hook; 4 start_container repeated Hook;"
        " 5 poststart repeated Hook; 6 poststop repeated Hook"
    ),
    "Hook": "1 path string; 2 args repeated string; 3 env repeated string; 4 timeout OptionalInt",
    "LinuxContainer": (
        "1 namespaces repeated LinuxNamespace; 2 devices repeated LinuxDevice;"
        " 3 resources LinuxResources; 4 oom_score_adj OptionalInt; 5 cgroups_path string;"
        " 6 io_priority LinuxIOPriority; 7 seccomp_profile SecurityProfile;"
        " 8 seccomp_policy LinuxSeccomp; 9 sysctl map<string, string>;"
        " 10 net_devices map<string, LinuxNetDevice>; 11 scheduler LinuxScheduler;"
        " 12 rdt LinuxRdt"
    ),
    "LinuxNamespace": "1 type string; 2 path string",
    "LinuxDevice": (
        "1 path string; 2 type string; 3 major int64; 4 minor int64;"
        " 5 file_mode OptionalFileMode; 6 uid OptionalUInt32; 7 gid OptionalUInt32"
    ),
    "LinuxDeviceCgroup": (
        "1 allow bool; 2 type string; 3 major OptionalInt64; 4 minor OptionalInt64; 5 access string"
    ),
    "CDIDevice": "1 name string",
    "User": "1 uid uint32; 2 gid uint32; 3 additional_gids repeated uint32",
    "POSIXRlimit": "1 type string; 2 hard uint64; 3 soft uint64",
    # resources
    "LinuxResources": (
        "1 memory LinuxMemory; 2 cpu LinuxCPU; 3 hugepage_limits repeated HugepageLimit;"
        " 4 blockio_class OptionalString; 5 rdt_class OptionalString;"
        " 6 unified map<string, string>; 7 devices repeated LinuxDeviceCgroup;"
        " 8 pids LinuxPids"
    ),
    "LinuxMemory": (
        "1 limit OptionalInt64; 2 reservation OptionalInt64; 3 swap OptionalInt64;"
        " 4 kernel OptionalInt64; 5 kernel_tcp OptionalInt64; 6 swappiness OptionalUInt64;"
        " 7 disable_oom_killer OptionalBool; 8 use_hierarchy OptionalBool"
    ),
    "LinuxCPU": (
        "1 shares OptionalUInt64; 2 quota OptionalInt64; 3 period OptionalUInt64;"
        " 4 realtime_runtime OptionalInt64; 5 realtime_period OptionalUInt64;"
        " 6 cpus string; 7 mems string"
    ),
    "HugepageLimit": "1 page_size string; 2 limit uint64",
    "LinuxPids": "1 limit int64",
    # security, scheduling, other Linux settings
    "SecurityProfile": "1 profile_type SecurityProfile.ProfileType; 2 localhost_ref string",
    "LinuxIOPriority": "1 class IOPrioClass; 2 priority int32",
    "LinuxSeccomp": (
        "1 default_action string; 2 default_errno OptionalUInt32;"
        " 3 architectures repeated string; 4 flags repeated string; 5 listener_path string;"
        " 6 listener_metadata string; 7 syscalls repeated LinuxSyscall"
    ),
    "LinuxSyscall": (
        "1 names repeated string; 2 action string; 3 errno_ret OptionalUInt32;"
        " 4 args repeated LinuxSeccompArg"
    ),
    "LinuxSeccompArg": "1 index uint32; 2 value uint64; 3 value_two uint64; 4 op string",
    "LinuxNetDevice": "1 name string",
    "LinuxScheduler": (
        "1 policy LinuxSchedulerPolicy; 2 nice int32; 3 priority int32;"
        " 4 flags repeated LinuxSchedulerFlag; 5 runtime uint64; 6 deadline uint64;"
        " 7 period uint64"
    ),
    "LinuxRdt": (
        "1 clos_id OptionalString; 2 schemata OptionalRepeatedString;"
        " 3 enable_monitoring OptionalBool; 4 remove bool"
    ),
    "LinuxMemoryPolicy": "1 mode MpolMode; 2 nodes string; 3 flags repeated MpolFlag",
    # adjustments and updates
    "ContainerAdjustment": (
        "2 annotations map<string, string>; 3 mounts repeated Mount; 4 env repeated KeyValue;"
        " 5 hooks Hooks; 6 linux LinuxContainerAdjustment; 7 rlimits repeated POSIXRlimit;"
        " 8 CDI_devices repeated CDIDevice; 9 args repeated string"
    ),
    "LinuxContainerAdjustment": (
        "1 devices repeated LinuxDevice; 2 resources LinuxResources; 3 cgroups_path string;"
        " 4 oom_score_adj OptionalInt; 5 io_priority LinuxIOPriority;"
        " 6 seccomp_policy LinuxSeccomp; 7 namespaces repeated LinuxNamespace;"
        " 8 sysctl map<string, string>; 9 net_devices map<string, LinuxNetDevice>;"
        " 10 scheduler LinuxScheduler; 11 rdt LinuxRdt; 12 memory_policy LinuxMemoryPolicy"
    ),
    "ContainerUpdate": (
        "1 container_id string; 2 linux LinuxContainerUpdate; 3 ignore_failure bool"
    ),
    "LinuxContainerUpdate": "1 resources LinuxResources",
    "ContainerEviction": "1 container_id string; 2 reason string",
    "KeyValue": "1 key string; 2 value string",
    # wrappers
    "OptionalString": "1 value string",
    "OptionalRepeatedString": "1 value repeated string",
    "OptionalInt": "1 value int64",
    "OptionalInt32": "1 value int32",
    "OptionalUInt32": "1 value uint32",
    "OptionalInt64": "1 value int64",
    "OptionalUInt64": "1 value uint64",
    "OptionalBool": "1 value bool",
    "OptionalFileMode": "1 value uint32",
    # ownership
    "CompoundFieldOwners": "1 owners map<string, string>",
    "FieldOwners": "1 simple map<int32, string>; 2 compound map<int32, CompoundFieldOwners>",
    "OwningPlugins": "1 owners map<string, FieldOwners>",
}

_SCALARS = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BYTES: "bytes",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_UINT32: "uint32",
    FieldDescriptor.TYPE_UINT64: "uint64",
    FieldDescriptor.TYPE_SINT32: "sint32",
    FieldDescriptor.TYPE_SINT64: "sint64",
    FieldDescriptor.TYPE_FIXED32: "fixed32",
    FieldDescriptor.TYPE_FIXED64: "fixed64",
    FieldDescriptor.TYPE_SFIXED32: "sfixed32",
    FieldDescriptor.TYPE_SFIXED64: "sfixed64",
    FieldDescriptor.TYPE_FLOAT: "float",
    FieldDescriptor.TYPE_DOUBLE: "double",
}


def _type_name(field: FieldDescriptor) -> str:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        assert field.message_type is not None
        full = field.message_type.full_name
    elif field.type == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        full = field.enum_type.full_name
    else:
        return _SCALARS[field.type]
    return full.removeprefix(PACKAGE + ".")


def _describe(field: FieldDescriptor) -> str:
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
        return f"map<{_type_name(key)}, {_type_name(value)}>"
    base = _type_name(field)
    return f"repeated {base}" if field.is_repeated else base


def _actual(desc: Descriptor) -> list[tuple[int, str, str]]:
    return sorted((f.number, f.name, _describe(f)) for f in desc.fields)


def _expected(spec: str) -> list[tuple[int, str, str]]:
    rows = []
    for item in filter(None, (part.strip() for part in spec.split(";"))):
        number, name, kind = item.split(" ", 2)
        rows.append((int(number), name, kind))
    return sorted(rows)


def test_message_set_is_complete() -> None:
    # Our own messages only: map entries are nested types, not listed here.
    assert set(nri_pb2.DESCRIPTOR.message_types_by_name) == set(MESSAGES)


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_message_fields(name: str) -> None:
    desc = nri_pb2.DESCRIPTOR.message_types_by_name[name]
    assert _actual(desc) == _expected(MESSAGES[name])


def test_no_field_uses_proto3_optional() -> None:
    # Upstream uses wrapper messages, never `optional` scalars, for presence.
    for desc in nri_pb2.DESCRIPTOR.message_types_by_name.values():
        for field in desc.fields:
            assert field.containing_oneof is None, f"{desc.name}.{field.name}"


def test_python_keyword_field_and_map_entry_types() -> None:
    prio = nri_pb2.LinuxIOPriority(priority=4, **{"class": nri_pb2.IOPRIO_CLASS_BE})
    assert getattr(prio, "class") == nri_pb2.IOPRIO_CLASS_BE
    assert prio.SerializeToString() == b"\x08\x02\x10\x04"
    owners = nri_pb2.FieldOwners()
    owners.simple[nri_pb2.MemLimit] = "plugin-a"
    owners.compound[nri_pb2.Annotations].owners["key"] = "plugin-b"
    assert nri_pb2.FieldOwners.FromString(owners.SerializeToString()) == owners


# ---------------------------------------------------------------------------
# Services (reference §3.1)
# ---------------------------------------------------------------------------

# The dedicated event RPCs of v0.12: `<Name>Request` -> empty `<Name>Response`.
POD_EVENT_RPCS = ("RunPodSandbox", "StopPodSandbox", "RemovePodSandbox", "PostUpdatePodSandbox")
CONTAINER_EVENT_RPCS = (
    "PostCreateContainer",
    "StartContainer",
    "PostStartContainer",
    "PostUpdateContainer",
    "RemoveContainer",
)

SERVICES: dict[str, dict[str, tuple[str, str]]] = {
    "Runtime": {
        "RegisterPlugin": ("RegisterPluginRequest", "Empty"),
        "UpdateContainers": ("UpdateContainersRequest", "UpdateContainersResponse"),
    },
    "Plugin": {
        "Configure": ("ConfigureRequest", "ConfigureResponse"),
        "Synchronize": ("SynchronizeRequest", "SynchronizeResponse"),
        "Shutdown": ("Empty", "Empty"),
        "CreateContainer": ("CreateContainerRequest", "CreateContainerResponse"),
        "UpdateContainer": ("UpdateContainerRequest", "UpdateContainerResponse"),
        "StopContainer": ("StopContainerRequest", "StopContainerResponse"),
        "StateChange": ("StateChangeEvent", "Empty"),
        "UpdatePodSandbox": ("UpdatePodSandboxRequest", "UpdatePodSandboxResponse"),
        "ValidateContainerAdjustment": (
            "ValidateContainerAdjustmentRequest",
            "ValidateContainerAdjustmentResponse",
        ),
        **{rpc: (f"{rpc}Request", f"{rpc}Response") for rpc in POD_EVENT_RPCS},
        **{rpc: (f"{rpc}Request", f"{rpc}Response") for rpc in CONTAINER_EVENT_RPCS},
    },
    "HostFunctions": {
        "Log": ("LogRequest", "Empty"),
    },
}


def test_service_set() -> None:
    assert set(nri_pb2.DESCRIPTOR.services_by_name) == set(SERVICES)


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_service_methods(service: str) -> None:
    desc = nri_pb2.DESCRIPTOR.services_by_name[service]
    assert desc.full_name == f"{PACKAGE}.{service}"
    actual = {
        m.name: (m.input_type.full_name, m.output_type.full_name)
        for m in desc.methods
        if not (m.client_streaming or m.server_streaming)
    }
    expected = {
        rpc: (f"{PACKAGE}.{req}", f"{PACKAGE}.{resp}")
        for rpc, (req, resp) in SERVICES[service].items()
    }
    assert actual == expected
    assert len(desc.methods) == len(expected)


@pytest.mark.parametrize("rpc", POD_EVENT_RPCS + CONTAINER_EVENT_RPCS)
def test_dedicated_event_messages_shape(rpc: str) -> None:
    messages = nri_pb2.DESCRIPTOR.message_types_by_name
    want = [(1, "pod", "PodSandbox")]
    if rpc in CONTAINER_EVENT_RPCS:
        want.append((2, "container", "Container"))
    assert _actual(messages[f"{rpc}Request"]) == want
    assert _actual(messages[f"{rpc}Response"]) == []


# ---------------------------------------------------------------------------
# Enums (reference §3.2, §3.3)
# ---------------------------------------------------------------------------

EVENTS = [
    "UNKNOWN",
    "RUN_POD_SANDBOX",
    "STOP_POD_SANDBOX",
    "REMOVE_POD_SANDBOX",
    "CREATE_CONTAINER",
    "POST_CREATE_CONTAINER",
    "START_CONTAINER",
    "POST_START_CONTAINER",
    "UPDATE_CONTAINER",
    "POST_UPDATE_CONTAINER",
    "STOP_CONTAINER",
    "REMOVE_CONTAINER",
    "UPDATE_POD_SANDBOX",
    "POST_UPDATE_POD_SANDBOX",
    "VALIDATE_CONTAINER_ADJUSTMENT",
    "LAST",
]

FIELDS = [
    "None",
    "Annotations",
    "Mounts",
    "OciHooks",
    "Devices",
    "CdiDevices",
    "Env",
    "Args",
    "MemLimit",
    "MemReservation",
    "MemSwapLimit",
    "MemKernelLimit",
    "MemTCPLimit",
    "MemSwappiness",
    "MemDisableOomKiller",
    "MemUseHierarchy",
    "CPUShares",
    "CPUQuota",
    "CPUPeriod",
    "CPURealtimeRuntime",
    "CPURealtimePeriod",
    "CPUSetCPUs",
    "CPUSetMems",
    "PidsLimit",
    "HugepageLimits",
    "BlockioClass",
    "RdtClass",
    "CgroupsUnified",
    "CgroupsPath",
    "OomScoreAdj",
    "Rlimits",
    "IoPriority",
    "SeccompPolicy",
    "Namespace",
    "Sysctl",
    "LinuxNetDevices",
    "LinuxSched",
    "RdtClosID",
    "RdtSchemata",
    "RdtEnableMonitoring",
    "MemoryPolicy",
]

ENUMS: dict[str, list[str]] = {
    "Event": EVENTS,
    "ContainerState": [
        "CONTAINER_UNKNOWN",
        "CONTAINER_CREATED",
        "CONTAINER_PAUSED",
        "CONTAINER_RUNNING",
        "CONTAINER_STOPPED",
    ],
    "IOPrioClass": ["IOPRIO_CLASS_NONE", "IOPRIO_CLASS_RT", "IOPRIO_CLASS_BE", "IOPRIO_CLASS_IDLE"],
    "LinuxSchedulerPolicy": [
        "SCHED_NONE",
        "SCHED_OTHER",
        "SCHED_FIFO",
        "SCHED_RR",
        "SCHED_BATCH",
        "SCHED_ISO",
        "SCHED_IDLE",
        "SCHED_DEADLINE",
    ],
    "LinuxSchedulerFlag": [
        "SCHED_FLAG_RESET_ON_FORK",
        "SCHED_FLAG_RECLAIM",
        "SCHED_FLAG_DL_OVERRUN",
        "SCHED_FLAG_KEEP_POLICY",
        "SCHED_FLAG_KEEP_PARAMS",
        "SCHED_FLAG_UTIL_CLAMP_MIN",
        "SCHED_FLAG_UTIL_CLAMP_MAX",
    ],
    "MpolMode": [
        "MPOL_DEFAULT",
        "MPOL_PREFERRED",
        "MPOL_BIND",
        "MPOL_INTERLEAVE",
        "MPOL_LOCAL",
        "MPOL_PREFERRED_MANY",
        "MPOL_WEIGHTED_INTERLEAVE",
    ],
    "MpolFlag": ["MPOL_F_STATIC_NODES", "MPOL_F_RELATIVE_NODES", "MPOL_F_NUMA_BALANCING"],
    "Field": FIELDS,
}

NESTED_ENUMS: dict[tuple[str, str], list[str]] = {
    ("LogRequest", "Level"): [
        "LEVEL_UNSPECIFIED",
        "LEVEL_DEBUG",
        "LEVEL_INFO",
        "LEVEL_WARN",
        "LEVEL_ERROR",
    ],
    ("SecurityProfile", "ProfileType"): ["RUNTIME_DEFAULT", "UNCONFINED", "LOCALHOST"],
}


def _values(enum_desc: EnumDescriptor) -> list[tuple[int, str]]:
    return sorted((v.number, v.name) for v in enum_desc.values)


def test_enum_set() -> None:
    assert set(nri_pb2.DESCRIPTOR.enum_types_by_name) == set(ENUMS)
    for desc in nri_pb2.DESCRIPTOR.message_types_by_name.values():
        for enum in desc.enum_types:
            assert (desc.name, enum.name) in NESTED_ENUMS


@pytest.mark.parametrize("name", sorted(ENUMS))
def test_top_level_enum_values(name: str) -> None:
    desc = nri_pb2.DESCRIPTOR.enum_types_by_name[name]
    assert _values(desc) == list(enumerate(ENUMS[name]))


@pytest.mark.parametrize(("message", "enum"), sorted(NESTED_ENUMS))
def test_nested_enum_values(message: str, enum: str) -> None:
    desc = nri_pb2.DESCRIPTOR.message_types_by_name[message].enum_types_by_name[enum]
    assert _values(desc) == list(enumerate(NESTED_ENUMS[(message, enum)]))


def test_event_values_and_mask_bits() -> None:
    for number, name in enumerate(EVENTS[:15]):
        assert nri_pb2.Event.Value(name) == number
        assert nri_pb2.Event.Name(number) == name
    assert nri_pb2.LAST == 15
    assert (1 << (nri_pb2.LAST - 1)) - 1 == 0x3FFF
    assert 1 << (nri_pb2.VALIDATE_CONTAINER_ADJUSTMENT - 1) == 0x2000


def test_field_enum_spans_0_to_40() -> None:
    assert [nri_pb2.Field.Name(n) for n in range(41)] == FIELDS
    assert nri_pb2.Field.Value("None") == 0
    assert nri_pb2.Field.Value("MemoryPolicy") == 40
    assert max(nri_pb2.Field.values()) == 40
