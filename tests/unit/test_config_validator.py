"""Configurations validated in a child process: the same answers as the model, no pydantic here."""

from __future__ import annotations

import json
import math
import os
import signal
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


VALID = "mode: observe\n"


@pytest.mark.parametrize("python", ["/bin/false", "/nonexistent/python"])
def test_a_child_that_fails_or_cannot_start_costs_no_valid_configuration(
    monkeypatch: pytest.MonkeyPatch, python: str
) -> None:
    monkeypatch.setattr(sys, "executable", python)
    assert validator.load_settings_text(VALID, "node.yaml").mode == "observe"
    with pytest.raises(ConfigError) as caught:
        validator.load_settings_text("mode: maybe\n", "node.yaml")
    assert str(caught.value).startswith("node.yaml: mode: ")


def stopped(text: str) -> validator.Validation:
    """A validation whose child is stopped at once, as a starved child on a busy node."""
    validation = validator.Validation(
        ["text", "node.yaml"], text.encode(), "node.yaml", patience=0.2
    )
    assert validation.pid is not None
    os.kill(validation.pid, signal.SIGSTOP)
    return validation


def test_a_child_that_does_not_answer_in_time_costs_no_valid_configuration() -> None:
    # Was: "node.yaml: cannot be validated: no answer within 30 s", and a plugin that exits.
    assert stopped(VALID).result().mode == "observe"


@pytest.mark.parametrize("name", ["alias-bomb", "nested-20000-deep", "too-large"])
def test_a_hostile_configuration_is_still_refused_without_the_child(name: str) -> None:
    text, reason = HOSTILE_YAML[name]
    with pytest.raises(ConfigError) as caught:
        stopped(text).result()
    assert str(caught.value).startswith("node.yaml: ")
    assert reason in str(caught.value)


def test_a_child_killed_at_its_cpu_bound_refuses_the_configuration() -> None:
    validation = stopped(VALID)
    assert validation.pid is not None
    os.kill(validation.pid, signal.SIGXCPU)  # what the kernel sends at RLIMIT_CPU
    os.kill(validation.pid, signal.SIGCONT)
    with pytest.raises(ConfigError) as caught:
        validation.result()
    assert str(caught.value) == (
        f"node.yaml: cannot be validated: used more than {validator.CPU_SECONDS} s of CPU"
    )


def test_the_child_runs_under_its_cpu_bound() -> None:
    code = (
        "import resource, sys\n"
        "from nri_midbatch.config import validator\n"
        "sys.stdin = open('/dev/null')\n"
        "validator.main(['text', 'x'])\n"
        "usage = resource.getrusage(resource.RUSAGE_SELF)\n"
        "print(*resource.getrlimit(resource.RLIMIT_CPU), usage.ru_utime + usage.ru_stime,"
        " file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True)
    soft, hard, spent = done.stderr.decode().strip().splitlines()[-1].split()
    # CPU_SECONDS past what starting and loading pydantic took (RLIMIT_CPU counts from exec).
    assert int(hard) == int(soft) + 1
    assert validator.CPU_SECONDS <= int(soft) <= validator.CPU_SECONDS + math.ceil(float(spent))


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
    "settings": type(app.plugin.live.in_force.config) is Settings,
    "mode": app.plugin.live.in_force.config.mode,
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
