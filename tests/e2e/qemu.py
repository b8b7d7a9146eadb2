"""Boot the QEMU guest of the cgroup v2 legs and run a shell command in it.

scripts/fetch-guest.sh provides Debian 12's qemu, its kernel and our own
initramfs (tests/e2e/guest/init.sh). The guest's root is the host's own `/`,
read-only over 9p under an overlay, so the worktree, its venv and the
containerd fetched into .cache/ run there unchanged. The command goes into
a writable 9p share; the guest's PID 1 for the leg (tests/e2e/guest/<leg>.sh)
runs it through run.sh, which leaves output.log and rc in the share, and
powers the guest off. Every boot is bounded by a timeout; the serial console
is kept in the share as console.log for the failure message.

Software emulation only: this machine's /dev/kvm is not usable by a stock
kernel. One vCPU: with two, multi-threaded TCG hung about one run in six.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FETCH = ROOT / "scripts" / "fetch-guest.sh"
GUEST_DIR = Path(__file__).resolve().parent / "guest"
#: The leg's PID 1 after the initramfs: a bare cgroup v2 node, or systemd.
LEGS = {"cgroupfs": GUEST_DIR / "cgroupfs.sh", "systemd": GUEST_DIR / "systemd.sh"}
#: Where the guest mounts the results share (init.sh).
GUEST_SHARE = "/guest-results"


class GuestError(RuntimeError):
    """The guest could not be prepared or booted."""


@dataclass(frozen=True)
class GuestRun:
    """How one boot ended. rc is None when the command never finished."""

    rc: int | None
    output: str
    console: Path
    seconds: float
    timed_out: bool

    def tails(self, lines: int = 60) -> str:
        """The ends of the command's output and of the console, for a failure message."""
        out = "\n".join(self.output.splitlines()[-lines:])
        console = self.console.read_text(errors="replace") if self.console.exists() else ""
        con = "\n".join(console.splitlines()[-lines:])
        return f"--- output.log (tail) ---\n{out}\n--- console.log (tail) ---\n{con}"


def fetch_guest(timeout: float = 900) -> Path:
    """The directory holding vmlinuz and initramfs.cpio.gz (fetched and built once)."""
    res = subprocess.run(["bash", str(FETCH)], capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise GuestError(f"{FETCH.name} failed:\n{res.stderr}")
    cache = Path(res.stdout.strip().splitlines()[-1])
    for path in (cache / "kernel" / "vmlinuz", cache / "initramfs.cpio.gz"):
        if not path.is_file():
            raise GuestError(f"{FETCH.name} printed {cache}, which has no {path.name}")
    return cache


def boot(
    cache: Path,
    leg: str,
    command: str,
    share: Path,
    *,
    timeout: float,
    memory_mib: int = 3072,
) -> GuestRun:
    """Boot the guest for `leg`, run `command` (sh) in it, wait at most `timeout` s."""
    share.mkdir(parents=True, exist_ok=True)
    for name in ("rc", "output.log", "console.log"):
        with contextlib.suppress(FileNotFoundError):
            (share / name).unlink()
    (share / "command").write_text(command)
    args = [
        "console=ttyS0",
        "panic=1",
        "cgroup_no_v1=all",
        f"guest.init={LEGS[leg]}",
    ]
    if leg == "systemd":
        args.append("systemd.unified_cgroup_hierarchy=1")
    console = share / "console.log"
    qemu = [
        "qemu-system-x86_64",
        "-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "1", "-m", str(memory_mib),
        "-nodefaults", "-display", "none", "-serial", "stdio", "-no-reboot",
        "-kernel", str(cache / "kernel" / "vmlinuz"),
        "-initrd", str(cache / "initramfs.cpio.gz"),
        "-append", " ".join(args),
        "-virtfs", "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap",
        "-virtfs", f"local,path={share},mount_tag=results,security_model=none,multidevs=remap",
        "-device", "virtio-rng-pci",
    ]  # fmt: skip
    started = time.monotonic()
    with open(console, "wb") as log:
        proc = subprocess.Popen(qemu, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            timed_out = True
    seconds = time.monotonic() - started
    rc_file = share / "rc"
    rc = int(rc_file.read_text().strip()) if rc_file.exists() else None
    output_file = share / "output.log"
    output = output_file.read_text(errors="replace") if output_file.exists() else ""
    return GuestRun(rc, output, console, seconds, timed_out)
