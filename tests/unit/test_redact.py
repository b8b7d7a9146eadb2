"""Redaction is an allowlist: a secret planted in any string field of any NRI message, found
by walking the descriptors, never reaches a recording's bytes; what replay needs does."""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
from pathlib import Path
from typing import cast

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from nri_midbatch.api import nri_pb2
from nri_midbatch.config.model import Config
from nri_midbatch.policy import Decision
from nri_midbatch.recording.call import NotedDecision
from nri_midbatch.recording.reader import PLUGIN_METHODS
from nri_midbatch.recording.redact import kept_annotations, redact
from nri_midbatch.recording.writer import Recorder, RotatingFile
from tests.unit.replay_fixtures import read_whole, replay_whole

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "nri.pkg.api.v1alpha1"
#: What replay needs, spelled out on its own: (message, field) whose strings stay.
KEPT = {
    (f"{PACKAGE}.{message}", field)
    for message, fields in {
        "PodSandbox": ("id", "name", "uid", "namespace", "labels"),
        "LinuxPodSandbox": ("cgroup_parent", "cgroups_path"),
        "Container": ("id", "pod_sandbox_id", "name", "labels"),
        "LinuxContainer": ("cgroups_path",),
        "LinuxContainerAdjustment": ("cgroups_path",),
        "ConfigureRequest": ("runtime_name", "runtime_version", "config", "NRI_version"),
        "RegisterPluginRequest": ("plugin_name", "plugin_idx", "NRI_version"),
        "ContainerUpdate": ("container_id",),
        "ContainerEviction": ("container_id", "reason"),
    }.items()
    for field in fields
}
KEPT_WHOLE = f"{PACKAGE}.LinuxResources"
SPEC_ANNOTATION = "example.com/renamed-spec"
KEPT_ANNOTATIONS = kept_annotations(SPEC_ANNOTATION)
TEXT = (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES)


class Planter:
    """Fills every field of a message: a distinct secret in each string that is not kept, a
    distinct plain value ("kept-N") in each that is."""

    def __init__(self) -> None:
        self.secrets: list[str] = []
        self.kept: list[str] = []
        self._numbers = itertools.count()

    def text(self, keep: bool) -> str:
        number = next(self._numbers)
        value = f"kept-{number:05d}" if keep else f"SECRET-{number:05d}"
        (self.kept if keep else self.secrets).append(value)
        return value

    def fill(self, message: Message, keep_all: bool = False, depth: int = 0) -> None:
        descriptor = cast(Descriptor, message.DESCRIPTOR)
        keep_all = keep_all or descriptor.full_name == KEPT_WHOLE
        assert depth < 12, f"{descriptor.full_name}: the NRI types were not expected to nest"
        for field in descriptor.fields:
            keep = keep_all or (descriptor.full_name, field.name) in KEPT
            target = getattr(message, field.name)
            entry = field.message_type
            if entry is not None and entry.GetOptions().map_entry:
                self._fill_map(field, target, keep, depth)
            elif entry is not None:
                items = [target.add() for _ in range(2)] if field.is_repeated else [target]
                for item in items:
                    self.fill(item, keep_all, depth + 1)
            elif field.type in TEXT:
                values = [self._scalar(field, keep) for _ in range(2 if field.is_repeated else 1)]
                if field.is_repeated:
                    target.extend(values)
                else:
                    setattr(message, field.name, values[0])

    def _scalar(self, field: FieldDescriptor, keep: bool) -> str | bytes:
        value = self.text(keep)
        return value.encode() if field.type == FieldDescriptor.TYPE_BYTES else value

    def _fill_map(self, field: FieldDescriptor, target: object, keep: bool, depth: int) -> None:
        entry = cast(Descriptor, field.message_type)
        key_field = entry.fields_by_name["key"]
        value_field = entry.fields_by_name["value"]
        if field.name == "annotations" and not keep:
            # Keys stay, and the values of the annotations the policy reads.
            names = [*sorted(KEPT_ANNOTATIONS), self.text(keep=True)]
            for name in names:
                target[name] = self.text(keep=name in KEPT_ANNOTATIONS)  # type: ignore[index]
            return
        for _ in range(2):
            key = self.text(keep) if key_field.type in TEXT else next(self._numbers)
            if value_field.message_type is not None:
                self.fill(target[key], keep, depth + 1)  # type: ignore[index]
            else:
                target[key] = self._scalar(value_field, keep)  # type: ignore[index]


def every_call() -> list[tuple[str, Message, Message]]:
    """A planted request and reply for each method of each NRI service."""
    planter_calls = []
    for service in nri_pb2.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            request = GetMessageClass(method.input_type)()
            response = GetMessageClass(method.output_type)()
            planter_calls.append((method.name, request, response))
    return planter_calls


def record(path: Path, calls: list[tuple[str, Message, Message]]) -> None:
    async def scenario() -> None:
        async with Recorder(RotatingFile(path), kept_annotations=KEPT_ANNOTATIONS) as recorder:
            for method, request, response in calls:
                recorder.call_begun(method, request).replied(response)

    asyncio.run(scenario())


def test_no_planted_secret_reaches_the_recording_and_every_kept_value_does(
    tmp_path: Path,
) -> None:
    planter = Planter()
    calls = every_call()
    for _, request, response in calls:
        planter.fill(request)
        planter.fill(response)
    # The walk reached the fields the defect leaked, so a new field is reached too.
    assert len(planter.secrets) > 100
    path = tmp_path / "calls.jsonl"
    record(path, calls)
    recorded = path.read_bytes()
    leaked = [secret for secret in planter.secrets if secret.encode() in recorded]
    assert leaked == []
    missing = [value for value in planter.kept if value.encode() not in recorded]
    assert missing == []
    # Redacted, the recording still reads back as the messages it holds (replay knows the
    # calls a runtime makes to a plugin, not the plugin's own).
    entries, problems = read_whole(path)
    not_replayed = ("RegisterPlugin", "UpdateContainers", "Log")
    assert [problem.message for problem in problems] == [
        f"unknown method {method!r}" for method in not_replayed
    ]
    assert len(entries) == len(calls) - len(not_replayed)


def test_the_leaks_of_issue_24_are_closed(tmp_path: Path) -> None:
    env = "API_TOKEN=tok-3f9a"
    container = nri_pb2.Container(
        id="ctr",
        name="main",
        args=["/app", "--password=pw-77c1"],
        mounts=[nri_pb2.Mount(destination="/m", options=["password=pw-mount-19"])],
        hooks=nri_pb2.Hooks(prestart=[nri_pb2.Hook(path="/h", args=["--key=hook-arg-5"])]),
        annotations={"kubectl.kubernetes.io/last-applied-configuration": f'{{"env":"{env}"}}'},
    )
    pod = nri_pb2.PodSandbox(
        id="sandbox",
        annotations={SPEC_ANNOTATION: '{"containers":{}}', "team.example/secret": "pod-s-81"},
    )
    path = tmp_path / "calls.jsonl"
    record(
        path,
        [
            (
                "CreateContainer",
                nri_pb2.CreateContainerRequest(pod=pod, container=container),
                nri_pb2.CreateContainerResponse(),
            )
        ],
    )
    recorded = path.read_bytes()
    for secret in ("pw-77c1", "pw-mount-19", "hook-arg-5", "tok-3f9a", "pod-s-81"):
        assert secret.encode() not in recorded
    (entry,), _ = read_whole(path)
    request = entry.request
    assert isinstance(request, nri_pb2.CreateContainerRequest)
    assert dict(request.pod.annotations) == {
        SPEC_ANNOTATION: '{"containers":{}}',
        "team.example/secret": "<redacted>",
    }
    assert list(request.container.annotations) == [
        "kubectl.kubernetes.io/last-applied-configuration"
    ]


@pytest.mark.parametrize(
    "recording",
    [Path("examples/recordings/demo.jsonl"), Path("tests/replay/containerd-1.7.24.jsonl")],
    ids=lambda path: path.name,
)
def test_redacted_golden_recordings_replay_to_the_same_replies_and_decisions(
    tmp_path: Path, recording: Path
) -> None:
    entries, problems = read_whole(ROOT / recording)
    assert problems == []
    redacted = tmp_path / "redacted.jsonl"
    calls = [(e.method, e.request, e.response) for e in entries if e.response is not None]
    assert len(calls) == len(entries)  # every call was answered
    record(redacted, calls)
    redacted_entries, problems = read_whole(redacted)
    assert problems == []
    original = replay_whole(entries, Config(), runtime_config=True)
    again = replay_whole(redacted_entries, Config(), runtime_config=True)
    assert [(o.response, o.error) for o in again] == [(o.response, o.error) for o in original]
    assert [_decided(o.decisions) for o in again] == [_decided(o.decisions) for o in original]


def _decided(decisions: tuple[NotedDecision, ...]) -> list[tuple[str, str, Decision]]:
    """Each decision, whole (its trace too), with whose it is."""
    return [
        (noted.pod.uid, "" if noted.container is None else noted.container.id, noted.decision)
        for noted in decisions
    ]


@pytest.mark.parametrize(
    "recording",
    [Path("examples/recordings/demo.jsonl"), Path("tests/replay/containerd-1.7.24.jsonl")],
    ids=lambda path: path.name,
)
def test_the_committed_recordings_are_redacted(recording: Path) -> None:
    """docs/replay.md says the demo was recorded redacted: redacting it again changes nothing."""
    for line in (ROOT / recording).read_text().splitlines():
        document = json.loads(line)
        request_type, response_type = PLUGIN_METHODS[document["method"]]
        request = copy.deepcopy(document["request"])
        redact(request_type(), request)
        assert request == document["request"], document["method"]
        if document["response"] is not None:
            response = copy.deepcopy(document["response"])
            redact(response_type(), response)
            assert response == document["response"], document["method"]
