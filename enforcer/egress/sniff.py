"""What a client's bytes say about the host it means: the TLS ClientHello's SNI (and ALPN), an HTTP
request head's Host and request target. Pure functions over bytes.

Hand-written: TLS libraries parse a ClientHello only as part of a handshake they terminate, and the
filter must read it without terminating TLS (the agent talks to the real server end to end).

Every parser here answers one of three things: complete (with what it found), "need more bytes",
or malformed. Whatever looks like TLS or HTTP is never answered as opaque bytes: the caller waits
for the rest (within its own size and time bounds) or refuses.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

MAX_HELLO = 65536  # bytes of TLS records that may carry one ClientHello (any fragmentation)
MAX_RECORD = 16384 + 256  # TLSPlaintext.length limit, with the slack TLS 1.2 gives ciphertext
MAX_HTTP_HEAD = 32768
MAX_LINE = 8192  # a request line or a chunk-size line
MAX_LEADING_EMPTY_LINES = 4  # RFC 9112 2.2: a server ignores empty lines before a request line
ECH_EXTENSIONS = (0xFE0D, 0xFFCE)  # encrypted_client_hello, and the draft ESNI it replaced
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HTTP_VERSION = re.compile(rb"HTTP/1\.[01]")
_HOST = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=%-]*")  # RFC 3986 reg-name, before normalisation
_TCHAR_FIRST = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_FIELD_VALUE_BAD = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
# Lenient servers split a request line on any whitespace (Python's http.server: str.split() over
# Latin-1), so only bytes no server reads as a space rule a line out as an HTTP request early.
_LENIENT_SPACE = b" \t\n\x0b\x0c\r\x1c\x1d\x1e\x1f\x85\xa0"
_NOT_IN_REQUEST_LINE = re.compile(rb"[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f\xa1-\xff]")


class Malformed(Exception):
    """Bytes that claim a protocol the filter reads but do not parse: the connection is refused."""


@dataclass(frozen=True)
class RequestHead:
    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]
    host_header: str | None  # the Host header's host, without its port (None: no Host header)
    target_host: str | None  # the host an absolute-form or authority-form target names
    body: str  # none | length | chunked
    content_length: int
    size: int  # bytes of the input this head took (leading empty lines and the blank line included)
    canonical: bytes  # the head as forwarded: one space between parts, CRLF line ends

    forwarded_hosts: tuple[str, ...] = ()  # X-Forwarded-Host / Forwarded host=: proxies may route by them

    @property
    def names(self) -> tuple[str, ...]:
        """Every host the request names (each must be the connection's host)."""
        return tuple(n for n in (self.host_header, self.target_host) if n is not None) + self.forwarded_hosts


@dataclass(frozen=True)
class Sniffed:
    protocol: str  # tls | http | ssh | tcp
    server_name: str | None = None  # SNI, or the HTTP request's host
    alpn: tuple[str, ...] = ()
    complete: bool = True  # False: more bytes are needed to decide
    malformed: str | None = None
    size: int = 0  # bytes the parsed message took (the ClientHello's records, the request head)
    ech: bool = False  # the ClientHello carries an encrypted (inner) ClientHello
    head: RequestHead | None = None
    silent: bool = False  # the client sent nothing (a server-speaks-first protocol)
    names: tuple[str, ...] = field(default=())  # every name the bytes carried
    need: int = 0  # incomplete: no answer can change before the input is this long


NEED_MORE = Sniffed("tcp", complete=False)


def sniff(data: bytes) -> Sniffed:
    """Classify and parse the first bytes a client sent. `complete=False` asks for more bytes."""
    if not data:
        return NEED_MORE
    if data[0] == 0x16:
        return _tls(data)
    if data.startswith(b"SSH-"):
        # "SSH-" is also a valid HTTP method token: the banner is decided on its whole line
        # (RFC 4253: at most 255 bytes), and a line naming an HTTP version is parsed as a request.
        line_end = data.find(b"\n")
        if line_end < 0:
            return Sniffed("ssh", complete=False, need=len(data) + 1) if len(data) < 255 else Sniffed("ssh")
        if b" HTTP/" in data[:line_end].upper():
            return sniff_http(data)
        return Sniffed("ssh")
    if b"SSH-".startswith(data):
        return Sniffed("ssh", complete=False)
    if _may_be_http(data):
        return sniff_http(data)
    return Sniffed("tcp")


def _may_be_http(data: bytes) -> bool:
    """Could these bytes start an HTTP request (any token as method: servers accept unknown and
    lower-case ones; empty lines first: servers skip them)?"""
    rest = data.lstrip(_LENIENT_SPACE)
    if len(data) - len(rest) > 2 * MAX_LEADING_EMPTY_LINES:
        return True  # parsed as HTTP, refused there
    return not rest or rest[0] in _TCHAR_FIRST


def _leading_empty_lines(data: bytes) -> tuple[int, int]:
    """(where the request line starts, how many empty lines, CRLF or bare LF, come before it)."""
    start = empty = 0
    while data.startswith(b"\n", start) or data.startswith(b"\r\n", start):
        start += 1 if data[start] == 0x0A else 2
        empty += 1
    return start, empty


def sniff_http(data: bytes) -> Sniffed:
    """An HTTP request head, or text that is no HTTP request ('tcp'), or need-more."""
    start, empty = _leading_empty_lines(data)
    if empty > MAX_LEADING_EMPTY_LINES:
        return Sniffed("http", malformed="too many empty lines before the request line")
    line_end = data.find(b"\n", start)
    first = data[start:] if line_end < 0 else data[start:line_end]
    if line_end < 0:
        if b"HTTP/" in first.upper():
            if len(data) >= MAX_LINE:
                return Sniffed("http", malformed=f"request line longer than {MAX_LINE} bytes")
            return Sniffed("http", complete=False)
        if len(data) >= MAX_LINE or _NOT_IN_REQUEST_LINE.search(first.removesuffix(b"\r")):
            return Sniffed("tcp")  # no request line has these bytes
        return Sniffed("http", complete=False)  # might still become a request line
    if b"HTTP/" not in first.upper():
        words = first.decode("latin-1").split()
        if words and words[0].upper() == "GET" and 1 <= len(words) <= 2:
            return Sniffed("http", malformed="an HTTP/0.9 request names no host")
        return Sniffed("tcp")  # a text protocol that is not HTTP (its first line names no version)
    try:
        head = parse_head(data)
    except Malformed as exc:
        return Sniffed("http", malformed=str(exc), names=claimed_hosts(data))
    if head is None:
        return Sniffed("http", complete=False)
    return http_result(head)


_CLAIMED_HOST = re.compile(rb"^[ \t]*host[ \t]*:[ \t]*([^\r\n]{0,300})", re.IGNORECASE | re.MULTILINE)


def claimed_hosts(data: bytes) -> tuple[str, ...]:
    """For the audit record of a head that did not parse: the Host values it seems to carry."""
    end = head_end(data)
    head = data[: end if 0 <= end <= MAX_HTTP_HEAD else MAX_HTTP_HEAD]
    return tuple(m.group(1).strip().decode("latin-1") for m in _CLAIMED_HOST.finditer(head))[:4]


def http_result(head: RequestHead) -> Sniffed:
    names = head.names
    return Sniffed("http", server_name=names[0] if names else None, size=head.size, head=head, names=names)


def head_end(data: bytes, start: int = 0) -> int:
    """Index just past the blank line that ends a head begun at `start` (CRLF or bare LF), or -1."""
    ends = [at + n for at, n in ((data.find(b"\n\n", start), 2), (data.find(b"\n\r\n", start), 3)) if at >= 0]
    return min(ends) if ends else -1


def parse_head(data: bytes) -> RequestHead | None:
    """Parse one request head at the start of `data` (None: incomplete). Strict where servers
    differ: the filter forwards the head re-serialised, so the server reads exactly what was checked."""
    start, empty = _leading_empty_lines(data)
    if empty > MAX_LEADING_EMPTY_LINES:
        raise Malformed("too many empty lines before the request line")
    end = head_end(data, start)
    if end < 0:
        if len(data) >= MAX_HTTP_HEAD:
            raise Malformed(f"HTTP request head larger than {MAX_HTTP_HEAD // 1024} KiB")
        first = data.find(b"\n", start)
        if first < 0 and len(data) - start > MAX_LINE:
            raise Malformed(f"request line longer than {MAX_LINE} bytes")
        return None
    if end > MAX_HTTP_HEAD:
        raise Malformed(f"HTTP request head larger than {MAX_HTTP_HEAD // 1024} KiB")
    lines = _lines(data[start:end])
    if not lines or not lines[-1] == b"":
        raise Malformed("request head does not end with an empty line")
    request_line, field_lines = lines[0], lines[1:-1]
    parts = request_line.split(b" ")
    if len(parts) != 3:
        raise Malformed("request line is not 'method SP target SP version'")
    method, target, version = parts
    if not _TOKEN.fullmatch(method):
        raise Malformed("request method is not a token")
    if not _HTTP_VERSION.fullmatch(version):
        what = version.decode("ascii", "replace")[:20]
        raise Malformed(f"HTTP version '{what}' is not read here (only HTTP/1.0 and HTTP/1.1)")
    if not target or any(b <= 0x20 or b >= 0x7F for b in target):
        raise Malformed("request target is empty or has a space, control or non-ASCII byte")
    headers = tuple(_field(line) for line in field_lines)
    if len(headers) > 256:
        raise Malformed("more than 256 header fields")
    method_text, target_text, version_text = method.decode(), target.decode(), version.decode()
    host_header = _host_header(headers)
    target_host = _target_host(method_text, target_text)
    body, length = _framing(headers, version_text)
    canonical = b"".join(
        [method, b" ", target, b" ", version, b"\r\n"]
        + [f"{n}: {v}\r\n".encode("latin-1") for n, v in headers]
        + [b"\r\n"]
    )
    return RequestHead(
        method_text,
        target_text,
        version_text,
        headers,
        host_header,
        target_host,
        body,
        length,
        end,
        canonical,
        _forwarded_hosts(headers),
    )


def _lines(block: bytes) -> list[bytes]:
    lines = block.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # after the final LF
    out = []
    for line in lines:
        if line.endswith(b"\r"):
            line = line[:-1]
        if b"\r" in line:
            raise Malformed("a bare CR inside a request head")
        out.append(line)
    return out


def _field(line: bytes) -> tuple[str, str]:
    if line[:1] in (b" ", b"\t"):
        raise Malformed("obsolete line folding in a header field")
    name, colon, value = line.partition(b":")
    if not colon or not _TOKEN.fullmatch(name):
        raise Malformed("a header field without a valid name (or with space before its colon)")
    value = value.strip(b" \t")
    if _FIELD_VALUE_BAD.search(value):
        raise Malformed(f"control byte in header field '{name.decode()}'")
    return name.decode("ascii"), value.decode("latin-1")


def fields(headers: tuple[tuple[str, str], ...], name: str) -> list[str]:
    return [v for n, v in headers if n.lower() == name]


def tokens(headers: tuple[tuple[str, str], ...], name: str) -> list[str]:
    return [t.strip().lower() for value in fields(headers, name) for t in value.split(",") if t.strip()]


def is_websocket(head: RequestHead) -> bool:
    """A WebSocket opening handshake (RFC 6455 4.1): a GET without a body asking to switch to
    websocket and nothing else."""
    return (
        head.method == "GET"
        and head.body == "none"
        and tokens(head.headers, "upgrade") == ["websocket"]
        and "upgrade" in tokens(head.headers, "connection")
    )


def _host_header(headers: tuple[tuple[str, str], ...]) -> str | None:
    values = fields(headers, "host")
    if len(values) > 1:
        raise Malformed("more than one Host header")
    if not values:
        return None
    return _authority_host(values[0], "Host header")


def _forwarded_hosts(headers: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """Hosts named by the headers a reverse proxy may route by instead of Host."""
    found = [_authority_host(v.strip(), "X-Forwarded-Host") for v in tokens_raw(headers, "x-forwarded-host")]
    for element in tokens_raw(headers, "forwarded"):
        for pair in element.split(";"):
            key, _, value = pair.strip().partition("=")
            if key.strip().lower() == "host":
                found.append(_authority_host(value.strip().strip('"'), "Forwarded host"))
    return tuple(found)


def tokens_raw(headers: tuple[tuple[str, str], ...], name: str) -> list[str]:
    return [t for value in fields(headers, name) for t in value.split(",") if t.strip()]


def _authority_host(authority: str, what: str) -> str:
    if "@" in authority:
        raise Malformed(f"{what} carries userinfo")
    if authority.startswith("["):
        literal, bracket, rest = authority[1:].partition("]")
        if not bracket or (rest and not (rest.startswith(":") and rest[1:].isdigit())) or not literal:
            raise Malformed(f"{what} '{authority[:100]}' is not host[:port]")
        return literal
    host, _, port = authority.partition(":")
    if (port and not port.isdigit()) or not _HOST.fullmatch(host) or not host:
        raise Malformed(f"{what} '{authority[:100]}' is not host[:port]")
    return host


def _target_host(method: str, target: str) -> str | None:
    if method.upper() == "CONNECT":
        return _authority_host(target, "CONNECT target")
    if target.startswith("/") or target == "*":
        return None
    scheme, sep, rest = target.partition("://")
    if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
        raise Malformed("request target is neither origin-form nor absolute-form")
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    return _authority_host(authority, "absolute-form request target")


def _framing(headers: tuple[tuple[str, str], ...], version: str) -> tuple[str, int]:
    """How the request's body is delimited (RFC 9112 6): refused where a server could read it
    differently."""
    codings = fields(headers, "transfer-encoding")
    lengths = fields(headers, "content-length")
    if codings:
        if lengths:
            raise Malformed("both Transfer-Encoding and Content-Length")
        if version == "HTTP/1.0":
            raise Malformed("Transfer-Encoding in an HTTP/1.0 request")
        listed = [c.strip().lower() for value in codings for c in value.split(",")]
        if listed != ["chunked"]:
            raise Malformed(f"Transfer-Encoding '{', '.join(codings)[:100]}' cannot be framed (only 'chunked')")
        return "chunked", 0
    if lengths:
        if len(lengths) > 1 or not lengths[0].isdigit() or not lengths[0].isascii() or len(lengths[0]) > 18:
            raise Malformed("Content-Length is not exactly one decimal number")
        size = int(lengths[0])
        return ("length", size) if size else ("none", 0)
    return "none", 0


def parse_chunk_line(data: bytes) -> tuple[int, int] | None:
    """(chunk size, bytes the line took) from a chunk-size line, or None when incomplete."""
    end = data.find(b"\n")
    if end < 0:
        if len(data) > MAX_LINE:
            raise Malformed("chunk-size line too long")
        return None
    line = data[:end]
    if line.endswith(b"\r"):
        line = line[:-1]
    size_text, _, extension = line.partition(b";")
    if not size_text or len(size_text) > 15 or not all(c in b"0123456789abcdefABCDEF" for c in size_text):
        raise Malformed("chunk size is not a hexadecimal number")
    if _FIELD_VALUE_BAD.search(extension) or b"\r" in extension:
        raise Malformed("control byte in a chunk extension")
    return int(size_text, 16), end + 1


def parse_line_end(data: bytes) -> int | None:
    """Bytes of the CRLF (or bare LF) that must follow chunk data; None when incomplete."""
    if data.startswith(b"\r\n"):
        return 2
    if data.startswith(b"\n"):
        return 1
    if data in (b"", b"\r"):
        return None
    raise Malformed("chunk data not followed by a line end")


def parse_trailers(data: bytes) -> tuple[bytes, int] | None:
    """The trailer section after the last chunk: (canonical bytes, bytes taken), None when incomplete."""
    if data.startswith(b"\r\n"):
        return b"\r\n", 2
    if data.startswith(b"\n"):
        return b"\r\n", 1
    end = head_end(data)
    if end < 0:
        if len(data) >= MAX_HTTP_HEAD:
            raise Malformed("chunked trailers too large")
        return None
    lines = _lines(data[:end])[:-1]
    trailers = [_field(line) for line in lines]
    return b"".join(f"{n}: {v}\r\n".encode("latin-1") for n, v in trailers) + b"\r\n", end


# -- TLS


def _tls(data: bytes) -> Sniffed:
    """Reassemble the ClientHello from as many handshake records as it was split into."""
    pos = 0
    message = bytearray()
    while True:
        if len(data) < pos + 5:
            missing = 4 + int.from_bytes(message[1:4], "big") - len(message) if len(message) >= 4 else 1
            return Sniffed("tls", complete=False, need=pos + 5 + max(1, missing))
        content_type, major, record_len = data[pos], data[pos + 1], struct.unpack_from("!H", data, pos + 3)[0]
        if content_type != 0x16:
            return Sniffed("tls", malformed=f"a TLS record of type {content_type} before the ClientHello was complete")
        if major != 3:
            return Sniffed("tls", malformed="TLS record with an unknown version")
        if record_len == 0 or record_len > MAX_RECORD:
            return Sniffed("tls", malformed=f"TLS handshake record of {record_len} bytes")
        if pos + 5 + record_len > MAX_HELLO:
            return Sniffed("tls", malformed=f"ClientHello larger than {MAX_HELLO // 1024} KiB")
        if len(data) < pos + 5 + record_len:
            return Sniffed("tls", complete=False, need=pos + 5 + record_len)
        message += data[pos + 5 : pos + 5 + record_len]
        pos += 5 + record_len
        if len(message) < 4:
            continue
        if message[0] != 0x01:
            return Sniffed("tls", malformed="first handshake message is not a ClientHello")
        length = int.from_bytes(message[1:4], "big")
        if 4 + length > MAX_HELLO:
            return Sniffed("tls", malformed=f"ClientHello larger than {MAX_HELLO // 1024} KiB")
        if len(message) < 4 + length:
            continue
        if len(message) > 4 + length:
            return Sniffed("tls", malformed="another handshake message follows the ClientHello")
        try:
            return _client_hello(memoryview(bytes(message))[4:], pos)
        except (IndexError, struct.error, UnicodeDecodeError, ValueError) as exc:
            return Sniffed("tls", malformed=f"unreadable ClientHello: {exc}")


def _take(body: memoryview, pos: int, size: int) -> tuple[memoryview, int]:
    if pos + size > len(body):
        raise ValueError("a length runs past its container")
    return body[pos : pos + size], pos + size


def _vector(body: memoryview, pos: int, width: int) -> tuple[memoryview, int]:
    if pos + width > len(body):
        raise ValueError("a length runs past its container")
    size = int.from_bytes(body[pos : pos + width], "big")
    return _take(body, pos + width, size)


def _client_hello(body: memoryview, size: int) -> Sniffed:
    _, pos = _take(body, 0, 2 + 32)  # legacy_version, random
    session, pos = _vector(body, pos, 1)
    suites, pos = _vector(body, pos, 2)
    compression, pos = _vector(body, pos, 1)
    if len(session) > 32 or not suites or len(suites) % 2 or not compression:
        raise ValueError("session id, cipher suites or compression methods out of range")
    if pos == len(body):
        return Sniffed("tls", size=size)  # no extensions: no SNI
    extensions, pos = _vector(body, pos, 2)
    if pos != len(body):
        raise ValueError("bytes after the extensions")
    server_name: str | None = None
    alpn: list[str] = []
    seen: set[int] = set()
    ech = False
    at = 0
    while at < len(extensions):
        if at + 4 > len(extensions):
            raise ValueError("truncated extension header")
        ext_type = struct.unpack_from("!H", extensions, at)[0]
        ext, at = _vector(extensions, at + 2, 2)
        if ext_type in seen:
            raise ValueError(f"extension {ext_type} appears twice")
        seen.add(ext_type)
        if ext_type == 0:
            server_name = _server_name(ext)
        elif ext_type == 16:
            alpn = _alpn(ext)
        elif ext_type in ECH_EXTENSIONS:
            ech = True
    names = (server_name,) if server_name else ()
    return Sniffed("tls", server_name=server_name, alpn=tuple(alpn), size=size, ech=ech, names=names)


def _server_name(ext: memoryview) -> str:
    names, end = _vector(ext, 0, 2)
    if end != len(ext) or not names:
        raise ValueError("server_name extension with a bad length")
    found: str | None = None
    at = 0
    while at < len(names):
        name_type = names[at]
        name, at = _vector(names, at + 1, 2)
        if name_type == 0:
            if found is not None:
                raise ValueError("two host names in SNI")
            text = bytes(name).decode("ascii")
            if not text or not _HOST.fullmatch(text):
                raise ValueError("SNI host name has bytes no host name has")
            found = text
    if found is None:
        raise ValueError("server_name extension without a host name")
    return found


def _alpn(ext: memoryview) -> list[str]:
    names, end = _vector(ext, 0, 2)
    if end != len(ext) or not names:
        raise ValueError("ALPN extension with a bad length")
    found = []
    at = 0
    while at < len(names):
        name, at = _vector(names, at, 1)
        if not name:
            raise ValueError("empty ALPN protocol name")
        found.append(bytes(name).decode("ascii", "replace"))
    return found


HTTP_ALPN = ("http/1.1", "h2", "http/1.0")


def protocol_name(sniffed: Sniffed, port: int) -> str:
    """The protocol decide() is asked about: what the bytes show, never more. TLS carrying HTTP
    (ALPN http/1.1 or h2, or no ALPN on 443) is https: wss and grpc ride inside it unseen, so only a
    declared https lets it through. Other TLS is tls; plain HTTP is http, or ws for a WebSocket
    opening handshake; an SSH banner is ssh;
    bytes that name no protocol (or none at all) are tcp."""
    if sniffed.protocol == "tls":
        if any(p in HTTP_ALPN for p in sniffed.alpn) or (not sniffed.alpn and port == 443):
            return "https"
        return "tls"
    if sniffed.head is not None and is_websocket(sniffed.head):
        return "ws"
    return sniffed.protocol
