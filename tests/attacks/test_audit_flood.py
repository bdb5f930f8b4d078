"""An agent that floods the egress filter with refused requests: every refusal is decided, but the
audit log the session shares with others must not grow with the agent's request rate."""

from __future__ import annotations

import textwrap

from ..helpers.netlab import needs_nft, payloads
from ..helpers.sandbox import Sandbox, needs_root

pytestmark = [needs_root, needs_nft]

FLOOD_SECONDS = 3
# Refused connections and DNS names are written one by one up to a bound, then only counted
# (enforcer.egress.server.MAX_DETAILED_DENIALS), as kernel denials and creation refusals are.
MAX_DETAILED = 1000


def test_a_flood_of_refused_connections_does_not_grow_the_audit_log(net_sandbox: Sandbox) -> None:
    result = net_sandbox.python(
        textwrap.dedent(
            f"""
            import socket, time
            tried, end = 0, time.monotonic() + {FLOOD_SECONDS}
            while time.monotonic() < end:
                tried += 1
                try:
                    socket.create_connection(("denied-{{}}.example.test".format(tried), 80), timeout=1).close()
                except OSError:
                    pass
            print("TRIED", tried)
            """
        ),
        timeout=120,
    )
    tried = int(result.out.split("TRIED")[-1])
    written = len(result.records)
    dns, connects = payloads(result, "net.dns"), payloads(result, "net.connect")
    size = sum(f.stat().st_size for f in net_sandbox.audit.rglob("*") if f.is_file())
    print(f"tried {tried}, records {written}, net.dns {len(dns)}, net.connect {len(connects)}, {size} bytes")
    assert tried > MAX_DETAILED, f"the flood was too slow to tell ({tried} attempts)"
    assert written <= MAX_DETAILED + 50, f"{tried} refused names wrote {written} audit records"
    (summary,) = payloads(result, "net.summary")
    counted = summary["denials_counted_only"]
    assert counted["total"] > 0 and sum(counted["by_rule"].values()) == counted["total"], counted
    assert len(payloads(result, "net.denials_counted")) == 1
