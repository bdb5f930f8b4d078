"""Files the commands read at run time, shipped inside the package (never looked up beside a checkout).

In a checkout `policies` here is a link to the repository's policies/ folder; builds copy its files.
"""

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent
SCHEMAS = DATA_DIR / "schemas"
POLICIES = DATA_DIR / "policies"
RUNTIME_BASELINE = POLICIES / "runtime-baseline.yaml"
REGIONS = POLICIES / "regions.yaml"
PRESETS = POLICIES / "presets.yaml"
EXAMPLES = POLICIES / "examples"
