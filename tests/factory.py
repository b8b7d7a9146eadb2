"""What the tests build: Koordinator's label and annotation names, quantities, the NRI
pods and containers a runtime sends, and the views and policies the policy decides with.
A test names only what its case changes; everything else is one pod of the default
namespace in kubelet's cgroup layout. The history tests' pods are the oracle's models
(`model_pod`), which their harness turns into NRI pods.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.config.compile import compile_policy
from nri_midbatch.config.model import load_config_text
from nri_midbatch.policy import (
    ContainerView,
    Decision,
    NativeLimits,
    PodView,
    Policy,
    decide_container,
)
from tests.oracle.model import ContainerModel, Extended, Kind, Native, PodModel

QOS = "koordinator.sh/qosClass"
PRIORITY = "koordinator.sh/priority-class"
SPEC = "node.koordinator.sh/extended-resource-spec"
BATCH_CPU, BATCH_MEMORY = "kubernetes.io/batch-cpu", "kubernetes.io/batch-memory"
MID_CPU, MID_MEMORY = "kubernetes.io/mid-cpu", "kubernetes.io/mid-memory"

MI = 1 << 20
GI = 1 << 30

#: A batch container: request 500m, limit 1 core ("1k" milli), memory limit 512Mi; Koordinator
#: gives it shares 512, quota 100000 and 512 MiB.
BATCH_APP = {"requests": {BATCH_CPU: "500"}, "limits": {BATCH_CPU: "1k", BATCH_MEMORY: "512Mi"}}

#: Request, limit and memory limit of one container, as quantity strings; None: absent.
Quantities = tuple[str | None, str | None, str | None]


def labels(qos: str | None, priority: str | None) -> dict[str, str]:
    """The QoS and priority-class labels; None leaves a label out."""
    given = {QOS: qos, PRIORITY: priority}
    return {name: value for name, value in given.items() if value is not None}


def spec(containers: Mapping[str, object]) -> str:
    """The extended-resource spec annotation holding these containers' entries."""
    return json.dumps({"containers": containers})


def resource_spec(cpu: str, memory: str, **containers: Quantities) -> str:
    """The annotation for containers asking these resources: name=(request, limit, memory)."""
    entries = {}
    for name, (request, limit, memory_limit) in containers.items():
        entry: dict[str, dict[str, str]] = {}
        if request is not None:
            entry["requests"] = {cpu: request}
        limits = {cpu: limit, memory: memory_limit}
        if any(value is not None for value in limits.values()):
            entry["limits"] = {k: v for k, v in limits.items() if v is not None}
        entries[name] = entry
    return spec(entries)


def batch_spec(**containers: Quantities) -> str:
    return resource_spec(BATCH_CPU, BATCH_MEMORY, **containers)


def mid_spec(**containers: Quantities) -> str:
    return resource_spec(MID_CPU, MID_MEMORY, **containers)


def cgroup_parent_of(uid: str, qos: str | None) -> str:
    """Kubelet's cgroupfs parent for a pod: burstable for LS, besteffort otherwise."""
    return f"/kubepods/{'burstable' if qos == 'LS' else 'besteffort'}/pod{uid}"


def pod(
    pod_id: str = "pod0",
    *,
    qos: str | None = None,
    priority: str | None = None,
    annotation: str | None = None,
    name: str | None = None,
    uid: str | None = None,
    namespace: str = "default",
    cgroup_parent: str | None = None,
) -> api.PodSandbox:
    """A PodSandbox as the runtime sends it; `annotation` is the extended-resource spec."""
    uid = uid or f"uid-{pod_id}"
    return api.PodSandbox(
        id=pod_id,
        name=name or f"{pod_id}-name",
        uid=uid,
        namespace=namespace,
        labels=labels(qos, priority),
        annotations={} if annotation is None else {SPEC: annotation},
        linux=api.LinuxPodSandbox(cgroup_parent=cgroup_parent or cgroup_parent_of(uid, qos)),
    )


def batch_pod(
    pod_id: str = "batch",
    *,
    annotation: str | None = spec({"app": BATCH_APP}),
    name: str | None = None,
    uid: str | None = None,
    namespace: str = "default",
    cgroup_parent: str | None = None,
) -> api.PodSandbox:
    """A BE koord-batch pod; by default one "app" container of BATCH_APP."""
    return pod(
        pod_id,
        qos="BE",
        priority="koord-batch",
        annotation=annotation,
        name=name,
        uid=uid,
        namespace=namespace,
        cgroup_parent=cgroup_parent,
    )


#: kubelet's values for an LS model pod's container: request 500m, limit 1 CPU, 512 MiB.
APP_NATIVE = Native(cpu_request=500, cpu_limit=1000, memory_limit=512 * MI)
#: A batch model pod's container: BATCH_APP's resources.
APP_BATCH = Extended(cpu_request=500, cpu_limit=1000, memory_limit=512 * MI)
#: A mid model pod's container: request 1500m, limit 2 CPUs, 1 GiB of the mid tier.
APP_MID = Extended(cpu_request=1500, cpu_limit=2000, memory_limit=1024 * MI)


def model_pod(
    kind: Kind,
    pod_id: str | None = None,
    *,
    tier: Extended | None = None,
    native: Native | None = None,
    overhead: Native | None = None,
) -> PodModel:
    """A pod of the history tests' model (tests/oracle/model.py) with one "app" container.

    By default its id is the kind's tier ("batch", "mid", "norm" or "prod"), its tier
    resources APP_BATCH or APP_MID by its annotation's tier (none for other kinds), and
    kubelet's values APP_NATIVE in an LS pod, none in a besteffort one."""
    prefix = kind.resource_prefix
    if tier is None:
        tier = {"batch": APP_BATCH, "mid": APP_MID}.get(prefix or "")
    if native is None:
        native = Native() if kind.besteffort else APP_NATIVE
    if pod_id is None:
        pod_id = prefix or ("norm" if kind is Kind.NORMALIZED_LS else "prod")
    containers = (ContainerModel("app", tier, native),)
    return PodModel(pod_id, kind, containers, overhead or Native())


def prod_pod(
    pod_id: str = "prod", *, name: str | None = None, **linux: api.LinuxResources
) -> api.PodSandbox:
    """An LS koord-prod pod without tier resources: no tier changes its values. `linux`: its
    `pod_resources` and `pod_overhead`, as containerd 2.x sends them."""
    result = pod(pod_id, qos="LS", priority="koord-prod", name=name)
    for field, given in linux.items():
        getattr(result.linux, field).CopyFrom(given)
    return result


def container(
    container_id: str = "ctr0",
    pod: api.PodSandbox | str = "pod0",
    name: str | None = None,
    *,
    state: int = api.CONTAINER_RUNNING,
    current: api.LinuxResources | None = None,
) -> api.Container:
    """A Container of `pod` (or of that pod id) holding `current` resources."""
    return api.Container(
        id=container_id,
        pod_sandbox_id=pod if isinstance(pod, str) else pod.id,
        name=name or f"{container_id}-name",
        state=state,
        linux=api.LinuxContainer(resources=current or api.LinuxResources()),
    )


def resources(
    *,
    shares: int | None = None,
    quota: int | None = None,
    period: int | None = None,
    memory: int | None = None,
) -> api.LinuxResources:
    """LinuxResources with only the given fields present, as a runtime sends them."""
    result = api.LinuxResources()
    if shares is not None:
        result.cpu.shares.value = shares
    if quota is not None:
        result.cpu.quota.value = quota
    if period is not None:
        result.cpu.period.value = period
    if memory is not None:
        result.memory.limit.value = memory
    return result


def update(container_id: str) -> api.ContainerUpdate:
    return api.ContainerUpdate(container_id=container_id)


def pod_view(
    qos: str | None = None,
    priority: str | None = None,
    annotation: str | None = None,
    *,
    uid: str = "0a1b",
    name: str | None = None,
    namespace: str = "default",
    native: NativeLimits | None = None,
) -> PodView:
    """The policy's view of a pod, in the besteffort cgroup parent whatever its QoS label."""
    return PodView(
        uid=uid,
        namespace=namespace,
        name=name or f"{uid}-name",
        labels=labels(qos, priority),
        annotations={} if annotation is None else {SPEC: annotation},
        cgroup_parent=f"/kubepods/besteffort/pod{uid}",
        native=native or NativeLimits(),
    )


def policy(yaml: str = "") -> Policy:
    """The policy of a configuration file holding `yaml`; "" gives Koordinator's defaults."""
    return compile_policy(load_config_text(yaml, "test"))


DEFAULT_POLICY = policy()

#: The container the policy tests decide for, unless they name another.
MAIN = ContainerView(id="c0", name="main")


def decide(
    pod: PodView, container: ContainerView = MAIN, policy: Policy = DEFAULT_POLICY
) -> Decision:
    return decide_container(pod, container, policy)
