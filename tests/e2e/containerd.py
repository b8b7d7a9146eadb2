"""A real containerd (1.7 or 2.x) with NRI enabled, driven over CRI, for end-to-end tests.

`Containerd(workdir, bin_dir, version="2.1.9")` lays out a private containerd
under `workdir` (root, state, sockets, runc state, NRI plugin dirs, log) with
the config format of that release (`FLAVOURS`), builds and imports a local
busybox image, and offers a small CRI client plus helpers that locate the
cgroup directories runc creates under /sys/fs/cgroup/<controller>/.
`fetch(flavour)` gets the binaries (scripts/fetch-containerd.sh, cached).

Nothing here is shared with another containerd on the machine: the CRI
namespace is always `k8s.io`, so runc's state directory is moved into
`workdir` (runc would otherwise use /run/containerd/runc/k8s.io), every pod
gets its own cgroup parent /kubepods/<qos>/pod<uuid>, and containerd runs in a
mount namespace of its own with a private tmpfs on /run/containerd, where the
shims put their sockets (/run/containerd/s). That namespace lives as long as
the harness, like a node's, so containerd can be stopped and started again
and still find its shims.

`close()` (also the context-manager exit) removes all pods and containers,
stops containerd, kills any shim it left behind, ends the mount namespace
(and with it every mount containerd made), and removes the cgroup
directories of the pods.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import platform
import signal
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from tests.e2e.cri import runtime_pb2 as cri
from tests.e2e.cri import runtime_pb2_grpc as cri_grpc
from tests.e2e.node import NODE, SLOWDOWN

BUSYBOX = Path("/bin/busybox")
IMAGE_TAG = "local/busybox:1"
# The CRI plugin normalises short names the docker way.
IMAGE = f"docker.io/{IMAGE_TAG}"
BUSYBOX_LINKS = ("sh", "sleep", "cat")
SLEEP_FOREVER = ("/bin/sleep", "2147483647")
CRI_NAMESPACE = "k8s.io"


ROOT = Path(__file__).resolve().parents[2]
FETCH = ROOT / "scripts" / "fetch-containerd.sh"
#: Where every containerd puts its shims' sockets; private to each harness.
RUN_CONTAINERD = Path("/run/containerd")


class ContainerdError(RuntimeError):
    """containerd did not start, or a harness step failed; carries the log tail."""


@dataclass(frozen=True)
class Flavour:
    """A containerd release under test: where it comes from and what it speaks."""

    version: str
    #: Debian suite whose `containerd` package is this release.
    suite: str
    #: NRI version it vendors (its go.mod; docs/reference nri-protocol.md 5.3).
    nri: str
    #: Version of its config file format.
    config_version: int

    @property
    def id(self) -> str:
        return f"containerd-{self.version}"

    @property
    def nri_version(self) -> tuple[int, ...]:
        return tuple(int(n) for n in self.nri.lstrip("v").split("."))

    @property
    def synchronizes_prelaunched(self) -> bool:
        """NRI v0.7 and later send Synchronize to pre-launched plugins too."""
        return self.nri_version >= (0, 7, 0)

    @property
    def configure_carries_timeouts(self) -> bool:
        """NRI v0.7 and later tell the plugin their timeouts in Configure."""
        return self.nri_version >= (0, 7, 0)


#: The releases every end-to-end test runs against.
FLAVOURS = {
    f.version: f
    for f in (
        Flavour("1.7.24", suite="trixie", nri="v0.6.1", config_version=2),
        Flavour("2.1.9", suite="sid", nri="v0.8.0", config_version=3),
    )
}


def fetch(flavour: Flavour, timeout: float = 900) -> Path:
    """The directory holding this release's containerd, shim and ctr (fetched once, cached)."""
    env = dict(os.environ, CONTAINERD_SUITE=flavour.suite, CONTAINERD_VERSION=flavour.version)
    res = subprocess.run(
        ["bash", str(FETCH)], capture_output=True, text=True, timeout=timeout, env=env
    )
    if res.returncode != 0:
        raise ContainerdError(f"{FETCH.name} ({flavour.id}) failed:\n{res.stderr}")
    bin_dir = Path(res.stdout.strip().splitlines()[-1])
    if not (bin_dir / "containerd").is_file():
        raise ContainerdError(f"{FETCH.name} printed {bin_dir}, which has no containerd")
    return bin_dir


def build_busybox_image(dest: Path, tag: str = IMAGE_TAG) -> Path:
    """Write a docker-archive tar (as `docker save` makes) holding static busybox."""
    if not BUSYBOX.is_file():
        raise ContainerdError(f"{BUSYBOX} missing: install busybox-static")
    layer = io.BytesIO()
    mtime = 0
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("bin", "dev", "etc", "proc", "sys", "tmp"):
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if name == "tmp" else 0o755
            info.mtime = mtime
            tar.addfile(info)
        data = BUSYBOX.read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size = len(data)
        info.mode = 0o755
        info.mtime = mtime
        tar.addfile(info, io.BytesIO(data))
        for link in BUSYBOX_LINKS:
            info = tarfile.TarInfo(f"bin/{link}")
            info.type = tarfile.SYMTYPE
            info.linkname = "busybox"
            info.mode = 0o777
            info.mtime = mtime
            tar.addfile(info)
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()

    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    config = {
        "architecture": arch,
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Env": ["PATH=/bin"], "Cmd": list(SLEEP_FOREVER), "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "nri-midbatch e2e"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_name = diff_id.removeprefix("sha256:") + "/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": [layer_name]}]

    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, mode="w") as tar:
        for name, blob in (
            (layer_name, layer_bytes),
            (config_name, config_bytes),
            ("manifest.json", json.dumps(manifest).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(blob))
    return dest


def remove_cgroup_tree(parent: str, attempts: int = 20) -> list[str]:
    """rmdir `parent` and everything below it in every hierarchy, leaves first.

    Returns the directories that could not be removed (still busy).
    """
    if not parent.strip("/"):
        raise ValueError("refusing to remove the cgroup root")
    left: list[str] = []
    for top in NODE.pod_dirs(parent):
        if not top.is_dir():
            continue
        dirs = [Path(d) for d, _, _ in os.walk(top)]
        for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
            for i in range(attempts):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    # EBUSY while the kernel reaps the last task; retry briefly.
                    if i == attempts - 1:
                        left.append(str(d))
                    else:
                        time.sleep(0.05)
    return left


def _pids_referring_to(needle: str) -> list[int]:
    """Pids whose command line mentions `needle` (our socket path)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle.encode() in cmdline:
            found.append(int(entry.name))
    return found


class Containerd:
    """A private containerd (CRI + NRI) living under `workdir`.

    `version` picks the release (a key of FLAVOURS) whose config format is
    written; `bin_dir` must hold that release (see `fetch`).
    `systemd_cgroup` selects runc's systemd cgroup driver instead of cgroupfs.
    """

    def __init__(
        self,
        workdir: Path,
        bin_dir: Path,
        *,
        version: str = "1.7.24",
        systemd_cgroup: bool = False,
        log_level: str = "info",
        start_timeout: float = 20.0,
        nri_socket: Path | None = None,
        root: Path | None = None,
    ) -> None:
        """`nri_socket`: where NRI listens (default `workdir`/nri.sock); a directory of
        its own lets a test bind that directory, and nothing else, into a container.
        `root`: containerd's root (default `workdir`/root); one that outlives the test
        keeps its images for the next harness."""
        self.workdir = Path(workdir).resolve()
        self.bin_dir = Path(bin_dir).resolve()
        self.flavour = FLAVOURS[version]
        self.systemd_cgroup = systemd_cgroup
        self.log_level = log_level
        self.start_timeout = start_timeout * SLOWDOWN

        self.root = (root or self.workdir / "root").resolve()
        self.state = self.workdir / "state"
        self.runc_root = self.workdir / "runc"
        self.address = self.workdir / "containerd.sock"
        self.nri_socket = nri_socket or self.workdir / "nri.sock"
        self.plugin_path = self.workdir / "nri-plugins"
        self.plugin_config_path = self.workdir / "nri-conf"
        self.config_path = self.workdir / "config.toml"
        self.log_path = self.workdir / "containerd.log"
        self.image_tar = self.workdir / "busybox.tar"
        self.pod_logs = self.workdir / "pod-logs"
        #: CNI plugins and network configuration, for pods not on the host's network
        self.cni_bin = self.workdir / "cni-bin"
        self.cni_conf = self.workdir / "cni-conf"

        self.proc: subprocess.Popen[bytes] | None = None
        #: holds the mount namespace containerd runs in (a sleeping process)
        self._namespace: subprocess.Popen[bytes] | None = None
        self._channel: grpc.Channel | None = None
        self._cri: cri_grpc.RuntimeServiceStub | None = None
        self._image_imported = False
        self._started_once = False
        #: pod id -> the PodSandboxConfig it was started with
        self.pod_configs: dict[str, cri.PodSandboxConfig] = {}
        #: every cgroup parent handed to a pod, for cleanup
        self.cgroup_parents: set[str] = set()

        for d in (
            self.root,
            self.state,
            self.runc_root,
            self.plugin_path,
            self.plugin_config_path,
            self.pod_logs,
            self.cni_bin,
            self.cni_conf,
        ):
            d.mkdir(parents=True, exist_ok=True)
        self.write_config()

    # ---------------------------------------------------------------- config

    def config_text(self) -> str:
        if self.flavour.config_version == 3:
            return self._config_v3()
        return self._config_v2()

    def _config_v2(self) -> str:
        """containerd 1.7's format: CRI settings under io.containerd.grpc.v1.cri."""
        return f"""\
version = 2
root = "{self.root}"
state = "{self.state}"
# Plugins this machine cannot use; skipping them keeps start-up quick and quiet.
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{self.address}"

{self._nri_section('"')}
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{IMAGE}"
  restrict_oom_score_adj = true
  disable_apparmor = true

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "{self.cni_bin}"
  conf_dir = "{self.cni_conf}"

[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  # runc keeps its state in <Root>/<namespace>; keep it out of /run/containerd.
  Root = "{self.runc_root}"
  SystemdCgroup = {str(self.systemd_cgroup).lower()}
"""

    def _config_v3(self) -> str:
        """containerd 2.x's format: CRI split into cri.v1.runtime and cri.v1.images."""
        runtime = "plugins.'io.containerd.cri.v1.runtime'"
        images = "plugins.'io.containerd.cri.v1.images'"
        return f"""\
version = 3
root = '{self.root}'
state = '{self.state}'
# Plugins that need kernel features or a network this machine lacks.
disabled_plugins = [
  'io.containerd.snapshotter.v1.btrfs',
  'io.containerd.snapshotter.v1.zfs',
  'io.containerd.snapshotter.v1.devmapper',
  'io.containerd.snapshotter.v1.erofs',
  'io.containerd.differ.v1.erofs',
  'io.containerd.mount-handler.v1.erofs',
  'io.containerd.tracing.processor.v1.otlp',
]

[grpc]
  address = '{self.address}'

{self._nri_section("'")}
[{runtime}]
  restrict_oom_score_adj = true
  disable_apparmor = true
  cdi_spec_dirs = ['{self.workdir / "cdi"}']

[{runtime}.cni]
  bin_dirs = ['{self.cni_bin}']
  conf_dir = '{self.cni_conf}'

[{runtime}.containerd]
  default_runtime_name = 'runc'

[{runtime}.containerd.runtimes.runc]
  runtime_type = 'io.containerd.runc.v2'

[{runtime}.containerd.runtimes.runc.options]
  # runc keeps its state in <Root>/<namespace>; keep it out of /run/containerd.
  Root = '{self.runc_root}'
  SystemdCgroup = {str(self.systemd_cgroup).lower()}

# The default, registry.k8s.io/pause, would be pulled; there is no registry.
[{images}.pinned_images]
  sandbox = '{IMAGE}'
"""

    def _nri_section(self, q: str) -> str:
        """NRI's table: the same keys in both formats (NRI is off by default)."""
        return f"""\
[plugins.{q}io.containerd.nri.v1.nri{q}]
  disable = false
  socket_path = {q}{self.nri_socket}{q}
  plugin_path = {q}{self.plugin_path}{q}
  plugin_config_path = {q}{self.plugin_config_path}{q}
  plugin_registration_timeout = {q}5s{q}
  plugin_request_timeout = {q}2s{q}
"""

    def write_config(self) -> None:
        self.config_path.write_text(self.config_text())

    # --------------------------------------------------------------- process

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.running and self.proc else None

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        path = env.get("PATH", "")
        extra = [p for p in ("/usr/sbin", "/usr/bin", "/sbin", "/bin") if p not in path.split(":")]
        env["PATH"] = ":".join([str(self.bin_dir), path, *extra]).replace("::", ":")
        return env

    def start(self) -> None:
        """Start containerd (again, after stop(): same root and state) and wait for CRI."""
        if self.running:
            return
        with contextlib.suppress(FileNotFoundError):
            self.address.unlink()
        namespace = self._enter_namespace()
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            log.write(f"\n=== harness: starting containerd at {time.time():.3f}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [
                    *self._systemd_scope(),
                    # nsenter execs containerd: proc.pid is containerd's own.
                    "nsenter",
                    f"--mount=/proc/{namespace}/ns/mnt",
                    "--",
                    str(self.bin_dir / "containerd"),
                    "--config",
                    str(self.config_path),
                    "--log-level",
                    self.log_level,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env(),
                cwd=self.workdir,
            )
        finally:
            log.close()
        self._wait_ready()
        self._started_once = True
        if not self._image_imported:
            self.import_image()

    def _systemd_scope(self) -> list[str]:
        """With the systemd driver, containerd runs in a delegated unit of its own, as a
        node's containerd.service does; `systemd-run --scope` then execs it, so it
        stays our child."""
        if not self.systemd_cgroup:
            return []
        unit = f"e2e-containerd-{uuid.uuid4().hex[:12]}.scope"
        return ["systemd-run", "--scope", "--quiet", f"--unit={unit}",
                "--property=Delegate=yes", "--property=KillMode=process", "--"]  # fmt: skip

    def _enter_namespace(self) -> int:
        """Pid of the process holding our mount namespace (started on first use).

        The namespace has a private tmpfs on /run/containerd; the host's
        /run/containerd is only the (empty) mount point.
        """
        if self._namespace is not None and self._namespace.poll() is None:
            return self._namespace.pid
        RUN_CONTAINERD.mkdir(parents=True, exist_ok=True)
        holder = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                f"mount -t tmpfs -o mode=0711 tmpfs {RUN_CONTAINERD} && echo ready"
                " && exec sleep infinity",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert holder.stdout is not None
        ready = holder.stdout.readline()
        holder.stdout.close()
        if ready != b"ready\n":
            holder.kill()
            _, err = holder.communicate(timeout=5)
            raise ContainerdError(f"no mount namespace for containerd: {err.decode().strip()}")
        self._namespace = holder
        return holder.pid

    def _leave_namespace(self) -> None:
        """End the namespace; its mounts go with its last process."""
        holder, self._namespace = self._namespace, None
        if holder is not None:
            holder.kill()
            holder.wait(5)
            if holder.stderr is not None:
                holder.stderr.close()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while not self.address.exists():
            self._check_alive("before creating its socket")
            if time.monotonic() > deadline:
                raise ContainerdError(self._with_log("no CRI socket after start"))
            time.sleep(0.02)
        self._connect()
        last: Exception | None = None
        while time.monotonic() < deadline:
            self._check_alive("during start-up")
            try:
                self.cri.Version(cri.VersionRequest(version="v1"), timeout=2)
                return
            except grpc.RpcError as e:  # CRI still initialising
                last = e
                time.sleep(0.05)
        raise ContainerdError(self._with_log(f"CRI not ready: {last}"))

    def _check_alive(self, when: str) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise ContainerdError(
                self._with_log(f"containerd exited with {self.proc.returncode} {when}")
            )

    def _connect(self) -> None:
        self._close_channel()
        self._channel = grpc.insecure_channel(f"unix://{self.address}")
        self._cri = cri_grpc.RuntimeServiceStub(self._channel)

    def _close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._cri = None

    @property
    def cri(self) -> cri_grpc.RuntimeServiceStub:
        """The raw CRI RuntimeService stub."""
        if self._cri is None:
            raise ContainerdError("containerd is not running")
        return self._cri

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM containerd by pid, wait, SIGKILL if it lingers. Shims keep running."""
        self._close_channel()
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def ctr(self, *args: str, timeout: float = 30.0) -> str:
        """Run `ctr` against this containerd in the CRI namespace; return stdout."""
        cmd = [str(self.bin_dir / "ctr"), "-a", str(self.address), "-n", CRI_NAMESPACE, *args]
        res = subprocess.run(cmd, capture_output=True, text=True, env=self._env(), timeout=timeout)
        if res.returncode != 0:
            raise ContainerdError(
                self._with_log(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}")
            )
        return res.stdout

    def import_image(self) -> None:
        if not self.image_tar.exists():
            build_busybox_image(self.image_tar)
        self.ctr("images", "import", str(self.image_tar))
        self._image_imported = True

    # ------------------------------------------------------------------- log

    def log_text(self) -> str:
        """Everything containerd has logged so far (across restarts)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for_log(self, needle: str, timeout: float = 10.0, *, after: int = 0) -> str:
        """Wait until `needle` appears in the log (from char offset `after`); return the line."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.log_text()
            idx = text.find(needle, after)
            if idx >= 0:
                start = text.rfind("\n", 0, idx) + 1
                end = text.find("\n", idx)
                return text[start : end if end >= 0 else None]
            if time.monotonic() > deadline:
                raise ContainerdError(self._with_log(f"{needle!r} not logged in {timeout}s"))
            time.sleep(0.05)

    def _with_log(self, msg: str, lines: int = 40) -> str:
        tail = "\n".join(self.log_text().splitlines()[-lines:])
        return f"{msg}\n--- {self.log_path} (tail) ---\n{tail}"

    # ------------------------------------------------------------------- CRI

    def pod_config(
        self,
        name: str,
        namespace: str = "default",
        uid: str | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        cgroup_parent: str | None = None,
    ) -> Any:
        """A host-network PodSandboxConfig; cgroup parent defaults to the besteffort tier."""
        uid = uid or str(uuid.uuid4())
        if cgroup_parent is None:
            cgroup_parent = NODE.new_cgroup_parent("besteffort", uid)
        return cri.PodSandboxConfig(
            metadata=cri.PodSandboxMetadata(name=name, namespace=namespace, uid=uid, attempt=0),
            # Host network implies the host's UTS namespace: no hostname of our own.
            hostname="",
            log_directory=str(self.pod_logs / f"{namespace}_{name}_{uid}"),
            labels=dict(labels or {}),
            annotations=dict(annotations or {}),
            linux=cri.LinuxPodSandboxConfig(
                cgroup_parent=cgroup_parent,
                security_context=cri.LinuxSandboxSecurityContext(
                    namespace_options=cri.NamespaceOption(network=cri.NODE),
                ),
            ),
        )

    def run_pod(
        self,
        name: str,
        namespace: str = "default",
        uid: str | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        cgroup_parent: str | None = None,
        *,
        timeout: float = 30.0,
    ) -> str:
        """RunPodSandbox with host networking; returns the pod sandbox id."""
        config = self.pod_config(name, namespace, uid, labels, annotations, cgroup_parent)
        return self.run_pod_config(config, timeout=timeout)

    def run_pod_config(self, config: Any, *, timeout: float = 30.0) -> str:
        self.cgroup_parents.add(config.linux.cgroup_parent)
        NODE.prepare_parent(config.linux.cgroup_parent)
        Path(config.log_directory).mkdir(parents=True, exist_ok=True)
        resp = self.cri.RunPodSandbox(cri.RunPodSandboxRequest(config=config), timeout=timeout)
        self.pod_configs[resp.pod_sandbox_id] = config
        pod_id: str = resp.pod_sandbox_id
        return pod_id

    def create_container(
        self,
        pod_id: str,
        pod_config: Any | None = None,
        name: str = "main",
        resources: Mapping[str, Any] | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        *,
        command: tuple[str, ...] | list[str] = SLEEP_FOREVER,
        attempt: int = 0,
        timeout: float = 30.0,
    ) -> str:
        """CreateContainer from the busybox image; `resources` are LinuxContainerResources
        fields (cpu_period, cpu_quota, cpu_shares, memory_limit_in_bytes, ...). `attempt`:
        kubelet's restart count, which names the container (one name, one container)."""
        if pod_config is None:
            pod_config = self.pod_configs[pod_id]
        config = cri.ContainerConfig(
            metadata=cri.ContainerMetadata(name=name, attempt=attempt),
            image=cri.ImageSpec(image=IMAGE),
            command=list(command),
            labels=dict(labels or {}),
            annotations=dict(annotations or {}),
            log_path=f"{name}/0.log",
            linux=cri.LinuxContainerConfig(
                resources=cri.LinuxContainerResources(**dict(resources or {}))
            ),
        )
        resp = self.cri.CreateContainer(
            cri.CreateContainerRequest(
                pod_sandbox_id=pod_id, config=config, sandbox_config=pod_config
            ),
            timeout=timeout,
        )
        container_id: str = resp.container_id
        return container_id

    def start_container(self, container_id: str, *, timeout: float = 30.0) -> None:
        self.cri.StartContainer(
            cri.StartContainerRequest(container_id=container_id), timeout=timeout
        )

    def update_container_resources(
        self,
        container_id: str,
        resources: Mapping[str, Any],
        annotations: Mapping[str, str] | None = None,
        *,
        timeout: float = 30.0,
    ) -> None:
        self.cri.UpdateContainerResources(
            cri.UpdateContainerResourcesRequest(
                container_id=container_id,
                linux=cri.LinuxContainerResources(**dict(resources)),
                annotations=dict(annotations or {}),
            ),
            timeout=timeout,
        )

    def container_status(self, container_id: str) -> Any:
        req = cri.ContainerStatusRequest(container_id=container_id)
        return self.cri.ContainerStatus(req, timeout=10).status

    def stop_container(self, container_id: str, grace: int = 0) -> None:
        req = cri.StopContainerRequest(container_id=container_id, timeout=grace)
        self.cri.StopContainer(req, timeout=grace + 30)

    def remove_container(self, container_id: str) -> None:
        self.cri.RemoveContainer(cri.RemoveContainerRequest(container_id=container_id), timeout=30)

    def stop_pod(self, pod_id: str) -> None:
        self.cri.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=30)

    def remove_pod(self, pod_id: str) -> None:
        self.cri.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=30)
        self.pod_configs.pop(pod_id, None)

    def list_containers(self, pod_id: str = "") -> list[Any]:
        req = cri.ListContainersRequest(filter=cri.ContainerFilter(pod_sandbox_id=pod_id))
        return list(self.cri.ListContainers(req, timeout=10).containers)

    def list_pods(self) -> list[Any]:
        return list(self.cri.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=10).items)

    def stop_and_remove_all(self) -> None:
        """Stop and remove every container and pod this containerd knows about."""
        for c in self.list_containers():
            with contextlib.suppress(grpc.RpcError):
                self.stop_container(c.id)
            self.remove_container(c.id)
        for p in self.list_pods():
            self.stop_pod(p.id)
            self.remove_pod(p.id)

    # --------------------------------------------------------------- cleanup

    def close(self) -> list[str]:
        """Tear everything down; returns problems found (empty when clean).

        Never leaves containerd or its shims running, even if a step fails.
        """
        problems: list[str] = []
        try:
            if not self.running and self._started_once:
                # A test may have stopped containerd; bring it back to clean up via CRI.
                try:
                    self.start()
                except Exception as e:
                    problems.append(f"restart for cleanup failed: {e}")
            if self.running:
                try:
                    self.stop_and_remove_all()
                except Exception as e:
                    problems.append(f"stop_and_remove_all failed: {e}")
        finally:
            self.stop()
            # Shims are daemons of their own; anything still naming our socket goes.
            for pid in _pids_referring_to(str(self.address)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    problems.append(f"killed leftover process {pid}")
            self._leave_namespace()
            for parent in sorted(self.cgroup_parents):
                left = remove_cgroup_tree(parent)
                if left:
                    problems.append(f"cgroup dirs still busy: {left}")
        return problems

    def __enter__(self) -> Containerd:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def running_containerd(workdir: Path, bin_dir: Path, **kwargs: Any) -> Iterator[Containerd]:
    """Context manager: a started harness, always torn down."""
    harness = Containerd(workdir, bin_dir, **kwargs)
    try:
        harness.start()
        yield harness
    finally:
        harness.close()
