"""Write enforcer/data/parsed.json: the packaged YAML files as their readers parse them.

Run after editing policies/regions.yaml or policies/runtime-baseline.yaml (tests/unit/
test_parsed_yaml.py fails until then): .venv/bin/python scripts/parsed_yaml.py
"""

from __future__ import annotations

import json

from enforcer.data import parsed
from enforcer.policy_cache import parsed_table

if __name__ == "__main__":
    parsed.TABLE.write_text(json.dumps(parsed_table(), indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    print(f"wrote {parsed.TABLE}")
