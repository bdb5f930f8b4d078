"""adl-enforcerd as a command: its environment is checked (python_path.py) before the daemon's
modules are imported. Those import hashlib, which reads the file OPENSSL_CONF names and loads the
libraries it names, and the modules a PYTHONPATH entry would shadow: refused first, they are never
read."""

from __future__ import annotations

import sys

from ..command_start import start_command


def main() -> int:
    start_command()
    from .python_path import refuse_untrusted

    refuse_untrusted("adl-enforcerd")
    from .enforcerd import main as run

    return run(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
