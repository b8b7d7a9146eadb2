"""The performance shortcuts give exactly what the plain code they replace gives.

Each shortcut (docs/performance.md) is checked against the straightforward
form: the bytes on the wire, the messages built, the log line, and what the
plugin remembers for a configuration reload.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.api import ttrpc_pb2
from nri_midbatch.deferred import AfterReply
from nri_midbatch.obs.logging import configure_logging
from nri_midbatch.plugin.codec import (
    MAX_REMEMBERED_RESOURCES_BYTES,
    container_update,
    current_values,
    decode_native_limits,
    encode_native_limits,
    limits_and_values,
    native_limits,
    pod_view,
    set_resources,
)
from nri_midbatch.plugin.decision_log import DecisionLines
from nri_midbatch.policy import CgroupValues, ContainerView, NativeLimits, PodView, calculate, spec
from nri_midbatch.policy.quantity import QuantityError, parse_quantity, quantity_value
from nri_midbatch.policy.trace import Field, PodSum, ValueFrom
from nri_midbatch.state.known import Known
from nri_midbatch.wire.connection import _response_with_payload
from nri_midbatch.wire.mux import frame_message, frame_ttrpc
from nri_midbatch.wire.ttrpc import MessageType, encode_message
from tests.factory import resources

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
UINT64 = st.integers(min_value=0, max_value=2**64 - 1)

# -- wire -------------------------------------------------------------------


# An empty payload never reaches the envelope: Connection.reply sends an empty
# reply message as a zero-byte Response, as protobuf encodes it.


@given(st.binary(min_size=1, max_size=20_000))
def test_response_envelope_is_what_protobuf_encodes(payload: bytes) -> None:
    assert _response_with_payload(payload) == (
        ttrpc_pb2.Response(payload=payload).SerializeToString()
    )


@pytest.mark.parametrize("size", [1, 127, 128, 16_383, 16_384, 2**21, 4 << 20])
def test_response_envelope_at_varint_boundaries(size: int) -> None:
    payload = b"\x07" * size
    assert _response_with_payload(payload) == (
        ttrpc_pb2.Response(payload=payload).SerializeToString()
    )


@given(st.binary(max_size=9000), st.integers(1, 2**32 - 1), st.sampled_from([1, 2]))
def test_one_frame_reply_is_what_the_codecs_frame(data: bytes, stream_id: int, conn: int) -> None:
    # Up to 4086 bytes of data take the one-pack path, beyond it the general one.
    fast = frame_ttrpc(conn, stream_id, MessageType.RESPONSE, data)
    assert fast == frame_message(conn, encode_message(stream_id, MessageType.RESPONSE, data))


# -- messages ---------------------------------------------------------------


def _nested(values: CgroupValues) -> api.LinuxResources:
    return api.LinuxResources(
        cpu=api.LinuxCPU(
            shares=api.OptionalUInt64(value=values.cpu_shares),
            quota=api.OptionalInt64(value=values.cpu_quota),
        ),
        memory=api.LinuxMemory(limit=api.OptionalInt64(value=values.memory_limit)),
    )


@given(UINT64, INT64, INT64)
def test_resources_built_in_place_equal_nested_constructors(
    shares: int, quota: int, memory: int
) -> None:
    values = CgroupValues(shares, quota, memory)
    expected = _nested(values)
    filled = api.LinuxResources()
    set_resources(filled, values)
    assert filled.SerializeToString() == expected.SerializeToString()
    update = api.ContainerUpdate(
        container_id="c1", linux=api.LinuxContainerUpdate(resources=expected)
    )
    assert container_update("c1", values).SerializeToString() == update.SerializeToString()


def test_zero_values_stay_present() -> None:
    resources = api.LinuxResources()
    set_resources(resources, CgroupValues(0, 0, 0))
    assert resources.cpu.HasField("shares") and resources.cpu.HasField("quota")
    assert resources.memory.HasField("limit")


# Within what a cgroup file holds (policy/holdable.py): an annotation beyond is not kubelet's.
@given(
    st.none() | st.integers(1000, 2**40),
    st.none() | st.integers(1000, 10**6),
    st.none() | st.integers(1, 2**40),
    st.none() | st.integers(2, 2**18),
)
def test_native_limits_text_is_cached_not_changed(
    quota: int | None, period: int | None, memory: int | None, shares: int | None
) -> None:
    native = NativeLimits(
        cpu_quota=quota, cpu_period=period, memory_limit=memory, cpu_shares=shares
    )
    present = {"cpuQuota": quota, "cpuPeriod": period, "memoryLimit": memory, "cpuShares": shares}
    text = json.dumps({k: v for k, v in present.items() if v is not None}, separators=(",", ":"))
    assert encode_native_limits(native) == text
    assert encode_native_limits(native) == text  # from the cache
    assert decode_native_limits(text) == native
    assert decode_native_limits(text) == native


def _reference_native(resources: api.LinuxResources) -> NativeLimits:
    """native_limits as first written: presence checked before each value."""
    cpu, memory = resources.cpu, resources.memory
    quota = cpu.quota.value if cpu.HasField("quota") and cpu.quota.value > 0 else None
    period = cpu.period.value if cpu.HasField("period") and cpu.period.value > 0 else None
    limit = memory.limit.value if memory.HasField("limit") and memory.limit.value > 0 else None
    shares = cpu.shares.value if cpu.HasField("shares") and cpu.shares.value > 0 else None
    return NativeLimits(cpu_quota=quota, cpu_period=period, memory_limit=limit, cpu_shares=shares)


def _reference_current(resources: api.LinuxResources) -> CgroupValues:
    cpu, memory = resources.cpu, resources.memory
    quota = cpu.quota.value if cpu.HasField("quota") and cpu.quota.value > 0 else -1
    limit = memory.limit.value if memory.HasField("limit") and memory.limit.value > 0 else -1
    shares = cpu.shares.value if cpu.HasField("shares") else 0
    return CgroupValues(cpu_shares=shares, cpu_quota=quota, memory_limit=limit)


@given(
    st.none() | UINT64,
    st.none() | INT64,
    st.none() | UINT64,
    st.none() | INT64,
    st.sampled_from([0, 1, 40]),
)
def test_values_read_without_presence_checks_are_the_same(
    shares: int | None, quota: int | None, period: int | None, memory: int | None, unified: int
) -> None:
    """The same, remembered by the resources' bytes or (past the bound) read each time."""
    given = resources(shares=shares, quota=quota, period=period, memory=memory)
    for n in range(unified):
        given.unified[f"memory.k{n}"] = "v" * 8
    remembered = len(given.SerializeToString()) <= MAX_REMEMBERED_RESOURCES_BYTES
    assert remembered == (unified < 40)
    for _ in range(2):  # the second from the cache, where it is remembered
        assert native_limits(given) == _reference_native(given)
        assert current_values(given) == _reference_current(given)
        assert limits_and_values(given) == (_reference_native(given), _reference_current(given))


@pytest.mark.parametrize("text", ['{"cpuQuota":null}', '{"cpuQuota":0}', '{"cpuPeriod":false}'])
def test_native_limits_text_rules_stay(text: str) -> None:
    """null is absent; 0 and non-integers are not what we write."""
    expected = NativeLimits() if "null" in text else None
    assert decode_native_limits(text) == expected


# -- what the plugin remembers ----------------------------------------------

_POD_IDS = st.sampled_from(["p1", "p2", "p3"])
_CTR_IDS = st.sampled_from(["c1", "c2", "c3", "c4", "c5"])
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), _CTR_IDS, _POD_IDS),
        st.tuples(st.just("forget"), _CTR_IDS, st.just("")),
        st.tuples(st.just("remove_pod"), st.just(""), _POD_IDS),
    ),
    max_size=40,
)


@settings(max_examples=300)
@given(_OPS)
def test_known_forgets_exactly_a_pods_containers(ops: list[tuple[str, str, str]]) -> None:
    """Known's by-pod index against a plain model that walks every container."""
    known = Known()
    model: dict[str, tuple[str, ContainerView]] = {}
    for op, container_id, pod_id in ops:
        view = ContainerView(container_id, container_id)
        if op == "set":
            known.set_container(container_id, pod_id, view)
            model[container_id] = (pod_id, view)
        elif op == "forget":
            known.forget_container(container_id)
            model.pop(container_id, None)
        else:
            known.remove_pod(pod_id)
            model = {c: entry for c, entry in model.items() if entry[0] != pod_id}
        assert known.containers == model


def test_remembered_pods_hold_plain_dicts_with_shared_keys_and_values() -> None:
    def pod(uid: str) -> api.PodSandbox:
        return api.PodSandbox(
            id=f"s-{uid}",
            uid=uid,
            name="n",
            namespace="ns",
            labels={"app.kubernetes.io/name": uid, "b": "2"},
            # The spec of a job's pods, the same text on each: kept once (1-2 KB a pod).
            annotations={"x": '{"containers": {"main": {}}}'},
            linux=api.LinuxPodSandbox(cgroup_parent=f"/kubepods/besteffort/pod{uid}"),
        )

    known = Known()
    first, second = pod("u1"), pod("u2")
    kept = known.add_pod(first.id, pod_view(first))
    other = known.add_pod(second.id, pod_view(second))
    assert kept is known.pods[first.id]
    assert type(kept.labels) is dict and type(kept.annotations) is dict
    assert kept.labels == dict(first.labels) and kept.annotations == dict(first.annotations)
    assert (kept.uid, kept.name, kept.namespace, kept.cgroup_parent) == (
        "u1",
        "n",
        "ns",
        "/kubepods/besteffort/podu1",
    )
    (key,) = [k for k in kept.labels if k.startswith("app.")]
    (same,) = [k for k in other.labels if k.startswith("app.")]
    assert key is same
    assert kept.annotations["x"] is other.annotations["x"]
    assert kept.labels["b"] is other.labels["b"]


def test_a_split_synchronize_keeps_each_path_and_shares_a_pods_strings() -> None:
    """Containers waiting for their pod's chunk hold its id and path head once, not each."""
    from nri_midbatch.cgroups.paths import CgroupDriver
    from nri_midbatch.config.compile import settings_of
    from nri_midbatch.config.model import Config
    from nri_midbatch.deferred import AfterReply
    from nri_midbatch.plugin.cgroup_writer import CgroupWriter
    from nri_midbatch.plugin.context import InForce, Live
    from nri_midbatch.plugin.counters import Counters
    from nri_midbatch.plugin.decisions import Decider
    from nri_midbatch.plugin.reconcile import Reconciler
    from nri_midbatch.plugin.records import Records
    from nri_midbatch.plugin.synchronize import SynchronizePass
    from nri_midbatch.plugin.writes import Writes
    from nri_midbatch.state.known import Known
    from nri_midbatch.state.store import BaselineStore

    parent = "kubepods-besteffort-podu1.slice"
    paths = {
        "c-1": f"{parent}:cri-containerd:c-1",
        "c-2": f"{parent}:cri-containerd:c-2",
        "c-3": "/elsewhere/not-named-after-the-id",
        "c-4": "",
    }
    containers = [
        api.Container(
            id=cid,
            pod_sandbox_id="s-u1",
            name=cid,
            state=api.CONTAINER_RUNNING,
            linux=api.LinuxContainer(cgroups_path=path),
        )
        for cid, path in paths.items()
    ]
    pod = api.PodSandbox(
        id="s-u1",
        uid="u1",
        name="p",
        namespace="ns",
        linux=api.LinuxPodSandbox(cgroup_parent=parent),
    )
    settings = settings_of(Config())
    writer = CgroupWriter(Path(settings.cgroups.root), CgroupDriver(settings.cgroups.driver))
    live = Live(InForce(settings, settings.compile(), writer), Known())
    store, counters, after_reply = BaselineStore(None), Counters(), AfterReply()
    records = Records(live, store, after_reply, dry_run=True)
    writes = Writes(live, records, counters, dry_run=True)
    reconcile = Reconciler(live, counters, after_reply, records, writes, dry_run=True)
    sync = SynchronizePass(
        live,
        store,
        counters,
        after_reply,
        Decider(live, records, counters, (), dry_run=True),
        writes,
        records,
        reconcile,
        dry_run=True,
    )
    sync.take([], containers, first=True)
    assert sync.part is not None
    first, second, *_ = sync.part.containers
    assert first[0] is second[0] and first[2] is second[2]

    async def last_chunk_and_reply() -> None:  # the reply leaves work for after it
        sync.take([pod], [], first=False)
        sync.reply()

    asyncio.run(last_chunk_and_reply())
    assert {cid: live.known.cgroups_path(cid) for cid in paths} == paths


# -- the decision log line ----------------------------------------------------


def test_decision_line_is_the_plain_log_call() -> None:
    """Written after the reply from a flat buffer, it is the line log.info would write."""
    pod = PodView("u", "ns", "p", {}, {}, "/kubepods/besteffort/podu")
    container = ContainerView("c1", "app")
    values = CgroupValues(512, 100_000, 512 * 2**20)
    plain, deferred = io.StringIO(), io.StringIO()
    try:
        configure_logging("info", "json", plain)
        structlog.get_logger("t").info(
            "decision",
            method="CreateContainer",
            tier="batch",
            namespace="ns",
            pod="p",
            container="app",
            cpu_shares=512,
            cpu_quota=100_000,
            memory_limit=512 * 2**20,
        )
        configure_logging("info", "json", deferred)
        lines = DecisionLines("CreateContainer")
        lines.add("batch", pod, container, values)

        async def write() -> None:
            after_reply = AfterReply()
            lines.write_after(after_reply)
            await after_reply.settle()

        asyncio.run(write())
    finally:
        structlog.reset_defaults()
    expected, got = json.loads(plain.getvalue()), json.loads(deferred.getvalue())
    del expected["timestamp"], got["timestamp"]
    assert list(got.items()) == list(expected.items())


def test_prebuilt_json_encoder_renders_as_json_dumps() -> None:
    out = io.StringIO()
    try:
        configure_logging("info", "json", out)
        event = {"a": 1, "b": "ü", "c": [1.5, None], "d": object()}
        structlog.get_logger("t").info("e", **event)
    finally:
        structlog.reset_defaults()
    rendered = out.getvalue().rstrip("\n")
    parsed = json.loads(rendered)
    expected = dict(event, event="e", level="info", timestamp=parsed["timestamp"])
    assert rendered == json.dumps(expected, default=repr)


# -- the policy core ------------------------------------------------------------

_SUFFIXES = ["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]


def _reference_value(text: str) -> int | str:
    try:
        return parse_quantity(text).value()
    except QuantityError as error:
        return str(error)


def _fast_value(text: str) -> int | str:
    try:
        return quantity_value(text)
    except QuantityError as error:
        return str(error)


@settings(max_examples=500)
@given(
    st.text(alphabet="0123456789", min_size=1, max_size=30)
    | st.integers(0, 2**70).map(str)
    | st.sampled_from(["0", "007", "9" * 1000, "9" * 1001, "8", "16"]),
    st.sampled_from(_SUFFIXES),
)
def test_plain_quantity_value_is_the_exact_parse(digits: str, suffix: str) -> None:
    # The integer shortcut: every plain shape, binary caps and m/u/n rounding included.
    text = digits + suffix
    assert _fast_value(text) == _reference_value(text)


@given(st.text(alphabet="0123456789.+-eEinumkKMGTP \n", max_size=12) | st.text(max_size=20))
def test_other_quantity_texts_give_the_exact_parse(text: str) -> None:
    assert _fast_value(text) == _reference_value(text)


def _reference_decode(text: str) -> object:
    return json.loads(
        text,
        object_pairs_hook=spec._Object,
        parse_int=spec._Number,
        parse_float=spec._Number,
        parse_constant=spec._reject_constant,
    )


def _outcome(decode: Callable[[str], object], text: str) -> tuple[str, object]:
    try:
        value = decode(text)
    except (ValueError, RecursionError) as error:
        return "error", f"{type(error).__name__}: {error}"
    return type(value).__name__, value


_JSON_TEXT = st.text(alphabet='{}[]":,0123456789.eE-+ abcnulltrfsNaI\ufeff\t', max_size=40)


@settings(max_examples=500)
@given(_JSON_TEXT | st.sampled_from(['\ufeff{"containers":{}}', "{} x", "NaN", "[1e3, -0]"]))
def test_spec_decoder_made_once_decodes_as_json_loads(text: str) -> None:
    # Texts with a backslash take the escape-aware decoder, as before.
    if "\\" not in text:
        assert _outcome(spec._decode, text) == _outcome(_reference_decode, text)


@given(
    st.sampled_from(list(Field)),
    st.integers(-(2**63), 2**63),
    st.sampled_from(["request", "limit"]),
    st.sampled_from(["kubernetes.io/batch-cpu", "kubernetes.io/mid-memory"]),
    st.integers(0, 2**63),
)
def test_shared_value_steps_equal_new_ones(
    field: Field, value: int, kind: str, resource: str, amount: int
) -> None:
    shared = calculate._value_from(field, value, kind, resource, amount)
    assert shared == ValueFrom(field, value, kind, resource, amount)
    assert str(shared) == str(ValueFrom(field, value, kind, resource, amount))
    assert calculate.shared_values(value, amount, None) == CgroupValues(value, amount, None)
    pod_sum = PodSum(field, value, resource, amount, 3, kind)
    assert calculate._pod_sum((field, value, resource, amount, 3, kind)) == pod_sum
