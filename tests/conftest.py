from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from enforcer.policy import CompileOptions, SchemaSet, compile_policy, spec_root

from .daemon_helpers import daemon  # noqa: F401  (fixture for tests/integration)
from .netlab import net_sandbox, netlab  # noqa: F401  (fixtures for the egress tests)
from .sandbox_helpers import agent_tmp_path, sandbox  # noqa: F401  (fixtures for tests/integration and tests/attacks)

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "policies" / "examples"
NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


# The published schemas and fixtures: test inputs only (the package validates with its own schemas).
SHARED_SPEC = REPO.parent / "shared" / "spec"


# The slow classes of tests carry markers (registered in pyproject.toml) so that a developer can leave
# them out (-m 'not root', -m 'not network and not daemon'); scripts/test.sh selects nothing and runs
# them all. Applied here from what a test uses, so that a new test is marked without remembering to.
ROOT_FIXTURES = {"agent_tmp_path", "sandbox", "daemon", "netlab", "net_sandbox"}
NETWORK_FIXTURES = {"netlab", "net_sandbox"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        skips_without_root = any("root" in str(mark.kwargs.get("reason", "")) for mark in item.iter_markers("skipif"))
        if skips_without_root or fixtures & ROOT_FIXTURES:
            item.add_marker(pytest.mark.root)
        if "daemon" in fixtures:
            item.add_marker(pytest.mark.daemon)
        if fixtures & NETWORK_FIXTURES:
            item.add_marker(pytest.mark.network)


@pytest.fixture(scope="session")
def spec() -> Path:
    if not SHARED_SPEC.is_dir():
        pytest.skip(f"the published specification tree is not at {SHARED_SPEC}")
    return SHARED_SPEC


@pytest.fixture(scope="session")
def schemas() -> SchemaSet:
    return SchemaSet(spec_root())


def base_adl(**extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "adl_spec": "0.3.0",
        "name": "Test Agent",
        "description": "test",
        "version": "1.0.0",
        "data_classification": {"sensitivity": "internal"},
    }
    doc.update(copy.deepcopy(extra))
    return doc


def compile_doc(schemas: SchemaSet, adl: dict[str, Any], aaif: dict[str, Any] | None = None, **options: Any) -> Any:
    return compile_policy(adl, aaif, schemas, NOW, CompileOptions(**options))


def load_json(path: Path) -> Any:
    return json.loads(path.read_text())


def json_paths(value: Any, leaves_only: bool = False, path: tuple = ()) -> Iterator[tuple]:
    """Every path into a JSON value (or only the paths of its scalar leaves), root excluded."""
    container = isinstance(value, dict | list)
    if path and not (leaves_only and container):
        yield path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        yield from json_paths(child, leaves_only, (*path, key))


def get_at(doc: Any, path: tuple) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def set_at(doc: Any, path: tuple, value: Any) -> None:
    get_at(doc, path[:-1])[path[-1]] = value
