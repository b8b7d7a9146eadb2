"""Configurations validated in a child process, so that pydantic never loads in the plugin.

The running plugin needs a configuration at start-up, on a reload and when the runtime
sends one in Configure. Validating it in-process would leave pydantic and the models in
memory for good (some 10 MB; dropping the modules after gives back nothing, and a reload
would load them again: docs/performance.md). So a short-lived child does what
`check-config` does, `model.load_config_*`, and hands back `Settings` (pickled: the child
runs this package's own code, from the same directory as the parent) or the
`ConfigError` with its message as the model wrote it. About 0.3 s of CPU per configuration.

The child is there for memory, not for safety: the model reads YAML within bounds that keep
a load to about a second of CPU (bounded_yaml.py). So a slow child never costs a valid
configuration: its verdict is awaited for PATIENCE_SECONDS of wall time (on a busy node
a child can wait long for a core), and a child that has not answered by then, could not
start, or died without a verdict, is replaced by the same validation in this process,
which then keeps pydantic loaded. The child's own bound is CPU time (RLIMIT_CPU), which
load does not stretch: a child that spends CPU_SECONDS on the configuration, once Python
and pydantic are loaded, is killed, and its configuration refused.

    python -m nri_midbatch.config.validator file PATH     # a file
    python -m nri_midbatch.config.validator text SOURCE   # YAML on stdin; SOURCE names it
"""

from __future__ import annotations

import math
import os
import pickle
import resource
import signal
import subprocess
import sys
from pathlib import Path

import structlog

from nri_midbatch.config.settings import ConfigError, Settings

__all__ = ["Validation", "load_settings_file", "load_settings_text", "load_startup_settings"]

log = structlog.get_logger(__name__)

#: How long the child's answer is awaited before this process validates instead: far
#: above its 0.3 s, and what a stuck child may delay a reload (in a thread) or a start-up.
PATIENCE_SECONDS = 30.0
#: The CPU time a child may spend on the configuration once its modules are loaded
#: (RLIMIT_CPU): 30 times what a configuration costs.
CPU_SECONDS = 10
#: The package's directory, first on the child's path: the child runs the parent's code.
_ROOT = str(Path(__file__).resolve().parents[2])


def load_startup_settings(path: str | Path | None) -> Settings:
    """The configuration the plugin starts with: the file's, or the defaults without one."""
    return Validation.startup(path).result()


def load_settings_file(path: str | Path) -> Settings:
    """`model.load_config_file`, validated in a child; raises its ConfigError."""
    return Validation(["file", str(path)], b"", str(path)).result()


def load_settings_text(text: str, source: str) -> Settings:
    """`model.load_config_text`, validated in a child; raises its ConfigError."""
    return Validation(["text", source], text.encode("utf-8", "surrogatepass"), source).result()


class Validation:
    """One child at work: started at once, its answer awaited by `result()`.

    So that `run` can import the rest of the plugin while the child imports pydantic:
    on two cores, the start-up then takes hardly longer than with pydantic in-process.
    """

    @classmethod
    def startup(cls, path: str | Path | None) -> Validation:
        """The file's configuration, or the defaults without one."""
        if path:
            return cls(["file", str(path)], b"", str(path))
        return cls(["text", "defaults"], b"", "defaults")

    def __init__(
        self, args: list[str], data: bytes, source: str, *, patience: float = PATIENCE_SECONDS
    ) -> None:
        self._args, self._data, self._source, self._patience = args, data, source, patience
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (_ROOT, env.get("PYTHONPATH"))))
        self._error: str | None = None
        try:
            # -P: nothing of the working directory on the child's path, only the package's.
            self._child: subprocess.Popen[bytes] | None = subprocess.Popen(
                [sys.executable, "-P", "-m", __name__, *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
            )
        except OSError as error:
            self._child, self._error = None, str(error)

    @property
    def pid(self) -> int | None:
        """The child's process id; None when it could not start."""
        return None if self._child is None else self._child.pid

    def result(self) -> Settings:
        """The Settings, or the ConfigError the model raised.

        Only the model's verdict refuses a configuration, or a child's CPU bound: without
        a verdict from the child, this process validates (the module's docstring says why).
        """
        verdict = self._child_verdict()
        if verdict is None:
            kind, where = self._args
            verdict = validate(kind, where, self._data)
        if isinstance(verdict, ConfigError):
            raise verdict
        return verdict

    def _child_verdict(self) -> Settings | ConfigError | None:
        source, child = self._source, self._child
        if child is None:
            log.warning(
                "validator could not start; validating in-process", source=source, error=self._error
            )
            return None
        try:
            out, err = child.communicate(self._data, timeout=self._patience)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            log.warning(
                "validator gave no answer in time; validating in-process",
                source=source,
                patience_seconds=self._patience,
            )
            return None
        if child.returncode == -signal.SIGXCPU:
            return ConfigError(
                f"{source}: cannot be validated: used more than {CPU_SECONDS} s of CPU"
            )
        try:
            result = pickle.loads(out) if child.returncode == 0 else None
        except Exception:  # e.g. cut short
            result = None
        if isinstance(result, Settings | ConfigError):
            return result
        lines = err.decode("utf-8", "replace").strip().splitlines()
        log.warning(
            "validator gave no verdict; validating in-process",
            source=source,
            status=child.returncode,
            stderr=lines[-1] if lines else "",
        )
        return None


def validate(kind: str, where: str, data: bytes) -> Settings | ConfigError:
    """What the model makes of a file (`where`) or of `data`, the text `where` names."""
    # Here, and only here, pydantic loads: in the child, or in the plugin for want of one.
    from nri_midbatch.config.compile import settings_of
    from nri_midbatch.config.model import load_config_file, load_config_text

    try:
        if kind == "file":
            config = load_config_file(where)
        else:
            config = load_config_text(data.decode("utf-8", "surrogatepass"), where)
        return settings_of(config)
    except ConfigError as error:
        return error


def main(argv: list[str]) -> int:
    """The child: validate with the model, write the pickled result to stdout."""
    # The bound is the configuration's, not Python's start and pydantic's import: a slow or
    # emulated node stretches those alone to seconds of CPU (RLIMIT_CPU counts from exec).
    import nri_midbatch.config.compile
    import nri_midbatch.config.model  # noqa: F401

    usage = resource.getrusage(resource.RUSAGE_SELF)
    limit = math.ceil(usage.ru_utime + usage.ru_stime) + CPU_SECONDS
    resource.setrlimit(resource.RLIMIT_CPU, (limit, limit + 1))
    kind, where = argv
    data = b"" if kind == "file" else sys.stdin.buffer.read()
    sys.stdout.buffer.write(pickle.dumps(validate(kind, where, data)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
