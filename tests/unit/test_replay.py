"""Replay: the containerd 1.7.24 recording against its golden replies, in process and through
the socket; configuration changes; malformed and older lines; --expect."""

from __future__ import annotations

import gc
import io
import json
import os
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO, cast

import pytest
import structlog
from google.protobuf.json_format import ParseDict

import nri_midbatch.tools.replay.report
from nri_midbatch.config.model import Config, load_config_text
from nri_midbatch.recording.reader import MAX_LINE_BYTES, MAX_NESTING, PLUGIN_METHODS
from nri_midbatch.tools.cli import main
from nri_midbatch.tools.replay.command import (
    EXIT_CANNOT_RUN,
    EXIT_EXPECT_DIFFERS,
    EXIT_MALFORMED_LINES,
    replay_command,
)
from nri_midbatch.tools.replay.compare import rows
from nri_midbatch.tools.replay.runner import Outcome
from tests.unit.replay_fixtures import read_whole, replay_whole

REPLAY_DIR = Path(__file__).resolve().parents[1] / "replay"
RECORDING = REPLAY_DIR / "containerd-1.7.24.jsonl"
EXPECTED = REPLAY_DIR / "containerd-1.7.24.expected.jsonl"


@pytest.fixture(autouse=True)
def _logging_reset() -> Iterator[None]:
    # The command line points structlog at the stderr pytest captures for one test; once that
    # stream is closed, a later test's log call would fail the handler it runs in.
    yield
    structlog.reset_defaults()


def replayed(
    config: Config | None = None, *, via_socket: bool = False, recording: Path = RECORDING
) -> list[Outcome]:
    entries, problems = read_whole(recording)
    assert problems == []
    return replay_whole(
        entries,
        config or Config(),
        runtime_config=config is None,
        via_socket=via_socket,
    )


def changed_containers(outcomes: list[Outcome]) -> dict[tuple[int, str, str], int]:
    """(line, pod, container) -> the new quota, for every container whose reply changed."""
    changed = {}
    for outcome in outcomes:
        for row in rows(outcome):
            container = row.noted.container
            if container is not None and row.changed:
                assert row.now is not None
                changed[(row.entry.line, row.noted.pod.name, container.name)] = row.now.cpu_quota
    return changed


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- golden ------------------------------------------------------------------------


@pytest.mark.parametrize("via_socket", [False, True], ids=["in-process", "via-socket"])
def test_recording_replays_to_the_golden_replies(via_socket: bool) -> None:
    outcomes = replayed(via_socket=via_socket)
    golden = lines(EXPECTED)
    assert len(outcomes) == len(golden) == 13
    for outcome, want in zip(outcomes, golden, strict=True):
        assert outcome.entry.method == want["method"]
        assert outcome.error is None and want["error"] is None
        response_type = PLUGIN_METHODS[want["method"]][1]
        expected = ParseDict(want["response"], response_type())
        assert outcome.response is not None
        assert outcome.response.SerializeToString(deterministic=True) == expected.SerializeToString(
            deterministic=True
        ), f"line {outcome.entry.line}"
        # And the replies are what containerd got when it was recorded.
        assert outcome.response_changed is False


def test_the_recording_covers_every_tier_and_the_bad_annotation() -> None:
    decided = {
        (row.noted.pod.name, row.noted.container is None): row.noted.decision
        for outcome in replayed()
        for row in rows(outcome)
    }
    assert decided[("batch-be", False)].tier == "batch"
    assert decided[("mid-be", False)].tier == "mid"
    assert decided[("mid-ls", False)].tier == "mid"
    assert decided[("prod-ls", False)].tier is None
    assert decided[("bad-annotation", False)].error is not None
    # Pod-level decisions are reported, though dry run writes nothing.
    assert decided[("batch-be", True)].values is not None


# -- changed configuration ---------------------------------------------------------


def test_cpu_normalization_changes_exactly_the_containers_with_a_quota() -> None:
    config = load_config_text("rules:\n  cpuNormalizationRatio: 1.2\n", "test")
    assert changed_containers(replayed(config)) == {
        (2, "batch-before-plugin", "main"): 41667,  # limit 500: ceil(50000 / 1.2)
        (4, "batch-be", "main"): 83334,
        (6, "mid-be", "main"): 41667,
        (8, "mid-ls", "main"): 83334,
        # Line 13, the update of batch-be to a native 50000, keeps the tighter native quota.
    }


NORMALIZING = (
    "rules: {cpuNormalizationRatio: 1.2}\n"
    "tiers:\n"
    "  - {name: batch, priorityClasses: [koord-batch, koord-free], qosClasses: [BE],\n"
    "     resources: {cpu: kubernetes.io/batch-cpu, memory: kubernetes.io/batch-memory}}\n"
    "  - {name: mid, priorityClasses: [koord-mid], qosClasses: [BE, LS],\n"
    "     resources: {cpu: kubernetes.io/mid-cpu, memory: kubernetes.io/mid-memory}}\n"
    "  - {name: prod, priorityClasses: [koord-prod, None], qosClasses: [LS, None],\n"
    "     calculator: cpu-normalization}\n"
)


def test_a_normalization_tier_adds_the_prod_pod_and_sets_its_quota_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    changed = changed_containers(replayed(load_config_text(NORMALIZING, "test")))
    # prod-ls: kubelet's 200000 (limits.cpu 2) / 1.2; mid-ls once, by the mid formula.
    assert changed[(10, "prod-ls", "main")] == 166667
    assert changed[(8, "mid-ls", "main")] == 83334
    config = tmp_path / "normalize.yaml"
    config.write_text(NORMALIZING)
    assert main(["replay", str(RECORDING), "--config", str(config)]) == 0
    out = capsys.readouterr().out
    (prod,) = [
        line for line in out.splitlines() if "default/prod-ls" in line and "container" in line
    ]
    # Tier prod, shares and memory not set ("-"), the quota scaled.
    assert prod.split()[5:9] == ["prod", "-", "166667", "-"]
    assert "was untouched" in prod


def test_cfs_quota_off_leaves_native_quotas_in_place() -> None:
    config = load_config_text("rules:\n  cfsQuota: false\n", "test")
    assert changed_containers(replayed(config)) == {
        (2, "batch-before-plugin", "main"): -1,
        (4, "batch-be", "main"): -1,
        (6, "mid-be", "main"): -1,
        (8, "mid-ls", "main"): 200000,  # unlimited would loosen kubelet's 2 CPUs
    }


def test_the_table_shows_what_changed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "ratio.yaml"
    config.write_text("rules:\n  cpuNormalizationRatio: 1.2\n")
    assert main(["replay", str(RECORDING), "--config", str(config)]) == 0
    out = capsys.readouterr().out
    mid_be = [line for line in out.splitlines() if "default/mid-be" in line and "container" in line]
    assert len(mid_be) == 1
    assert mid_be[0].split()[5:9] == ["mid", "256", "41667", "256Mi"]
    assert "quota 50000 -> 41667" in mid_be[0]
    assert "4 replies differ from the recording" in out


def test_observe_mode_shows_now_untouched_and_the_legend_says_what_it_means(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "observe.yaml"
    config.write_text("mode: observe\n")
    main(["replay", str(RECORDING), "--config", str(config)])
    out = capsys.readouterr().out
    batch = [line for line in out.splitlines() if "default/batch-be" in line and "main" in line]
    assert "now untouched" in batch[0]
    assert "now untouched: values were set then, none now (observe mode decides values" in out


def test_the_config_flag_wins_over_a_recorded_configure(tmp_path: Path) -> None:
    recorded = lines(RECORDING)
    recorded[0]["request"]["config"] = "rules:\n  cfsQuota: false\n"
    recording = tmp_path / "with-config.jsonl"
    recording.write_text("".join(json.dumps(line) + "\n" for line in recorded))
    # Without --config, the runtime's config applies, as it did in the plugin.
    assert changed_containers(replayed(recording=recording))[(6, "mid-be", "main")] == -1
    config = load_config_text("rules:\n  cpuNormalizationRatio: 1.2\n", "test")
    assert changed_containers(replayed(config, recording=recording))[(6, "mid-be", "main")] == 41667


# -- malformed and older lines -----------------------------------------------------


def test_malformed_lines_are_reported_and_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = RECORDING.read_text().splitlines()
    unknown = json.loads(text[3])
    unknown["method"] = "FrobnicateContainer"
    invalid = json.loads(text[3])
    invalid["request"]["pod"]["labels"] = ["not", "a", "map"]
    bad = [
        "{this is not json",
        json.dumps(unknown),
        text[3][: len(text[3]) // 2],  # truncated mid-line
        json.dumps(invalid),
        json.dumps({"v": 99, "method": "CreateContainer", "request": {}}),
    ]
    recording = tmp_path / "damaged.jsonl"
    recording.write_text("\n".join(text[:3] + bad + text[3:]) + "\n")

    status = main(["replay", str(recording), "--format", "json"])
    captured = capsys.readouterr()
    assert status == EXIT_MALFORMED_LINES
    for number, why in (
        (4, "not valid JSON"),
        (5, "unknown method 'FrobnicateContainer'"),
        (6, "not valid JSON"),
        (7, "request is not a valid CreateContainerRequest"),
        (8, "format version 99 is newer"),
    ):
        assert f"{recording}:{number}: {why}" in captured.err
    report = json.loads(captured.out)
    assert [p["line"] for p in report["problems"]] == [4, 5, 6, 7, 8]
    # The rest replayed: every good line, unchanged.
    assert [call["line"] for call in report["calls"]] == [1, 2, 3, *range(9, 19)]
    assert not any(call["response_changed"] for call in report["calls"])


def test_an_older_line_replays(tmp_path: Path) -> None:
    created = lines(RECORDING)[3]
    assert created["method"] == "CreateContainer"
    for optional in ("v", "ts", "error", "decisions"):
        del created[optional]
    created["plugin_build"] = "0.0.1"  # a key this version does not know
    created["request"]["pod"]["future_field"] = {"nested": True}  # an unknown protobuf field
    recording = tmp_path / "older.jsonl"
    recording.write_text(json.dumps(created) + "\n")

    (outcome,) = replayed(recording=recording)
    assert outcome.error is None
    assert outcome.response_changed is False
    # The pod, first met at its CreateContainer, is decided too: the container's row is last.
    row = rows(outcome)[-1]
    assert row.noted.container is not None
    assert row.noted.decision.tier == "batch"
    assert row.now is not None and row.now.cpu_shares == 512


# -- --expect ----------------------------------------------------------------------


@pytest.mark.parametrize("via_socket", [[], ["--via-socket"]], ids=["in-process", "via-socket"])
def test_expect_passes_on_the_golden_file(
    via_socket: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(RECORDING), "--expect", str(EXPECTED), *via_socket]) == 0
    assert capsys.readouterr().err == ""


def test_expect_fails_on_a_tampered_golden_file_with_a_diff(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = lines(EXPECTED)
    quota = golden[5]["response"]["adjust"]["linux"]["resources"]["cpu"]["quota"]
    assert quota["value"] == "50000"
    quota["value"] = "40000"
    tampered = tmp_path / "tampered.expected.jsonl"
    tampered.write_text("".join(json.dumps(line) + "\n" for line in golden))

    status = main(["replay", str(RECORDING), "--expect", str(tampered)])
    err = capsys.readouterr().err
    assert status == EXIT_EXPECT_DIFFERS
    assert f"--- {tampered} (call 6: CreateContainer)" in err
    assert "+++ replay (call 6: CreateContainer, recording line 6)" in err
    assert '-              "value": "40000"' in err
    assert '+              "value": "50000"' in err
    assert "call 4" not in err  # only the call that differs


def test_write_expected_round_trips(tmp_path: Path) -> None:
    golden = tmp_path / "golden.jsonl"
    assert main(["replay", str(RECORDING), "--write-expected", str(golden)]) == 0
    assert golden.read_bytes() == EXPECTED.read_bytes()
    # A recording is a golden file of itself.
    assert main(["replay", str(RECORDING), "--expect", str(RECORDING)]) == 0


def test_replay_writes_no_pod_cgroup(tmp_path: Path) -> None:
    # A cgroup v1 tree holding every pod cgroup of the recording, as a live node would.
    parents = {
        call["request"]["pod"]["linux"]["cgroup_parent"]
        for call in lines(RECORDING)
        if call["method"] == "StateChange"
    }
    files = []
    for parent in parents:
        for controller, name, value in (
            ("cpu", "cpu.shares", "2"),
            ("cpu", "cpu.cfs_quota_us", "-1"),
            ("memory", "memory.limit_in_bytes", "9223372036854771712"),
        ):
            directory = tmp_path / controller / parent.strip("/")
            directory.mkdir(parents=True, exist_ok=True)
            (directory / name).write_text(f"{value}\n")
            files.append((directory / name, f"{value}\n"))
    config = load_config_text(f"cgroups:\n  root: {tmp_path}\n  driver: cgroupfs\n", "test")

    outcomes = replayed(config)
    pod_decisions = [row for o in outcomes for row in rows(o) if row.noted.container is None]
    assert any(row.now is not None for row in pod_decisions)
    for path, content in files:
        assert path.read_text() == content, path


# -- hostile input -----------------------------------------------------------------


def _no_traceback(err: str) -> None:
    assert "Traceback" not in err


def test_deeply_nested_lines_are_refused_with_their_line_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = RECORDING.read_text().splitlines()
    created = json.loads(text[3])
    created["request"]["pod"]["unknown"] = json.loads(
        "[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1)
    )
    bad = [
        "[" * 200_000 + "]" * 200_000,  # past Python's own recursion limit
        '{"v": 1, "method": "CreateContainer", "request": ' + '{"a": ' * 100_000,
        json.dumps(created),  # within the recursion limit, past ours
    ]
    recording = tmp_path / "nested.jsonl"
    recording.write_text("\n".join(text[:3] + bad + text[3:]) + "\n")

    status = main(["replay", str(recording)])
    captured = capsys.readouterr()
    _no_traceback(captured.err)
    assert status == EXIT_MALFORMED_LINES
    for number in (4, 5, 6):
        assert f"{recording}:{number}: nested deeper than {MAX_NESTING} levels" in captured.err
    assert "13 calls replayed, 3 malformed lines skipped; 0 replies differ" in captured.out


def test_a_deeply_nested_golden_file_is_reported_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = EXPECTED.read_text().splitlines()
    golden[2] = '{"a": ' * 100_000 + "1" + "}" * 100_000
    nested = tmp_path / "nested.expected.jsonl"
    nested.write_text("\n".join(golden) + "\n")

    status = main(["replay", str(RECORDING), "--expect", str(nested)])
    err = capsys.readouterr().err
    _no_traceback(err)
    assert f"{nested}:3: nested deeper than {MAX_NESTING} levels" in err
    assert status & EXIT_EXPECT_DIFFERS


def test_a_line_over_the_length_bound_is_skipped_unread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = RECORDING.read_text().splitlines()
    created = json.loads(text[3])
    created["request"]["pod"]["annotations"]["huge"] = "x" * MAX_LINE_BYTES
    recording = tmp_path / "long.jsonl"
    recording.write_text("\n".join([*text[:3], json.dumps(created), *text[3:]]) + "\n")

    status = main(["replay", str(recording), "--format", "json"])
    captured = capsys.readouterr()
    _no_traceback(captured.err)
    assert status == EXIT_MALFORMED_LINES
    assert f"{recording}:4: longer than {MAX_LINE_BYTES} bytes" in captured.err
    report = json.loads(captured.out)
    assert [call["line"] for call in report["calls"]] == [1, 2, 3, *range(5, 15)]
    assert not any(call["response_changed"] for call in report["calls"])


@pytest.mark.parametrize("via_socket", [[], ["--via-socket"]], ids=["in-process", "via-socket"])
def test_a_request_too_large_for_ttrpc_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], via_socket: list[str]
) -> None:
    text = RECORDING.read_text().splitlines()
    created = json.loads(text[3])
    created["request"]["pod"]["annotations"]["big"] = "x" * (5 << 20)
    recording = tmp_path / "big.jsonl"
    recording.write_text("\n".join([*text[:3], json.dumps(created), *text[3:]]) + "\n")

    status = main(["replay", str(recording), *via_socket])
    captured = capsys.readouterr()
    _no_traceback(captured.err)
    assert status == EXIT_MALFORMED_LINES
    assert f"{recording}:4: request is 524" in captured.err
    assert "over ttrpc's message limit" in captured.err
    assert "13 calls replayed, 1 malformed lines skipped; 0 replies differ" in captured.out


def test_write_expected_to_a_full_disk_is_an_error_not_a_crash(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(["replay", str(RECORDING), "--write-expected", "/dev/full"])
    err = capsys.readouterr().err
    _no_traceback(err)
    assert status == EXIT_CANNOT_RUN
    assert "/dev/full: cannot write: No space left on device" in err


class RetainedSampler(io.TextIOBase):
    """An output that, every few writes and at the first, measures the bytes still held
    (after a full collection, so garbage not yet collected is not counted)."""

    def __init__(self, every: int = 25) -> None:
        self.every = every
        self.writes = 0
        self.most = 0

    def write(self, text: str) -> int:
        if self.writes % self.every == 0:
            gc.collect()
            self.most = max(self.most, tracemalloc.get_traced_memory()[0])
        self.writes += 1
        return len(text)


@pytest.mark.parametrize("fmt", ["json", "table"])
def test_replay_memory_stays_flat_in_the_number_of_lines(
    tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The table holds a block of rows to size its columns: make the block small next to N.
    monkeypatch.setattr(nri_midbatch.tools.replay.report, "TABLE_BLOCK_ROWS", 100)
    text = RECORDING.read_text().splitlines()
    configure, run_pod, create = (json.loads(text[n]) for n in (0, 2, 3))
    assert (run_pod["method"], create["method"]) == ("StateChange", "CreateContainer")

    def retained(calls: int) -> int:
        recording = tmp_path / f"{calls}.jsonl"
        recording.write_text(
            "".join(json.dumps(line) + "\n" for line in [configure, run_pod, *[create] * calls])
        )
        out = RetainedSampler()
        with open(os.devnull, "w") as err:
            tracemalloc.start()
            try:
                status = replay_command(
                    recording,
                    Config(),
                    runtime_config=True,
                    via_socket=False,
                    fmt=fmt,
                    expect=None,
                    write_expected_to=None,
                    out=cast(TextIO, out),
                    err=err,
                )
                out.write("")  # a last sample, after the whole recording
            finally:
                tracemalloc.stop()
        assert status == 0
        return out.most

    retained(50)  # first use: imports, caches and interned strings, whatever the length
    small, large = retained(50), retained(300)
    # 250 more lines held 1.3 MB (table) to 1.8 MB (json) when every call's reply and
    # decisions were kept to the end.
    assert large - small < 400_000, (small, large)
