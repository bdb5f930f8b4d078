"""Reading policy documents from disk: the I/O shell around the pure policy core."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import data
from .policy.errors import DocumentRejected, Finding, Refusal
from .policy.model import CompileOptions, Policy
from .policy.regions import RegionMap, RegionMapError

if TYPE_CHECKING:
    from .policy.specs import SchemaSet

DEFAULT_REGIONS = data.REGIONS


class PolicyFileError(Refusal):
    """A file could not be read or parsed; `findings` holds structured errors when there are any."""

    def __init__(self, path: str, message: str, findings: list[Finding] | None = None) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.findings = findings or []


def read_document(path: str | os.PathLike[str], expect: str | None = None) -> dict[str, Any]:
    """Read and parse one document; `expect` ('adl' or 'aaif') checks its kind."""
    return document_from_bytes(read_bytes(path), str(path), expect)


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """A document's bytes (at most one byte over the size limit, which parsing then refuses)."""
    from .policy.loader import MAX_DOCUMENT_BYTES

    name = str(path)
    try:
        with open(path, "rb") as handle:
            return handle.read(MAX_DOCUMENT_BYTES + 1)
    except OSError as exc:
        raise PolicyFileError(
            name, f"cannot read: {exc.strerror}", [Finding("ENF-1004", f"cannot read {name}: {exc.strerror}")]
        ) from exc


def document_from_bytes(data: bytes, name: str, expect: str | None = None) -> dict[str, Any]:
    """Parse one document read by read_bytes; `expect` as for read_document."""
    from .policy.loader import parse_document

    parsed = parse_document(data, name)
    if not parsed.ok:
        raise PolicyFileError(name, parsed.findings[0].detail, list(parsed.findings))
    if expect == "adl" and parsed.kind is None:
        detail = "Required member 'adl_spec' is missing"
        raise PolicyFileError(name, detail, [Finding("ADL-1003", detail, "")])
    if expect and parsed.kind != expect:
        what = {
            "adl": "an ADL document (it has no adl_spec member)",
            "aaif": "an AAIF document (sc_standard is not SC-006)",
        }[expect]
        raise PolicyFileError(name, f"not {what}", [Finding("ENF-1005", f"{name} is not {what}")])
    return parsed.document


def yaml_name(name: str) -> bool:
    """Whether the loader reads a file of this name as YAML whatever its content."""
    return name.lower().endswith((".yaml", ".yml"))


def load_regions(path: str | os.PathLike[str] | None) -> RegionMap:
    if path is None:
        if not DEFAULT_REGIONS.is_file():
            return RegionMap.empty()
        path = DEFAULT_REGIONS
    return regions_from_bytes(read_bytes(path), str(path))


def regions_from_bytes(data: bytes, name: str) -> RegionMap:
    from .data import parsed

    # The packaged region map needs no YAML parser: the table holds what the loader parses it to.
    found, document = parsed.lookup("yaml-document", data) if yaml_name(name) else (False, None)
    if not found:
        document = document_from_bytes(data, name)
    try:
        return RegionMap.from_data(document)
    except RegionMapError as exc:
        raise PolicyFileError(name, str(exc)) from exc


def schema_set(spec_dir: Path | None = None) -> SchemaSet:
    """The schemas in `spec_dir` (the spec_dir setting), else the package's own."""
    from .policy.specs import SchemaSet, SpecMissing, spec_root

    try:
        return SchemaSet(spec_root(spec_dir))
    except SpecMissing as exc:
        raise PolicyFileError("(specification)", str(exc), [Finding("ENF-1006", str(exc))]) from exc


def load_policy(
    adl_path: str | os.PathLike[str],
    aaif_path: str | os.PathLike[str] | None = None,
    options: CompileOptions | None = None,
    now: datetime | None = None,
    spec_dir: Path | None = None,
) -> Policy:
    """Read, validate (against `spec_dir`'s schemas, else the package's) and compile; raises
    PolicyFileError or DocumentRejected."""
    adl = read_document(adl_path, "adl")
    aaif = read_document(aaif_path, "aaif") if aaif_path else None
    return compile_documents(adl, aaif, options, now or datetime.now(UTC), spec_dir)


def compile_documents(
    adl: dict[str, Any],
    aaif: dict[str, Any] | None,
    options: CompileOptions | None,
    now: datetime,
    spec_dir: Path | None = None,
) -> Policy:
    from .policy.compiler import compile_policy

    return compile_policy(adl, aaif, schema_set(spec_dir), now, options)


__all__ = [
    "DocumentRejected",
    "PolicyFileError",
    "compile_documents",
    "document_from_bytes",
    "load_policy",
    "load_regions",
    "read_bytes",
    "read_document",
    "regions_from_bytes",
    "schema_set",
]
