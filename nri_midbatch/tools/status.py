"""`nri-midbatch status`: why each pod and container has the values it has, on a live node.

Reads the running plugin's status socket (process/status.py) and shows, for each workload,
its tier, kubelet's values, the target the configuration in force gives it, what its cgroup
files hold now, whether they drift from the target, and for pods when the convergence pass
last checked them and the last drift it found and put back. Exit status: 0 no drift, 1 drift,
2 the plugin could not be asked.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any, TextIO

__all__ = ["MAX_DOCUMENT_BYTES", "status_command"]

#: About 400 bytes a container: a node of 100,000 containers and more.
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024
TIMEOUT_SECONDS = 60.0


def status_command(path: Path, *, fmt: str, out: TextIO, err: TextIO) -> int:
    try:
        document = _fetch(path)
    except (OSError, ValueError) as exc:
        print(f"nri-midbatch: status from {path}: {exc}", file=err)
        return 2
    workloads: list[dict[str, Any]] = document.get("workloads", [])
    if fmt == "json":
        json.dump(document, out, indent=2)
        out.write("\n")
    else:
        _table(document, workloads, out)
    return 1 if any(w.get("drift") for w in workloads) else 0


def _fetch(path: Path) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(TIMEOUT_SECONDS)
        client.connect(str(path))
        chunks, size = [], 0
        while chunk := client.recv(1 << 16):
            size += len(chunk)
            if size > MAX_DOCUMENT_BYTES:
                raise ValueError(f"answer larger than {MAX_DOCUMENT_BYTES} bytes")
            chunks.append(chunk)
    document = json.loads(b"".join(chunks))
    if not isinstance(document, dict) or document.get("format") != 1:
        raise ValueError("not a status document of this version")
    return document


_COLUMNS = ("WORKLOAD", "TIER", "KUBELET", "TARGET", "NOW", "DRIFT", "CHECKED")


def _table(document: dict[str, Any], workloads: list[dict[str, Any]], out: TextIO) -> None:
    rows = [_COLUMNS]
    now = time.time()
    for w in workloads:
        where = f"{w['namespace']}/{w['pod']}" + (f"/{w['container']}" if w["container"] else "")
        drift = "?" if w["drift"] is None else "DRIFT" if w["drift"] else "-"
        rows.append(
            (
                where,
                w["tier"] or "-",
                _triple(w["kubelet"]),
                _triple(w["target"]) if w["target"] else "untouched",
                _now(w),
                drift,
                _checked(w, now),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    for row in rows:
        out.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        out.write("\n")
    drifting = sum(1 for w in workloads if w["drift"])
    out.write(
        f"\nmode {document.get('mode')}; {len(workloads)} workloads, {drifting} drifting; "
        "values are shares/quota/memory (v2: shares as kubelet's weight), -1 unlimited.\n"
    )
    if not document.get("keeping_records"):
        out.write("no --state-dir: kubelet's pod values are not kept across restarts.\n")


def _checked(w: dict[str, Any], now: float) -> str:
    """A pod's last convergence check, and the last drift found there, as ages."""
    if w["level"] != "pod":
        return ""
    checked = w.get("checked_at")
    if checked is None:
        return "not yet"
    text = f"{now - checked:.0f}s ago"
    drift = w.get("last_drift")
    if drift is not None:
        where = f" in {drift['container']}" if drift["container"] else ""
        put_back = "put back" if drift["repaired"] else "NOT put back"
        text += f"; drift{where} {now - drift['at']:.0f}s ago by {drift['writer']}, {put_back}"
    return text


def _triple(values: dict[str, int]) -> str:
    return "/".join(str(values.get(k, "*")) for k in ("cpu_shares", "cpu_quota", "memory_limit"))


def _now(w: dict[str, Any]) -> str:
    now = w["now"]
    if now is None:
        return f"unreadable: {w['unreadable']}"
    shares = now["cpu_shares"] if now["cpu_shares"] is not None else f"w{now['cpu_weight']}"
    return f"{shares}/{now['cpu_quota']}/{now['memory_limit']}"
