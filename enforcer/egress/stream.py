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

from .relay import CHUNK, at_urgent_mark, give_back, nonblocking_splice, splice_exact, take_pipe
from .sniff import (
    MAX_HTTP_HEAD,
    MAX_LINE,
    Malformed,
    RequestHead,
    Sniffed,
    claimed_hosts,
    parse_chunk_line,
    parse_head,
    parse_line_end,
    parse_trailers,
)

READ_SIZE = 16384
# Reads from the agent one Outbound.step() makes before it returns to the loop: a client streaming
# requests must not keep the loop from the other connections (what is left is read at the next wake).
READS_PER_STEP = 16
# Moves (a head, a chunk-size line, a piece of body...) one Outbound.step() makes: bytes already read
# can hold thousands of tiny chunks or requests, each costing a few sends, and no read bounds those.
MOVES_PER_STEP = 64
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
        if self.read_ready(limit):  # what has arrived already is read without a poll first
            return
        if not self.wait(deadline):
            raise Incomplete("timed out")
        try:
            data = self.sock.recv(limit)
        except OSError as exc:
            raise ClientGone(str(exc)) from None
        self._keep(data)

    def read_ready(self, limit: int = READ_SIZE) -> bool:
        """Read what has arrived into the buffer, never waiting (MSG_DONTWAIT: this call only, a
        blocking socket stays blocking): False when nothing has yet; raise ClientGone when the agent
        closed or reset its side. The event loop's read, and fill()'s first."""
        try:
            data = self.sock.recv(limit, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError as exc:
            raise ClientGone(str(exc)) from None
        self._keep(data)
        return True

    def _keep(self, data: bytes) -> None:
        if not data:
            raise ClientGone("closed")
        self.received += len(data)
        self.buffer += data

    def take(self, size: int) -> bytes:
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data


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


class Outbound:
    """The agent's side of a plain-HTTP connection moved upstream without waiting, as _requests and
    forward_body move it on a thread: each request head read whole (from its first byte, within
    `message_s`; the wait for that first byte is unbounded, keep-alive), checked by `check` and sent
    re-serialised; each body as its head frames it (bytes already read sent, the rest spliced,
    chunk framing re-serialised and each framing line within `message_s`). step() moves what can be
    moved now; wants() says what to wait for; expired() is called at `deadline`. A head refused by
    `check`, or unreadable, sets `refusal` (what it named, and why) and ends the moving; so does
    the agent's end. OSError from step(): the upstream side reset."""

    def __init__(
        self,
        reader: ClientReader,
        upstream: socket.socket,
        first: RequestHead,
        check: Callable[[RequestHead], object | None],
        message_s: float,
    ) -> None:
        self.reader, self.upstream = reader, upstream
        self.check = check
        self.message_s = message_s
        self.head: RequestHead | None = first
        self.state = "head"  # head | body | chunk_line | chunk_end | trailers | next | done
        self.after_body = "next"
        self.remaining = 0
        self.pending = b""
        self.pipe: tuple[int, int] | None = None
        self.in_pipe = 0
        self.deadline: float | None = None
        self.requests = 0
        self.sent = 0
        self.refusal: tuple[Sniffed, object] | None = None
        # The last step stopped at MOVES_PER_STEP with more to move: what is left may be in the
        # buffer alone, where no readiness brings the loop back, so its caller steps it again.
        self.more = False
        self._reads = 0

    @property
    def done(self) -> bool:
        return self.state == "done"

    def wants(self) -> tuple[int, int] | None:
        if self.done:
            return None
        if self.pending or self.in_pipe:
            return self.upstream.fileno(), select.POLLOUT
        return self.reader.sock.fileno(), select.POLLIN

    def expired(self) -> None:
        """The message being read did not finish in time."""
        if self.state == "next":
            self._unreadable(f"incomplete HTTP request head after {self.message_s:g} s")
        elif self.state in ("chunk_line", "chunk_end", "trailers"):
            self._unreadable(f"incomplete chunked framing after {self.message_s:g} s")

    def close(self) -> None:
        if self.pipe is not None:
            give_back(*self.pipe, self.in_pipe == 0)
            self.pipe = None

    def step(self) -> None:
        self._reads = 0
        self.more = False
        moves = 0
        try:
            while not self.done and self._flushed():
                if moves == MOVES_PER_STEP:
                    self.more = True
                    return
                moves += 1
                if not self._advance():
                    break
        except Malformed as exc:
            self._unreadable(str(exc))

    def _flushed(self) -> bool:
        """Send what is pending; True once nothing is."""
        while self.pending:
            try:
                sent = self.upstream.send(self.pending)
            except BlockingIOError:
                return False
            self.pending = self.pending[sent:]
        while self.in_pipe:
            assert self.pipe is not None
            try:
                self.in_pipe -= nonblocking_splice(self.pipe[0], self.upstream.fileno(), self.in_pipe)
            except BlockingIOError:
                return False
        return True

    def _advance(self) -> bool:
        """One move of the current state; False: waiting for the agent."""
        if self.state == "head":
            assert self.head is not None
            self.requests += 1
            self.pending = self.head.canonical
            self.sent += len(self.head.canonical)
            self.deadline = None
            if self.head.body == "length":
                self.state, self.remaining, self.after_body = "body", self.head.content_length, "next"
            elif self.head.body == "chunked":
                self._framing("chunk_line")
            else:
                self.state = "next"
            return True
        if self.state == "body":
            return self._body()
        if self.state == "chunk_line":
            found = parse_chunk_line(bytes(self.reader.buffer[: MAX_HTTP_HEAD + 1]))
            if found is None:
                return self._fill()
            size, taken = found
            self.reader.take(taken)
            self.pending = f"{size:x}\r\n".encode()
            self.sent += len(self.pending)
            if size == 0:
                self._framing("trailers")
            else:
                self.state, self.remaining, self.after_body = "body", size, "chunk_end"
            return True
        if self.state == "chunk_end":
            end = parse_line_end(bytes(self.reader.buffer[: MAX_HTTP_HEAD + 1]))
            if end is None:
                return self._fill()
            self.reader.take(end)
            self.pending = b"\r\n"
            self.sent += 2
            self._framing("chunk_line")
            return True
        if self.state == "trailers":
            found_trailers = parse_trailers(bytes(self.reader.buffer[: MAX_HTTP_HEAD + 1]))
            if found_trailers is None:
                return self._fill()
            trailers, taken = found_trailers
            self.reader.take(taken)
            self.pending = trailers
            self.sent += len(trailers)
            self.state, self.deadline = "next", None
            return True
        return self._next_head()

    def _framing(self, state: str) -> None:
        """A chunk-framing line or the trailers: each within message_s from now."""
        self.state = state
        self.deadline = time.monotonic() + self.message_s

    def _body(self) -> bool:
        if not self.remaining:
            if self.after_body == "next":
                self.state, self.deadline = "next", None
            else:
                self._framing(self.after_body)
            return True
        if self.reader.buffer:
            data = self.reader.take(self.remaining)
            self.pending = data
            self.remaining -= len(data)
            self.sent += len(data)
            return True
        if self._spent():
            return False
        if self.pipe is None:
            self.pipe = take_pipe()
        try:
            moved = nonblocking_splice(self.reader.sock.fileno(), self.pipe[1], min(CHUNK, self.remaining))
        except BlockingIOError:
            if not at_urgent_mark(self.reader.sock):
                return False
            # splice stops before TCP urgent data: recv steps over the urgent byte and reads on
            try:
                data = self.reader.sock.recv(min(CHUNK, self.remaining))
            except BlockingIOError:
                return False
            if data:
                self.pending = data
                self.remaining -= len(data)
                self.sent += len(data)
                return True
            moved = 0
        except OSError:
            moved = 0  # the agent reset: it is gone
        if moved == 0:
            self.state = "done"  # closed mid-body
            return False
        self.in_pipe += moved
        self.remaining -= moved
        self.sent += moved
        return True

    def _spent(self) -> bool:
        """Whether this step has read its share; the socket stays readable, so the loop comes back."""
        self._reads += 1
        return self._reads > READS_PER_STEP

    def _fill(self) -> bool:
        """Read more of the agent's bytes into the buffer; False when none have arrived yet (or this
        step has read its share)."""
        if self._spent():
            return False
        try:
            return self.reader.read_ready()
        except ClientGone:
            self._agent_ended()
            return False

    def _agent_ended(self) -> None:
        if self.state == "next" and self.reader.buffer.strip(b"\r\n"):
            self._unreadable("client went away mid-head")
        else:
            self.state = "done"  # as a thread's ClientGone, mid-framing too: nothing more to move

    def _next_head(self) -> bool:
        reader = self.reader
        if not reader.buffer:
            self.deadline = None  # keep-alive: the wait for a next request's first byte is unbounded
            return self._fill()
        if self.deadline is None:
            self.deadline = time.monotonic() + self.message_s
        following = parse_head(bytes(reader.buffer[: MAX_HTTP_HEAD + 1]))
        if following is None:
            before = len(reader.buffer)
            while True:
                if not self._fill():
                    return False
                if b"\n" in reader.buffer[before:] or len(reader.buffer) > MAX_HTTP_HEAD:
                    return True  # parsed again at the next advance
                before = len(reader.buffer)
        reader.take(following.size)
        problem = self.check(following)
        if problem is not None:
            self.refusal = (Sniffed("http", head=following), problem)
            self.state = "done"
            return False
        self.head, self.state = following, "head"
        return True

    def _unreadable(self, why: str) -> None:
        self.refusal = (Sniffed("http", names=claimed_hosts(bytes(self.reader.buffer))), Malformed(why))
        self.state = "done"
