"""Configurations validated in a child process, so that pydantic never loads in the plugin.

The running plugin needs a configuration at start-up, on a reload and when the runtime
sends one in Configure. Validating it in-process would leave pydantic and the models in
memory for good (some 10 MB; dropping the modules after gives back nothing, and a reload
would load them again: docs/performance.md). So a short-lived child does what
`check-config` does, `model.load_config_*`, and hands back `Settings` (pickled: the child
runs this package's own code, from the same directory as the parent) or the
`ConfigError` with its message as the model wrote it. About 0.3 s of CPU per configuration.

    python -m nri_midbatch.config.validator file PATH     # a file
    python -m nri_midbatch.config.validator text SOURCE   # YAML on stdin; SOURCE names it
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

from nri_midbatch.config.settings import ConfigError, Settings

__all__ = ["Validation", "load_settings_file", "load_settings_text", "load_startup_settings"]

#: How long the child's answer is awaited: far above its 0.3 s, and what a stuck child
#: may cost a reload (which runs in a thread) or a start-up.
TIMEOUT_SECONDS = 30.0
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

    def __init__(self, args: list[str], data: bytes, source: str) -> None:
        self._data, self._source = data, source
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

    def result(self) -> Settings:
        """The Settings, or the ConfigError the model raised (or why the child could not say)."""
        source = self._source
        if self._child is None:
            raise ConfigError(f"{source}: cannot be validated: {self._error}")
        try:
            out, err = self._child.communicate(self._data, timeout=TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.communicate()
            raise ConfigError(
                f"{source}: cannot be validated: no answer within {TIMEOUT_SECONDS:g} s"
            ) from None
        if self._child.returncode != 0:
            lines = err.decode("utf-8", "replace").strip().splitlines()
            why = lines[-1] if lines else f"exit status {self._child.returncode}"
            raise ConfigError(f"{source}: cannot be validated: the validator failed: {why}")
        try:
            result = pickle.loads(out)
        except Exception as error:  # e.g. cut short
            raise ConfigError(
                f"{source}: cannot be validated: unreadable answer: {error}"
            ) from None
        if isinstance(result, ConfigError):
            raise result
        if not isinstance(result, Settings):
            raise ConfigError(f"{source}: cannot be validated: answered {type(result).__name__}")
        return result


def main(argv: list[str]) -> int:
    """The child: validate with the model, write the pickled result to stdout."""
    # Here, and only here, pydantic loads.
    from nri_midbatch.config.compile import settings_of
    from nri_midbatch.config.model import load_config_file, load_config_text

    kind, where = argv
    result: Settings | ConfigError
    try:
        if kind == "file":
            config = load_config_file(where)
        else:
            text = sys.stdin.buffer.read().decode("utf-8", "surrogatepass")
            config = load_config_text(text, where)
        result = settings_of(config)
    except ConfigError as error:
        result = error
    sys.stdout.buffer.write(pickle.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
