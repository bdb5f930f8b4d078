"""The egress filter's pure parts: sniffing, the nftables rules, settings, the DNS stub's answers,
the protocol mapping, and the plan's refusal when the filter's tools are missing."""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import dns.message
import dns.rcode
import pytest

from enforcer.egress import netns
from enforcer.egress.dns import DnsStub, Resolution, SyntheticAddresses, UpstreamResolver
from enforcer.egress.sniff import Malformed, protocol_name, sniff
from enforcer.egress_settings import EgressSettings
from enforcer.egress_values import EgressValues, parse_endpoint, system_resolver
from enforcer.policy import NetworkConnect, decide
from enforcer.sandbox.plan import HostFeatures, PlanError, build_plan, load_baseline
from enforcer.settings.model import load as load_settings

from ..helpers.documents import base_adl, compile_doc

REPO = Path(__file__).resolve().parents[2]


def client_hello(server_name: str | None, alpn: list[str] | None = None) -> bytes:
    """A real ClientHello from Python's ssl module, captured from a memory BIO."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if alpn:
        context.set_alpn_protocols(alpn)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_sniff_tls_sni_and_alpn() -> None:
    hello = client_hello("api.example.test", ["h2", "http/1.1"])
    found = sniff(hello)
    assert found.protocol == "tls" and found.server_name == "api.example.test" and found.alpn == ("h2", "http/1.1")
    assert protocol_name(found, 8443) == "https"
    assert sniff(hello[:40]).complete is False  # a ClientHello cut across segments asks for more
    assert protocol_name(sniff(client_hello("x.test", ["imap"])), 993) == "tls"
    assert sniff(client_hello(None)).server_name is None


def test_sniff_http_host() -> None:
    found = sniff(b"GET / HTTP/1.1\r\nHost: api.example.test:8080\r\nAccept: */*\r\n\r\n")
    assert found.protocol == "http" and found.server_name == "api.example.test"
    assert sniff(b"GET / HTTP/1.1\r\nHost: a\r\n").complete is False
    assert sniff(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n").malformed
    assert sniff(b"SSH-2.0-OpenSSH_9.2\r\n").protocol == "ssh"
    assert sniff(b"\x00\x00\x00\x08\x04\xd2\x16\x2f").protocol == "tcp"  # opaque (a PostgreSQL SSLRequest)
    assert sniff(b"GE").complete is False  # could still become an HTTP request


def test_ruleset_captures_tcp_and_dns_and_counts_drops() -> None:
    rules = netns.ruleset(15001, 53)
    assert "meta l4proto { tcp, udp } th dport 53 redirect to :53" in rules
    assert "meta l4proto tcp redirect to :15001" in rules
    assert 'udp dport 443 counter name "quic_dropped" drop' in rules
    assert "policy drop" in rules


def test_settings_from_environment(tmp_path: Path) -> None:
    env = {
        "ADL_ENFORCER_UPSTREAM_DNS": "[2001:db8::53]:5353",
        "ADL_ENFORCER_PUBLIC_TEST_RANGES": "198.51.100.0/24, 203.0.113.0/24",
    }
    settings = load_settings(env).egress()
    assert settings.resolver() == ("2001:db8::53", 5353)
    assert settings.public_test_ranges == ("198.51.100.0/24", "203.0.113.0/24")
    with pytest.raises(ValueError, match="documentation range"):
        load_settings({**env, "ADL_ENFORCER_PUBLIC_TEST_RANGES": "8.8.8.0/24"})
    with pytest.raises(ValueError, match="IP:PORT"):
        load_settings({"ADL_ENFORCER_UPSTREAM_DNS": "dns.example.com:53"})
    with pytest.raises(ValueError, match="documentation range"):  # the model checks too
        EgressSettings(public_test_ranges=["8.8.8.0/24"])
    with pytest.raises(ValueError, match="documentation range"):  # and the values a session is given
        EgressValues(public_test_ranges=("8.8.8.0/24",))
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("# comment\nsearch example\nnameserver fe80::1%eth0\nnameserver 10.0.0.2\n")
    assert system_resolver(resolv) == "[fe80::1]:53" and parse_endpoint("10.0.0.2") == ("10.0.0.2", 53)


class FakeUpstream(UpstreamResolver):
    def __init__(self, zone: dict[str, list[str]]) -> None:
        super().__init__(("192.0.2.53", 53), 1.0)
        self.zone = zone
        self.asked: list[str] = []

    def _query(self, name: str, version: int) -> tuple[Resolution, float]:
        self.asked.append(name)
        if name not in self.zone:
            return Resolution(nxdomain=True), 5.0
        found = [ipaddress.ip_address(a) for a in self.zone[name] if ipaddress.ip_address(a).version == version]
        return Resolution(found), 30.0


def _ask(stub: DnsStub, name: str, qtype: str = "A") -> tuple[dns.message.Message, dict[str, Any]]:
    outcome = stub.answer(dns.message.make_query(name, qtype).to_wire())
    assert outcome.response is not None
    return dns.message.from_wire(outcome.response), outcome.event


def test_dns_stub_answers_allowed_names_with_synthetic_addresses(schemas: Any) -> None:
    policy = compile_doc(
        schemas,
        base_adl(
            permissions={"network": {"allowed_hosts": ["api.example.test", "*.cdn.test"], "allowed_ports": [443]}}
        ),
    )
    upstream = FakeUpstream({"api.example.test": ["203.0.113.5", "2001:db8::5"], "x.cdn.test": ["203.0.113.6"]})
    synthetic = SyntheticAddresses()
    stub = DnsStub(policy, upstream, synthetic)
    reply, event = _ask(stub, "API.Example.Test.")
    answer = reply.answer[0][0].address
    assert event["decision"] == "allow" and event["upstream"] == ["203.0.113.5"]
    assert synthetic.name_for(ipaddress.ip_address(answer)) == "api.example.test"
    reply6, _ = _ask(stub, "api.example.test", "AAAA")
    assert synthetic.name_for(ipaddress.ip_address(reply6.answer[0][0].address)) == "api.example.test"
    assert _ask(stub, "api.example.test")[0].answer[0][0].address == answer  # stable per session
    nodata, _ = _ask(stub, "x.cdn.test", "AAAA")
    assert nodata.rcode() == dns.rcode.NOERROR and not nodata.answer


def test_dns_stub_never_forwards_denied_names(schemas: Any) -> None:
    policy = compile_doc(
        schemas, base_adl(permissions={"network": {"allowed_hosts": ["api.example.test"], "allowed_ports": [443]}})
    )
    upstream = FakeUpstream({"api.example.test": ["203.0.113.5"]})
    stub = DnsStub(policy, upstream, SyntheticAddresses())
    exfil = "c2VjcmV0LWRhdGEtaGVyZQ.a8f3.api.example.test"
    reply, event = _ask(stub, exfil, "TXT")
    assert reply.rcode() == dns.rcode.NXDOMAIN and event["decision"] == "deny"
    assert event["host"] == exfil and event["rules"] == ["net.dns_name_not_allowed"]
    assert upstream.asked == []
    reply, event = _ask(stub, "missing.example.test")
    assert reply.rcode() == dns.rcode.NXDOMAIN and upstream.asked == []


def test_observed_protocols_against_declared_ones(schemas: Any) -> None:
    def verdict(protocols: list[str], observed: str, port: int) -> str:
        doc = base_adl(
            permissions={
                "network": {"allowed_hosts": ["h.test"], "allowed_protocols": protocols, "deny_private": False}
            }
        )
        return decide(compile_doc(schemas, doc), NetworkConnect("h.test", port, observed)).verdict

    assert verdict(["https"], "https", 443) == "ALLOW"
    assert verdict(["https"], "http", 443) == "DENY"  # plain HTTP on an HTTPS-only grant
    assert verdict(["https"], "tcp", 443) == "DENY"  # opaque bytes are not HTTPS
    assert verdict(["ssh"], "ssh", 22) == "ALLOW"
    assert verdict(["ssh"], "tcp", 22) == "DENY"  # decide() never reads one protocol as another
    assert verdict(["ssh"], "http", 22) == "DENY"
    assert verdict(["wss"], "https", 443) == "DENY"
    tcp_any = base_adl(permissions={"network": {"allowed_hosts": ["h.test"], "allowed_protocols": ["tcp"],
                                                "allowed_ports": [443], "deny_private": False}})  # fmt: skip
    assert decide(compile_doc(schemas, tcp_any), NetworkConnect("h.test", 443, "tls")).verdict == "ALLOW"


def test_plan_refuses_network_without_the_filter_tools(schemas: Any) -> None:
    policy = compile_doc(
        schemas, base_adl(permissions={"network": {"allowed_hosts": ["api.example.test"], "allowed_ports": [443]}})
    )
    features = HostFeatures(landlock_abi=4, cgroups="v1", egress_tools_missing=("nft",))
    baseline = load_baseline(REPO / "policies" / "runtime-baseline.yaml")
    with pytest.raises(PlanError, match="needs nft"):
        build_plan(policy, ["/bin/true"], baseline=baseline, environ={}, features=features)
    plan = build_plan(
        policy, ["/bin/true"], baseline=baseline, environ={}, features=features,
        accept_unenforced=frozenset({"network"}),
    )  # fmt: skip
    assert plan.egress is None and plan.accepted_unenforced == ["network"]
    ok = HostFeatures(landlock_abi=4, cgroups="v1")
    plan = build_plan(policy, ["/bin/true"], baseline=baseline, environ={}, features=ok, egress=EgressValues())
    assert plan.egress is not None and not plan.landlock.deny_tcp_connect and plan.landlock.deny_tcp_bind


def test_plan_reads_egress_settings_only_for_a_network_and_refuses_bad_ones(schemas: Any) -> None:
    calls = []

    def loader() -> EgressValues:
        calls.append(1)
        return load_settings({"ADL_ENFORCER_UPSTREAM_DNS": "resolver.example"}).egress()  # a name, not an address

    baseline = load_baseline(REPO / "policies" / "runtime-baseline.yaml")
    features = HostFeatures(landlock_abi=4, cgroups="v1")
    offline = compile_doc(schemas, base_adl())
    plan = build_plan(offline, ["/bin/true"], baseline=baseline, environ={}, features=features, egress=loader)
    assert plan.egress is None and not calls
    online = compile_doc(
        schemas, base_adl(permissions={"network": {"allowed_hosts": ["api.example.test"], "allowed_ports": [443]}})
    )
    with pytest.raises(PlanError, match="ADL_ENFORCER_UPSTREAM_DNS"):
        build_plan(online, ["/bin/true"], baseline=baseline, environ={}, features=features, egress=loader)
    assert calls == [1]
    good = build_plan(
        online, ["/bin/true"], baseline=baseline, environ={}, features=features,
        egress=lambda: load_settings({"ADL_ENFORCER_UPSTREAM_DNS": "192.0.2.53:5353"}).egress(),
    )  # fmt: skip
    assert good.egress is not None and good.egress.resolver() == ("192.0.2.53", 5353)


def test_synthetic_addresses_are_never_real_destinations() -> None:
    synthetic = SyntheticAddresses()
    v4 = synthetic.address_for("a.test", 4)
    assert v4 in ipaddress.ip_network("198.18.0.0/15") and synthetic.name_for(v4) == "a.test"
    assert synthetic.name_for(ipaddress.ip_address("203.0.113.1")) is None


def test_relay_moves_bytes_both_ways() -> None:
    from enforcer.egress.relay import pump, relay

    agent, filter_side = socket.socketpair()
    upstream_side, server = socket.socketpair()
    payload = b"x" * (3 << 20)
    result: list[tuple[int, int]] = []
    pool = ThreadPoolExecutor(2)
    thread = threading.Thread(
        target=lambda: result.append(relay(filter_side, upstream_side, pool, lambda: pump(filter_side, upstream_side)))
    )
    thread.start()
    agent.sendall(b"request")
    agent.shutdown(socket.SHUT_WR)
    received = b""
    while len(received) < 7:
        received += server.recv(100)

    def answer() -> None:
        server.sendall(payload)  # from a thread: the agent side reads concurrently, as a real client does
        server.close()

    sender = threading.Thread(target=answer)
    sender.start()
    agent.settimeout(10)
    got = 0
    while chunk := agent.recv(1 << 20):
        got += len(chunk)
    thread.join(5)
    sender.join(5)
    assert received == b"request" and got == len(payload) and result == [(7, len(payload))]


def test_relay_here_moves_bytes_both_ways_on_the_calling_thread() -> None:
    """A spliced connection is relayed both ways by the thread that handles it (it is given no
    pool): the checked first message goes first, a large answer comes back while the agent still
    sends, and each side's end is passed on."""
    from enforcer.egress.relay import relay_here

    agent, filter_side = socket.socketpair()
    upstream_side, server = socket.socketpair()
    payload = b"y" * (3 << 20)
    result: list[tuple[int, int]] = []
    relaying = threading.Thread(target=lambda: result.append(relay_here(filter_side, upstream_side, b"hello ")))
    relaying.start()

    def answer() -> None:
        server.sendall(payload)
        server.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=answer)
    sender.start()
    agent.sendall(b"world")
    agent.shutdown(socket.SHUT_WR)
    server.settimeout(10)
    received = b""
    while chunk := server.recv(100):
        received += chunk
    agent.settimeout(10)
    got = 0
    while chunk := agent.recv(1 << 20):
        got += len(chunk)
    relaying.join(5)
    sender.join(5)
    assert received == b"hello world" and got == len(payload) and result == [(11, len(payload))]
    for sock in (agent, filter_side, upstream_side, server):
        sock.close()


def test_relay_here_ends_both_ways_when_one_side_resets() -> None:
    from enforcer.egress.relay import relay_here

    agent, filter_side = socket.socketpair()
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    result: list[tuple[int, int]] = []
    relaying = threading.Thread(target=lambda: result.append(relay_here(filter_side, client, b"ping")))
    relaying.start()
    assert server.recv(10) == b"ping"
    server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    server.close()  # a reset from upstream while the agent's side is idle
    relaying.join(5)
    assert not relaying.is_alive() and result == [(4, 0)]
    agent.settimeout(5)
    assert agent.recv(10) == b""  # the agent's side was shut too
    for sock in (agent, filter_side, listener, client):
        sock.close()


def test_a_dial_gives_up_after_its_timeout_and_later_sends_have_none() -> None:
    """The filter's dial is one blocking connect(2) bounded by its timeout; once dialled, the
    threaded relay lifts the limit so that a slow reader does not cut the connection."""
    import time

    from enforcer.egress.filter import blocking_sends, dial

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    address, port = ipaddress.ip_address("127.0.0.1"), listener.getsockname()[1]
    queued: list[socket.socket] = []
    try:
        dialled = dial(address, port, 1.0)
        queued.append(dialled)
        assert dialled.gettimeout() is None  # blocking, as the relay expects
        blocking_sends(dialled)
        assert dialled.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, 16) == struct.pack("ll", 0, 0)
        with pytest.raises(TimeoutError):  # the accept queue is full: the SYNs go unanswered
            for _ in range(4):
                started = time.monotonic()
                queued.append(dial(address, port, 0.3))
        assert time.monotonic() - started < 0.9
    finally:
        for sock in (listener, *queued):
            sock.close()


def test_a_relay_pipe_is_kept_for_the_next_connection_only_when_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """A next connection gets a kept pipe only if nothing of the last one is in it: a pipe the
    count calls drained but the kernel does not, or one a cut left bytes in, is closed; and only so
    many are kept, whatever a burst of connections left behind."""
    from enforcer.egress import relay

    monkeypatch.setattr(relay, "_kept", [])
    monkeypatch.setattr(relay, "MAX_KEPT_PIPES", 2)
    read_end, write_end = relay.take_pipe()
    relay.give_back(read_end, write_end, drained=True)
    assert relay.take_pipe() == (read_end, write_end)  # kept, and given to the next one
    os.write(write_end, b"left over")
    relay.give_back(read_end, write_end, drained=True)  # the kernel says otherwise
    assert _closed(read_end) and _closed(write_end) and relay._kept == []
    cut = relay.take_pipe()
    relay.give_back(*cut, drained=False)  # a cut: whatever the kernel says
    assert all(_closed(fd) for fd in cut) and relay._kept == []
    burst = [relay.take_pipe() for _ in range(3)]
    for pipe in burst:
        relay.give_back(*pipe, drained=True)
    assert relay._kept == burst[:2] and all(_closed(fd) for fd in burst[2])
    for pipe in relay._kept:
        os.close(pipe[0])
        os.close(pipe[1])


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


# -- whole-message sniffing: segmentation, bounds, names


def records(hello: bytes, sizes: list[int]) -> bytes:
    """The same ClientHello handshake message re-split into TLS records of the given sizes."""
    message = hello[5 : 5 + int.from_bytes(hello[3:5], "big")]
    out, at = b"", 0
    for size in [*sizes, len(message)]:
        part = message[at : at + size]
        if not part:
            break
        out += b"\x16\x03\x01" + len(part).to_bytes(2, "big") + part
        at += len(part)
    return out


def test_sniff_reassembles_a_clienthello_split_across_records() -> None:
    hello = client_hello("api.example.test", ["http/1.1"])
    for sizes in ([1], [1] * 40, [3, 500], [100, 100, 100]):
        split = records(hello, sizes)
        assert sniff(split).server_name == "api.example.test", sizes
        for cut in range(1, len(split)):
            prefix = sniff(split[:cut])
            assert prefix.protocol == "tls" and not prefix.complete and not prefix.malformed
    assert sniff(records(hello, [1]) + b"\x17\x03\x03\x00\x01x").server_name == "api.example.test"  # early data after
    broken = hello[:5] + b"\x02" + hello[6:]  # not a ClientHello
    assert sniff(broken).malformed
    interleaved = records(hello, [10])
    interleaved = interleaved[:15] + b"\x15\x03\x03\x00\x02\x01\x00" + interleaved[15:]  # an alert mid-hello
    assert sniff(interleaved).malformed
    assert sniff(b"\x16\x03\x01\xff\xff").malformed  # a record larger than TLS allows


def test_sniff_http_heads_strictly() -> None:
    bare_lf = sniff(b"GET / HTTP/1.1\nHost: other.test\n\n")
    assert bare_lf.server_name == "other.test" and bare_lf.head is not None
    assert bare_lf.head.canonical == b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n"
    absolute = sniff(b"GET http://other.test:8080/x HTTP/1.1\r\nHost: api.test\r\n\r\n")
    assert absolute.head is not None and absolute.head.names == ("api.test", "other.test")
    assert sniff(b"get / HTTP/1.1\r\nHost: other.test\r\n\r\n").server_name == "other.test"  # any token is a method
    assert sniff(b"\r\nPROPFIND / HTTP/1.1\r\nHost: x.test\r\n\r\n").server_name == "x.test"
    assert sniff(b"GET /\r\n").malformed  # HTTP/0.9 names no host
    for bad in (
        b"GET / HTTP/1.1\r\nHost: a.test\r\n x: folded\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost : a.test\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a.test\rX: y\r\n\r\n",
        b"GET  / HTTP/1.1\r\nHost: a.test\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: api.test@b.test\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: +5\r\n\r\n",
        b"GET / HTTP/1.1\r\n" + b"X: " + b"y" * 40000 + b"\r\n\r\n",
    ):
        assert sniff(bad).malformed, bad[:60]
    assert sniff(b"GET / HTTP/1.1\r\nHost: a.test\r\nX: " + b"y" * 100).complete is False
    assert sniff(b"G").complete is False and sniff(b"GET / HT").complete is False
    for lenient in (b" GET / HTTP/1.1\r\n", b"\tGET\t/", b"GET\xa0/\xa0HTTP/1.1\r\n", b"\x0cGET / HTTP/1.1"):
        assert sniff(lenient).protocol == "http", lenient  # whitespace a lenient server skips or splits on
    assert sniff(b"A\x00\x00\x00\xd4\x07").protocol == "tcp"  # a binary message that starts with a letter
    assert sniff(b"NICK agent\r\n").protocol == "tcp"  # a text protocol that is not HTTP
    assert sniff(b"*1\r\n$4\r\nPING\r\n").protocol == "tcp"


def test_protocol_names_state_only_what_the_wire_shows() -> None:
    from enforcer.egress.sniff import Sniffed

    assert protocol_name(Sniffed("tls", alpn=("h2",)), 8443) == "https"  # grpc or wss inside cannot be seen
    assert protocol_name(Sniffed("tls", alpn=("imap",)), 993) == "tls"
    assert protocol_name(Sniffed("http"), 80) == "http"
    handshake = sniff(b"GET /chat HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
    assert protocol_name(handshake, 80) == "ws"
    h2c = sniff(b"GET / HTTP/1.1\r\nHost: a.test\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n")
    assert protocol_name(h2c, 80) == "http"  # and refused by the filter: it cannot follow h2c
    assert protocol_name(Sniffed("ssh"), 22) == "ssh"
    assert protocol_name(Sniffed("tcp", silent=True), 25) == "tcp"


def _writer(sock: socket.socket, parts: list[bytes], pause: float) -> threading.Thread:
    def run() -> None:
        import time

        for part in parts:
            sock.sendall(part)
            time.sleep(pause)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_request_bodies_are_framed_so_the_next_head_is_found() -> None:
    from enforcer.egress.stream import ClientReader, forward_body, read_head

    stream = (
        b"POST /a HTTP/1.1\nHost: a.test\nTransfer-Encoding: chunked\n\n"
        b"5;ext=1\nhello\n0\nTrailer: x\n\n"
        b"POST /b HTTP/1.1\r\nHost: b.test\r\nContent-Length: 16\r\n\r\nGET / HTTP/1.1\r\n"
        b"GET /c HTTP/1.1\r\nHost: c.test\r\n\r\n"
    )
    agent, filter_side = socket.socketpair()
    upstream_side, server = socket.socketpair()
    with agent, filter_side, upstream_side, server:
        writer = _writer(agent, [bytes([b]) for b in stream[:80]] + [stream[80:]], 0.0)
        reader = ClientReader(filter_side)
        hosts = []
        for _ in range(3):
            head = read_head(reader, 2.0, idle=False)
            assert head is not None
            reader.take(head.size)
            hosts.append(head.host_header)
            upstream_side.sendall(head.canonical)
            forward_body(reader, upstream_side, head, 2.0)
        writer.join()
        upstream_side.shutdown(socket.SHUT_WR)
        forwarded = b""
        while chunk := server.recv(65536):
            forwarded += chunk
    assert hosts == ["a.test", "b.test", "c.test"]  # the body that looks like a head was not taken for one
    assert forwarded == (
        b"POST /a HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\nTrailer: x\r\n\r\n"
        b"POST /b HTTP/1.1\r\nHost: b.test\r\nContent-Length: 16\r\n\r\nGET / HTTP/1.1\r\n"
        b"GET /c HTTP/1.1\r\nHost: c.test\r\n\r\n"
    )


def test_names_a_first_message_must_carry() -> None:
    from enforcer.egress.filter import _name_problem
    from enforcer.egress.sniff import Sniffed

    def rule(found: Sniffed, host: str, name: str | None) -> str | None:
        problem = _name_problem(found, host, name)
        return problem.rule if problem else None

    api = "api.example.test"
    assert rule(sniff(client_hello(api)), api, api) is None
    assert rule(sniff(client_hello("API.example.test")), api, api) is None
    assert rule(sniff(client_hello("other.example.test")), api, api) == "net.host_mismatch"
    assert rule(sniff(client_hello(None)), api, api) == "net.sni_missing"
    assert rule(sniff(client_hello(None)), "198.51.100.10", None) is None  # a literal address: RFC 6066
    assert rule(Sniffed("tls", server_name=api, ech=True), api, api) == "net.ech"
    assert rule(sniff(b"GET / HTTP/1.1\r\n\r\n"), api, api) == "net.host_missing"
    assert rule(sniff(b"GET / HTTP/1.0\r\n\r\n"), "198.51.100.10", None) is None
    assert rule(sniff(b"GET http://other.example.test/ HTTP/1.1\r\nHost: api.example.test\r\n\r\n"), api, api) == (
        "net.host_mismatch"
    )
    assert rule(Sniffed("http", malformed="incomplete HTTP request head after 5 s"), api, api) == "net.incomplete"
    forwarded = b"GET / HTTP/1.1\r\nHost: api.example.test\r\nX-Forwarded-Host: other.example.test\r\n\r\n"
    assert rule(sniff(forwarded), api, api) == "net.host_mismatch"  # reverse proxies may route by it
    forwarded = b'GET / HTTP/1.1\r\nHost: api.example.test\r\nForwarded: for=x;host="other.example.test"\r\n\r\n'
    assert rule(sniff(forwarded), api, api) == "net.host_mismatch"
    assert rule(sniff(forwarded.replace(b"other", b"api")), api, api) is None
    smuggling = b"GET / HTTP/1.1\r\nHost: api.example.test\r\nContent-Length: 5\r\n\r\n"
    assert rule(sniff(smuggling), api, api) == "net.unreadable"  # read as a request by servers ignoring it
    assert rule(sniff(smuggling.replace(b"GET", b"POST")), api, api) is None
    assert rule(Sniffed("tcp", silent=True), api, api) is None  # opaque: decided as tcp by the policy


def test_a_client_that_closes_after_an_empty_line_closed_between_requests() -> None:
    from enforcer.egress.stream import ClientReader, read_head

    agent, filter_side = socket.socketpair()
    with agent, filter_side:
        agent.sendall(b"\r\n")  # what some clients send after a POST body
        agent.shutdown(socket.SHUT_WR)
        assert read_head(ClientReader(filter_side), 1.0, idle=True) is None
    agent, filter_side = socket.socketpair()
    with agent, filter_side:
        agent.sendall(b"GET / HTTP/1.1\r\nHost: a")
        agent.shutdown(socket.SHUT_WR)
        with pytest.raises(Malformed):
            read_head(ClientReader(filter_side), 1.0, idle=True)


def test_relay_here_sends_the_checked_first_message_before_anything_else() -> None:
    """The first message goes upstream before the agent sends more or anything comes back, and is
    counted."""
    from enforcer.egress.relay import relay_here

    agent, filter_side = socket.socketpair()
    upstream_side, server = socket.socketpair()
    result: list[tuple[int, int]] = []
    thread = threading.Thread(target=lambda: result.append(relay_here(filter_side, upstream_side, b"hello ")))
    thread.start()
    server.settimeout(5)
    assert server.recv(100) == b"hello "  # while the agent has sent nothing more
    agent.sendall(b"world")
    agent.shutdown(socket.SHUT_WR)
    server.settimeout(5)
    received = b""
    while chunk := server.recv(100):
        received += chunk
    server.sendall(b"ok")
    server.close()
    agent.settimeout(5)
    assert agent.recv(10) == b"ok"
    thread.join(5)
    assert received == b"world" and result == [(11, 2)]
    for sock in (agent, filter_side, upstream_side):
        sock.close()
