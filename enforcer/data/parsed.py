"""The packaged YAML files as their readers parse them: reading one needs no YAML parser.

parsed.json maps, for each reader ("yaml-document": the document loader reading a .yaml file;
"baseline": the runtime baseline's reader), the SHA-256 of a packaged file's bytes to what that
reader parses them to. scripts/parsed_yaml.py writes it from the files (policy_cache.parsed_table);
a test checks that it equals parsing them now. Bytes it does not hold, such as an operator's own
file or an edited copy, are parsed as always: the table can only stand in for the very same bytes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

TABLE = Path(__file__).resolve().parent / "parsed.json"
READERS = ("yaml-document", "baseline")


def lookup(reader: str, raw: bytes) -> tuple[bool, Any]:
    """(True, what `reader` parses `raw` to) when the table holds these bytes, else (False, None)."""
    try:
        table = json.loads(TABLE.read_bytes())
    except FileNotFoundError:
        return False, None  # a tree without the generated table parses every file
    entry = table.get(reader, {}).get(hashlib.sha256(raw).hexdigest())
    return (True, entry["value"]) if entry is not None else (False, None)
