"""Apply the runtime presets an ADL document opts into (see enforcer/policy/presets.py) to a launch:
their paths extend the runtime baseline (so they are granted, explained and recorded exactly like
it), their variables are set in the agent's environment, and `tmp` gives the session a writable
directory of its own that is removed when it ends."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .. import data
from ..policy import presets
from ..quick_dataclass import dataclass
from . import landlock
from .plan import Baseline, LaunchPlan, Layer, PlanError


@dataclass(frozen=True)
class Applied:
    names: tuple[str, ...]
    catalog_digest: str
    env: Mapping[str, str]
    session_tmp: bool
    details: tuple[str, ...]


def load_catalog(path: Path = data.PRESETS) -> presets.Catalog:
    from ruamel.yaml import YAML  # only for documents that ask for presets
    from ruamel.yaml.error import YAMLError

    try:
        raw = path.read_bytes()
        return presets.parse_catalog(raw, YAML(typ="safe").load(raw), str(path))
    except (OSError, YAMLError, presets.PresetError) as exc:
        raise PlanError(f"presets: {exc}") from None


def explain_lines(adl_document: Mapping[str, Any], catalog_path: Path = data.PRESETS) -> list[str]:
    """What the runtime presets the document enables add to its permissions (paths and variables
    they do not list), as a launch's presets layer shows it: [] for none, one line saying the launch
    is refused for a document whose presets cannot be had."""
    try:
        names = presets.requested(adl_document)
        if not names:
            return []
        catalog = load_catalog(catalog_path)
        chosen = presets.select(catalog, names)
    except (presets.PresetError, PlanError) as exc:
        return [f"REFUSED at launch: {exc}"]
    from ..explain import preset_details  # only for documents with presets

    return preset_details(catalog, names, chosen)[1]


def extend(
    baseline: Baseline,
    adl_document: Mapping[str, Any],
    catalog: presets.Catalog | None = None,
    *,
    catalog_path: Path = data.PRESETS,
) -> tuple[Baseline, Applied | None]:
    """The baseline with the requested presets' paths, and what else they apply (None: no presets).
    The catalog is read from `catalog_path` (the presets setting) unless given."""
    try:
        names = presets.requested(adl_document)
        if not names:
            return baseline, None
        catalog = catalog or load_catalog(catalog_path)
        chosen = presets.select(catalog, names)
    except presets.PresetError as exc:
        raise PlanError(str(exc)) from None
    from ..explain import preset_details  # what adl-policy explain shows too; only for documents with presets

    env, details = preset_details(catalog, names, chosen)
    extended = dataclasses.replace(
        baseline,
        digest=presets.combined_digest(baseline.digest, catalog, names),
        read=baseline.read + tuple(p for c in chosen for p in c.read),
        read_write=baseline.read_write + tuple(p for c in chosen for p in c.read_write),
        execute=baseline.execute + tuple(p for c in chosen for p in c.execute),
    )
    applied = Applied(names, catalog.digest, env, any(c.session_tmp for c in chosen), tuple(details))
    return extended, applied


def finish_plan(
    plan: LaunchPlan, applied: Applied | None, *, uid: int | None = None, gid: int | None = None, explain_only: bool
) -> Callable[[], None]:
    """Set the presets' variables and the session's temp directory on the plan; the returned
    function removes the directory (call it when the session has ended)."""
    if applied is None:
        return lambda: None
    plan.env.update(applied.env)
    mechanism = "runtime presets (ADL extension adl-enforcer.runtime)"
    plan.layers.append(Layer("presets", mechanism, "active", list(applied.details)))
    if not applied.session_tmp or explain_only:
        return lambda: None
    import shutil  # only for presets that ask for a session temp directory
    import tempfile

    directory = tempfile.mkdtemp(prefix="adl-session-tmp-", dir="/tmp")
    if uid is not None:
        os.chown(directory, uid, gid if gid is not None else -1)
    plan.landlock.add(directory, landlock.READ | landlock.WRITE)
    for var in ("TMPDIR", "TMP", "TEMP"):
        plan.env[var] = directory

    def remove() -> None:
        with contextlib.suppress(OSError):
            shutil.rmtree(directory)

    return remove
