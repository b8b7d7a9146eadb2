"""Round trip: what the webhook writes is what the plugin's policy core acts on.

The mutated pod's labels and annotation become the PodView the runtime would hand the plugin
(cgroup parent from the pod's Kubernetes QoS class), and decide_container / decide_pod must
give the tier and the cgroup values the webhook meant (Koordinator's formulas: shares =
milli*1024/1000, quota = milli*100 per 100 ms period, memory = the limit in bytes).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonpatch
import pytest

from nri_midbatch.config.compile import compile_policy
from nri_midbatch.config.model import Config
from nri_midbatch.policy import (
    CgroupValues,
    ContainerView,
    PodView,
    decide_container,
    decide_pod,
)
from nri_midbatch.tools.webhook.admission import handle
from nri_midbatch.tools.webhook.pods import cgroup_parent, read_pod
from tests.admission import (
    batch_pod,
    container,
    mid_pod,
    pod,
    review,
)
from tests.factory import BATCH_CPU, BATCH_MEMORY, GI, MI, MID_CPU, MID_MEMORY, QOS

POLICY = compile_policy(Config())


def admitted(obj: dict[str, Any]) -> dict[str, Any]:
    """The pod as stored: mutated, then validated."""
    answer = handle(json.dumps(review(obj)).encode(), "mutate", POLICY)
    response = answer.body["response"]
    ops = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
    stored = jsonpatch.apply_patch(obj, ops)
    check = handle(json.dumps(review(stored)).encode(), "validate", POLICY)
    assert check.body["response"]["allowed"] is True, check.body
    return stored  # type: ignore[no-any-return]


def on_the_node(stored: dict[str, Any]) -> PodView:
    """What the runtime gives the plugin: labels, annotations, the kubelet cgroup parent."""
    metadata = stored["metadata"]
    return PodView(
        uid="0f0e0d0c-0000-4000-8000-000000000001",
        namespace=metadata["namespace"],
        name=metadata["name"],
        labels=metadata.get("labels") or {},
        annotations=metadata.get("annotations") or {},
        cgroup_parent=cgroup_parent(read_pod(stored, ""), "0f0e0d0c-0000-4000-8000-000000000001"),
    )


def test_mid_be_pod() -> None:
    view = on_the_node(admitted(mid_pod()))
    assert view.cgroup_parent.startswith("/kubepods/besteffort/pod")
    main = decide_container(view, ContainerView(id="c1", name="main"), POLICY)
    assert main.error is None
    assert main.tier == "mid"
    assert str(main.priority.value) == "koord-mid"
    # request 1k -> shares 1024; limit 2k -> quota 200000; memory limit 1Gi.
    assert main.values == CgroupValues(cpu_shares=1024, cpu_quota=200_000, memory_limit=GI)
    helper = decide_container(view, ContainerView(id="c2", name="helper"), POLICY)
    # Limit only: the request became the limit, 1500 -> shares 1536.
    assert helper.values == CgroupValues(cpu_shares=1536, cpu_quota=150_000, memory_limit=512 * MI)
    sidecar = decide_container(view, ContainerView(id="c3", name="sidecar"), POLICY)
    assert sidecar.tier == "mid"
    assert sidecar.values is None  # not in the spec: left as kubelet made it
    whole = decide_pod(view, POLICY)
    assert whole.values == CgroupValues(
        cpu_shares=(1000 + 1500) * 1024 // 1000,
        cpu_quota=(2000 + 1500) * 100,
        memory_limit=GI + 512 * MI,
    )


def test_batch_be_pod() -> None:
    view = on_the_node(admitted(batch_pod()))
    job = decide_container(view, ContainerView(id="c1", name="job"), POLICY)
    assert job.tier == "batch"
    assert str(job.priority.value) == "koord-batch"
    assert job.values == CgroupValues(cpu_shares=1536, cpu_quota=300_000, memory_limit=4 * GI)


def test_mid_ls_pod_in_the_burstable_cgroup() -> None:
    obj = pod(
        container(
            "server",
            requests={"cpu": "100m", MID_CPU: "500", MID_MEMORY: "256Mi"},
            limits={MID_CPU: "1k", MID_MEMORY: "512Mi"},
        ),
        priority=7100,
        labels={QOS: "LS"},
        name="mid-ls",
    )
    view = on_the_node(admitted(obj))
    assert view.cgroup_parent.startswith("/kubepods/burstable/pod")
    decision = decide_container(view, ContainerView(id="c1", name="server"), POLICY)
    assert decision.tier == "mid"
    assert decision.values == CgroupValues(cpu_shares=512, cpu_quota=100_000, memory_limit=512 * MI)


@pytest.mark.parametrize(
    ("requests", "limits", "expected"),
    [
        ({BATCH_CPU: "1"}, {BATCH_CPU: "1"}, CgroupValues(2, 1000, -1)),  # 1 milli-core: minimums
        ({BATCH_CPU: "64k"}, {}, CgroupValues(65536, -1, -1)),  # no limit: unlimited
        ({BATCH_CPU: "300k"}, {BATCH_MEMORY: "1.5Gi"}, CgroupValues(262144, -1, 1536 * MI)),
    ],
)
def test_batch_edge_values(
    requests: dict[str, str], limits: dict[str, str], expected: CgroupValues
) -> None:
    obj = pod(container("c", requests=requests, limits=limits), priority=5000, labels={QOS: "BE"})
    view = on_the_node(admitted(obj))
    assert decide_container(view, ContainerView(id="c1", name="c"), POLICY).values == expected


def test_a_pod_left_untouched_stays_out_of_every_tier() -> None:
    obj = pod(container("c", limits={"cpu": "1"}), priority=9500, labels={QOS: "LS"})
    stored = admitted(obj)
    assert stored == obj
    decision = decide_container(on_the_node(stored), ContainerView(id="c1", name="c"), POLICY)
    assert decision.tier is None
    assert decision.values is None
