"""The pure policy core: load, validate and compile ADL/AAIF documents; decide actions.

No sockets, threads or clocks: callers pass `now` and read policy files themselves. The one read
the core does is of the published JSON Schemas (specs.py), once per file and cached.

The names below load on first use (PEP 562): importing one leaf module, such as `patterns` in the
launch stage, must not compile the whole core (its schema and condition libraries are heavy).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .compiler import compile_policy, policy_digest
    from .decider import decide
    from .errors import DocumentRejected, Finding
    from .loader import Parsed, parse_document
    from .model import (
        CompileOptions,
        Decision,
        EnvVar,
        FileAccess,
        NetworkConnect,
        Policy,
        ProcessExec,
        Reason,
        ToolCall,
    )
    from .regions import RegionMap
    from .specs import SchemaSet, spec_root

_HOME = {
    "compile_policy": "compiler",
    "policy_digest": "compiler",
    "decide": "decider",
    "DocumentRejected": "errors",
    "Finding": "errors",
    "Parsed": "loader",
    "parse_document": "loader",
    "CompileOptions": "model",
    "Decision": "model",
    "EnvVar": "model",
    "FileAccess": "model",
    "NetworkConnect": "model",
    "Policy": "model",
    "ProcessExec": "model",
    "Reason": "model",
    "ToolCall": "model",
    "RegionMap": "regions",
    "SchemaSet": "specs",
    "spec_root": "specs",
}
__all__ = [
    "CompileOptions",
    "Decision",
    "DocumentRejected",
    "EnvVar",
    "FileAccess",
    "Finding",
    "NetworkConnect",
    "Parsed",
    "Policy",
    "ProcessExec",
    "Reason",
    "RegionMap",
    "SchemaSet",
    "ToolCall",
    "compile_policy",
    "decide",
    "parse_document",
    "policy_digest",
    "spec_root",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})
