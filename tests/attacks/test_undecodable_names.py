"""The agent uses names that are not UTF-8: a file name with byte 0xff, a process name (comm) set
with prctl. Its denials must still reach the audit log, with the bytes shown escaped: a record
whose text the encoder refuses is not written, so such names would hide what the agent tried (and
an encoder error inside the creation guard stopped the guard itself)."""

from __future__ import annotations

import textwrap
from typing import Any

from ..helpers.sandbox import Sandbox, needs_root

pytestmark = needs_root


def _decisions(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r["payload"] for r in records if r["intent"] == "adl.enforcer.decision"]


def test_a_refused_creation_under_an_undecodable_name_is_audited(sandbox: Sandbox) -> None:
    ws = str(sandbox.ws)
    code = textwrap.dedent(
        f"""
        import os
        for name in (b"/\\xff.pem", b"/second\\xfe.pem"):
            try:
                os.close(os.open({ws!r}.encode() + name, os.O_WRONLY | os.O_CREAT, 0o600))
                print("ESCAPED")
            except OSError as e:
                print("refused", e.errno)
        with open({ws!r} + "/after.txt", "w") as f:  # the guard still answers
            f.write("ok")
        print("after")
        """
    )
    result = sandbox.python(code, timeout=30)
    assert result.out.split() == ["refused", "13", "refused", "13", "after"], result.out + result.err
    denials = [d for d in _decisions(result.records) if "creation guard" in d.get("enforced_by", "")]
    assert [d["path"] for d in denials] == [f"{ws}/\\xff.pem", f"{ws}/second\\xfe.pem"]
    assert result.record("exit")["payload"]["creations_refused"] == 2


def test_a_kernel_denial_of_a_process_with_an_undecodable_name_is_audited(sandbox: Sandbox) -> None:
    target = sandbox.outside / "private.txt"
    code = textwrap.dedent(
        f"""
        import ctypes
        ctypes.CDLL(None).prctl(15, b"\\xff\\xfehidden", 0, 0, 0)  # PR_SET_NAME
        try:
            open({str(target)!r}).read()
            print("ESCAPED")
        except OSError as e:
            print("refused", e.errno)
        """
    )
    result = sandbox.python(code, timeout=30)
    assert result.out.split() == ["refused", "13"], result.out + result.err
    kernel = result.record("exit")["payload"]["kernel_denials"]
    if not kernel.get("available"):
        import pytest

        pytest.skip(f"kernel denials are not recorded here: {kernel}")
    found = [d for d in _decisions(result.records) if d.get("path") == str(target)]
    assert len(found) == 1, [d for d in _decisions(result.records)]
    assert found[0]["command"] == "\\xff\\xfehidden"
