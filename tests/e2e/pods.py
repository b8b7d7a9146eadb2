"""The e2e tests' pods on a real containerd, as kubelet would run them: a pod cgroup of
its QoS class, one container "main", Koordinator's labels and spec annotation.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from tests.e2e.containerd import Containerd
from tests.e2e.node import NODE
from tests.factory import SPEC, labels, resource_spec

BE_NATIVE = {"cpu_shares": 2}  # what kubelet gives a BestEffort container

# The default tiers, then production pods normalized; ratio 1.25 divides exactly.
NORMALIZATION_CONFIG = """
rules: {cpuNormalizationRatio: 1.25}
tiers:
  - {name: batch, priorityClasses: [koord-batch, koord-free], qosClasses: [BE],
     resources: {cpu: kubernetes.io/batch-cpu, memory: kubernetes.io/batch-memory}}
  - {name: mid, priorityClasses: [koord-mid], qosClasses: [BE, LS],
     resources: {cpu: kubernetes.io/mid-cpu, memory: kubernetes.io/mid-memory}}
  - {name: prod, priorityClasses: [koord-prod, None], qosClasses: [LS, None],
     calculator: cpu-normalization}
"""


def normalizing(ratio: str) -> str:
    """NORMALIZATION_CONFIG's tiers (batch, mid, prod normalized) under another ratio."""
    return NORMALIZATION_CONFIG.replace(
        "cpuNormalizationRatio: 1.25", f"cpuNormalizationRatio: {ratio}"
    )


def spec(tier: str, request_cpu: str, limit_cpu: str, limit_memory: str) -> str:
    """The annotation of a pod whose one container "main" asks this tier's resources."""
    cpu, memory = f"kubernetes.io/{tier}-cpu", f"kubernetes.io/{tier}-memory"
    return resource_spec(cpu, memory, main=(request_cpu, limit_cpu, limit_memory))


@dataclass
class Pod:
    parent: str
    pod_id: str
    container_id: str


def run(
    containerd: Containerd,
    name: str,
    qos_dir: str,
    pod_labels: dict[str, str],
    annotations: dict[str, str],
    resources: dict[str, int],
) -> Pod:
    parent = NODE.new_cgroup_parent(qos_dir)
    pod_id = containerd.run_pod(
        name,
        uid=str(uuid.uuid4()),
        labels=pod_labels,
        annotations=annotations,
        cgroup_parent=parent,
    )
    container_id = containerd.create_container(pod_id, name="main", resources=resources)
    containerd.start_container(container_id)
    return Pod(parent, pod_id, container_id)


def run_batch(containerd: Containerd, name: str = "batch") -> Pod:
    """A BE koord-batch pod asking 500m, 1 CPU and 512Mi: Koordinator gives it shares 512,
    quota 100000 and 512 MiB."""
    batch_spec = {SPEC: spec("batch", "500", "1k", "512Mi")}
    return run(containerd, name, "besteffort", labels("BE", "koord-batch"), batch_spec, BE_NATIVE)
