"""Counts: each owner describes its own families (nri_midbatch/counts.py), and the App's
metrics read every owner through one list (`App.counted`, process/metrics.py `Gathered`).

The last tests hold the one mechanism in place: a family counted outside it (a collector of
its own, a series of obs/metrics.py fed by a callback, an owner left out of the list) fails.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from nri_midbatch.config.compile import settings_of
from nri_midbatch.config.model import load_config_text
from nri_midbatch.config.validator import load_startup_settings
from nri_midbatch.counts import Counted, CounterFamily, family
from nri_midbatch.process.app import App
from nri_midbatch.process.metrics import Gathered
from nri_midbatch.recording.writer import Recorder, Written

PACKAGE = Path(__file__).resolve().parents[2] / "nri_midbatch"

#: The series obs/metrics.py holds and the App's session observer feeds as things happen
#: (process/session_watch.py), the metrics server's own drops, and the build: every other
#: family of the plugin's page is a count some room keeps, gathered.
LIVE_SERIES = {
    "nri_midbatch_events",
    "nri_midbatch_event_duration_seconds",
    "nri_midbatch_registered",
    "nri_midbatch_synchronized",
    "nri_midbatch_reconnects",
    "nri_midbatch_synchronize_objects",
    "nri_midbatch_synchronize_duration_seconds",
    "nri_midbatch_http_connections_dropped",
    "nri_midbatch_build_info",
    "nri_midbatch_mode",
}


class _NullSink:
    def write(self, lines: Sequence[bytes]) -> Written:
        return Written(len(lines), 0)

    def close(self) -> None:
        pass


class _Owner:
    def __init__(self) -> None:
        self.invalid: dict[tuple[str], int] = {("spec",): 1}

    def counter_families(self) -> Iterator[CounterFamily]:
        yield family("app_invalid", "Invalid", ("reason",), self.invalid, zeros=[("quota",)])


def _samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    return {
        (sample.name, sample.labels.get("reason", "")): sample.value
        for metric in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in metric.samples
    }


def _app(config: str | None = None) -> App:
    settings = (
        load_startup_settings(None)
        if config is None
        else settings_of(load_config_text(config, "test"))
    )
    return App(
        settings, name="midbatch", idx="10", config_path=None, recorder=Recorder(_NullSink())
    )


def test_a_family_keeps_what_it_was_given_while_the_owner_counts_on() -> None:
    counts = {("spec",): 1}
    described = family("app_invalid", "Invalid", ("reason",), counts, zeros=[("quota",)])
    counts[("spec",)] = 5
    counts[("size",)] = 1
    assert described.values == {("quota",): 0, ("spec",): 1}


def test_owners_are_asked_again_at_each_scrape() -> None:
    """Replaced owners (a Synchronize's new memory of pods) and new series are seen."""
    owners = [_Owner()]
    registry = CollectorRegistry()
    registry.register(Gathered(lambda: owners))
    assert _samples(registry) == {
        ("app_invalid_total", "quota"): 0,
        ("app_invalid_total", "spec"): 1,
    }
    owners[0].invalid[("size",)] = 2
    assert _samples(registry)[("app_invalid_total", "size")] == 2
    owners[0] = _Owner()
    assert ("app_invalid_total", "size") not in _samples(registry)


def _owners_in_the_package() -> set[str]:
    """Every class of the package that describes counts of its own (not the protocol)."""
    return {
        node.name
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and node.name != Counted.__name__
        and any(
            isinstance(item, ast.FunctionDef) and item.name == "counter_families"
            for item in node.body
        )
    }


def _family_names(owners: Iterator[Counted]) -> list[str]:
    return [counted.name for owner in owners for counted in owner.counter_families()]


def test_every_owner_of_counts_is_in_the_one_list_and_each_family_has_one_owner() -> None:
    cgroupfs, systemd = _app(), _app("cgroups:\n  driver: systemd\n")
    listed = {type(owner).__name__ for app in (cgroupfs, systemd) for owner in app.counted()}
    assert listed == _owners_in_the_package()
    for app in (cgroupfs, systemd):
        names = _family_names(app.counted())
        assert len(names) == len(set(names)), "a family described by two owners"
    assert _family_names(cgroupfs.counted()) == _family_names(systemd.counted())


def test_every_family_of_the_page_is_gathered_or_a_live_series() -> None:
    """A family added beside the mechanism (a collector of its own, a counter in
    obs/metrics.py fed by a callback) fails here; a new live series must be listed above."""
    app = _app()
    page = {
        metric.name
        for metric in text_string_to_metric_families(generate_latest(app.metrics.registry).decode())
        if metric.name.startswith("nri_midbatch_")
    }
    gathered = set(_family_names(app.counted()))
    assert gathered.isdisjoint(LIVE_SERIES)
    assert page == gathered | LIVE_SERIES


def test_only_the_gathering_reads_the_owners_for_the_metrics() -> None:
    readers = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "counter_families"
    )
    assert readers == ["process/metrics.py"]


def test_the_tiers_of_a_new_configuration_are_shown_from_zero() -> None:
    """Decisions by tier start at 0 for every configured tier, also one a reload brings."""
    app = _app()
    app.plugin.reconfigure(
        settings_of(
            load_config_text(
                "tiers:\n- name: spot\n  priorityClasses: [koord-free]\n  qosClasses: [BE]\n"
                "  resources: {cpu: kubernetes.io/batch-cpu, memory: kubernetes.io/batch-memory}\n",
                "test",
            )
        )
    )
    families = {f.name: f for f in app.plugin.counters.counter_families()}
    decisions = families["nri_midbatch_decisions"]
    assert decisions.values == {("spot",): 0, ("none",): 0}
