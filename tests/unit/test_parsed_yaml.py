"""The packaged region map and runtime baseline are read from enforcer/data/parsed.json, without a
YAML parser, only when their bytes are the very ones it was generated from; any other bytes are
parsed as always."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from enforcer import data
from enforcer.data import parsed
from enforcer.documents import PolicyFileError, load_regions, regions_from_bytes
from enforcer.policy.loader import parse_document
from enforcer.policy.regions import RegionMap
from enforcer.policy_cache import parsed_table
from enforcer.sandbox.plan import load_baseline, parse_baseline


def test_the_table_is_what_the_readers_parse_the_packaged_files_to_now() -> None:
    # Fails after an edit of policies/regions.yaml or runtime-baseline.yaml until
    # scripts/parsed_yaml.py has written the table again.
    assert json.loads(parsed.TABLE.read_text()) == parsed_table()
    found, value = parsed.lookup("yaml-document", data.REGIONS.read_bytes())
    assert found and value == parse_document(data.REGIONS.read_bytes(), "regions.yaml").document
    found, value = parsed.lookup("baseline", data.RUNTIME_BASELINE.read_bytes())
    assert found and value == parse_baseline(data.RUNTIME_BASELINE.read_bytes())


def test_the_packaged_files_are_read_without_a_yaml_parser() -> None:
    probe = """
import json, sys
from enforcer import data
from enforcer.documents import load_regions
from enforcer.sandbox.plan import load_baseline
regions, baseline = load_regions(None), load_baseline(data.RUNTIME_BASELINE)
print(json.dumps({"digest": regions.digest, "read": baseline.read, "yaml": "ruamel.yaml" in sys.modules}))
"""
    out = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)
    assert out["yaml"] is False
    # The same results as parsing the files.
    regions = RegionMap.from_data(parse_document(data.REGIONS.read_bytes(), "regions.yaml").document)
    assert out["digest"] == regions.digest == load_regions(None).digest
    assert out["read"] == list(parse_baseline(data.RUNTIME_BASELINE.read_bytes())["read"])


def test_other_bytes_are_parsed(tmp_path: Path) -> None:
    edited = tmp_path / "regions.yaml"
    edited.write_bytes(data.REGIONS.read_bytes() + b"\n  MARS:\n    hosts: ['*.mars.example']\n")
    assert parsed.lookup("yaml-document", edited.read_bytes()) == (False, None)
    assert "MARS" in {region for _, region in load_regions(edited).host_rules}
    baseline = tmp_path / "baseline.yaml"
    original = data.RUNTIME_BASELINE.read_bytes()
    assert b"\nproc_self: true\n" in original and load_baseline(data.RUNTIME_BASELINE).proc_self is True
    baseline.write_bytes(original.replace(b"\nproc_self: true\n", b"\nproc_self: false\n"))
    assert parsed.lookup("baseline", baseline.read_bytes()) == (False, None)
    assert load_baseline(baseline).proc_self is False
    assert load_baseline(baseline).digest != load_baseline(data.RUNTIME_BASELINE).digest


def test_the_table_stands_in_only_for_the_reader_and_name_it_was_made_for(tmp_path: Path) -> None:
    raw = data.REGIONS.read_bytes()
    assert parsed.lookup("baseline", raw) == (False, None)
    # The loader reads a .json name as JSON: the packaged YAML bytes under that name stay refused.
    with pytest.raises(PolicyFileError):
        regions_from_bytes(raw, str(tmp_path / "regions.json"))


def test_a_value_json_would_change_is_refused() -> None:
    from enforcer.policy_cache import _plain_json

    assert _plain_json({"a": [1, 2.5, "x", None, True]})
    assert not _plain_json({"a": (1, 2)}) and not _plain_json({1: "x"}) and not _plain_json(float("nan"))
