"""The `nri-midbatch` command's first lines: signal dispositions before anything loads.

The command line (tools/cli.py) imports most of the plugin; a signal that came while it
does must not end the plugin (process/early_signals.py).
"""

from __future__ import annotations

import os
import sys

from nri_midbatch.process import early_signals


def main() -> int:
    if early_signals.runs_plugin(sys.argv[1:], os.environ):
        early_signals.hold()
    from nri_midbatch.tools.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
