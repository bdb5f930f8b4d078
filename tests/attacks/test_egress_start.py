"""The egress filter says "ready" as soon as the agent's namespace and its listeners exist, and loads
what serves them (its audit writer, the connection filter, dnspython) while the agent already runs.
If that fails, nothing may leave the namespace, and the session's exit record must say why.

The failure here is an operator's: an audit directory the launcher (root, with its capabilities)
can write but the filter (root's uid without capabilities) cannot. The agent tries, from its first
instant and for a while after, every way out: a name through the stub, TCP to a lab server's
address, IPv6, UDP, a TCP connection to the capture port itself."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..helpers.netlab import NetLab, needs_nft, payloads
from ..helpers.sandbox import Sandbox, needs_root

pytestmark = [needs_root, needs_nft]

OTHER_UID = 65533  # owns the audit files: neither root nor the agent

ATTEMPTS = """
import json, socket, struct, time
results = {}
def attempt(name, fn):
    try:
        results.setdefault(name, "OK " + str(fn())[:200])
    except Exception as exc:
        results.setdefault(name, "BLOCKED " + type(exc).__name__)
def tcp(host, port, family=socket.AF_INET):
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(1)
        s.connect((host, port))
        s.sendall(b"GET / HTTP/1.0\\r\\nHost: api.example.test\\r\\n\\r\\n")
        data = s.recv(100)
        if not data:
            raise ConnectionResetError("closed")
        return data
def udp_dns(server):
    name = b"\\x03api\\x07example\\x04test\\x00"
    query = struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + name + struct.pack("!HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(0.5)
        s.sendto(query, (server, 53))
        return s.recv(512)
deadline = time.monotonic() + 3  # from the agent's first instant until well after the filter gave up
rounds = 0
while time.monotonic() < deadline:
    rounds += 1
    attempt(f"resolve {rounds}", lambda: socket.getaddrinfo("api.example.test", 80, type=socket.SOCK_STREAM))
    attempt(f"tcp {rounds}", lambda: tcp("198.51.100.10", 80))
    attempt(f"tcp6 {rounds}", lambda: tcp("2001:db8:1::10", 80, socket.AF_INET6))
    attempt(f"capture port {rounds}", lambda: tcp("127.0.0.1", 15001))
    attempt(f"udp dns {rounds}", lambda: udp_dns("198.51.100.53"))
print(json.dumps(results))
"""


def lock_out_the_filter(audit: Path) -> None:
    """The audit directory's files owned by another uid, for their owner only (the directory stays
    root's: a writer refuses a directory another user owns, the launcher's writer included)."""
    for path in audit.rglob("*"):
        os.chown(path, OTHER_UID, OTHER_UID, follow_symlinks=False)
        path.chmod(0o700 if path.is_dir() else 0o600)


def test_a_filter_that_fails_after_ready_lets_nothing_out_and_the_exit_record_says_so(
    net_sandbox: Sandbox, netlab: NetLab
) -> None:
    # The control, with a filter that works (the launcher creates the log): the name resolves.
    first = net_sandbox.python(ATTEMPTS, timeout=90)
    assert first.code == 0 and payloads(first, "net.start"), first.err
    assert json.loads(first.out.strip().splitlines()[-1])["resolve 1"].startswith("OK"), first.out
    lock_out_the_filter(net_sandbox.audit)
    before = len(netlab.server_events())
    r = net_sandbox.python(ATTEMPTS, timeout=90)
    assert r.code == 0, r.err
    results = json.loads(r.out.strip().splitlines()[-1])
    assert len(results) >= 5
    escaped = {name: outcome for name, outcome in results.items() if not outcome.startswith("BLOCKED")}
    assert not escaped, f"escaped: {escaped}"
    assert netlab.server_events()[before:] == []  # nothing reached the lab's servers
    assert not [k for k in r.kinds() if k.startswith("net.")]  # the filter wrote nothing
    network = r.record("exit")["payload"]["network"]
    assert "the egress filter failed after it started" in network["error"], network
