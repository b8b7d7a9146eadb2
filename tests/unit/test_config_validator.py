"""Configurations validated in a child process: the same answers as the model, no pydantic here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nri_midbatch.config import validator
from nri_midbatch.config.compile import settings_of
from nri_midbatch.config.model import load_config_file, load_config_text
from nri_midbatch.config.settings import ConfigError

from .hostile_config import HOSTILE_YAML

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "config" / "default.yaml"

NORMALIZING = (
    "mode: observe\nfailurePolicy: Fail\n"
    "tiers:\n"
    "  - {name: b, priorityClasses: [koord-batch, None], qosClasses: [BE],\n"
    "     resources: {cpu: x/cpu, memory: x/mem}, namespaces: [jobs]}\n"
    "  - {name: n, priorityClasses: [koord-prod], qosClasses: [LS],\n"
    "     calculator: cpu-normalization}\n"
    "classification: {qosFromCgroupParent: true}\n"
    "rules: {cfsQuota: false, cpuNormalizationRatio: 1.2}\n"
    "cgroups: {root: /cg, driver: systemd, podLevel: false}\n"
)


@pytest.mark.parametrize("text", ["", NORMALIZING], ids=["defaults", "every-setting"])
def test_settings_are_what_the_model_compiles_to(text: str) -> None:
    got = validator.load_settings_text(text, "node.yaml")
    want = settings_of(load_config_text(text, "node.yaml"))
    assert got == want
    if text:
        assert str(got.rules.cpu_normalization_ratio) == "6/5"
    # Equality is the effective configuration's; every field came across too.
    for name in ("mode", "failure_policy", "tiers", "classification", "rules", "cgroups"):
        assert getattr(got, name) == getattr(want, name)


def test_a_file_and_the_defaults(tmp_path: Path) -> None:
    assert validator.load_settings_file(EXAMPLE) == settings_of(load_config_file(EXAMPLE))
    assert validator.load_startup_settings(None) == validator.load_settings_text("", "x")


def test_equal_configurations_are_equal_settings_and_different_ones_not() -> None:
    a = validator.load_settings_text("rules: {cpuNormalizationRatio: 2.0}\n", "a")
    b = validator.load_settings_text(
        "# the same, written otherwise\nrules:\n  cpuNormalizationRatio: 2.0\n", "b"
    )
    c = validator.load_settings_text("rules: {cpuNormalizationRatio: 3.0}\n", "c")
    assert a == b and a != c


@pytest.mark.parametrize(
    "text",
    [
        "cgroups: {root: relative}\nbogus: 1\n",
        "tiers: []\nmode: maybe\n",
        HOSTILE_YAML["alias-bomb"][0],
        HOSTILE_YAML["number-of-5000-digits"][0],
        "tiers: '\udcff'\n",  # a lone surrogate, which a file can never hold
    ],
)
def test_errors_are_the_models_word_for_word(text: str) -> None:
    with pytest.raises(ConfigError) as model:
        load_config_text(text, "node.yaml")
    with pytest.raises(ConfigError) as child:
        validator.load_settings_text(text, "node.yaml")
    assert str(child.value) == str(model.value)


def test_an_unreadable_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        validator.load_settings_file(tmp_path / "missing.yaml")
    assert (
        str(caught.value) == f"{tmp_path / 'missing.yaml'}: cannot read: No such file or directory"
    )


def test_a_validator_that_fails_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with pytest.raises(ConfigError) as caught:
        validator.load_settings_text("", "node.yaml")
    assert (
        str(caught.value) == "node.yaml: cannot be validated: the validator failed: exit status 1"
    )


def test_a_validator_that_cannot_start_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    with pytest.raises(ConfigError) as caught:
        validator.load_settings_text("", "node.yaml")
    assert str(caught.value).startswith("node.yaml: cannot be validated: ")


def test_the_running_plugin_never_loads_pydantic(tmp_path: Path) -> None:
    """Start-up, a reload and a scrape, as `run` does them: the configuration is Settings, not a
    model (pydantic and its models cost the plugin's memory, docs/performance.md)."""
    config = tmp_path / "config.yaml"
    config.write_text(f"cgroups: {{root: {tmp_path}}}\n")
    code = f"""
import asyncio, json, sys
from nri_midbatch.config.settings import Settings
from nri_midbatch.config.validator import load_startup_settings
from nri_midbatch.process.app import App
from prometheus_client import generate_latest
NOT_LOADED = ("pydantic", "pydantic_core", "yaml")
app = App(load_startup_settings({str(config)!r}), name="midbatch", idx="10",
          config_path={str(config)!r})
open({str(config)!r}, "w").write("mode: observe\\ncgroups: {{root: {tmp_path}}}\\n")
asyncio.run(app.reload("test"))
page = generate_latest(app.metrics.registry)
print(json.dumps({{
    "loaded": sorted(m for m in sys.modules if m.split(".")[0] in NOT_LOADED
                     or m == "nri_midbatch.config.model"),
    "settings": type(app.plugin.config) is Settings,
    "mode": app.plugin.config.mode,
    "reloads": app.reloads,
    "mode_on_page": 'nri_midbatch_mode{{mode="observe"}} 1.0' in page.decode(),
}}))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {
        "loaded": [],
        "settings": True,
        "mode": "observe",
        "reloads": {"applied": 1},
        "mode_on_page": True,
    }
