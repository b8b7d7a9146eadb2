"""Today's mid-tier flow, end to end on a real containerd.

Koordinator's ClusterColocationProfile webhook renames a koord-mid pod's cpu/memory to
kubernetes.io/mid-cpu / mid-memory and deletes the native ones, so the pod is Kubernetes
BestEffort (besteffort cgroup parent) whether its Koordinator QoS is LS or BE, and nothing
writes the extended-resource spec annotation. nri-midbatch's admission webhook writes the
priority-class label and the annotation; the plugin then sets the mid values.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from nri_midbatch.config.compile import compile_policy
from nri_midbatch.config.model import Config
from nri_midbatch.tools.webhook.admission import handle
from nri_midbatch.tools.webhook.pods import cgroup_parent, read_pod
from tests.admission import review
from tests.e2e.containerd import Containerd
from tests.e2e.node import NODE
from tests.e2e.plugin_process import PluginProcess
from tests.factory import GI, MID_CPU, MID_MEMORY, PRIORITY, QOS, SPEC


def as_the_colocation_profile_leaves_it(qos: str, uid: str) -> dict[str, Any]:
    """koord-mid (spec.priority 7000), QoS label from the profile, native cpu/memory gone."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"mid-{qos.lower()}",
            "namespace": "default",
            "uid": uid,
            "labels": {QOS: qos, "app": "stream"},
        },
        "spec": {
            "priorityClassName": "koord-mid",
            "priority": 7000,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {
                        # cpu "1" -> mid-cpu 1k (milli-cores), as the profile webhook converts.
                        "requests": {MID_CPU: "1k", MID_MEMORY: "512Mi"},
                        "limits": {MID_CPU: "2k", MID_MEMORY: "1Gi"},
                    },
                }
            ],
        },
    }


def admitted(obj: dict[str, Any]) -> dict[str, Any]:
    """Our webhook's mutation applied, then its validation passed: the pod as stored."""
    policy = compile_policy(Config())
    answer = handle(json.dumps(review(obj)).encode(), "mutate", policy)
    response = answer.body["response"]
    assert response["allowed"] is True, response
    ops = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
    stored: dict[str, Any] = jsonpatch.apply_patch(obj, ops)
    check = handle(json.dumps(review(stored)).encode(), "validate", policy)
    assert check.body["response"]["allowed"] is True, check.body
    return stored


@pytest.fixture
def plugin(containerd: Containerd, tmp_path: Path) -> Iterator[PluginProcess]:
    process = PluginProcess(tmp_path / "plugin", containerd.nri_socket)
    process.wait_for("synchronized")
    yield process
    assert process.stop() == 0


@pytest.mark.parametrize("qos", ["LS", "BE"])
def test_a_koord_mid_pod_as_koordinator_leaves_it_gets_mid_values(
    containerd: Containerd, plugin: PluginProcess, qos: str
) -> None:
    uid = str(uuid.uuid4())  # pod cgroups live in the host's tree: one per test
    stored = admitted(as_the_colocation_profile_leaves_it(qos, uid))
    metadata = stored["metadata"]
    assert metadata["labels"][PRIORITY] == "koord-mid"
    assert json.loads(metadata["annotations"][SPEC]) == {
        "containers": {
            "main": {
                "limits": {MID_CPU: "2k", MID_MEMORY: "1Gi"},
                "requests": {MID_CPU: "1k", MID_MEMORY: "512Mi"},
            }
        }
    }
    # No native cpu/memory: Kubernetes BestEffort, even for Mid+LS.
    parent = cgroup_parent(read_pod(stored, ""), uid)
    assert parent.startswith("/kubepods/besteffort/")

    pod_id = containerd.run_pod(
        metadata["name"],
        uid=uid,
        labels=metadata["labels"],
        annotations=metadata["annotations"],
        cgroup_parent=parent,
    )
    # What kubelet asks for a BestEffort container: minimum shares, no limits.
    container_id = containerd.create_container(pod_id, name="main", resources={"cpu_shares": 2})
    containerd.start_container(container_id)

    # Mid formulas: request 1000 -> shares 1024; limit 2000 -> quota 200000; memory 1Gi.
    # Nothing native to keep (never-loosen has nothing to compare with).
    assert NODE.read_values(parent, container_id) == NODE.expect(1024, 200000, GI)
    assert NODE.read_values(parent, None) == NODE.expect(1024, 200000, GI)
