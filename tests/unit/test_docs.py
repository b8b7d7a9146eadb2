"""The documentation cannot drift from the code.

- docs/configuration.md is generated from the configuration models; it must be fresh.
- docs/metrics.md lists exactly the metric families a running App exposes, with their types
  and labels.
- The command-line flags are all documented, and relative links between the docs resolve.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.config.compile import settings_of
from nri_midbatch.config.model import load_config_text
from nri_midbatch.nri.testing import LoopbackRuntime
from nri_midbatch.obs.metrics import WebhookMetrics
from nri_midbatch.process.app import App
from nri_midbatch.recording.writer import Recorder, Written
from nri_midbatch.tools.cli import command_line
from tests.factory import BATCH_CPU, BATCH_MEMORY, batch_pod, container

from .nri_fixtures import STEP_TIMEOUT, run

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
METRICS_DOC = DOCS / "metrics.md"
REPLAY_DOC = DOCS / "replay.md"
#: The pages this test keeps honest (docs/install.md has its own link test).
OWN_PAGES = [
    README,
    DOCS / "configuration.md",
    METRICS_DOC,
    DOCS / "koordinator.md",
    DOCS / "troubleshooting.md",
    REPLAY_DOC,
]

BATCH_SPEC = json.dumps(
    {
        "containers": {
            "app": {
                "requests": {BATCH_CPU: "500"},
                "limits": {BATCH_CPU: "1k", BATCH_MEMORY: "1Gi"},
            }
        }
    }
)


# ---------------------------------------------------------------------------
# docs/configuration.md
# ---------------------------------------------------------------------------


def test_configuration_reference_is_generated_from_the_models() -> None:
    res = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen-config-docs.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr


# ---------------------------------------------------------------------------
# docs/metrics.md
# ---------------------------------------------------------------------------


class _NullSink:
    def write(self, lines: Sequence[bytes]) -> Written:
        return Written(len(lines), 0)

    def close(self) -> None:
        pass


def exposed_families(tmp_path: Path) -> dict[str, tuple[str, frozenset[str]]]:
    """name as exposed -> (type, label names), after a session that fills every family."""
    config = load_config_text(json.dumps({"cgroups": {"root": str(tmp_path)}}), "test")

    async def session() -> App:
        # With a recorder, so the recording family is there too; nothing is ever written.
        app = App(
            settings_of(config),
            name="midbatch",
            idx="10",
            config_path=None,
            recorder=Recorder(_NullSink()),
            metrics_address=None,
        )
        plugin_end, runtime_end = socket.socketpair()
        runtime = await LoopbackRuntime.over(runtime_end)
        task = asyncio.create_task(app.session.run(plugin_end))
        try:
            good = batch_pod("good", name="good", annotation=BATCH_SPEC)
            bad = batch_pod("bad", name="bad", annotation="{not json")
            await runtime.start(pods=[good], containers=[container("c0", good, "app")])
            for pod in (good, bad):
                await runtime.call(
                    "RunPodSandbox", api.RunPodSandboxRequest(pod=pod), api.RunPodSandboxResponse
                )
                await runtime.call(
                    "CreateContainer",
                    api.CreateContainerRequest(
                        pod=pod, container=container(f"c-{pod.id}", pod, "app")
                    ),
                    api.CreateContainerResponse,
                )
        finally:
            await runtime.close()
            app.session.close()
            await asyncio.gather(task, return_exceptions=True)
        return app

    app = run(session(), timeout=4 * STEP_TIMEOUT)
    families = page_families(generate_latest(app.metrics.registry))
    for name, (_, labels) in families.items():
        # Label names are read from the samples: a family without any would hide stale labels.
        assert labels is not None, f"{name}: extend the session so that this family has samples"
    return {name: (kind, labels or frozenset()) for name, (kind, labels) in families.items()}


def page_families(page: bytes) -> dict[str, tuple[str, frozenset[str] | None]]:
    """name (as exposed) -> (type, label names of its samples, or None without samples)."""
    families: dict[str, tuple[str, frozenset[str] | None]] = {}
    for family in text_string_to_metric_families(page.decode()):
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = frozenset(
            label for sample in family.samples for label in sample.labels if label != "le"
        )
        families[name] = (family.type, labels if family.samples else None)
    return families


WEBHOOK_METRICS_HEADING = "## The admission webhook's metrics"


#: The families of prometheus_client's own collectors, documented once for both processes.
LIBRARY_PREFIXES = ("`process_", "`python_")


def documented_families(webhook: bool = False) -> dict[str, tuple[str, frozenset[str]]]:
    """The rows of the plugin's (or the webhook's) metrics table in docs/metrics.md, and those
    of the library's families."""
    text = METRICS_DOC.read_text()
    plugin, _, rest = text.partition(WEBHOOK_METRICS_HEADING)
    section = rest.split("\n## ", 1)[0] if webhook else plugin
    row_starts = tuple("| " + prefix for prefix in LIBRARY_PREFIXES)
    library = [line for line in text.splitlines() if line.startswith(row_starts)]
    rows: dict[str, tuple[str, frozenset[str]]] = {}
    for line in [*section.splitlines(), *(library if webhook else [])]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0].startswith(("`nri_midbatch_", *LIBRARY_PREFIXES)):
            continue
        name = cells[0].strip("`")
        assert name not in rows, f"{name} is documented twice"
        labels = frozenset(re.findall(r"`([a-z_]+)`", cells[2]))
        rows[name] = (cells[1], labels)
    return rows


def test_metrics_doc_lists_exactly_the_exposed_families(tmp_path: Path) -> None:
    exposed = exposed_families(tmp_path)
    documented = documented_families()
    assert set(exposed) - set(documented) == set(), "exposed but not in docs/metrics.md"
    assert set(documented) - set(exposed) == set(), "in docs/metrics.md but not exposed"
    for name, type_and_labels in exposed.items():
        assert documented[name] == type_and_labels, name


def test_metrics_doc_lists_exactly_the_webhooks_families() -> None:
    exposed = {
        name: (kind, labels or frozenset())
        for name, (kind, labels) in page_families(
            generate_latest(WebhookMetrics().registry)
        ).items()
    }
    assert documented_families(webhook=True) == exposed


# ---------------------------------------------------------------------------
# Flags and links
# ---------------------------------------------------------------------------


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = command_line()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return [
        option
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    ]


def test_every_command_and_run_flag_is_in_the_readme() -> None:
    text = README.read_text()
    commands = _subcommands()
    for command in commands:
        assert f"nri-midbatch {command}" in text, command
    for option in _options(commands["run"]):
        assert f"`{option}" in text, f"run {option}"


def test_every_replay_and_explain_flag_is_in_the_replay_doc() -> None:
    text = REPLAY_DOC.read_text()
    commands = _subcommands()
    for command in ("replay", "explain"):
        for option in _options(commands[command]):
            assert f"`{option}" in text, f"{command} {option}"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors (lower case, punctuation dropped, spaces to hyphens),
    and the ids of `<a id="...">` tags, which keep a moved section's old links working."""
    anchors: set[str] = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        anchors.update(re.findall(r'<a id="([^"]+)"></a>', line))
        if not line.startswith("#"):
            continue
        heading = line.lstrip("#").strip().lower()
        slug = "".join(ch for ch in heading if ch.isalnum() or ch in " -_").replace(" ", "-")
        base, n = slug, 1
        while slug in anchors:
            slug = f"{base}-{n}"
            n += 1
        anchors.add(slug)
    return anchors


def test_links_between_the_docs_resolve() -> None:
    for page in OWN_PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if "://" in target or target.startswith("mailto:"):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            assert resolved.exists(), f"{page.name}: {target}"
            if anchor and resolved.suffix == ".md":
                assert anchor in _anchors(resolved), f"{page.name}: {target}"
