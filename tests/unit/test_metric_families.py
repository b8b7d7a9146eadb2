"""Every family the plugin and the webhook expose, pinned in a golden file.

The golden file holds, per family, its name, type and HELP, and every series of a fresh
process (sample name and labels). A change to any of them (a renamed family, a lost label,
a `_created` series appearing, a series no longer there from the start) fails here and
shows as a diff of tests/unit/golden/metric_families.json. After an intended change,
rewrite the file with `python -m tests.unit.test_metric_families` and review the diff.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nri_midbatch.config.validator import load_startup_settings
from nri_midbatch.obs.metrics import WebhookMetrics
from nri_midbatch.process.app import App
from nri_midbatch.recording.writer import Recorder, Written

GOLDEN = Path(__file__).parent / "golden" / "metric_families.json"
#: Label values that depend on the machine, not on the code.
VARYING = {
    "nri_midbatch_build_info": ("version", "python"),
    "python_info": ("implementation", "major", "minor", "patchlevel", "version"),
}


class _NullSink:
    def write(self, lines: Sequence[bytes]) -> Written:
        return Written(len(lines), 0)

    def close(self) -> None:
        pass


def page_summary(page: bytes) -> list[dict[str, Any]]:
    """Each family's name, type, HELP and series, in the order of the page."""
    families = []
    for family in text_string_to_metric_families(page.decode()):
        varying = VARYING.get(family.name, ())
        series = sorted(
            {
                (
                    sample.name,
                    tuple(
                        sorted(
                            (key, "*" if key in varying else value)
                            for key, value in sample.labels.items()
                        )
                    ),
                )
                for sample in family.samples
            }
        )
        families.append(
            {
                "name": family.name,
                "type": family.type,
                "help": family.documentation,
                "series": [_series(name, labels) for name, labels in series],
            }
        )
    return families


def _series(name: str, labels: tuple[tuple[str, str], ...]) -> str:
    pairs = ",".join(f"{key}={value!r}" for key, value in labels)
    return f"{name}{{{pairs}}}" if pairs else name


def pages() -> dict[str, list[dict[str, Any]]]:
    """A fresh plugin (with a recorder, so the recording family is there) and webhook."""
    app = App(
        load_startup_settings(None),
        name="midbatch",
        idx="10",
        config_path=None,
        recorder=Recorder(_NullSink()),
    )
    # The one family without series before the first Synchronize.
    app.metrics.sync_objects.labels("pods").set(2)
    app.metrics.sync_objects.labels("containers").set(3)
    return {
        "plugin": page_summary(generate_latest(app.metrics.registry)),
        "webhook": page_summary(generate_latest(WebhookMetrics().registry)),
    }


def test_the_families_are_those_of_the_golden_file() -> None:
    golden = json.loads(GOLDEN.read_text())
    exposed = pages()
    for page in ("plugin", "webhook"):
        want = {family["name"]: family for family in golden[page]}
        got = {family["name"]: family for family in exposed[page]}
        assert sorted(got) == sorted(want), page
        for name, family in got.items():
            assert family == want[name], f"{page}: {name}"


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(pages(), indent=1) + "\n")
