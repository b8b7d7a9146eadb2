"""Packaging: the image, the Kubernetes manifests, the runtime snippets, the install scripts.

No container engine is needed: the Dockerfile is checked with hadolint and by reading it,
the manifests with kubernetes-validate's strict schemas (unknown fields fail) and by the
properties the plugin relies on, and the runtime snippets by parsing them as TOML.
hadolint and kubernetes-validate are dev dependencies: when missing, the tests fail.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from nri_midbatch import __version__
from nri_midbatch.config.model import Config, load_config_file, load_config_text
from nri_midbatch.tools.cli import DEFAULT_NAME, DEFAULT_SOCKET

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
K8S = ROOT / "examples" / "kubernetes"
CONTAINERD_17 = ROOT / "examples" / "containerd" / "config-1.7.toml"
CONTAINERD_2X = ROOT / "examples" / "containerd" / "config-2.x.toml"
CRIO = ROOT / "examples" / "crio" / "10-enable-nri.conf"
PRELAUNCHED = ROOT / "examples" / "prelaunched"
DEFAULT_CONFIG = ROOT / "examples" / "config" / "default.yaml"
INSTALL_DOC = ROOT / "docs" / "install.md"

#: Validate against this Kubernetes release's schemas (the newest kubernetes-validate has).
KUBERNETES_VERSION = "1.37.0"
NRI_TABLE = "io.containerd.nri.v1.nri"
SOCKET_DIR = str(PurePosixPath(DEFAULT_SOCKET).parent)
TOLERATE_ANNOTATION = "tolerate-missing-nri-plugins.noderesource.dev"


def _tool(name: str) -> str:
    """A console script from this interpreter's environment, else from PATH; never a skip."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed; it is a dev dependency: pip install -e '.[dev]'")
    return found


# ------------------------------------------------------------------------------ image


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, args = line.partition(" ")
        result.append((keyword.upper(), args.strip()))
    return result


def test_dockerfile_passes_hadolint() -> None:
    hadolint = _tool("hadolint")
    res = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE.name)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_dockerfile_is_two_stages_on_one_pinned_slim_python() -> None:
    steps = _instructions(DOCKERFILE.read_text())
    base = next(args for kw, args in steps if kw == "ARG" and args.startswith("PYTHON_IMAGE="))
    # A full version tag on a slim Debian image, Python 3.11 or newer.
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.(1[1-9])\.\d+-slim-[a-z]+", base), (
        f"base image not pinned to a slim python tag: {base}"
    )
    froms = [args for kw, args in steps if kw == "FROM"]
    assert froms == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"]


def test_final_stage_installs_wheels_only_and_runs_the_plugin() -> None:
    steps = _instructions(DOCKERFILE.read_text())
    final_at = max(i for i, (kw, _) in enumerate(steps) if kw == "FROM")
    build, final = steps[:final_at], steps[final_at:]
    build_runs = " ".join(args for kw, args in build if kw == "RUN")
    assert "pip wheel --no-cache-dir --no-deps --wheel-dir /wheels ." in build_runs
    # No source tree in the final image: nothing is copied into it at all.
    assert not [args for kw, args in final if kw in {"COPY", "ADD"}]
    runs = [args for kw, args in final if kw == "RUN"]
    assert len(runs) == 1
    assert "--mount=type=bind,from=build,source=/wheels" in runs[0]
    assert "pip install --no-cache-dir --no-index" in runs[0]
    assert "-e " not in runs[0] and "--editable" not in runs[0]
    # Exec form, split so the DaemonSet's args replace only the default command.
    entrypoint = json.loads(next(args for kw, args in final if kw == "ENTRYPOINT"))
    cmd = json.loads(next(args for kw, args in final if kw == "CMD"))
    assert entrypoint == ["/usr/local/bin/nri-midbatch"]
    assert cmd == ["run"]
    labels = " ".join(args for kw, args in final if kw == "LABEL")
    for key in ("title", "description", "version", "revision", "licenses", "source"):
        assert f"org.opencontainers.image.{key}=" in labels
    version = next(args for kw, args in final if kw == "ARG" and args.startswith("VERSION="))
    assert version == f"VERSION={__version__}"


def _dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern[1:] if negated else pattern
        regex = _docker_pattern(body.strip("/"))
        if any(regex.fullmatch(c) for c in candidates):
            excluded = not negated
    return excluded


def _docker_pattern(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def test_dockerignore_sends_only_what_the_wheel_is_built_from() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    excluded = [
        ".venv/bin/python",
        ".cache/containerd-trixie/unpacked/usr/bin/containerd",
        ".cache/containerd-sid/unpacked/usr/bin/containerd",
        ".git/HEAD",
        ".hypothesis/examples/x",
        ".mypy_cache/3.11/x.json",
        "tests/unit/test_packaging.py",
        "tests/replay/containerd-1.7.24.jsonl",
        "examples/kubernetes/daemonset.yaml",
        "docs/install.md",
        "protos/nri.proto",
        "nri_midbatch/__pycache__/cli.cpython-311.pyc",
        "nri_midbatch/api/__pycache__/nri_pb2.cpython-311.pyc",
        "nri_midbatch.egg-info/PKG-INFO",
        "Dockerfile",
    ]
    included = [
        "pyproject.toml",
        "README.md",
        "nri_midbatch/__init__.py",
        "nri_midbatch/py.typed",
        "nri_midbatch/api/nri_pb2.py",
    ]
    for path in excluded:
        assert _dockerignore_excludes(patterns, path), f"{path} would be sent to the build"
    for path in included:
        assert not _dockerignore_excludes(patterns, path), f"{path} would be left out"
    # Everything the Dockerfile copies from the context exists and is sent.
    for kw, args in _instructions(DOCKERFILE.read_text()):
        if kw == "COPY" and "--from=" not in args:
            for source in args.split()[:-1]:
                assert (ROOT / source).exists(), source
                assert not _dockerignore_excludes(patterns, source.rstrip("/")), source


# ------------------------------------------------------------------------- kubernetes


def _manifest_files() -> list[Path]:
    webhook = K8S / "webhook"
    return sorted(
        p
        for p in [*K8S.rglob("*.yaml"), *K8S.rglob("*.yml")]
        if webhook not in p.parents and p.is_file()
    )


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _one(kind: str) -> dict[str, Any]:
    found = [d for p in _manifest_files() for d in _docs(p) if d.get("kind") == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def test_the_expected_manifests_are_there() -> None:
    names = {p.relative_to(K8S).as_posix() for p in _manifest_files()}
    assert {"namespace.yaml", "configmap.yaml", "daemonset.yaml"} <= names


@pytest.mark.parametrize("path", _manifest_files(), ids=lambda p: p.relative_to(K8S).as_posix())
def test_manifest_validates_strictly(path: Path) -> None:
    import kubernetes_validate

    documents = _docs(path)
    assert documents, f"{path} holds no manifest"
    for document in documents:
        # Raises ValidationError (bad or unknown field) or SchemaNotFoundError (unknown kind).
        validated = kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
        assert validated == "1.37", validated


def test_strict_validation_rejects_an_unknown_field() -> None:
    import kubernetes_validate

    daemonset = _one("DaemonSet")
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    container["securityContext"]["readOnlyRootFileSystem"] = True  # misspelt
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSION, strict=True)


def test_all_objects_live_in_the_namespace() -> None:
    namespace = _one("Namespace")["metadata"]["name"]
    assert _one("ConfigMap")["metadata"]["namespace"] == namespace
    assert _one("DaemonSet")["metadata"]["namespace"] == namespace
    labels = _one("Namespace")["metadata"]["labels"]
    # hostPath volumes are outside the baseline and restricted Pod Security levels.
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"


def test_configmap_holds_the_default_configuration() -> None:
    data = _one("ConfigMap")["data"]
    assert set(data) == {"config.yaml"}
    config = load_config_text(data["config.yaml"], source="configmap.yaml")
    assert config == Config()
    assert config == load_config_file(DEFAULT_CONFIG)


def _pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = _one("DaemonSet")["spec"]["template"]["spec"]
    return spec


def _container() -> dict[str, Any]:
    containers = _pod_spec()["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def _host_paths() -> dict[str, dict[str, Any]]:
    """Volume name -> hostPath for the DaemonSet's hostPath volumes."""
    return {v["name"]: v["hostPath"] for v in _pod_spec()["volumes"] if "hostPath" in v}


def _mount(volume: str) -> dict[str, Any]:
    mounts = [m for m in _container()["volumeMounts"] if m["name"] == volume]
    assert len(mounts) == 1, volume
    mount: dict[str, Any] = mounts[0]
    return mount


def test_daemonset_mounts_the_nri_socket_directory_not_the_socket() -> None:
    host_paths = _host_paths()
    socket_dirs = [name for name, hp in host_paths.items() if hp["path"] == SOCKET_DIR]
    assert len(socket_dirs) == 1, host_paths
    assert host_paths[socket_dirs[0]]["type"] == "DirectoryOrCreate"
    mount = _mount(socket_dirs[0])
    assert mount["mountPath"] == SOCKET_DIR
    assert "subPath" not in mount and "subPathExpr" not in mount
    for name, hp in host_paths.items():
        assert hp.get("type") != "Socket", name
        assert not hp["path"].endswith(".sock"), name
    for m in _container()["volumeMounts"]:
        assert not m["mountPath"].endswith(".sock"), m
    # The plugin's socket (the default; args must not point elsewhere) is inside the mount.
    assert "--socket-path" not in _container()["args"]


def test_daemonset_mounts_the_host_cgroupfs_read_write_at_the_configured_root() -> None:
    host_paths = _host_paths()
    cgroup = [name for name, hp in host_paths.items() if hp["path"] == "/sys/fs/cgroup"]
    assert len(cgroup) == 1, host_paths
    mount = _mount(cgroup[0])
    assert mount.get("readOnly", False) is False
    assert mount["mountPath"] == Config().cgroups.root
    # No other host path: these are the whole of the plugin's reach into the node.
    assert {hp["path"] for hp in host_paths.values()} == {
        SOCKET_DIR,
        "/sys/fs/cgroup",
        "/run/dbus",
        "/var/lib/nri-midbatch",
    }


def test_daemonset_mounts_the_system_bus_directory_read_only() -> None:
    # For `cgroups.driver: systemd`: the directory, so a restarted dbus-daemon's new
    # socket is seen; where dbus-fast looks for the system bus by default.
    dbus = [name for name, hp in _host_paths().items() if hp["path"] == "/run/dbus"]
    assert len(dbus) == 1
    mount = _mount(dbus[0])
    assert mount["mountPath"] == "/run/dbus"
    assert mount["readOnly"] is True


def test_daemonset_runs_the_plugin_with_its_config_and_metrics_in_the_pod_network() -> None:
    container = _container()
    assert container["image"] == "ghcr.io/example/nri-midbatch:0.1.0"
    assert "command" not in container  # the image's ENTRYPOINT stays
    args = container["args"]
    assert args == [
        "run",
        "--config",
        "/etc/nri-midbatch/config.yaml",
        "--metrics-address",
        "0.0.0.0:9464",
    ]
    config_mount = _mount("config")
    assert config_mount["mountPath"] == "/etc/nri-midbatch"
    assert config_mount["readOnly"] is True
    assert "subPath" not in config_mount  # a subPath mount never sees ConfigMap updates
    volume = next(v for v in _pod_spec()["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == _one("ConfigMap")["metadata"]["name"]
    assert not _pod_spec().get("hostNetwork", False)
    port = int(args[-1].rsplit(":", 1)[1])
    assert container["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    annotations = _one("DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == "/metrics"


def test_daemonset_args_are_flags_the_cli_knows() -> None:
    from nri_midbatch.tools.cli import command_line

    parser = command_line()
    run = next(
        action.choices["run"]
        for action in parser._actions
        if isinstance(action.choices, dict) and "run" in action.choices
    )
    if "--metrics-address" not in run._option_string_actions:
        pytest.skip("the CLI has no --metrics-address yet (metrics server not merged)")
    args = parser.parse_args(_container()["args"])
    assert args.command == "run"
    assert args.config == "/etc/nri-midbatch/config.yaml"
    assert args.socket_path == DEFAULT_SOCKET


def test_daemonset_has_liveness_and_readiness_probes() -> None:
    container = _container()
    liveness = container["livenessProbe"]["httpGet"]
    readiness = container["readinessProbe"]["httpGet"]
    assert liveness["path"] == "/healthz"
    assert readiness["path"] == "/readyz"
    for probe in (liveness, readiness):
        assert probe["port"] in ("metrics", 9464)


def test_daemonset_is_node_critical_everywhere_and_least_privileged() -> None:
    pod = _pod_spec()
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["automountServiceAccountToken"] is False
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert {"operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert {"operator": "Exists", "effect": "NoExecute"} in pod["tolerations"]
    for namespace in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(namespace, False), namespace
    security = _container()["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]}  # and nothing added
    assert security["allowPrivilegeEscalation"] is False
    assert security["privileged"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["runAsUser"] == 0
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert _container()["resources"] == {
        "requests": {"cpu": "10m", "memory": "64Mi"},
        "limits": {"cpu": "200m", "memory": "128Mi"},
    }


def test_daemonset_rolls_one_node_at_a_time_without_surge() -> None:
    strategy = _one("DaemonSet")["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    # A surge pod would register a second plugin of the same name next to the old one.
    assert strategy["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 0}


def _config_checksum() -> str:
    data = _one("ConfigMap")["data"]
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def test_checksum_annotation_matches_the_configmap_data() -> None:
    annotations = _one("DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["checksum/config"] == _config_checksum(), (
        "configmap.yaml changed: run examples/kubernetes/update-checksum.sh"
    )


def test_update_checksum_script_agrees(tmp_path: Path) -> None:
    script = K8S / "update-checksum.sh"
    env = {**os.environ, "PYTHON": sys.executable}
    check = subprocess.run(
        ["sh", str(script), "--check"], capture_output=True, text=True, env=env, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    # On a copy with a stale annotation: --check fails, a plain run repairs it.
    for name in ("configmap.yaml", "daemonset.yaml", "update-checksum.sh"):
        shutil.copy(K8S / name, tmp_path / name)
    stale = tmp_path / "daemonset.yaml"
    stale.write_text(stale.read_text().replace(_config_checksum(), "0" * 64))
    copy = str(tmp_path / "update-checksum.sh")
    run = [
        subprocess.run(["sh", copy, *flag], capture_output=True, text=True, env=env, timeout=60)
        for flag in (["--check"], [], ["--check"])
    ]
    assert [r.returncode for r in run] == [1, 0, 0], [r.stderr for r in run]
    assert stale.read_text() == (K8S / "daemonset.yaml").read_text()


# ---------------------------------------------------------------------- runtimes


def _toml(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        return tomllib.load(f)


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", duration)
    assert match, duration
    return float(match[1]) * {"ms": 0.001, "s": 1.0, "m": 60.0}[match[2]]


def _uncomment_block(path: Path, header: str) -> dict[str, Any]:
    """Parse the commented-out TOML block that starts with `# <header>`."""
    lines, inside = [], False
    for line in path.read_text().splitlines():
        if line == f"# {header}":
            inside = True
        elif inside and not line.startswith("#"):
            break
        if inside:
            lines.append(line[2:] if line.startswith("# ") else line[1:])
    assert lines, f"{path.name}: no commented block {header}"
    return tomllib.loads("\n".join(lines))


CONTAINERD_KEYS = {
    "disable",
    "disable_connections",
    "socket_path",
    "plugin_path",
    "plugin_config_path",
    "plugin_registration_timeout",
    "plugin_request_timeout",
}


@pytest.mark.parametrize(
    ("path", "version"),
    [(CONTAINERD_17, 2), (CONTAINERD_2X, 3)],
    ids=["containerd-1.7", "containerd-2.x"],
)
def test_containerd_snippet_enables_nri_for_external_plugins(path: Path, version: int) -> None:
    config = _toml(path)
    # Only the version and the plugin table: keys at the root are ignored by containerd.
    assert set(config) == {"version", "plugins"}
    assert config["version"] == version
    assert set(config["plugins"]) == {NRI_TABLE}
    nri = config["plugins"][NRI_TABLE]
    assert set(nri) == CONTAINERD_KEYS
    assert nri["disable"] is False  # off by default in containerd 1.7
    assert nri["disable_connections"] is False  # the DaemonSet connects through the socket
    assert nri["socket_path"] == DEFAULT_SOCKET
    assert nri["plugin_path"] == "/opt/nri/plugins"
    assert nri["plugin_config_path"] == "/etc/nri/conf.d"
    registration = _seconds(nri["plugin_registration_timeout"])
    request = _seconds(nri["plugin_request_timeout"])
    assert (registration, request) == (5.0, 2.0)
    assert registration > request


def test_containerd_2x_validator_block_makes_midbatch_required() -> None:
    block = _uncomment_block(CONTAINERD_2X, f'[plugins."{NRI_TABLE}".default_validator]')
    validator = block["plugins"][NRI_TABLE]["default_validator"]
    assert validator == {
        "enable": True,
        "required_plugins": [DEFAULT_NAME],
        "tolerate_missing_plugins_annotation": TOLERATE_ANNOTATION,
    }


def test_crio_dropin_enables_nri_for_external_plugins() -> None:
    config = _toml(CRIO)
    assert set(config) == {"crio"}
    assert set(config["crio"]) == {"nri"}
    nri = config["crio"]["nri"]
    assert nri == {
        "enable_nri": True,
        "nri_disable_connections": False,
        "nri_listen": DEFAULT_SOCKET,
        "nri_plugin_dir": "/opt/nri/plugins",
        "nri_plugin_config_dir": "/etc/nri/conf.d",
        "nri_plugin_registration_timeout": "5s",
        "nri_plugin_request_timeout": "2s",
    }
    block = _uncomment_block(CRIO, "[crio.nri.default_validator]")
    assert block["crio"]["nri"]["default_validator"] == {
        "nri_enable_default_validator": True,
        "nri_validator_required_plugins": [DEFAULT_NAME],
        "nri_validator_tolerate_missing_plugins_annotation": TOLERATE_ANNOTATION,
    }


def test_daemonset_tolerates_its_own_absence_when_required() -> None:
    annotations = _one("DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert annotations[TOLERATE_ANNOTATION] == "true"


# --------------------------------------------------------------------- pre-launched


@pytest.mark.parametrize(
    "script",
    [PRELAUNCHED / "install.sh", PRELAUNCHED / "launcher.sh", K8S / "update-checksum.sh"],
    ids=lambda p: p.name,
)
def test_shell_scripts_parse_and_are_executable(script: Path) -> None:
    assert os.access(script, os.X_OK), f"{script} is not executable"
    assert script.read_text().startswith("#!/bin/sh\n")
    res = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr


def test_install_script_refuses_a_name_the_runtime_would_choke_on(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "NAME": "midbatch",
        "PREFIX": str(tmp_path / "venv"),
        "PLUGIN_DIR": str(tmp_path / "plugins"),
        "CONF_DIR": str(tmp_path / "conf"),
    }
    res = subprocess.run(
        ["sh", str(PRELAUNCHED / "install.sh")], capture_output=True, text=True, env=env, timeout=30
    )
    assert res.returncode == 1
    assert "NN-name" in res.stderr
    assert not any(tmp_path.iterdir())  # nothing was installed


# ------------------------------------------------------------------------------ docs


def test_install_doc_links_resolve() -> None:
    text = INSTALL_DOC.read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t and not t.startswith("mailto:")]
    assert local, "docs/install.md links to none of the examples"
    for target in local:
        assert (INSTALL_DOC.parent / target).resolve().exists(), target
