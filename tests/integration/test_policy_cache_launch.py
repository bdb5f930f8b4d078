"""A launch whose documents are in the compiled-policy cache loads none of the validation code, and
none loads the settings model (pydantic), with or without the egress filter."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers.netlab import NetLab, needs_nft
from tests.helpers.sandbox import AGENT_USER, Sandbox, needs_root

# What validating and compiling documents loads; a warm launch must need none of it.
VALIDATION = (
    "enforcer.policy.adl",
    "enforcer.policy.aaif",
    "enforcer.policy.compiler",
    "enforcer.policy.loader",
    "enforcer.policy.specs",
    "jsonschema_rs",
)
# What only a refused document (the pure-Python validator words its errors) or a YAML file other
# than the packaged ones loads: neither launch of a valid JSON document needs it.
WORDING = (
    "enforcer.policy.schema_errors",
    "jsonschema",
    "referencing",
    "ruamel.yaml",
)
# What only some launches use (learn mode, a new audit key, a failing stage), or what has a cheaper
# exact replacement on the launch path; a warm launch without --learn loads none.
UNUSED_BY_A_PLAIN_LAUNCH = (
    "enforcer.cli.exec_learn",
    "enforcer.policy.learn",
    "enforcer.sandbox.fanotify",
    "enforcer.audit.query",
    "cryptography.hazmat.primitives.serialization",  # the audit key is read directly
    "_strptime",  # timestamps in the log are read directly
    "calendar",
    "secrets",  # ids from os.urandom: secrets would load random
    "traceback",
    "argparse",  # a plain command line is read without it (enforcer/cli/exec_args.py)
    "gettext",
)
LAUNCHER = """
import json, sys
from enforcer.cli.exec import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


@needs_root
def test_a_warm_cache_launch_imports_no_validator(sandbox):
    policy = sandbox.policy()
    env = {
        **os.environ,
        "ADL_ENFORCER_AUDIT_DIR": str(sandbox.audit),
        "ADL_ENFORCER_AUDIT_KEY": str(sandbox.root / "audit-key.pem"),
        "ADL_ENFORCER_CACHE_DIR": str(sandbox.root / "policy-cache"),
    }

    def launch() -> dict:
        argv = [
            sys.executable,
            "-c",
            LAUNCHER,
            "--adl",
            str(policy),
            "--user",
            AGENT_USER,
            "--",
            "cat",
            str(sandbox.ws / "notes.txt"),
        ]
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert lines[0] == "workspace notes", proc.stdout
        return json.loads(lines[-1])

    cold, warm = launch(), launch()
    assert cold["code"] == warm["code"] == 0
    assert set(VALIDATION) <= set(cold["modules"])  # the first launch validates and compiles
    assert not set(WORDING) & set(cold["modules"]), set(WORDING) & set(cold["modules"])
    validation = set(VALIDATION) | set(WORDING)
    assert not validation & set(warm["modules"]), validation & set(warm["modules"])
    # Nor the settings model: a launch without a network layer reads its settings without pydantic.
    assert not {m for m in warm["modules"] if m.split(".")[0].startswith("pydantic")}
    assert "enforcer.settings.model" not in warm["modules"]
    unused = set(UNUSED_BY_A_PLAIN_LAUNCH) & set(warm["modules"])
    assert not unused, unused
    # Changing the document's bytes misses the cache: that launch validates again.
    policy.write_text(policy.read_text() + "\n")
    assert set(VALIDATION) <= set(launch()["modules"])


@needs_root
@needs_nft
def test_a_launch_with_allowed_hosts_imports_no_pydantic(net_sandbox: Sandbox, netlab: NetLab) -> None:
    """The egress filter's settings are read and validated without the settings model."""
    policy = net_sandbox.policy()
    env = net_sandbox.environ(netlab.env())
    argv = [
        *netlab.wrap(), sys.executable, "-c", LAUNCHER, "--adl", str(policy), "--user", AGENT_USER, "--",
        "curl", "-sS", "--noproxy", "*", "--max-time", "5", "http://api.example.test/",
    ]  # fmt: skip
    for _ in range(2):  # cold, then warm
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert "host=api.example.test" in proc.stdout, proc.stdout  # through the filter, so it ran
        modules = set(json.loads(proc.stdout.splitlines()[-1])["modules"])
        assert "enforcer.egress.process" in modules and "enforcer.egress_values" in modules
        assert not {m for m in modules if m.split(".")[0].startswith("pydantic")}
        assert not {"enforcer.settings.model", "enforcer.egress_settings"} & modules
