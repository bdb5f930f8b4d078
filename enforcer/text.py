"""Printing text that agents and API callers chose, safely. Imports nothing: `adl-exec --daemon
--report` prints with it without loading the audit package."""

from __future__ import annotations


def printable(text: str) -> str:
    """`text` with every control character escaped. Records carry names agents and API callers chose
    (paths, command names, tools): printed raw, they could drive the terminal or start a forged line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def escape_non_utf8(text: str) -> str:
    """`text` (from os.fsdecode: bytes that are not UTF-8 kept as surrogates) with those bytes as
    \\xNN. The audit log's encoder refuses surrogates, and the agent chooses the names."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def printable_json(text: str) -> str:
    """JSON text with every character that is not printable written as a \\u escape (the value stays
    the same). The encoder escapes only C0 controls; C1 controls (which UTF-8 terminals may obey),
    DEL, bidi overrides and line separators would reach the terminal raw. Line breaks of indented
    output are kept: inside JSON strings they are already escaped."""
    if text.isascii() and "\x7f" not in text:
        return text
    return "".join(c if c.isprintable() or c == "\n" else _json_escape(ord(c)) for c in text)


def _json_escape(code: int) -> str:
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
