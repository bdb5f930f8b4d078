"""The daemon's Explain keeps what a document's runtime presets grant per catalog file identity: a
catalog rewritten in place, to the same size and with its modification time put back (`cp -p`,
`touch -r`, an unpacked archive), must not leave a reviewer shown the grants of the old one while
launches apply the new."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from enforcer.data import PRESETS

from ..helpers.explaining import agent_document, explaining, runtime_presets


def test_a_catalog_rewritten_with_its_size_and_time_kept_is_read_again(tmp_path: Path, schemas: Any) -> None:
    catalog = tmp_path / "presets.yaml"
    shutil.copy(PRESETS, catalog)
    policies = agent_document(tmp_path / "policies", ["python"]).parent
    with explaining(tmp_path, schemas, policies, catalog) as explain:
        before = runtime_presets(explain())
        assert any("/usr/lib/python3" in line for line in before), before
        text = catalog.read_text()
        assert text.count("    - /usr/lib/python3\n") == 1
        stat = catalog.stat()
        with open(catalog, "r+") as f:  # in place: the same inode
            f.write(text.replace("    - /usr/lib/python3\n", "    - /usr/lib/pythonX\n"))
        os.utime(catalog, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        assert catalog.stat().st_size == stat.st_size and catalog.stat().st_ino == stat.st_ino
        after = runtime_presets(explain())
        # What a launch now applies: the path is gone (one that does not exist is skipped), and the
        # catalog's digest is the new file's.
        assert not any("/usr/lib/python3" in line for line in after), after
        assert after[0] != before[0]
