"""Printing text that agents and API callers chose, safely. Imports nothing: `adl-exec --daemon
--report` prints with it without loading the audit package."""

from __future__ import annotations


def printable(text: str) -> str:
    """`text` with every control character escaped. Records carry names agents and API callers chose
    (paths, command names, tools): printed raw, they could drive the terminal or start a forged line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
