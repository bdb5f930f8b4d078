"""The pure policy core: load, validate and compile ADL/AAIF documents; decide actions.

No sockets, threads or clocks: callers pass `now` and read policy files themselves. The one read
the core does is of the published JSON Schemas (specs.py), once per file and cached.
"""

from .compiler import compile_policy, policy_digest
from .decide import decide
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
