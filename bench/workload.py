"""Realistic NRI objects for the benchmark, and the fake cgroup tree they point into.

Every object is what containerd hands a plugin for a Kubernetes pod: the pod's
labels and annotations as kubelet and containerd set them, a container with
its CRI labels and annotations, environment, mounts, namespaces and resources.

Pods and containers of the event phases carry a 12-character placeholder
(`TOKEN`) in their ids, uid, name and cgroup parent, and in the memory request
of their extended-resource spec. The runtime encodes each request once and
swaps the placeholder for a 12-digit decimal counter per call (equal length,
so every length prefix stays valid), which makes every pod, container and
spec distinct without encoding anything per event. A memory request takes
part in no formula, so the values the plugin answers stay the same.
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.cgroups.paths import CgroupDriver, CgroupLocation
from nri_midbatch.cgroups.values import cpu_shares_to_weight

#: Stands for a 12-hex-digit counter in pre-encoded requests; not hex, so never ambiguous.
TOKEN = "ZZZZZZZZZZZZ"

#: Where the plugin keeps kubelet's limits on containers it adjusted.
NATIVE_LIMITS_ANNOTATION = "nri-midbatch.io/native-limits"

SPEC_ANNOTATION = "node.koordinator.sh/extended-resource-spec"
PRIORITY_LABEL = "koordinator.sh/priority-class"
BATCH_CPU = "kubernetes.io/batch-cpu"
BATCH_MEMORY = "kubernetes.io/batch-memory"

GI = 1 << 30

#: The main container of an event-phase pod: requests 1 core / 2 GiB, limits 2 cores / 4 GiB.
MAIN_SPEC = {
    "requests": {BATCH_CPU: "1k", BATCH_MEMORY: "2Gi"},
    "limits": {BATCH_CPU: "2k", BATCH_MEMORY: "4Gi"},
}
#: What the plugin must answer for it: shares = 1000m * 1024 / 1000, quota = 2000m * 100.
MAIN_VALUES = (1024, 200_000, 4 * GI)

# kubelet's values for a BestEffort pod's or container's cgroup (cgroup v2, systemd driver).
BE_CGROUP_FILES = {"cpu.weight": "1\n", "cpu.max": "max 100000\n", "memory.max": "max\n"}


def counter_token(n: int) -> bytes:
    """Decimal, so that `<token>Mi` is a quantity: 000000001234Mi is 1234 MiB."""
    return b"%012d" % n


def pod_uid(token: str) -> str:
    return f"6f1c2a0e-0b1a-4c55-9d1e-{token}"


def pod_id(token: str) -> str:
    return "8381fffc8ab289e19b1779db734c31260bb0e7a4611b7a8b52a9" + token


def container_id(token: str, index: int = 0) -> str:
    """64 hex digits, as containerd's ids: a prefix, the container's index, the pod's counter."""
    return f"30cce08ad3c880e877c4f3106543dead7dce148cbe63db3ef6{index:02x}" + token


def be_cgroup_parent(uid: str) -> str:
    """kubelet's systemd-driver parent for a BestEffort pod, as containerd passes it."""
    return f"kubepods-besteffort-pod{uid.replace('-', '_')}.slice"


def burstable_cgroup_parent(uid: str) -> str:
    return f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"


def pod_cgroup_dir(root: Path, cgroup_parent: str) -> Path:
    """Where the plugin resolves a systemd parent (the slice expanded) below a v2 root."""
    stem = cgroup_parent.removesuffix(".slice").split("-")
    parts = ["-".join(stem[: i + 1]) + ".slice" for i in range(len(stem))]
    return root.joinpath(*parts)


def make_cgroup_root(root: Path) -> None:
    """A cgroup v2 root as the plugin sees one: `cgroup.controllers` at the top."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")


def create_pod_cgroup(root: Path, cgroup_parent: str) -> Path:
    """What the runtime does before RunPodSandbox: the pod cgroup exists with kubelet's values."""
    directory = pod_cgroup_dir(root, cgroup_parent)
    write_cgroup_files(directory, BE_CGROUP_FILES)
    return directory


def container_cgroup_dir(root: Path, container: api.Container) -> Path:
    """A container's cgroup: at its own `cgroups_path`, as the plugin reads it."""
    parent = container.linux.cgroups_path.split(":", 1)[0]
    location = CgroupLocation(CgroupDriver.AUTO, parent, container.id, container.linux.cgroups_path)
    return root / location.relpath()


def write_cgroup_files(directory: Path, files: dict[str, str], *, create: bool = True) -> None:
    if create:
        directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        fd = os.open(f"{directory}/{name}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def container_files(resources: api.LinuxResources) -> dict[str, str]:
    """The v2 files of a container holding `resources`, as the runtime writes them."""
    cpu, memory = resources.cpu, resources.memory
    return _files(
        cpu.shares.value,
        cpu.quota.value if cpu.HasField("quota") else 0,
        memory.limit.value if memory.HasField("limit") else 0,
    )


@functools.lru_cache(maxsize=64)
def _files(shares: int, quota: int, memory: int) -> dict[str, str]:
    return {
        "cpu.weight": f"{cpu_shares_to_weight(shares)}\n",
        "cpu.max": f"{quota if quota > 0 else 'max'} 100000\n",
        "memory.max": f"{memory if memory > 0 else 'max'}\n",
    }


def reset_sync_cgroups(
    root: Path, pods: list[api.PodSandbox], containers: list[api.Container]
) -> None:
    """The batch pods' and their containers' cgroups as before the plugin's first run.

    Pods hold kubelet's BestEffort values; each container what the runtime
    reports for it (kubelet's values, or the plugin's for the one it set).
    """
    batch = {pod.id for pod in pods if pod.labels.get(PRIORITY_LABEL) == "koord-batch"}
    for pod in pods:
        if pod.id in batch:
            create_pod_cgroup(root, pod.linux.cgroup_parent)
    for ctr in containers:
        if ctr.pod_sandbox_id in batch:
            files = container_files(ctr.linux.resources)
            write_cgroup_files(container_cgroup_dir(root, ctr), files)


def apply_updates(
    directories: dict[str, Path], updates: Iterable[tuple[str, api.LinuxResources]]
) -> None:
    """What the runtime does with a Synchronize reply: each container's new values, in order.

    directories: each container's cgroup, by container id.
    """
    for container_id, resources in updates:
        files = container_files(resources)
        write_cgroup_files(directories[container_id], files, create=False)


def remove_pod_cgroup(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)


def spec_annotation(containers: dict[str, dict[str, dict[str, str]]]) -> str:
    return json.dumps({"containers": containers}, separators=(",", ":"))


@dataclass(frozen=True)
class PodShape:
    token: str
    batch: bool = True
    namespace: str = "batch-jobs"
    app: str = "spark-etl"
    containers: tuple[str, ...] = ("main",)
    #: The main container's batch-memory request: distinct per pod, as specs of different jobs are.
    memory_request: str = "2Gi"


def pod(shape: PodShape) -> api.PodSandbox:
    """A pod with 10 labels and 20 annotations (the extended-resource spec among them)."""
    uid = pod_uid(shape.token)
    sandbox_id = pod_id(shape.token)
    name = f"{shape.app}-exec-{shape.token}"
    if shape.batch:
        qos, priority = "BE", "koord-batch"
        parent = be_cgroup_parent(uid)
    else:
        qos, priority = "LS", "koord-prod"
        parent = burstable_cgroup_parent(uid)
    labels = {
        "koordinator.sh/qosClass": qos,
        PRIORITY_LABEL: priority,
        "app.kubernetes.io/name": shape.app,
        "app.kubernetes.io/instance": f"{shape.app}-20261129",
        "app.kubernetes.io/component": "executor",
        "app.kubernetes.io/managed-by": "spark-operator",
        "pod-template-hash": "7d9f8c6b5",
        "io.kubernetes.pod.name": name,
        "io.kubernetes.pod.namespace": shape.namespace,
        "io.kubernetes.pod.uid": uid,
    }
    spec: dict[str, dict[str, dict[str, str]]] = {}
    for index, cname in enumerate(shape.containers):
        if cname == "main":
            spec[cname] = {
                "requests": {**MAIN_SPEC["requests"], BATCH_MEMORY: shape.memory_request},
                "limits": MAIN_SPEC["limits"],
            }
        else:
            spec[cname] = {
                "requests": {BATCH_CPU: f"{250 + 50 * index}", BATCH_MEMORY: "512Mi"},
                "limits": {BATCH_CPU: f"{500 + 100 * index}", BATCH_MEMORY: "1Gi"},
            }
    annotations = {
        SPEC_ANNOTATION: spec_annotation(spec),
        "kubernetes.io/config.seen": "2026-11-29T23:49:21.123456789Z",
        "kubernetes.io/config.source": "api",
        "scheduling.koordinator.sh/resource-status": '{"cpuset":""}',
        "koordinator.sh/reservation-allocated": "",
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9090",
        "sparkoperator.k8s.io/app-name": shape.app,
        "cni.projectcalico.org/podIP": "10.244.3.17/32",
        "cni.projectcalico.org/containerID": sandbox_id,
        "io.kubernetes.cri.container-type": "sandbox",
        "io.kubernetes.cri.sandbox-id": sandbox_id,
        "io.kubernetes.cri.sandbox-name": name,
        "io.kubernetes.cri.sandbox-namespace": shape.namespace,
        "io.kubernetes.cri.sandbox-uid": uid,
        "io.kubernetes.cri.sandbox-log-directory": (
            f"/var/log/pods/{shape.namespace}_{name}_{uid}"
        ),
        "io.kubernetes.cri.sandbox-cpu-period": "100000",
        "io.kubernetes.cri.sandbox-cpu-quota": "0",
        "io.kubernetes.cri.sandbox-cpu-shares": "2",
        "io.kubernetes.cri.sandbox-memory": "0",
    }
    assert len(labels) == 10 and len(annotations) == 20
    return api.PodSandbox(
        id=sandbox_id,
        name=name,
        uid=uid,
        namespace=shape.namespace,
        labels=labels,
        annotations=annotations,
        runtime_handler="runc",
        linux=api.LinuxPodSandbox(
            cgroup_parent=parent,
            cgroups_path=f"{parent}:cri-containerd:{sandbox_id}",
            namespaces=[
                api.LinuxNamespace(type="pid"),
                api.LinuxNamespace(type="ipc"),
                api.LinuxNamespace(type="uts"),
                api.LinuxNamespace(type="network", path=f"/var/run/netns/cni-{uid}"),
            ],
            resources=api.LinuxResources(
                cpu=api.LinuxCPU(shares=api.OptionalUInt64(value=2)),
            ),
        ),
        pid=21613,
        ips=["10.244.3.17"],
    )


def container(
    shape: PodShape,
    index: int = 0,
    *,
    state: int = api.CONTAINER_UNKNOWN,
    values: tuple[int, int, int] | None = None,
) -> api.Container:
    """A container with CRI labels and annotations, 30 env entries and 5 mounts.

    `values` (shares, quota, memory) are its current resources; by default what
    kubelet gives a BestEffort container (shares 2, no quota, no memory limit).
    """
    cname = shape.containers[index]
    uid = pod_uid(shape.token)
    sandbox_id = pod_id(shape.token)
    cid = container_id(shape.token, index)
    pod_name = f"{shape.app}-exec-{shape.token}"
    parent = be_cgroup_parent(uid) if shape.batch else burstable_cgroup_parent(uid)
    env = [
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        f"HOSTNAME={pod_name}",
        "JAVA_HOME=/opt/java/openjdk",
        "LANG=C.UTF-8",
        "SPARK_HOME=/opt/spark",
        "SPARK_USER=spark",
        f"SPARK_APPLICATION_ID=spark-{shape.token}",
        "SPARK_EXECUTOR_CORES=2",
        "SPARK_EXECUTOR_MEMORY=3g",
        f"SPARK_EXECUTOR_POD_NAME={pod_name}",
        "SPARK_DRIVER_URL=spark://CoarseGrainedScheduler@spark-driver-svc.batch-jobs.svc:7078",
        "SPARK_EXECUTOR_POD_IP=10.244.3.17",
        "SPARK_CONF_DIR=/opt/spark/conf",
        "SPARK_LOCAL_DIRS=/var/data/spark-local",
        "KUBERNETES_SERVICE_HOST=10.96.0.1",
        "KUBERNETES_SERVICE_PORT=443",
        "KUBERNETES_SERVICE_PORT_HTTPS=443",
        "KUBERNETES_PORT=tcp://10.96.0.1:443",
        "KUBERNETES_PORT_443_TCP=tcp://10.96.0.1:443",
        "KUBERNETES_PORT_443_TCP_PROTO=tcp",
        "KUBERNETES_PORT_443_TCP_PORT=443",
        "KUBERNETES_PORT_443_TCP_ADDR=10.96.0.1",
        "SPARK_DRIVER_SVC_SERVICE_HOST=10.96.41.12",
        "SPARK_DRIVER_SVC_SERVICE_PORT=7078",
        "SPARK_DRIVER_SVC_PORT=tcp://10.96.41.12:7078",
        "SPARK_DRIVER_SVC_PORT_7078_TCP=tcp://10.96.41.12:7078",
        "SPARK_DRIVER_SVC_PORT_7078_TCP_PROTO=tcp",
        "SPARK_DRIVER_SVC_PORT_7078_TCP_PORT=7078",
        "SPARK_DRIVER_SVC_PORT_7078_TCP_ADDR=10.96.41.12",
        "TZ=UTC",
    ]
    assert len(env) == 30
    kubelet = f"/var/lib/kubelet/pods/{uid}"
    mounts = [
        api.Mount(
            destination="/var/run/secrets/kubernetes.io/serviceaccount",
            type="bind",
            source=f"{kubelet}/volumes/kubernetes.io~projected/kube-api-access-x7k2p",
            options=["rbind", "rprivate", "ro"],
        ),
        api.Mount(
            destination="/etc/hosts",
            type="bind",
            source=f"{kubelet}/etc-hosts",
            options=["rbind", "rprivate", "rw"],
        ),
        api.Mount(
            destination="/dev/termination-log",
            type="bind",
            source=f"{kubelet}/containers/{cname}/4f2a9c1e",
            options=["rbind", "rprivate", "rw"],
        ),
        api.Mount(
            destination="/etc/hostname",
            type="bind",
            source=f"/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/{sandbox_id}/hostname",
            options=["rbind", "rprivate", "rw"],
        ),
        api.Mount(
            destination="/etc/resolv.conf",
            type="bind",
            source=(
                f"/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/{sandbox_id}/resolv.conf"
            ),
            options=["rbind", "rprivate", "rw"],
        ),
    ]
    shares, quota, memory = values if values is not None else (2, -1, -1)
    annotations = {
        "io.kubernetes.container.hash": "9b2f6c1d",
        "io.kubernetes.container.restartCount": "0",
        "io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
        "io.kubernetes.container.terminationMessagePolicy": "File",
        "io.kubernetes.cri.container-name": cname,
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.image-name": "registry.example.com/spark/spark:3.5.3",
        "io.kubernetes.cri.sandbox-id": sandbox_id,
        "io.kubernetes.cri.sandbox-name": pod_name,
        "io.kubernetes.cri.sandbox-namespace": shape.namespace,
        "io.kubernetes.cri.sandbox-uid": uid,
    }
    if values is not None:
        # Adjusted by the plugin when it was created: it carries kubelet's limits.
        annotations[NATIVE_LIMITS_ANNOTATION] = '{"cpuPeriod":100000}'
    cpu = api.LinuxCPU(
        shares=api.OptionalUInt64(value=shares), period=api.OptionalUInt64(value=100000)
    )
    if quota > 0:
        cpu.quota.value = quota
    memory_msg = api.LinuxMemory()
    if memory > 0:
        memory_msg.limit.value = memory
    return api.Container(
        id=cid,
        pod_sandbox_id=sandbox_id,
        name=cname,
        state=state,
        labels={
            "io.kubernetes.container.name": cname,
            "io.kubernetes.pod.name": pod_name,
            "io.kubernetes.pod.namespace": shape.namespace,
            "io.kubernetes.pod.uid": uid,
        },
        annotations=annotations,
        args=[
            "/opt/entrypoint.sh",
            "executor",
            "--driver-url",
            "spark://CoarseGrainedScheduler@spark-driver-svc.batch-jobs.svc:7078",
            "--cores",
            "2",
        ],
        env=env,
        mounts=mounts,
        linux=api.LinuxContainer(
            namespaces=[
                api.LinuxNamespace(type="pid", path="/proc/21613/ns/pid"),
                api.LinuxNamespace(type="ipc", path="/proc/21613/ns/ipc"),
                api.LinuxNamespace(type="uts", path="/proc/21613/ns/uts"),
                api.LinuxNamespace(type="mount"),
                api.LinuxNamespace(type="network", path=f"/var/run/netns/cni-{uid}"),
            ],
            resources=api.LinuxResources(cpu=cpu, memory=memory_msg),
            oom_score_adj=api.OptionalInt(value=1000),
            cgroups_path=f"{parent}:cri-containerd:{cid}",
        ),
        rlimits=[api.POSIXRlimit(type="RLIMIT_NOFILE", hard=1048576, soft=1048576)],
    )


def sync_objects(
    pods: int, containers_per_pod: int
) -> tuple[list[api.PodSandbox], list[api.Container], int]:
    """A node's worth of running pods for Synchronize; returns (pods, containers, expected updates).

    Nine pods in ten are batch BE pods whose containers all appear in the
    extended-resource spec; the tenth is a prod LS pod no tier takes. In a
    batch pod, the last container already has its values (a plugin restart
    after it was set), the others still have kubelet's BestEffort values and
    need an update. Pods of one job (37 jobs) share their extended-resource
    spec. Containers come in no particular order, as containerd lists them.
    `reset_sync_cgroups` makes their cgroups.
    """
    names = tuple("main" if i == 0 else f"worker-{i}" for i in range(containers_per_pod))
    pod_list: list[api.PodSandbox] = []
    ctr_list: list[api.Container] = []
    expected = 0
    for p in range(pods):
        shape = PodShape(
            token=f"{0xE0000000000 + p:012x}",
            batch=p % 10 != 9,
            app=f"job{p % 37}",
            containers=names,
            # One spec per job: a job's pods share theirs.
            memory_request=f"{1024 + p % 37}Mi",
        )
        pod_list.append(pod(shape))
        for c in range(containers_per_pod):
            done = shape.batch and c == containers_per_pod - 1
            values = expected_values(names[c], c) if done else None
            ctr_list.append(container(shape, c, state=api.CONTAINER_RUNNING, values=values))
            if shape.batch and not done:
                expected += 1
    # containerd lists containers from a map: in no particular order, pods mixed.
    random.Random(0).shuffle(ctr_list)
    return pod_list, ctr_list, expected


def expected_pod_files(containers_per_pod: int) -> dict[str, str]:
    """The CFS quota and memory limit a Synchronize batch pod's v2 files start with.

    Sums over the spec's containers, as `expected_values` gives them (the
    cpu weight is left out: it is a conversion of the shares, not a sum).
    cpu.max is "quota period" when read from cgroupfs, the plugin writes the
    quota alone.
    """
    names = ("main", *(f"worker-{i}" for i in range(1, containers_per_pod)))
    values = [expected_values(name, index) for index, name in enumerate(names)]
    quota = sum(quota for _, quota, _ in values)
    memory = sum(memory for _, _, memory in values)
    return {"cpu.max": str(quota), "memory.max": str(memory)}


def expected_values(name: str, index: int) -> tuple[int, int, int]:
    """What the default policy gives a container of `pod()`'s spec (see MAIN_SPEC)."""
    if name == "main":
        return MAIN_VALUES
    request = 250 + 50 * index
    limit = 500 + 100 * index
    return (request * 1024 // 1000, limit * 100, GI)
