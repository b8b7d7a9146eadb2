"""Generate the Python protobuf modules from protos/.

`python scripts/gen_protos.py` writes the modules in place;
`python scripts/gen_protos.py --check` generates into a temporary tree and
exits 1 if any committed module differs, so a stale checkout fails the tests.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from grpc_tools import protoc  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Job:
    """One protoc invocation: sources under `include`, modules into `out`."""

    include: str
    sources: tuple[str, ...]
    out: str
    grpc: bool = False


JOBS = (
    Job(
        include="protos",
        sources=(
            "nri_midbatch/api/rpc_status.proto",
            "nri_midbatch/api/ttrpc.proto",
            "nri_midbatch/api/nri.proto",
        ),
        out=".",
    ),
    # CRI subset for the end-to-end tests: generates tests/e2e/cri/runtime_pb2*.py
    Job(
        include="protos",
        sources=("tests/e2e/cri/runtime.proto",),
        out=".",
        grpc=True,
    ),
)


def generated_files(out_root: Path) -> list[Path]:
    found: list[Path] = []
    for job in JOBS:
        for src in job.sources:
            stem = (out_root / job.out / src).with_suffix("")
            found.append(stem.with_name(stem.name + "_pb2.py"))
            if job.grpc:
                found.append(stem.with_name(stem.name + "_pb2_grpc.py"))
    return found


def generate(out_root: Path) -> None:
    well_known = Path(protoc.__file__).parent / "_proto"
    for job in JOBS:
        out = out_root / job.out
        out.mkdir(parents=True, exist_ok=True)
        args = [
            "grpc_tools.protoc",
            f"-I{ROOT / job.include}",
            f"-I{well_known}",
            f"--python_out={out}",
        ]
        if job.grpc:
            args.append(f"--grpc_python_out={out}")
        args += [str(ROOT / job.include / s) for s in job.sources]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed for {job.sources}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if modules are stale")
    opts = parser.parse_args()
    if not opts.check:
        generate(ROOT)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = [
            str(committed.relative_to(ROOT))
            for fresh, committed in zip(
                generated_files(Path(tmp)), generated_files(ROOT), strict=True
            )
            if not committed.exists() or not filecmp.cmp(fresh, committed, shallow=False)
        ]
    if stale:
        print("stale generated modules (run `make gen`):", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
