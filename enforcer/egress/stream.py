"""Reading what the agent sends, within bounds, and moving a plain-HTTP connection's requests one
head at a time.

The agent's socket stays in blocking mode while it is read here: the way back may be spliced into
it from another thread, and a timeout (O_NONBLOCK on the shared file) would break that splice.
Waits are poll(2).
"""

from __future__ import annotations

import re
import select
import socket
import time
from collections.abc import Callable
from typing import TypeVar

from .relay import splice_exact
from .sniff import (
    MAX_HTTP_HEAD,
    MAX_LINE,
    Malformed,
    RequestHead,
    Sniffed,
    parse_chunk_line,
    parse_head,
    parse_line_end,
    parse_trailers,
    sniff,
)

READ_SIZE = 16384
_LINE_OR_BINARY = re.compile(rb"[\x00-\x1f\x7f-\xff]")  # a line end, or a byte no request line has


class Incomplete(Exception):
    """The agent did not finish a message within the time or size bound."""


class ClientGone(Exception):
    """The agent closed (or reset) its side."""


class ClientReader:
    """The agent's socket plus what was read from it and not yet forwarded."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.received = 0

    def wait(self, deadline: float | None) -> bool:
        """Wait until the agent sent something (True) or the deadline passed (False)."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN | select.POLLPRI)
        while True:
            timeout_ms = None if deadline is None else max(0, round((deadline - time.monotonic()) * 1000))
            if poller.poll(timeout_ms):
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def fill(self, deadline: float | None, limit: int = READ_SIZE) -> None:
        """Read more bytes into the buffer (at least one), or raise Incomplete / ClientGone."""
        try:
            # What has arrived already is read without a poll first (MSG_DONTWAIT: this call only,
            # the socket stays blocking).
            data = self.sock.recv(limit, socket.MSG_DONTWAIT)
        except BlockingIOError:
            if not self.wait(deadline):
                raise Incomplete("timed out") from None
            try:
                data = self.sock.recv(limit)
            except OSError as exc:
                raise ClientGone(str(exc)) from None
        except OSError as exc:
            raise ClientGone(str(exc)) from None
        if not data:
            raise ClientGone("closed")
        self.received += len(data)
        self.buffer += data

    def take(self, size: int) -> bytes:
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data


def sniff_first(reader: ClientReader, first_byte_s: float | None, message_s: float) -> Sniffed:
    """Read until the first bytes say what they are. A client that sends nothing within
    `first_byte_s` waits for the server (silent: opaque); once it has sent something, whatever
    looks like TLS or HTTP must be complete within `message_s` and the size bounds, else refused.
    `first_byte_s` None: wait for the first byte for as long as the connection lasts."""
    started = time.monotonic()
    if not reader.buffer:
        try:
            reader.fill(None if first_byte_s is None else started + first_byte_s)
        except Incomplete:
            return Sniffed("tcp", silent=True)
        except ClientGone as exc:
            return Sniffed("tcp", malformed=f"client went away before sending anything ({exc})")
    deadline = time.monotonic() + message_s
    result = sniff(bytes(reader.buffer))
    while True:
        if result.complete or result.malformed:
            return result
        before = len(reader.buffer)
        try:
            reader.fill(deadline)
        except Incomplete:
            what = {"tls": "TLS ClientHello", "http": "HTTP request head"}.get(result.protocol, "first message")
            return Sniffed(
                result.protocol,
                malformed=f"incomplete {what} after {message_s:g} s ({len(reader.buffer)} bytes)",
            )
        except ClientGone as exc:
            return Sniffed(result.protocol, malformed=f"client went away mid-message ({exc})")
        if may_change(result, reader.buffer, before):
            result = sniff(bytes(reader.buffer))


def may_change(result: Sniffed, buffer: bytearray, before: int) -> bool:
    """Whether the bytes just read can change an incomplete answer: a client writing one byte at a
    time must not make the filter re-read its whole message for every byte."""
    if result.protocol == "tls":
        return len(buffer) >= result.need
    if result.protocol == "http":
        return bool(_LINE_OR_BINARY.search(buffer, before)) or len(buffer) >= MAX_LINE
    return True


def read_head(reader: ClientReader, message_s: float, idle: bool) -> RequestHead | None:
    """The next request head on the connection (None: the agent closed between requests). `idle`:
    the wait for its first byte is unbounded (keep-alive); the head itself is bounded."""
    deadline: float | None = None
    if not reader.buffer:
        try:
            reader.fill(None if idle else time.monotonic() + message_s)
        except ClientGone:
            return None
        except Incomplete:
            raise Malformed(f"no HTTP request head within {message_s:g} s") from None
    deadline = time.monotonic() + message_s
    head = parse_head(bytes(reader.buffer[: MAX_HTTP_HEAD + 1]))
    while head is None:
        before = len(reader.buffer)
        try:
            reader.fill(deadline)
        except Incomplete:
            raise Malformed(f"incomplete HTTP request head after {message_s:g} s") from None
        except ClientGone:
            if not reader.buffer.strip(b"\r\n"):
                return None  # only the empty lines some clients send after a body: it closed between requests
            raise Malformed("client went away mid-head") from None
        if b"\n" in reader.buffer[before:] or len(reader.buffer) > MAX_HTTP_HEAD:
            head = parse_head(bytes(reader.buffer[: MAX_HTTP_HEAD + 1]))
    return head


def _forward_exact(reader: ClientReader, upstream: socket.socket, size: int) -> int:
    """Forward `size` body bytes: those already read, then the rest spliced."""
    buffered = reader.take(size)
    if buffered:
        upstream.sendall(buffered)
    rest = size - len(buffered)
    moved = splice_exact(reader.sock, upstream, rest) if rest else 0
    if moved < rest:
        raise ClientGone("closed mid-body")
    return size


_Parsed = TypeVar("_Parsed")


def _read_until(reader: ClientReader, parse: Callable[[bytes], _Parsed | None], message_s: float) -> _Parsed:
    deadline = time.monotonic() + message_s
    while True:
        found = parse(bytes(reader.buffer[: MAX_HTTP_HEAD + 1]))
        if found is not None:
            return found
        try:
            reader.fill(deadline)
        except Incomplete:
            raise Malformed(f"incomplete chunked framing after {message_s:g} s") from None


def forward_body(reader: ClientReader, upstream: socket.socket, head: RequestHead, message_s: float) -> int:
    """Forward one request's body as its head frames it; chunk framing is re-serialised, chunk data
    spliced. Returns the bytes sent."""
    if head.body == "length":
        return _forward_exact(reader, upstream, head.content_length)
    if head.body != "chunked":
        return 0
    sent = 0
    while True:
        size, taken = _read_until(reader, parse_chunk_line, message_s)
        reader.take(taken)
        line = f"{size:x}\r\n".encode()
        upstream.sendall(line)
        sent += len(line)
        if size == 0:
            trailers, taken = _read_until(reader, parse_trailers, message_s)
            reader.take(taken)
            upstream.sendall(trailers)
            return sent + len(trailers)
        sent += _forward_exact(reader, upstream, size)
        taken = _read_until(reader, parse_line_end, message_s)
        reader.take(taken)
        upstream.sendall(b"\r\n")
        sent += 2
