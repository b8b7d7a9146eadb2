"""The YAML configuration: defaults, validation with field paths, round trips, the example."""

from __future__ import annotations

import os
import threading
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from nri_midbatch.cgroups import paths
from nri_midbatch.config.compile import compile_policy
from nri_midbatch.config.model import (
    MAX_CONFIG_BYTES,
    MAX_DEPTH,
    CgroupDriver,
    Config,
    ConfigError,
    FailurePolicy,
    effective_config_yaml,
    load_config_file,
    load_config_text,
)
from nri_midbatch.policy import PriorityClass, QoSClass

from .hostile_config import HOSTILE_YAML

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "config" / "default.yaml"


def tier(
    name: str = "x",
    priority: str = "koord-batch",
    qos: str = "BE",
    cpu: str = "a",
    memory: str = "b",
    extra: str = "",
) -> str:
    """One tier as a YAML flow mapping; `extra` adds raw `key: value` entries."""
    return (
        f"{{name: {name}, priorityClasses: [{priority}], qosClasses: [{qos}], "
        f"resources: {{cpu: {cpu}, memory: {memory}}}{', ' + extra if extra else ''}}}"
    )


def rejected(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config_text(text, "node.yaml")
    message = str(caught.value)
    assert message.startswith("node.yaml: ")
    return message


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n", "---\n"])
def test_empty_text_gives_defaults(text: str) -> None:
    assert load_config_text(text, "empty.yaml") == Config()


def test_defaults_reproduce_koordinator() -> None:
    config = Config()
    assert config.failure_policy is FailurePolicy.IGNORE
    batch, mid = config.tiers
    assert (batch.name, batch.priority_classes, batch.qos_classes) == (
        "batch",
        (PriorityClass.BATCH, PriorityClass.FREE),
        (QoSClass.BE,),
    )
    assert batch.resources is not None and mid.resources is not None
    assert (batch.resources.cpu, batch.resources.memory) == (
        "kubernetes.io/batch-cpu",
        "kubernetes.io/batch-memory",
    )
    assert (mid.name, mid.priority_classes, mid.qos_classes) == (
        "mid",
        (PriorityClass.MID,),
        (QoSClass.BE, QoSClass.LS),
    )
    assert (mid.resources.cpu, mid.resources.memory) == (
        "kubernetes.io/mid-cpu",
        "kubernetes.io/mid-memory",
    )
    assert batch.namespaces is None and mid.namespaces is None
    assert config.classification.qos_label == "koordinator.sh/qosClass"
    assert config.classification.priority_class_label == "koordinator.sh/priority-class"
    assert (
        config.classification.extended_resource_spec_annotation
        == "node.koordinator.sh/extended-resource-spec"
    )
    assert config.classification.qos_from_cgroup_parent is False
    assert config.rules.cfs_quota is True
    assert config.rules.cpu_normalization_ratio is None
    assert config.cgroups.root == "/sys/fs/cgroup"
    assert config.cgroups.driver is paths.CgroupDriver.AUTO
    assert config.cgroups.pod_level is True


def test_partial_config_keeps_other_defaults() -> None:
    config = load_config_text("failurePolicy: Fail\nrules: {cfsQuota: false}\n", "x")
    assert config.failure_policy is FailurePolicy.FAIL
    assert config.rules.cfs_quota is False
    assert config.rules.cpu_normalization_ratio is None
    assert config.tiers == Config().tiers


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("failurePolicy: Ignore\nverbose: true\n", "verbose: unknown key"),
        ("rules: {cfsQuota: true, cfs_quota: true}", "rules.cfs_quota: unknown key"),
        (
            f"tiers: [{tier()}, {tier('y', 'koord-mid', cpu='c', memory='d', extra='more: 1')}]",
            "tiers.1.more: unknown key",
        ),
        ("cgroups: {driver: auto, podlevel: true}", "cgroups.podlevel: unknown key"),
    ],
)
def test_unknown_key_rejected_with_its_path(text: str, path: str) -> None:
    assert path in rejected(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            f"tiers: [{tier()}, {tier(name='y', qos='BE, XX', cpu='c', memory='d')}]",
            "tiers.1.qosClasses.1: Input should be 'LSE', 'LSR', 'LS', 'BE', 'SYSTEM' or 'None'",
        ),
        (f"tiers: [{tier(priority='koord-low')}]", "tiers.0.priorityClasses.0: Input should be"),
        (f"tiers: [{tier(name='Batch')}]", "tiers.0.name: must match [a-z0-9-]+"),
        (f"tiers: [{tier(name='a_b')}]", "tiers.0.name: must match [a-z0-9-]+"),
        (f"tiers: [{tier(priority='')}]", "tiers.0.priorityClasses: must not be empty"),
        (f"tiers: [{tier(qos='BE, BE')}]", "tiers.0.qosClasses: listed more than once: BE"),
        (f"tiers: [{tier(extra='namespaces: []')}]", "tiers.0.namespaces: must not be empty"),
        (f"tiers: [{tier(memory='a')}]", "tiers.0.resources: cpu and memory must name different"),
        (f"tiers: [{tier(cpu='a b')}]", "tiers.0.resources.cpu: must be non-empty"),
        (
            f"tiers: [{tier()}, {tier(priority='koord-mid', cpu='c', memory='d')}]",
            "tiers: tier 1 (x): name 'x' is already used",
        ),
        (
            f"tiers: [{tier()}, {tier(name='y', priority='koord-mid', cpu='c', memory='a')}]",
            "tiers: tiers 0 (x) and 1 (y) both read resource 'a'",
        ),
        ("tiers: {batch: {}}", "tiers: Input should be a valid tuple"),
        (
            "rules: {cpuNormalizationRatio: 0}",
            "rules.cpuNormalizationRatio: Input should be greater",
        ),
        ("rules: {cpuNormalizationRatio: -1.5}", "cpuNormalizationRatio: Input should be greater"),
        ("rules: {cpuNormalizationRatio: .inf}", "cpuNormalizationRatio: must be a decimal"),
        ("rules: {cpuNormalizationRatio: '1.2'}", "cpuNormalizationRatio: must be a decimal"),
        ("rules: {cfsQuota: 'no'}", "rules.cfsQuota: Input should be a valid boolean"),
        ("failurePolicy: ignore", "failurePolicy: Input should be 'Ignore' or 'Fail'"),
        ("cgroups: {driver: systemD}", "cgroups.driver: Input should be"),
        ("cgroups: {root: sys/fs/cgroup}", "cgroups.root: must be an absolute path"),
        ("classification: {qosLabel: 'a b'}", "classification.qosLabel: must be non-empty"),
        ("- tiers", "the top level must be a mapping"),
        ("rules: {cfsQuota: true}\nrules: {cfsQuota: false}\n", "duplicate key 'rules'"),
        ("rules: [", "not valid YAML"),
    ],
)
def test_invalid_values_rejected_with_path_and_reason(text: str, message: str) -> None:
    assert message in rejected(text)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (tier(), tier(name="y", cpu="c", memory="d")),
        (
            tier(priority="koord-mid", qos="BE, LS"),
            tier(name="y", priority="koord-batch, koord-mid", qos="LS", cpu="c", memory="d"),
        ),
    ],
)
def test_ambiguous_tiers_rejected(first: str, second: str) -> None:
    message = rejected(f"tiers: [{first}, {second}]")
    assert "tiers: tiers 0 (x) and 1 (y) both claim priority" in message
    assert "a pod must map to one tier" in message


def test_same_pair_in_different_namespaces_is_still_ambiguous() -> None:
    a = tier("a", extra="namespaces: [x]")
    b = tier("b", cpu="c", memory="d", extra="namespaces: [y]")
    assert "both claim priority koord-batch with qos BE" in rejected(f"tiers: [{a}, {b}]")


def test_errors_report_every_problem() -> None:
    message = rejected("failurePolicy: Never\nrules: {bogus: 1}\n")
    assert "failurePolicy:" in message
    assert "rules.bogus: unknown key" in message


def test_no_tiers_is_allowed() -> None:
    assert load_config_text("tiers: []", "x").tiers == ()


CUSTOM = """
failurePolicy: Fail
tiers:
  - name: batch
    priorityClasses: [koord-batch]
    qosClasses: [BE]
    resources: {cpu: kubernetes.io/batch-cpu, memory: kubernetes.io/batch-memory}
    namespaces: [jobs]
  - name: free-2
    priorityClasses: [koord-free]
    qosClasses: [BE, LS]
    resources: {cpu: example.com/free-cpu, memory: example.com/free-memory}
classification: {qosFromCgroupParent: true, qosLabel: example.com/qos}
rules: {cfsQuota: false, cpuNormalizationRatio: 1.15}
cgroups: {root: /host/sys/fs/cgroup, driver: systemd, podLevel: false}
"""


@pytest.mark.parametrize("text", ["", CUSTOM])
def test_effective_config_round_trips(text: str) -> None:
    config = load_config_text(text, "in.yaml")
    rendered = effective_config_yaml(config)
    assert load_config_text(rendered, "effective.yaml") == config
    assert effective_config_yaml(load_config_text(rendered, "again")) == rendered


def test_effective_config_lists_every_field_in_camel_case() -> None:
    rendered = yaml.safe_load(effective_config_yaml(Config()))
    assert list(rendered) == [
        "mode",
        "failurePolicy",
        "tiers",
        "classification",
        "rules",
        "cgroups",
        "convergence",
    ]
    assert rendered["convergence"] == {"intervalSeconds": 10.0}
    assert rendered["rules"] == {"cfsQuota": True, "cpuNormalizationRatio": None}
    assert rendered["cgroups"] == {"root": "/sys/fs/cgroup", "driver": "auto", "podLevel": True}
    assert rendered["tiers"][0]["namespaces"] is None
    assert rendered["classification"]["qosFromCgroupParent"] is False


def test_example_config_is_the_defaults() -> None:
    assert load_config_file(EXAMPLE) == Config()
    # It spells out every setting, not just the ones that differ from nothing.
    assert yaml.safe_load(EXAMPLE.read_text()) == yaml.safe_load(effective_config_yaml(Config()))


def test_load_config_file_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError, match=r"absent\.yaml: cannot read"):
        load_config_file(missing)
    broken = tmp_path / "broken.yaml"
    broken.write_text("rules:\n  cfsQuota: maybe\n")
    with pytest.raises(ConfigError, match=rf"^{broken}: rules\.cfsQuota: "):
        load_config_file(broken)
    unparsable = tmp_path / "unparsable.yaml"
    unparsable.write_text("rules:\n  - [\n")
    with pytest.raises(ConfigError, match=r'not valid YAML(.|\n)*in ".*unparsable\.yaml", line 3'):
        load_config_file(unparsable)


def test_config_is_frozen() -> None:
    config = Config()
    with pytest.raises(ValueError):
        config.rules.cfs_quota = False  # type: ignore[misc]


def test_compile_policy() -> None:
    policy = compile_policy(load_config_text(CUSTOM, "x"))
    batch, free = policy.chain.tiers
    assert batch.namespaces == frozenset({"jobs"})
    assert free.priority_classes == (PriorityClass.FREE,)
    assert free.qos_classes == frozenset({QoSClass.BE, QoSClass.LS})
    assert (free.cpu_resource, free.memory_resource) == (
        "example.com/free-cpu",
        "example.com/free-memory",
    )
    assert policy.rules.cfs_quota is False
    assert policy.rules.cpu_normalization_ratio == Fraction(23, 20)  # exactly 1.15
    assert policy.classifier.settings.qos_label == "example.com/qos"
    assert policy.classifier.settings.qos_from_cgroup_parent is True
    assert policy.spec_annotation == "node.koordinator.sh/extended-resource-spec"


# ---------------------------------------------------------------------------
# Hostile input: every failure is a ConfigError with a reason, nothing blocks or runs away
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "reason"), HOSTILE_YAML.values(), ids=HOSTILE_YAML.keys())
def test_hostile_text_is_a_config_error_with_its_reason(text: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text(text, "hostile.yaml")
    assert str(caught.value).startswith("hostile.yaml: ")
    assert reason in str(caught.value)


def test_aliases_within_the_bounds_are_fine() -> None:
    first = tier("a", "koord-batch", cpu="a-cpu", memory="a-mem", extra="namespaces: &ns [x, y]")
    second = tier("b", "koord-mid", cpu="b-cpu", memory="b-mem", extra="namespaces: *ns")
    config = load_config_text(f"tiers:\n  - {first}\n  - {second}\n", "anchors.yaml")
    assert [t.namespaces for t in config.tiers] == [("x", "y"), ("x", "y")]


def test_nesting_up_to_the_bound_is_parsed_and_beyond_it_refused() -> None:
    # A value MAX_DEPTH levels down (the top mapping is level 1) is only refused by the model.
    deep = "x: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n"
    assert "x: unknown key" in rejected(deep)
    deeper = "x: " + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "\n"
    assert f"nested more than {MAX_DEPTH} levels deep" in rejected(deeper)


def test_a_file_at_the_size_bound_loads_and_one_byte_more_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    body = "failurePolicy: Fail\n"
    path.write_text(body + "#" * (MAX_CONFIG_BYTES - len(body)))
    assert load_config_file(path).failure_policy is FailurePolicy.FAIL
    path.write_text(body + "#" * (MAX_CONFIG_BYTES - len(body) + 1))
    with pytest.raises(ConfigError, match=f"larger than {MAX_CONFIG_BYTES} bytes"):
        load_config_file(path)


@pytest.mark.parametrize("device", ["/dev/null", "/dev/zero"])
def test_a_config_linked_to_a_device_is_refused_unread(tmp_path: Path, device: str) -> None:
    path = tmp_path / "config.yaml"
    path.symlink_to(device)
    with pytest.raises(ConfigError, match=r"special file .*not a regular file"):
        load_config_file(path)


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="a directory, not a regular file"):
        load_config_file(tmp_path)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    os.mkfifo(path)
    outcome: list[BaseException] = []

    def load() -> None:
        try:
            load_config_file(path)
        except BaseException as error:
            outcome.append(error)

    # In a thread, so the test reports a blocked open instead of hanging; the bound
    # only separates "returned" from "blocked forever".
    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "reading a FIFO blocked"
    (error,) = outcome
    assert isinstance(error, ConfigError)
    assert "special file" in str(error)


def test_the_driver_setting_is_the_cgroup_writers_own_enum() -> None:
    # One enum: the value the model validates is what the path code switches on.
    config = load_config_text("cgroups: {driver: systemd}\n", "node.yaml")
    assert config.cgroups.driver is paths.CgroupDriver.SYSTEMD
    assert CgroupDriver is paths.CgroupDriver


def test_tier_class_names_are_the_policy_classes_and_none() -> None:
    from typing import get_args

    from nri_midbatch.config.model import _PriorityName, _QoSName
    from nri_midbatch.policy import PriorityClass, QoSClass

    assert set(get_args(_PriorityName)) == {*PriorityClass, "None"}
    assert set(get_args(_QoSName)) == {*QoSClass, "None"}


def test_the_calculators_a_tier_may_name_are_the_policys() -> None:
    from typing import get_args

    from nri_midbatch.config.model import _Calculator
    from nri_midbatch.policy.calculators import CALCULATORS

    assert set(get_args(_Calculator)) == set(CALCULATORS)


def ratio_of(written: str) -> Fraction | None:
    """The ratio the policy gets from `rules.cpuNormalizationRatio: <written>`."""
    config = load_config_text(f"rules: {{cpuNormalizationRatio: {written}}}", "node.yaml")
    return compile_policy(config).rules.cpu_normalization_ratio


@pytest.mark.parametrize(
    ("written", "exactly"),
    [
        ("1.2", Fraction(6, 5)),
        ("1.15", Fraction(23, 20)),
        ("2", Fraction(2)),
        (".5", Fraction(1, 2)),
        ("1.", Fraction(1)),
        ("+1.5", Fraction(3, 2)),
        ("12e-1", Fraction(6, 5)),
        ("1e3", Fraction(1000)),  # YAML 1.1 reads an exponent without a dot as text
        ("1e300", Fraction(10**300)),
        ("5e-324", Fraction(5, 10**324)),  # the least double, as written
        ("1.2000000000000002", Fraction(12000000000000002, 10**16)),  # 17 digits, a double
        ("010", Fraction(10)),  # a decimal ten, not YAML 1.1's octal eight
        ("!!float 1.25", Fraction(5, 4)),
    ],
)
def test_a_ratio_written_as_a_decimal_is_that_decimal_exactly(
    written: str, exactly: Fraction
) -> None:
    assert ratio_of(written) == exactly


@pytest.mark.parametrize(
    ("written", "message"),
    [
        # Not decimals, though YAML 1.1 reads them as numbers:
        ("0x10", "must be a decimal number (digits with an optional sign, fraction and exponent"),
        ("0o17", "not '0o17'"),
        ("1_000", "not '1_000'"),
        ("1:30", "not '1:30'"),  # base 60
        (".inf", "not '.inf'"),
        (".nan", "not '.nan'"),
        ("'1.2'", "must be a decimal number"),
        ("!!float 0x10", "'0x10' is not a decimal number"),
        ("!!int 0x10", "'0x10' is not a decimal number"),
        # Decimals no double holds exactly, so that the ratio would not be the one written:
        ("1.23456789012345678", "1.23456789012345678 cannot be held exactly as a double"),
        ("1e999", "1e999 cannot be held exactly as a double"),
        ("1e-999", "1e-999 cannot be held exactly as a double"),
        ("1e-999999999999", "1e-999999999999 cannot be held exactly"),
    ],
)
def test_a_ratio_not_written_as_an_exact_decimal_is_refused_with_the_grammar(
    written: str, message: str
) -> None:
    error = rejected(f"rules: {{cpuNormalizationRatio: {written}}}")
    assert message in error


def test_a_ratio_written_with_an_exponent_survives_the_effective_configuration() -> None:
    for written in ("1e300", "5e-324", "1.2000000000000002"):
        config = load_config_text(f"rules: {{cpuNormalizationRatio: {written}}}", "node.yaml")
        again = load_config_text(effective_config_yaml(config), "effective")
        assert again == config
