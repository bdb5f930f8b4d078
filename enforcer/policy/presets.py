"""Runtime presets: named, documented fragments (python, node, git, ca-certificates, tmp) that an ADL
document opts into through ADL's extension mechanism, in its permissions object:

    ADL 0.3:        "permissions": {"extensions": {"adl-enforcer.runtime": {"presets": ["python", "git"]}}}
    ADL 0.1, 0.2:   "permissions": {"x_adl_enforcer_presets": ["python", "git"]}

Why an extension: ADL has no include mechanism, and its extension members (0.3: `extensions` keyed
by a dotted namespace; before: `x_` + namespace) are the standard place for what one implementation
adds, allowed in the permissions object, preserved, never a reason to reject. The request then
travels with the document (to the daemon too), is covered by its signature and digest, and an
implementation that does not know it ignores it, granting less, never more. What a preset grants
is defined by the operator's presets file, not by the document, the same way as the runtime
baseline, and is recorded by digest like it.

Pure: parses what the caller read, answers what the document asks for.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import field
from typing import Any

from ..quick_dataclass import dataclass

MEMBER = "x_adl_enforcer_presets"  # ADL 0.1 and 0.2
NAMESPACE = "adl-enforcer.runtime"  # ADL 0.3: permissions.extensions[NAMESPACE].presets
_PATH_KEYS = ("read", "read_write", "execute")


class PresetError(ValueError):
    pass


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    read: tuple[str, ...] = ()
    read_write: tuple[str, ...] = ()
    execute: tuple[str, ...] = ()
    env: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # candidates, first existing wins
    session_tmp: bool = False


@dataclass(frozen=True)
class Catalog:
    source: str
    digest: str
    presets: Mapping[str, Preset]


def parse_catalog(raw: bytes, data: Any, source: str) -> Catalog:
    """`data`: the YAML document loaded from `raw` (bytes, for the digest)."""
    if not isinstance(data, dict):
        raise PresetError(f"{source}: a mapping of preset names is expected")
    presets = {}
    for name, body in data.items():
        if not isinstance(name, str) or not isinstance(body, dict):
            raise PresetError(f"{source}: preset {name!r} must be a mapping")
        unknown = set(body) - {"description", "env", "session_tmp", *_PATH_KEYS}
        if unknown:
            raise PresetError(f"{source}: preset {name!r} has unknown keys {sorted(unknown)}")
        paths: dict[str, tuple[str, ...]] = {}
        for key in _PATH_KEYS:
            value = body.get(key) or []
            if not isinstance(value, list) or not all(isinstance(v, str) and v.startswith("/") for v in value):
                raise PresetError(f"{source}: preset {name!r}: {key} must be a list of absolute paths")
            paths[key] = tuple(value)
        env: dict[str, tuple[str, ...]] = {}
        for var, value in (body.get("env") or {}).items():
            candidates = value if isinstance(value, list) else [value]
            if not all(isinstance(c, str) for c in candidates) or not candidates:
                raise PresetError(f"{source}: preset {name!r}: env {var} must be a string or a list of strings")
            env[str(var)] = tuple(candidates)
        presets[name] = Preset(
            name=name,
            description=str(body.get("description") or ""),
            env=env,
            session_tmp=bool(body.get("session_tmp", False)),
            **paths,
        )
    return Catalog(source, "sha256:" + hashlib.sha256(raw).hexdigest(), presets)


def requested(adl_document: Mapping[str, Any]) -> tuple[str, ...]:
    """The preset names a document asks for (in its order, once each)."""
    permissions = adl_document.get("permissions")
    if not isinstance(permissions, Mapping):
        return ()
    extension = (permissions.get("extensions") or {}).get(NAMESPACE)
    if isinstance(extension, Mapping) and "presets" in extension:
        names, where = extension["presets"], f"permissions.extensions.{NAMESPACE}.presets"
    elif MEMBER in permissions:
        names, where = permissions[MEMBER], f"permissions.{MEMBER}"
    else:
        return ()
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise PresetError(f"{where} must be a list of preset names")
    return tuple(dict.fromkeys(names))


def select(catalog: Catalog, names: tuple[str, ...]) -> tuple[Preset, ...]:
    unknown = [n for n in names if n not in catalog.presets]
    if unknown:
        known = ", ".join(sorted(catalog.presets))
        raise PresetError(f"unknown preset(s) {', '.join(unknown)} (known: {known})")
    return tuple(catalog.presets[n] for n in names)


def combined_digest(baseline_digest: str, catalog: Catalog, names: tuple[str, ...]) -> str:
    """The digest the launch records for the baseline once presets extend it."""
    text = "\n".join([baseline_digest, catalog.digest, *names])
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
