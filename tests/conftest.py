from __future__ import annotations

import os
from pathlib import Path

import pytest

from enforcer.policy import SchemaSet, spec_root
from enforcer.settings.launch import read as read_settings

from .helpers.daemon import daemon  # noqa: F401  (fixture for tests/integration)
from .helpers.documents import SHARED_SPEC
from .helpers.harness import pytest_addoption, pytest_configure  # noqa: F401  (--full, --require-root)
from .helpers.netlab import net_sandbox, netlab  # noqa: F401  (fixtures for the egress tests)
from .helpers.sandbox import agent_tmp_path, sandbox  # noqa: F401  (fixtures for tests/integration and tests/attacks)

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
    # ADL_ENFORCER_SPEC_DIR runs the suite against another schema tree, as it does the commands.
    return SchemaSet(spec_root(read_settings(os.environ).spec_dir))
