"""Fuzzing the ClientHello and HTTP head readers: real ClientHellos from OpenSSL (python ssl), curl and
Node, synthetic ones with GREASE, ECH outer extensions and padding, fragmented into records any
way, and mutated. Never a crash; never a name other than the one the server would read (OpenSSL,
fed the same bytes, is the reference); never an unchecked pass for bytes that look like TLS or HTTP.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import ssl
import struct
import subprocess
import time
from email.parser import BytesHeaderParser

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from enforcer.egress.sniff import MAX_HELLO, Malformed, RequestHead, parse_head, sniff

from ..helpers.budgets import examples
from ..helpers.netlab import self_signed

NAME = "api.example.test"


# -- ClientHellos from real clients


def _python_hello(server_name: str | None, alpn: list[str], maximum: ssl.TLSVersion | None = None) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if alpn:
        context.set_alpn_protocols(alpn)
    if maximum is not None:
        context.maximum_version = maximum
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def _captured(argv: list[str]) -> bytes:
    """The first TLS record a client program sends to a loopback listener."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        proc = subprocess.Popen(
            [a.replace("PORT", str(port)) for a in argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            listener.settimeout(10)
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(10)
                data = b""
                deadline = time.monotonic() + 10
                while (len(data) < 5 or len(data) < 5 + struct.unpack_from("!H", data, 3)[0]) and (
                    time.monotonic() < deadline
                ):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
        finally:
            proc.kill()
            proc.wait(timeout=10)
    return data


def _real_hellos() -> dict[str, bytes]:
    found = {
        "python h2": _python_hello(NAME, ["h2", "http/1.1"]),
        "python no alpn": _python_hello(NAME, []),
        "python tls1.2": _python_hello(NAME, ["http/1.1"], ssl.TLSVersion.TLSv1_2),
        "python no sni": _python_hello(None, ["http/1.1"]),
    }
    if shutil.which("curl"):
        resolve = f"{NAME}:PORT:127.0.0.1"
        found["curl"] = _captured(["curl", "-sk", "--max-time", "3", "--resolve", resolve, f"https://{NAME}:PORT/"])
        found["curl http2"] = _captured(
            ["curl", "-sk", "--http2", "--max-time", "3", "--resolve", resolve, f"https://{NAME}:PORT/"]
        )
    if shutil.which("node"):
        script = (
            "const t = require('tls').connect({host: '127.0.0.1', port: PORT, servername: 'NAME',"
            " ALPNProtocols: ['h2', 'http/1.1'], rejectUnauthorized: false}); t.on('error', () => {});"
            " setTimeout(() => process.exit(0), 3000);"
        ).replace("NAME", NAME)
        found["node"] = _captured(["node", "-e", script])
    if shutil.which("openssl"):
        found["openssl s_client"] = _captured(
            ["openssl", "s_client", "-connect", "127.0.0.1:PORT", "-servername", NAME, "-alpn", "h2", "-quiet"]
        )
    return found


def build_hello(
    server_name: str | None,
    *,
    alpn: tuple[str, ...] = (),
    grease: bool = False,
    ech: bool = False,
    padding: int = 0,
) -> bytes:
    """A TLS 1.3 ClientHello as browsers shape it: GREASE values, an ECH outer extension, padding."""
    extensions: list[tuple[int, bytes]] = []
    if grease:
        extensions.append((0x0A0A, b""))
    if server_name is not None:
        name = server_name.encode()
        extensions.append((0, struct.pack("!HBH", len(name) + 3, 0, len(name)) + name))
    if alpn:
        names = b"".join(bytes([len(p)]) + p.encode() for p in alpn)
        extensions.append((16, struct.pack("!H", len(names)) + names))
    groups = (b"\x2a\x2a" if grease else b"") + b"\x00\x1d\x00\x17"
    extensions += [
        (43, b"\x04\x03\x04\x03\x03"),  # supported_versions: TLS 1.3, 1.2
        (10, struct.pack("!H", len(groups)) + groups),
        (13, b"\x00\x04\x04\x03\x08\x04"),
        (51, struct.pack("!HHH", 36, 0x1D, 32) + os.urandom(32)),  # key_share x25519
    ]
    if ech:  # outer ECHClientHello: type 0, HPKE suite, config id, enc, payload
        payload = os.urandom(144)
        extensions.append(
            (
                0xFE0D,
                b"\x00\x00\x01\x00\x01\x2a" + struct.pack("!H", 32) + os.urandom(32) + struct.pack("!H", 144) + payload,
            )
        )
    if grease:
        extensions.append((0x1A1A, b"\x00"))
    if padding:
        extensions.append((21, bytes(padding)))
    block = b"".join(struct.pack("!HH", t, len(v)) + v for t, v in extensions)
    suites = (b"\x0a\x0a" if grease else b"") + b"\x13\x01\x13\x02\xc0\x2f"
    body = (
        b"\x03\x03"
        + os.urandom(32)
        + b"\x20"
        + os.urandom(32)
        + struct.pack("!H", len(suites))
        + suites
        + b"\x01\x00"
        + struct.pack("!H", len(block))
        + block
    )
    message = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + struct.pack("!H", len(message)) + message


def refragment(hello: bytes, sizes: list[int]) -> bytes:
    message = hello[5 : 5 + struct.unpack_from("!H", hello, 3)[0]]
    out, at, index = b"", 0, 0
    while at < len(message):
        size = max(1, sizes[index % len(sizes)]) if sizes else len(message)
        part = message[at : at + size]
        out += b"\x16\x03\x01" + struct.pack("!H", len(part)) + part
        at += len(part)
        index += 1
    return out


REAL = _real_hellos()
SYNTHETIC = {
    "grease": build_hello(NAME, alpn=("h2", "http/1.1"), grease=True),
    "grease ech outer": build_hello("public.example.test", alpn=("h2",), grease=True, ech=True),
    "padding": build_hello(NAME, alpn=("http/1.1",), padding=200),
    "no sni": build_hello(None, alpn=("h2",)),
}
CORPUS = {**REAL, **SYNTHETIC}


@pytest.fixture(scope="module")
def openssl_server(tmp_path_factory: pytest.TempPathFactory) -> ssl.SSLContext:
    cert, key = self_signed(tmp_path_factory.mktemp("fuzz-cert"))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


def openssl_names(context: ssl.SSLContext, data: bytes) -> list[str]:
    """The SNI OpenSSL's server reads from these bytes (empty: it read none, or refused them)."""
    seen: list[str] = []
    context.sni_callback = lambda _obj, name, _ctx: seen.append(name) and None  # type: ignore[func-returns-value]
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    server = context.wrap_bio(incoming, outgoing, server_side=True)
    incoming.write(data)
    with contextlib.suppress(ssl.SSLWantReadError, ssl.SSLError):
        server.do_handshake()
    return seen


def test_real_clients_are_captured_and_read() -> None:
    assert {"python h2", "curl", "node", "openssl s_client"} <= set(REAL), sorted(REAL)
    for label, hello in CORPUS.items():
        found = sniff(hello)
        assert found.protocol == "tls" and found.complete and not found.malformed, (label, found)
        if "no sni" in label:
            assert found.server_name is None
        elif label == "grease ech outer":
            assert found.ech and found.server_name == "public.example.test"
        else:
            assert found.server_name == NAME and not found.ech, label
    assert "h2" in sniff(REAL["node"]).alpn and "h2" in sniff(REAL["curl http2"]).alpn


def test_openssl_reads_the_same_names(openssl_server: ssl.SSLContext) -> None:
    for label, hello in CORPUS.items():
        expected = [sniff(hello).server_name]  # OpenSSL calls back with None for no SNI
        assert openssl_names(openssl_server, hello) == expected, label


mutation = st.tuples(st.integers(min_value=0, max_value=4000), st.integers(min_value=0, max_value=255))


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    label=st.sampled_from(sorted(CORPUS)),
    sizes=st.lists(st.integers(min_value=1, max_value=600), max_size=6),
    flips=st.lists(mutation, max_size=4),
    cut=st.one_of(st.none(), st.integers(min_value=0, max_value=4000)),
)
def test_mutated_clienthellos_never_pass_unchecked(
    openssl_server: ssl.SSLContext, label: str, sizes: list[int], flips: list[tuple[int, int]], cut: int | None
) -> None:
    data = bytearray(refragment(CORPUS[label], sizes))
    for at, value in flips:
        if at < len(data):
            data[at] = value
    if cut is not None:
        del data[cut:]
    found = sniff(bytes(data))  # never raises
    if data[:1] == b"\x16":
        assert found.protocol == "tls"  # bytes that look like TLS are never relayed as opaque
    if not found.complete or found.malformed:
        return
    read_by_openssl = openssl_names(openssl_server, bytes(data))
    if read_by_openssl:  # the server read the hello: it must have read the name the filter checked
        theirs = read_by_openssl[0]
        assert (found.server_name or "").lower() == (theirs or "").lower() or not (theirs or "").isascii()


@settings(max_examples=examples(200), deadline=None)
@given(label=st.sampled_from(sorted(CORPUS)), sizes=st.lists(st.integers(min_value=1, max_value=700), max_size=8))
def test_any_fragmentation_reads_the_same_hello(label: str, sizes: list[int]) -> None:
    whole = sniff(CORPUS[label])
    split = refragment(CORPUS[label], sizes)
    assert sniff(split).server_name == whole.server_name and sniff(split).alpn == whole.alpn
    for end in range(0, len(split), max(1, len(split) // 37)):
        prefix = sniff(split[:end])
        assert not prefix.complete and not prefix.malformed  # no prefix ever decides


@settings(max_examples=examples(500), deadline=None)
@given(data=st.binary(max_size=600))
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    for candidate in (data, b"\x16\x03\x01" + data, b"GET / HTTP/1.1\r\n" + data):
        found = sniff(candidate)
        assert found.protocol in ("tls", "http", "ssh", "tcp")
        if candidate[:1] == b"\x16":
            assert found.protocol == "tls"


def test_oversized_hellos_are_refused() -> None:
    message = b"\x01" + (MAX_HELLO + 1).to_bytes(3, "big") + bytes(MAX_HELLO + 1)
    records = b"".join(
        b"\x16\x03\x01" + struct.pack("!H", len(message[i : i + 16384])) + message[i : i + 16384]
        for i in range(0, len(message), 16384)
    )
    assert "larger" in (sniff(records[:16389]).malformed or "")  # refused as soon as its length is read
    endless = b"".join(b"\x16\x03\x01\x00\x01\x01" for _ in range(MAX_HELLO // 6 + 1))  # 1-byte records
    assert "larger" in (sniff(endless).malformed or "")


# -- HTTP heads

_token = st.text(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-!#$%&'*+.^_`|~", min_size=1, max_size=8
)
_value = st.text(st.characters(min_codepoint=0, max_codepoint=0x7F), max_size=20)
_eol = st.sampled_from(["\r\n", "\n", "\r", " \r\n", "\r\r\n"])
_host = st.sampled_from(["api.example.test", "other.example.test", "API.example.test:80", "[2001:db8::1]:8080", ""])


@st.composite
def request_heads(draw: st.DrawFn) -> bytes:
    eol = draw(_eol) if draw(st.booleans()) else "\r\n"
    method = draw(st.sampled_from(["GET", "POST", "get", "PROPFIND", "CONNECT", draw(_token)]))
    target = draw(st.sampled_from(["/", "*", "http://other.example.test/x", "//other.example.test/", "/a b", "x"]))
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "http/1.1", "HTTP/1.1 "]))
    sep = draw(st.sampled_from([" ", " ", " ", "\t", "  ", "\xa0"]))
    lead = draw(st.sampled_from(["", "", "", " ", "\t", "\r\n", "\x0c", "\x85"]))
    lines = [f"{lead}{method}{sep}{target}{sep}{version}"]
    for _ in range(draw(st.integers(min_value=0, max_value=5))):
        kind = draw(st.sampled_from(["host", "Host ", "HOST", "x", "Content-Length", "Transfer-Encoding", " fold"]))
        lines.append(
            f"{kind if kind != 'x' else draw(_token)}:{draw(st.sampled_from(['', ' ', chr(9)]))}"
            + draw(st.one_of(_host, _value, st.sampled_from(["chunked", "5", "gzip, chunked", "-1"])))
        )
    return (eol.join(lines) + eol + eol).encode("latin-1")


def _same(a: RequestHead, b: RequestHead) -> bool:
    return (a.names, a.body, a.content_length, a.canonical) == (b.names, b.body, b.content_length, b.canonical)


@settings(max_examples=examples(1000), deadline=None)
@given(raw=request_heads(), tail=st.binary(max_size=40))
def test_http_heads_are_read_as_the_server_reads_them(raw: bytes, tail: bytes) -> None:
    data = raw + tail
    found = sniff(data)  # never raises
    try:
        head = parse_head(data)
    except Malformed:
        assert found.protocol != "http" or found.malformed or found.protocol == "tcp"
        return
    if head is None:
        return
    assert found.protocol == "http" and found.head is not None and not found.malformed
    assert _same(parse_head(head.canonical), head)  # type: ignore[arg-type]  # the forwarded form is a fixed point
    parsed = BytesHeaderParser().parsebytes(head.canonical.split(b"\r\n", 1)[1])
    hosts = parsed.get_all("Host") or []
    assert [h.rsplit(":", 1)[0].strip("[]") if h.count(":") == 1 or h.startswith("[") else h for h in hosts] == (
        [head.host_header] if head.host_header is not None else []
    )
    for end in range(len(data)):  # any segmentation: a prefix either waits or reads the same head
        try:
            early = parse_head(data[:end])
        except Malformed:
            continue  # refused early (size bounds): refused either way
        assert early is None or _same(early, head)


@settings(max_examples=examples(300), deadline=None)
@given(raw=request_heads())
def test_a_head_that_names_another_host_is_never_taken_for_opaque_bytes(raw: bytes) -> None:
    assume(b"other.example.test" in raw.split(b"\n", 1)[0] or b"ost" in raw)
    found = sniff(raw)
    first = raw.decode("latin-1").strip().split("\n", 1)[0]
    if found.protocol == "tcp":
        assert "HTTP/" not in first.upper()  # only lines naming no HTTP version may be opaque text
    if "HTTP/" in first.upper():  # however it is segmented, no prefix is taken for opaque bytes
        # (a prefix may still be undecided: "S" could begin an SSH banner; more bytes are awaited)
        prefixes = [sniff(raw[:end]) for end in range(1, len(raw))]
        assert all(p.protocol == "http" or not p.complete for p in prefixes)


def test_an_ssh_banner_is_decided_on_its_whole_line() -> None:
    """ "SSH-" is also an HTTP method token: a line naming an HTTP version is a request, checked by
    name; a real banner is ssh once its line is whole."""
    smuggled = sniff(b"SSH- http://other.example.test/ HTTP/1.1\r\nHost: other.example.test\r\n\r\n")
    assert smuggled.protocol == "http" and smuggled.server_name == "other.example.test"
    assert not sniff(b"SSH-2.0-OpenSSH_9.2").complete  # the line is not whole yet
    banner = sniff(b"SSH-2.0-OpenSSH_9.2\r\n")
    assert banner.protocol == "ssh" and banner.complete
