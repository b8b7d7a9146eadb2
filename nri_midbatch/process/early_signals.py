"""Signal dispositions from the first line the plugin runs, before its modules load.

Loading the plugin's modules takes 0.3-0.7 s. Until the event loop installs its handlers, a
SIGHUP (reload) or SIGUSR1 (debug logging) kept its default disposition and ended the
process, and the runtime does not restart a pre-launched plugin that dies. `hold` installs
handlers that only remember what came (standard library only: it runs first), and the
running plugin acts on each once it serves (`take`). What remains is the interpreter's own
start, before any of the plugin's code runs (30-100 ms on a loaded 2-core VM): the
pre-launched launcher (examples/prelaunched/launcher.sh) ignores both signals across it.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from types import FrameType

__all__ = ["HELD", "hold", "runs_plugin", "take"]

#: Those the plugin acts on; until it serves, remembered in the order they came.
HELD = (signal.SIGHUP, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)

#: Appended to by the handler, in the main thread, between two bytecodes.
_pending: list[signal.Signals] = []


def runs_plugin(argv: list[str], environ: Mapping[str, str]) -> bool:
    """The command serves NRI: `run`, or no arguments where the runtime pre-launched it."""
    return argv[:1] == ["run"] or (not argv and "NRI_PLUGIN_SOCKET" in environ)


def hold() -> None:
    for sig in HELD:
        signal.signal(sig, _remember)


def take() -> list[signal.Signals]:
    """What came since `hold`, oldest first; called once the loop's own handlers are in."""
    taken = _pending[:]
    del _pending[: len(taken)]  # not clear(): what the handler adds meanwhile stays
    return taken


def _remember(signum: int, _frame: FrameType | None) -> None:
    _pending.append(signal.Signals(signum))
