"""examples/kubernetes/daemonset.yaml as kubelet hands it to a runtime over CRI.

The test reads the manifest itself, never a copy: `PluginPod.load()` takes the
DaemonSet's pod template and the ConfigMap it mounts, and turns them into the
PodSandboxConfig and ContainerConfig that kubelet would send (namespaces,
args, mounts, security context, resources), with each hostPath mapped to the
test node's own path. A field the translation does not know fails the test
rather than being dropped, so the manifest cannot grow an untested setting.
"""

from __future__ import annotations

import ctypes
import http.client
import os
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nri_midbatch.policy.quantity import parse_quantity
from tests.e2e.cri import runtime_pb2 as cri
from tests.e2e.node import NODE

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "examples" / "kubernetes"
DAEMONSET = MANIFESTS / "daemonset.yaml"
CONFIGMAP = MANIFESTS / "configmap.yaml"

#: What kubelet does with a securityContext field (the ones the manifest may use).
_KNOWN_SECURITY = {
    "privileged",
    "allowPrivilegeEscalation",
    "readOnlyRootFilesystem",
    "runAsUser",
    "runAsGroup",
    "runAsNonRoot",
    "capabilities",
    "seccompProfile",
}
_SECCOMP = {
    "RuntimeDefault": cri.SecurityProfile.RuntimeDefault,
    "Unconfined": cri.SecurityProfile.Unconfined,
}
#: kubelet's CFS period and its smallest cpu.shares.
CFS_PERIOD = 100_000
MIN_SHARES = 2
#: setns(2)'s flag for a network namespace (os.setns arrives only in Python 3.12).
CLONE_NEWNET = 0x40000000


class ManifestError(AssertionError):
    """The manifest asks for something this translation (and so the test) does not cover."""


@dataclass(frozen=True)
class Probe:
    path: str
    port: int
    timeout: float


def _milli_cpu(text: str) -> int:
    return int(parse_quantity(text).amount * 1000)


def _bytes(text: str) -> int:
    return int(parse_quantity(text).amount)


@dataclass
class PluginPod:
    """The DaemonSet's pod on one node: its template, config data and host paths."""

    template: dict[str, Any]
    config_data: dict[str, str]
    #: the DaemonSet's name and namespace, which its pods carry
    name: str
    namespace: str

    @classmethod
    def load(cls) -> PluginPod:
        """The DaemonSet's pod template and the data of the ConfigMap it mounts."""
        daemonset = yaml.safe_load(DAEMONSET.read_text())
        template = daemonset["spec"]["template"]
        configmap = yaml.safe_load(CONFIGMAP.read_text())
        mounted = [v["configMap"]["name"] for v in template["spec"]["volumes"] if "configMap" in v]
        if configmap["metadata"]["name"] not in mounted:
            raise ManifestError(f"{CONFIGMAP.name} is not the ConfigMap the DaemonSet mounts")
        metadata = daemonset["metadata"]
        return cls(template, dict(configmap["data"]), metadata["name"], metadata["namespace"])

    @property
    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.template["spec"]
        return spec

    @property
    def container(self) -> dict[str, Any]:
        containers = self.spec["containers"]
        if len(containers) != 1 or self.spec.get("initContainers"):
            raise ManifestError("the test runs exactly one container")
        container: dict[str, Any] = containers[0]
        return container

    @property
    def image(self) -> str:
        image: str = self.container["image"]
        return image

    def probe(self, kind: str) -> Probe:
        """The liveness or readiness probe's GET, with a named port resolved."""
        get = self.container[kind]["httpGet"]
        port = get["port"]
        if isinstance(port, str):
            (port,) = [p["containerPort"] for p in self.container["ports"] if p["name"] == port]
        return Probe(get["path"], int(port), float(self.container[kind]["timeoutSeconds"]))

    # ------------------------------------------------------------- sandbox

    def namespaces(self) -> Any:
        """hostNetwork/hostPID/hostIPC as kubelet maps them (false: the pod's own)."""
        return cri.NamespaceOption(
            network=cri.NODE if self.spec.get("hostNetwork") else cri.POD,
            pid=cri.NODE if self.spec.get("hostPID") else cri.CONTAINER,
            ipc=cri.NODE if self.spec.get("hostIPC") else cri.POD,
        )

    def qos_dir(self) -> str:
        """kubelet's QoS class of the pod, as its cgroup directory is named."""
        resources = self.container.get("resources", {})
        requests, limits = resources.get("requests", {}), resources.get("limits", {})
        if not requests and not limits:
            return "besteffort"
        if set(limits) >= {"cpu", "memory"} and all(
            requests.get(k, limits[k]) == limits[k] for k in ("cpu", "memory")
        ):
            return "guaranteed"
        return "burstable"

    def sandbox_config(self, log_directory: Path, attempt: int = 0) -> Any:
        metadata = self.template["metadata"]
        uid = str(uuid.uuid4())
        # A DaemonSet's pods are named <daemonset>-<5 characters>.
        name = f"{self.name}-{uid[:5]}"
        return cri.PodSandboxConfig(
            metadata=cri.PodSandboxMetadata(
                name=name, namespace=self.namespace, uid=uid, attempt=attempt
            ),
            hostname="" if self.spec.get("hostNetwork") else name,
            log_directory=str(log_directory),
            labels=dict(metadata.get("labels", {})),
            annotations=dict(metadata.get("annotations", {})),
            linux=cri.LinuxPodSandboxConfig(
                cgroup_parent=NODE.new_cgroup_parent(self.qos_dir(), uid),
                security_context=cri.LinuxSandboxSecurityContext(
                    namespace_options=self.namespaces()
                ),
            ),
        )

    # ----------------------------------------------------------- container

    def mounts(self, host_paths: Mapping[str, Path], config_root: Path) -> list[Any]:
        """Each volumeMount as a CRI mount.

        hostPath volumes go to `host_paths[path]` (every one must be mapped;
        DirectoryOrCreate is created as kubelet does, Directory must exist);
        a configMap volume becomes a directory under `config_root` holding
        its data, as kubelet projects it.
        """
        volumes = {v["name"]: v for v in self.spec.get("volumes", [])}
        mounts = []
        for mount in self.container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            if "hostPath" in volume:
                wanted = volume["hostPath"]["path"]
                if wanted not in host_paths:
                    raise ManifestError(f"hostPath {wanted} has no path on the test node")
                source = host_paths[wanted]
                kind = volume["hostPath"].get("type", "")
                if kind == "DirectoryOrCreate":
                    source.mkdir(mode=0o755, parents=True, exist_ok=True)
                elif kind == "Directory" and not source.is_dir():
                    raise ManifestError(f"hostPath {wanted}: {source} is not a directory")
            elif "configMap" in volume:
                source = config_root / mount["name"]
                source.mkdir(parents=True, exist_ok=True)
                for key, text in self.config_data.items():
                    (source / key).write_text(text)
            else:
                raise ManifestError(f"volume {mount['name']}: only hostPath and configMap")
            mounts.append(
                cri.Mount(
                    container_path=mount["mountPath"],
                    host_path=str(source),
                    readonly=bool(mount.get("readOnly", False)),
                )
            )
        return mounts

    def security_context(self) -> Any:
        context = self.container.get("securityContext", {})
        unknown = set(context) - _KNOWN_SECURITY
        if unknown:
            raise ManifestError(f"securityContext fields not translated: {sorted(unknown)}")
        user = context.get("runAsUser")
        if context.get("runAsNonRoot") and user in (None, 0):
            raise ManifestError("runAsNonRoot with uid 0: kubelet would refuse to start it")
        seccomp = context.get("seccompProfile", {}).get("type")
        group = context.get("runAsGroup")
        return cri.LinuxContainerSecurityContext(
            capabilities=cri.Capability(
                add_capabilities=context.get("capabilities", {}).get("add", []),
                drop_capabilities=context.get("capabilities", {}).get("drop", []),
            ),
            privileged=bool(context.get("privileged", False)),
            namespace_options=self.namespaces(),
            run_as_user=cri.Int64Value(value=user) if user is not None else None,
            run_as_group=cri.Int64Value(value=group) if group is not None else None,
            readonly_rootfs=bool(context.get("readOnlyRootFilesystem", False)),
            no_new_privs=context.get("allowPrivilegeEscalation") is False,
            seccomp=cri.SecurityProfile(profile_type=_SECCOMP[seccomp]) if seccomp else None,
        )

    def resources(self) -> Any:
        """requests/limits as kubelet turns them into cgroup values."""
        resources = self.container.get("resources", {})
        requests, limits = resources.get("requests", {}), resources.get("limits", {})
        values: dict[str, int] = {}
        cpu_request = requests.get("cpu", limits.get("cpu"))
        if cpu_request is not None:
            values["cpu_shares"] = max(MIN_SHARES, _milli_cpu(cpu_request) * 1024 // 1000)
        if "cpu" in limits:
            values["cpu_period"] = CFS_PERIOD
            values["cpu_quota"] = _milli_cpu(limits["cpu"]) * CFS_PERIOD // 1000
        if "memory" in limits:
            values["memory_limit_in_bytes"] = _bytes(limits["memory"])
        return cri.LinuxContainerResources(**values)

    def container_config(
        self, host_paths: Mapping[str, Path], config_root: Path, attempt: int = 0
    ) -> Any:
        container = self.container
        for field in ("command", "env", "envFrom", "workingDir"):
            if field in container:
                raise ManifestError(f"container field {field} is not translated")
        return cri.ContainerConfig(
            metadata=cri.ContainerMetadata(name=container["name"], attempt=attempt),
            image=cri.ImageSpec(image=self.image),
            args=list(container.get("args", [])),
            mounts=self.mounts(host_paths, config_root),
            log_path=f"{container['name']}/{attempt}.log",
            linux=cri.LinuxContainerConfig(
                resources=self.resources(), security_context=self.security_context()
            ),
        )


def http_get_in_netns(netns: Path, host: str, probe: Probe) -> int:
    """GET the probe's path from inside a network namespace, as kubelet reaches a pod.

    The socket is made in a thread that has joined `netns` (setns affects only the
    calling thread), so the test process itself stays in its own namespace.
    Returns the status, or 0 when nothing answers.
    """
    result: list[int] = []

    def get() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(netns, os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns {netns}")
        finally:
            os.close(fd)
        connection = http.client.HTTPConnection(host, probe.port, timeout=probe.timeout)
        try:
            connection.request("GET", probe.path)
            result.append(connection.getresponse().status)
        except OSError:
            result.append(0)
        finally:
            connection.close()

    thread = threading.Thread(target=get, name="probe")
    thread.start()
    thread.join()
    return result[0] if result else 0
