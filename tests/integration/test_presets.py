"""Presets in a real sandbox: what they grant works, what they do not grant stays denied, the
session's temp directory is its own and is removed at exit, --explain and the launch record show them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..helpers.sandbox import Sandbox, needs_root

pytestmark = needs_root

EXTENSION = {"adl-enforcer.runtime": {"presets": ["python", "ca-certificates", "tmp"]}}


def test_presets_grant_the_ca_bundle_its_variables_and_a_private_tmpdir(sandbox: Sandbox) -> None:
    code = (
        "import os, ssl, tempfile\n"
        "print('TMPDIR', os.environ['TMPDIR'])\n"
        "with tempfile.NamedTemporaryFile(dir=None) as f: f.write(b'x'); print('tmp ok')\n"
        "print('ca', ssl.create_default_context().cert_store_stats()['x509_ca'] > 0)\n"
        "print('env', os.environ['SSL_CERT_FILE'], os.environ['REQUESTS_CA_BUNDLE'])\n"
        "try: open('/tmp/outside-the-session-dir', 'w')\n"
        "except PermissionError: print('tmp root denied')\n"
    )
    without = sandbox.python(code)
    assert without.code == 1 and "KeyError" in without.err  # no TMPDIR without the preset
    policy = sandbox.policy(permissions={**sandbox.permissions, "extensions": EXTENSION})
    r = sandbox.python(code, policy=policy)
    assert r.code == 0, r.err
    tmpdir = re.search(r"TMPDIR (\S+)", r.out).group(1)  # type: ignore[union-attr]
    assert tmpdir.startswith("/tmp/adl-session-tmp-") and "tmp ok" in r.out and "tmp root denied" in r.out
    assert "ca True" in r.out and "env /etc/ssl/certs/ca-certificates.crt" in r.out
    assert not Path(tmpdir).exists()  # removed when the session ended
    launch = r.record("launch")["payload"]
    assert launch["baseline"]["digest"] != without.record("launch")["payload"]["baseline"]["digest"]
    presets_layer = next(layer for layer in launch["layers"] if layer["name"] == "presets")
    assert any("python, ca-certificates, tmp" in d for d in presets_layer["details"])


def test_explain_lists_presets_and_unknown_names_are_refused(sandbox: Sandbox) -> None:
    policy = sandbox.policy(permissions={**sandbox.permissions, "extensions": EXTENSION})
    r = sandbox.run("python3", "-c", "1", args=("--explain", "--json"), policy=policy)
    assert r.code == 0
    layers = {layer["name"]: layer for layer in json.loads(r.out)["layers"]}
    assert "SSL_CERT_FILE" in " ".join(layers["presets"]["details"])
    bad = sandbox.policy(
        permissions={**sandbox.permissions, "extensions": {"adl-enforcer.runtime": {"presets": ["everything"]}}}
    )
    r = sandbox.python("print(1)", policy=bad)
    assert r.code == 125 and "unknown preset(s) everything" in r.err
