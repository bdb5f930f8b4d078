"""The installed distribution's version, for every command's --version."""

from __future__ import annotations

import argparse
from typing import Any


def version_text(prog: str) -> str:
    # importlib.metadata (and the email and zipfile modules it loads) only when --version asks.
    from importlib.metadata import PackageNotFoundError, version

    try:
        number = version("adl-enforcer")
    except PackageNotFoundError:
        number = "unknown (not installed)"
    return f"{prog} {number}"


def version_action(prog: str) -> type[argparse.Action]:
    """An argparse action for --version that looks the version up only when it is asked for."""

    class _Version(argparse.Action):
        def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
            kwargs.setdefault("help", "show program's version number and exit")
            super().__init__(option_strings, argparse.SUPPRESS, nargs=0, **kwargs)

        def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
            print(version_text(prog))
            parser.exit()

    return _Version
