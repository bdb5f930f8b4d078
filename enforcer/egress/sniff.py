"""What a client's first bytes say about the host it means: the TLS ClientHello's SNI (and ALPN) or
the HTTP request's Host header. Pure functions over bytes.

Hand-written: TLS libraries parse a ClientHello only as part of a handshake they terminate, and the
filter must read it without terminating TLS (the agent talks to the real server end to end).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAX_HELLO = 5 + 16384  # one TLS record: a ClientHello larger than this is not looked into
MAX_HTTP_HEAD = 16384
_HTTP_METHODS = (b"GET ", b"POST ", b"PUT ", b"HEAD ", b"DELETE ", b"OPTIONS ", b"PATCH ", b"CONNECT ", b"TRACE ")


@dataclass(frozen=True)
class Sniffed:
    protocol: str  # tls | http | tcp
    server_name: str | None = None  # SNI, or the Host header without its port
    alpn: tuple[str, ...] = ()
    complete: bool = True  # False: more bytes are needed to decide
    malformed: str | None = None


NEED_MORE = Sniffed("tcp", complete=False)


def sniff(data: bytes) -> Sniffed:
    """Classify the first bytes a client sent. `complete=False` asks for more bytes."""
    if not data:
        return NEED_MORE
    if data[0] == 0x16:
        return _tls(data)
    if any(m.startswith(data[: len(m)]) for m in _HTTP_METHODS):
        return _http(data)
    return Sniffed("tcp")


def _tls(data: bytes) -> Sniffed:
    if len(data) < 5:
        return Sniffed("tls", complete=False)
    record_len = struct.unpack_from("!H", data, 3)[0]
    if len(data) < 5 + record_len:
        if 5 + record_len > MAX_HELLO:
            return Sniffed("tls", malformed="ClientHello record larger than 16 KiB")
        return Sniffed("tls", complete=False)
    try:
        return _client_hello(memoryview(data)[5 : 5 + record_len])
    except (IndexError, struct.error, UnicodeDecodeError, ValueError) as exc:
        return Sniffed("tls", malformed=f"unreadable ClientHello: {exc}")


def _client_hello(body: memoryview) -> Sniffed:
    if body[0] != 0x01:
        raise ValueError("first handshake message is not a ClientHello")
    length = int.from_bytes(body[1:4], "big")
    if 4 + length > len(body):
        raise ValueError("ClientHello continues in a later record")
    pos = 4 + 2 + 32  # type+length, legacy_version, random
    pos += 1 + body[pos]  # session id
    pos += 2 + struct.unpack_from("!H", body, pos)[0]  # cipher suites
    pos += 1 + body[pos]  # compression methods
    if pos >= 4 + length:
        return Sniffed("tls")  # no extensions: no SNI
    end = pos + 2 + struct.unpack_from("!H", body, pos)[0]
    pos += 2
    server_name: str | None = None
    alpn: list[str] = []
    while pos + 4 <= end:
        ext_type, ext_len = struct.unpack_from("!HH", body, pos)
        ext = body[pos + 4 : pos + 4 + ext_len]
        pos += 4 + ext_len
        if ext_type == 0:  # server_name
            names_end = 2 + struct.unpack_from("!H", ext, 0)[0]
            at = 2
            while at + 3 <= names_end:
                name_type, name_len = ext[at], struct.unpack_from("!H", ext, at + 1)[0]
                if name_type == 0:
                    if server_name is not None:
                        raise ValueError("two host names in SNI")
                    server_name = bytes(ext[at + 3 : at + 3 + name_len]).decode("ascii")
                at += 3 + name_len
        elif ext_type == 16:  # application_layer_protocol_negotiation
            at, list_end = 2, 2 + struct.unpack_from("!H", ext, 0)[0]
            while at < list_end:
                alpn.append(bytes(ext[at + 1 : at + 1 + ext[at]]).decode("ascii", "replace"))
                at += 1 + ext[at]
    return Sniffed("tls", server_name=server_name, alpn=tuple(alpn))


def _http(data: bytes) -> Sniffed:
    head_end = data.find(b"\r\n\r\n")
    if head_end < 0:
        if len(data) >= MAX_HTTP_HEAD:
            return Sniffed("http", malformed="HTTP request head larger than 16 KiB")
        return Sniffed("http", complete=False)
    lines = data[:head_end].split(b"\r\n")
    hosts = [line.split(b":", 1)[1].strip() for line in lines[1:] if line[:5].lower() == b"host:"]
    if len(hosts) > 1:
        return Sniffed("http", malformed="more than one Host header")
    if not hosts:
        return Sniffed("http")
    try:
        return Sniffed("http", server_name=strip_port(hosts[0].decode("ascii")))
    except UnicodeDecodeError:
        return Sniffed("http", malformed="Host header is not ASCII")


def strip_port(host: str) -> str:
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    if host.count(":") == 1:
        return host.split(":", 1)[0]
    return host


def protocol_name(sniffed: Sniffed, port: int) -> str:
    """The protocol to check against allowed_protocols: https for TLS carrying HTTP (ALPN http/1.1 or
    h2, or no ALPN on 443), tls for other TLS, http, or tcp."""
    if sniffed.protocol == "tls":
        if any(p in ("http/1.1", "h2", "http/1.0") for p in sniffed.alpn) or (not sniffed.alpn and port == 443):
            return "https"
        return "tls"
    return sniffed.protocol
