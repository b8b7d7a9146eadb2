"""explain: the example pods, an NRI PodSandbox, a bad annotation, JSON output."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nri_midbatch.tools.cli import main

ROOT = Path(__file__).resolve().parents[2]
PODS = ROOT / "examples" / "pods"
RECORDING = ROOT / "tests" / "replay" / "containerd-1.7.24.jsonl"


def explain(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["explain", *args]) == 0
    return capsys.readouterr().out


def section(text: str, title: str) -> str:
    """The lines from `title` up to the next blank line."""
    start = text.index(title)
    end = text.find("\n\n", start)
    return text[start : None if end < 0 else end]


def test_batch_be(capsys: pytest.CaptureFixture[str]) -> None:
    out = explain(capsys, "--pod", str(PODS / "batch-be.yaml"))
    assert "qos BE from label koordinator.sh/qosClass" in out
    assert "priority koord-batch from label koordinator.sh/priority-class" in out
    tier = section(out, "Tier: batch")
    assert "tier batch: matched" in tier
    assert "tier mid: priority koord-batch not in [koord-mid]" in tier
    container = section(out, "Container main")
    assert "cpu.shares    512" in container
    assert "cpu quota     100000 (1 CPU) per 100000us period" in container
    assert "memory limit  536870912 (512Mi)" in container
    assert "cpu.shares 512 from request kubernetes.io/batch-cpu=500" in container
    assert "cpu quota 100000 from limit kubernetes.io/batch-cpu=1000" in container
    pod = section(out, "Pod level")
    assert "pod cpu.shares 512 from kubernetes.io/batch-cpu requests summing to 500" in pod


def test_mid_be(capsys: pytest.CaptureFixture[str]) -> None:
    out = explain(capsys, "--pod", str(PODS / "mid-be.yaml"))
    assert "priority koord-mid from label koordinator.sh/priority-class" in out
    tier = section(out, "Tier: mid")
    assert "tier batch: priority koord-mid not in [koord-batch, koord-free]" in tier
    assert "tier mid: matched" in tier
    container = section(out, "Container main")
    assert "cpu.shares    256" in container
    assert "cpu quota     50000 (0.5 CPU)" in container


def test_mid_ls_keeps_the_tighter_native_memory_limit(capsys: pytest.CaptureFixture[str]) -> None:
    out = explain(capsys, "--pod", str(PODS / "mid-ls.yaml"))
    assert "qos LS from label koordinator.sh/qosClass" in out
    assert "cgroup parent  /kubepods/burstable/pod" in out
    container = section(out, "Container main")
    assert "native limits cpu quota 200000, memory 1073741824 (1Gi)" in container
    assert "memory limit  1073741824 (1Gi)" in container
    assert (
        "memory limit 1073741824: native 1073741824 is tighter than computed 2147483648; "
        "never loosen" in container
    )


def test_prod_ls_matches_no_tier(capsys: pytest.CaptureFixture[str]) -> None:
    out = explain(capsys, "--pod", str(PODS / "prod-ls.yaml"))
    tier = section(out, "Tier: none")
    assert "tier batch: priority koord-prod not in [koord-batch, koord-free]" in tier
    assert "tier mid: priority koord-prod not in [koord-mid]" in tier
    assert "left untouched" in section(out, "Container main")


def test_configuration_shows_in_the_formulas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "ratio.yaml"
    config.write_text("rules:\n  cpuNormalizationRatio: 1.2\n")
    out = explain(capsys, "--pod", str(PODS / "mid-be.yaml"), "--config", str(config))
    container = section(out, "Container main")
    assert "cpu quota     41667" in container
    assert "cpu quota 41667 = ceil(50000 / cpuNormalizationRatio 1.2)" in container


def test_a_bad_annotation_is_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = (PODS / "batch-be.yaml").read_text()
    start = manifest.index('{"containers"')
    end = manifest.index("\n", start)
    pod = tmp_path / "bad.yaml"
    pod.write_text(manifest[:start] + '{"containers": {"main": 5}}' + manifest[end:])
    out = explain(capsys, "--pod", str(pod))
    container = section(out, "Container main")
    assert "error: extended-resource spec: container 'main'" in container
    assert "failurePolicy Ignore: left untouched" in container


def test_an_nri_pod_sandbox_from_a_recording(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = [json.loads(line) for line in RECORDING.read_text().splitlines()]
    sandbox = next(
        call["request"]["pod"]
        for call in calls
        if call["method"] == "StateChange" and call["request"]["pod"]["name"] == "mid-be"
    )
    pod = tmp_path / "sandbox.json"
    pod.write_text(json.dumps(sandbox))
    out = explain(capsys, "--pod", str(pod), "--format", "json")
    explained = json.loads(out)
    assert explained["pod"]["tier"] == "mid"
    assert explained["pod"]["cgroup_parent"].startswith("/kubepods/besteffort/pod")
    (container,) = explained["containers"]
    assert container["container"] == "main"
    assert container["values"] == {"cpu_shares": 256, "cpu_quota": 50000, "memory_limit": 1 << 28}
    text = explain(capsys, "--pod", str(pod))
    assert "Containers from the extended-resource spec (a PodSandbox lists none)." in text


def test_an_unreadable_pod_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod = tmp_path / "pod.yaml"
    pod.write_text("- just\n- a list\n")
    assert main(["explain", "--pod", str(pod)]) == 1
    assert "expected a Pod manifest or a PodSandbox object" in capsys.readouterr().err
    assert main(["explain", "--pod", str(tmp_path / "missing.yaml")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_a_manifest_s_pod_cgroup_is_below_kubelet_s_cgroup_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "kind.yaml"
    config.write_text("cgroups: {kubeletCgroupRoot: /kubelet}\n")
    text = explain(capsys, "--pod", str(PODS / "mid-ls.yaml"), "--config", str(config))
    assert "cgroup parent  /kubelet/kubepods/burstable/pod6f1c2a0e-" in text
    assert "Tier: mid" in text


def test_what_is_not_a_pod_is_refused_with_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A Deployment's pods look like a Pod inside its template, and used to be "no tier".
    deployment = tmp_path / "deployment.yaml"
    pod = (PODS / "batch-be.yaml").read_text()
    deployment.write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: batch}\n"
        "spec:\n  template:\n" + "".join(f"    {line}\n" for line in pod.splitlines())
    )
    assert main(["explain", "--pod", str(deployment)]) == 2
    err = capsys.readouterr().err
    assert "a Deployment, not a Pod" in err
    assert "kubectl get pod NAME -o yaml" in err
    # A configuration file parses as an empty PodSandbox when read leniently.
    config = ROOT / "examples" / "config" / "default.yaml"
    assert main(["explain", "--pod", str(config)]) == 2
    err = capsys.readouterr().err
    assert "neither a Pod manifest (kind: Pod) nor an NRI PodSandbox" in err
    assert "no tier" not in capsys.readouterr().out


def test_an_init_container_without_resources_makes_the_pod_burstable_as_in_the_webhook(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Explain and the webhook share one QoS function: both see the init container."""
    from nri_midbatch.config.compile import compile_policy
    from nri_midbatch.config.model import load_config_file
    from nri_midbatch.tools.webhook.admission import classify
    from nri_midbatch.tools.webhook.pods import cgroup_parent, read_pod

    config = tmp_path / "config.yaml"
    config.write_text("classification:\n  qosFromCgroupParent: true\n")
    both = {"cpu": "1", "memory": "1Gi", "kubernetes.io/mid-cpu": "1k"}
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "init-without-resources",
            "namespace": "default",
            "uid": "u1",
            "labels": {"koordinator.sh/priority-class": "koord-mid"},
        },
        "spec": {
            "initContainers": [{"name": "setup", "image": "busybox"}],
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"requests": both, "limits": both},
                }
            ],
        },
    }
    pod_file = tmp_path / "pod.json"
    pod_file.write_text(json.dumps(manifest))
    policy = compile_policy(load_config_file(config))
    facts = read_pod(manifest, "default")
    webhook_tier = classify(facts, policy).tier
    assert cgroup_parent(facts, "u1") == "/kubepods/burstable/podu1"
    assert webhook_tier is not None and webhook_tier.name == "mid"

    out = explain(capsys, "--pod", str(pod_file), "--config", str(config))
    assert "cgroup parent  /kubepods/burstable/podu1" in out
    assert "qos LS from cgroup parent /kubepods/burstable/podu1" in out
    assert "Tier: mid" in out


def test_normalization_and_observe_mode_are_explained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "normalize.yaml"
    config.write_text(
        "mode: observe\n"
        "rules: {cpuNormalizationRatio: 1.2}\n"
        "tiers:\n"
        "  - {name: prod, priorityClasses: [koord-prod, None], qosClasses: [LS, None],\n"
        "     calculator: cpu-normalization}\n"
    )
    out = explain(capsys, "--pod", str(PODS / "prod-ls.yaml"), "--config", str(config))
    assert "Mode: observe (these values would be set; nothing is written)" in out
    container = section(out, "Container main")
    # kubelet's quota for limits.cpu 2 is 200000; only the quota is set.
    assert "cpu quota 166667 = ceil(200000 / cpuNormalizationRatio 1.2)" in container
    assert "cpu.shares    left as kubelet set it" in container
    assert "memory limit  left as kubelet set it" in container


# A pod file is anyone's: each way it could hang or crash the explainer is a refusal.
HOSTILE_POD_FILES: dict[str, tuple[str, str]] = {
    "nested-100000-deep": ("spec: " + "[" * 100_000 + "]" * 100_000 + "\n", "levels deep"),
    "json-nested-100000-deep": ('{"spec": ' + "[" * 100_000 + "]" * 100_000 + "}", "levels deep"),
    "scalar-of-50-MB": ("metadata: " + "x" * 50_000_000 + "\n", "larger than 1048576 bytes"),
    "long-list": ("spec: [" + "1, " * 30_000 + "]\n", "stands for more than 20000 values"),
}


@pytest.mark.parametrize(
    ("text", "reason"), HOSTILE_POD_FILES.values(), ids=HOSTILE_POD_FILES.keys()
)
def test_a_hostile_pod_file_is_refused_with_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, reason: str
) -> None:
    pod = tmp_path / ("pod.json" if text.startswith("{") else "pod.yaml")
    pod.write_text(text)
    assert main(["explain", "--pod", str(pod)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"nri-midbatch: {pod}: ")
    assert reason in err


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "directory"])
def test_a_pod_file_that_is_not_a_regular_file_is_refused_unread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    pod = tmp_path / "pod.yaml"
    if kind == "fifo":
        os.mkfifo(pod)  # with no writer: a blocking open or read would never return
    elif kind == "directory":
        pod.mkdir()
    else:
        pod.symlink_to(kind)
    assert main(["explain", "--pod", str(pod)]) == 1
    err = capsys.readouterr().err
    assert f"nri-midbatch: {pod}: cannot read: " in err
    assert "not a regular file" in err
