"""The policy store: a directory of ADL documents (NAME.adl.json|yaml) with optional AAIF companions
(NAME.aaif.json|yaml), compiled into an immutable snapshot that is swapped in one assignment.

A reload never leaves a half-loaded state visible: readers take `store.snapshot` once per request.
A document that fails to load keeps its previous version (if any) and is reported as a problem.

The directory, every directory above it and every document must be writable only by the daemon's
user (or root): whoever else could write there could rewrite an agent's grants, or put back an older
signed version of them. A directory that fails this is refused at start and, on a reload, keeps what
was loaded before; a document that fails it is refused like one that does not validate.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..audit import Masker
from ..audit.events import agent_of
from ..documents import read_document
from ..paths import check_private, check_private_file
from ..policy import CompileOptions, Policy, compile_policy
from ..policy.errors import Refusal
from ..policy.specs import SchemaSet

ADL_SUFFIXES = (".adl.json", ".adl.yaml", ".adl.yml")
AAIF_SUFFIXES = (".aaif.json", ".aaif.yaml", ".aaif.yml")


@dataclass(frozen=True)
class AgentEntry:
    key: str  # the agent id when it has one, else its name
    policy: Policy
    adl_path: Path
    aaif_path: Path | None
    source_digest: str  # over the documents' bytes: tells a changed file from an unchanged one
    adl_document: dict[str, Any] = field(repr=False)
    aaif_document: dict[str, Any] | None = field(repr=False)
    masker: Masker = field(repr=False)


@dataclass(frozen=True)
class Problem:
    path: str
    detail: str
    codes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    generation: int
    agents: MappingProxyType[str, AgentEntry]  # by key
    aliases: MappingProxyType[str, AgentEntry]  # by key, id and name
    problems: tuple[Problem, ...]

    def resolve(self, agent: str) -> AgentEntry | None:
        return self.aliases.get(agent)


EMPTY = Snapshot(0, MappingProxyType({}), MappingProxyType({}), ())


@dataclass(frozen=True)
class ReloadResult:
    snapshot: Snapshot
    changed: tuple[str, ...]
    removed: tuple[str, ...]


def _companion(adl: Path) -> Path | None:
    stem = next(adl.name[: -len(s)] for s in ADL_SUFFIXES if adl.name.endswith(s))
    for suffix in AAIF_SUFFIXES:
        candidate = adl.with_name(stem + suffix)
        if candidate.is_file():
            return candidate
    return None


def _digest(*files: Path | None) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes() if f is not None else b"-")
        h.update(b"\0")
    return h.hexdigest()


class UnsafePolicyDirectory(Exception):
    """The policy directory, or one above it, may be written by a user other than the daemon's."""

    def __init__(self, directory: Path, fault: str) -> None:
        super().__init__(f"policy directory {directory} refused: {fault}")
        self.fault = fault  # what is wrong, naming the path at fault


class PolicyStore:
    def __init__(self, directory: Path, schemas: SchemaSet, options: CompileOptions) -> None:
        self.directory = directory
        self.schemas = schemas
        self.options = options
        self.snapshot: Snapshot = EMPTY

    def check_directory(self) -> None:
        """UnsafePolicyDirectory naming the path and what is wrong with it; a directory that does not
        exist (yet) passes here and is reported by reload()."""
        if not self.directory.exists():
            return
        try:
            check_private(self.directory)
        except OSError as exc:
            raise UnsafePolicyDirectory(self.directory, str(exc)) from exc

    def reload(self, now: datetime | None = None) -> ReloadResult:
        """Load every document again; the new snapshot replaces the old one in one assignment."""
        previous = self.snapshot
        by_source = {e.adl_path: e for e in previous.agents.values()}
        problems: list[Problem] = []
        loaded: dict[str, AgentEntry] = {}
        try:
            self.check_directory()
            files = sorted(p for p in self.directory.iterdir() if p.name.endswith(ADL_SUFFIXES) and p.is_file())
            missing = "holds no ADL document" if not files else ""
        except UnsafePolicyDirectory as exc:
            files, missing = [], f"refused: {exc.fault}"
        except OSError as exc:
            files, missing = [], f"cannot be read ({exc.strerror or exc})"
        if missing and previous.agents:
            # An emptied, vanished or newly unsafe directory is far likelier a mistake (a failed
            # deploy, an unmounted volume, a chmod) than a wish to refuse every agent: keep serving
            # what was loaded, and say so.
            kept = Problem(
                str(self.directory),
                f"policy directory {missing}: the {len(previous.agents)} agent(s) loaded before are kept",
            )
            snapshot = Snapshot(previous.generation + 1, previous.agents, previous.aliases, (kept,))
            self.snapshot = snapshot
            return ReloadResult(snapshot, (), ())
        if missing:
            problems.append(Problem(str(self.directory), f"policy directory {missing}"))
        for adl_path in files:
            entry = self._load(adl_path, by_source.get(adl_path), now, problems)
            if entry is None:
                continue
            if entry.key in loaded:
                problems.append(
                    Problem(str(adl_path), f"agent {entry.key!r} is already defined by {loaded[entry.key].adl_path}")
                )
                continue
            loaded[entry.key] = entry
        aliases: dict[str, AgentEntry] = {}
        for entry in loaded.values():
            for alias in (entry.key, entry.policy.agent_name, entry.policy.agent_id):
                if alias and alias not in aliases:
                    aliases[alias] = entry
        changed = tuple(
            k for k, e in loaded.items() if k not in previous.agents or previous.agents[k].policy is not e.policy
        )
        removed = tuple(k for k in previous.agents if k not in loaded)
        snapshot = Snapshot(
            previous.generation + 1, MappingProxyType(loaded), MappingProxyType(aliases), tuple(problems)
        )
        self.snapshot = snapshot
        return ReloadResult(snapshot, changed, removed)

    def _load(
        self, adl_path: Path, previous: AgentEntry | None, now: datetime | None, problems: list[Problem]
    ) -> AgentEntry | None:
        aaif_path = _companion(adl_path)
        try:
            for document in (adl_path, aaif_path):
                if document is not None:
                    check_private_file(document)
            digest = _digest(adl_path, aaif_path)
            if previous is not None and previous.source_digest == digest and previous.aaif_path == aaif_path:
                return previous
            adl = read_document(adl_path, "adl")
            aaif = read_document(aaif_path, "aaif") if aaif_path else None
            policy = compile_policy(adl, aaif, self.schemas, now or datetime.now(UTC), self.options)
        except (Refusal, OSError) as exc:
            findings = getattr(exc, "findings", None) or []
            detail = str(exc) if not findings else "; ".join(f"{f.code} {f.detail}" for f in findings[:5])
            kept = " (previous version kept)" if previous is not None else ""
            problems.append(Problem(str(adl_path), detail + kept, tuple(f.code for f in findings)))
            return previous
        return AgentEntry(
            key=agent_of(policy),
            policy=policy,
            adl_path=adl_path,
            aaif_path=aaif_path,
            source_digest=digest,
            adl_document=adl,
            aaif_document=aaif,
            masker=Masker(),
        )
