#!/usr/bin/env python3
"""Record the demo NRI event stream from a real containerd 1.7.24.

Starts a private containerd (the e2e harness, binaries from scripts/fetch-containerd.sh), runs
`nri-midbatch run --record`, and drives CRI through one pod of every kind: a batch BE pod
already running when the plugin registers (so Synchronize has work), batch BE, mid BE, mid LS in
a burstable cgroup parent with native limits, prod LS, a pod with a malformed annotation, and an
UpdateContainerResources call. Then it stops the plugin (which flushes the recording) and writes

    examples/recordings/demo.jsonl                   the recording
    tests/replay/containerd-1.7.24.jsonl             the same recording, for the golden test
    tests/replay/containerd-1.7.24.expected.jsonl    its replies, replayed, as the golden file

Needs root and cgroup v1, as the e2e tests do. Run: .venv/bin/python scripts/record-demo.py
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nri_midbatch.config.model import Config  # noqa: E402
from nri_midbatch.obs.logging import configure_logging  # noqa: E402
from nri_midbatch.tools.replay.command import replay_command  # noqa: E402
from tests.e2e.containerd import Containerd  # noqa: E402
from tests.e2e.node import Node  # noqa: E402
from tests.e2e.plugin_process import event, wait_for_record  # noqa: E402
from tests.unit.replay_fixtures import read_whole  # noqa: E402

EXECUTABLE = Path(sys.executable).with_name("nri-midbatch")
SPEC = "node.koordinator.sh/extended-resource-spec"
QOS = "koordinator.sh/qosClass"
PRIORITY = "koordinator.sh/priority-class"
MI = 1 << 20
GI = 1 << 30


def spec(tier: str, requests: tuple[str, str], limits: tuple[str, str]) -> str:
    """The annotation for one container named main."""
    cpu, memory = f"kubernetes.io/{tier}-cpu", f"kubernetes.io/{tier}-memory"
    main = {
        "requests": {cpu: requests[0], memory: requests[1]},
        "limits": {cpu: limits[0], memory: limits[1]},
    }
    return json.dumps({"containers": {"main": main}}, separators=(",", ":"))


def run_pod(
    ctrd: Containerd,
    name: str,
    labels: dict[str, str],
    annotation: str | None,
    qos: str = "besteffort",
    resources: dict[str, int] | None = None,
) -> str:
    """A pod with one started container, main; returns the container id."""
    uid = str(uuid.uuid4())
    pod_id = ctrd.run_pod(
        name,
        uid=uid,
        labels=labels,
        annotations={} if annotation is None else {SPEC: annotation},
        cgroup_parent=Node.detect().new_cgroup_parent(qos, uid),
    )
    container_id = ctrd.create_container(pod_id, resources=resources)
    ctrd.start_container(container_id)
    return container_id


def fetch_containerd() -> Path:
    fetched = subprocess.run(
        ["bash", str(ROOT / "scripts" / "fetch-containerd.sh")],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(fetched.stdout.strip().splitlines()[-1])


def record(workdir: Path, bin_dir: Path) -> Path:
    recording = workdir / "demo.jsonl"
    plugin_log = workdir / "plugin.log"
    with Containerd(workdir / "ctrd", bin_dir) as ctrd:
        # Running before the plugin registers: it arrives in Synchronize.
        run_pod(
            ctrd,
            "batch-before-plugin",
            {QOS: "BE", PRIORITY: "koord-batch"},
            spec("batch", ("250", "128Mi"), ("500", "256Mi")),
        )
        plugin = subprocess.Popen(
            [
                str(EXECUTABLE),
                "run",
                "--socket-path",
                str(ctrd.nri_socket),
                "--record",
                str(recording),
                "--log-file",
                str(plugin_log),
                "--metrics-address",
                "",
            ],
            cwd=ROOT,
        )
        try:
            wait_for_record(plugin_log, event("synchronized"), timeout=15)
            batch = run_pod(
                ctrd,
                "batch-be",
                {QOS: "BE", PRIORITY: "koord-batch"},
                spec("batch", ("500", "256Mi"), ("1k", "512Mi")),
            )
            run_pod(
                ctrd,
                "mid-be",
                {QOS: "BE", PRIORITY: "koord-mid"},
                spec("mid", ("250", "128Mi"), ("500", "256Mi")),
            )
            # Kubelet's native limits for a burstable pod: 2 CPUs, 1Gi; mid's 2Gi is looser.
            run_pod(
                ctrd,
                "mid-ls",
                {QOS: "LS", PRIORITY: "koord-mid"},
                spec("mid", ("500", "512Mi"), ("1k", "2Gi")),
                qos="burstable",
                resources={
                    "cpu_period": 100_000,
                    "cpu_quota": 200_000,
                    "cpu_shares": 512,
                    "memory_limit_in_bytes": GI,
                },
            )
            run_pod(
                ctrd,
                "prod-ls",
                {QOS: "LS", PRIORITY: "koord-prod"},
                None,
                qos="burstable",
                resources={
                    "cpu_period": 100_000,
                    "cpu_quota": 200_000,
                    "cpu_shares": 1024,
                    "memory_limit_in_bytes": 2 * GI,
                },
            )
            run_pod(
                ctrd,
                "bad-annotation",
                {QOS: "BE", PRIORITY: "koord-batch"},
                '{"containers":{"main":{"requests":{"kubernetes.io/batch-cpu":"lots"}}}}',
            )
            # The new native limits are tighter than batch's 1 CPU and 512Mi: never loosened.
            ctrd.update_container_resources(
                batch,
                {"cpu_period": 100_000, "cpu_quota": 50_000, "memory_limit_in_bytes": 256 * MI},
            )
            wait_for_record(plugin_log, lambda r: r.get("method") == "UpdateContainer", timeout=10)
        finally:
            plugin.send_signal(signal.SIGTERM)
            status = plugin.wait(timeout=15)
    if status != 0:
        raise SystemExit(f"the plugin exited with {status}; see {plugin_log}")
    return recording


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    configure_logging("error", "console")
    workdir = Path(tempfile.mkdtemp(prefix="nri-midbatch-demo-"))
    try:
        recording = record(workdir, fetch_containerd())
        entries, problems = read_whole(recording)
        if problems:
            raise SystemExit("\n".join(str(p) for p in problems))
        targets = (
            ROOT / "examples" / "recordings" / "demo.jsonl",
            ROOT / "tests" / "replay" / "containerd-1.7.24.jsonl",
        )
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(recording, target)
        # The golden replies come from the default configuration, as the test replays it.
        status = replay_command(
            recording,
            Config(),
            runtime_config=True,
            via_socket=False,
            fmt="json",
            expect=None,
            write_expected_to=ROOT / "tests" / "replay" / "containerd-1.7.24.expected.jsonl",
            out=io.StringIO(),
            err=sys.stderr,
        )
        if status != 0:
            raise SystemExit(f"the golden replies were not written (replay exited with {status})")
        written = ", ".join(str(target.relative_to(ROOT)) for target in targets)
        print(f"{len(entries)} calls recorded: {written}")
    finally:
        if args.keep:
            print(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
