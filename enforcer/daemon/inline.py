"""Hot unary methods served on one thread of their own, straight from gRPC's core.

grpcio's sync server hands every call between its polling thread and a pool thread several times
(new call, request message, sent status), each a wake-up and an interpreter-lock hand-over. For a
method that never blocks, such as Check, those hand-offs cost more than deciding and auditing
together (bench/check.py compares both stacks; bench/RESULTS.md has the figures). So the hot
methods are registered on the
server's core and served by one thread that polls a completion queue of its own and runs the
handler where the request arrives. Everything else (streaming, health, reflection, methods that
wait) stays with the sync server.

Requests that have arrived together are handled together: after a blocking poll the loop takes
whatever else is already queued (up to MAX_BATCH requests) without waiting, hands each method its
requests in one call, then sends every answer. Under load that is several requests a turn; a handler
can then share work between them (Check appends all their audit records with one write), and the
answers leave in one burst. Nobody waits for a batch to fill: an idle loop answers one at once.

A request larger than `large_bytes` is not handled on the loop: deciding it may take much longer
than a turn (the time grows with its size), and every caller whose request arrived with it would
wait that long. It goes to a second thread of its own instead, queued (at most `large_queue`
waiting; beyond that it is refused with RESOURCE_EXHAUSTED), and answered from there. The two
threads share the interpreter lock, so a large request slows the loop down by time slices rather
than holding it for its whole decision.

This drives grpcio's Cython layer (grpc._cython.cygrpc) with the same calls grpc._server makes;
that layer is not a public API. InlineUnary refuses with InlineUnavailable when a grpcio release
lacks what it needs; the caller then leaves those methods to the sync server's handlers (same
answers, lower throughput) and says so.

The loop can run at a lower nice value than the process's other threads. gRPC's I/O threads wake
for every request; at the same nice value each wake-up preempts the loop in the middle of a batch.
At nice -10 they wait until the loop blocks, and then read every socket that is ready in one go:
fewer context switches per Check (bench/RESULTS.md, "The inline loop at nice -10"). Every thread
keeps its share of the CPU, and the I/O threads still preempt other processes on wake-up.
SCHED_BATCH for the I/O threads would cut as many switches, but a batch thread never preempts on
wake-up: with a busy process on the same CPU, Check's latency grows several-fold, so it is not used.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import grpc

log = logging.getLogger(__name__)

# The status, its details, and the response's bytes (None with a status other than OK).
Answer = tuple[grpc.StatusCode, str, bytes | None]
# A handler gets the bytes of every request for its method that arrived together (None for a call
# that sent no message) and returns one answer for each, in order.
BatchHandler = Callable[[Sequence[bytes | None]], list[Answer]]
# With with_peers: also each call's peer string (who is calling), in the same order.
PeerBatchHandler = Callable[[Sequence[bytes | None], Sequence[bytes]], list[Answer]]

# Calls requested ahead per method, so a new call never waits for the loop to ask for it.
DEPTH = 32
# Requests taken in one turn of the loop at most.
MAX_BATCH = 32

_NEW, _MESSAGE, _SENT = 0, 1, 2
# The core's number for each status (StatusCode.value is an enum property: slow on a hot path).
_CODE_NUMBER = {code: code.value[0] for code in grpc.StatusCode}


class InlineUnavailable(Exception):
    """This grpcio does not offer what the inline loop needs."""


class InlineUnary:
    """Serves `handlers` (full method name -> handler) for `server`. Build before server.start(),
    call start() after it (InlineUnavailable when its threads cannot start), and stop() after the
    server has stopped. With `nice` below 0 the loop's thread takes that nice value (it needs
    CAP_SYS_NICE or RLIMIT_NICE); if it may not, it keeps the process's and says so in the log.
    `nice` holds the value the loop runs at once it has started. With `large_bytes` above 0, larger
    requests are handled on a thread of their own (see above), except those over `refused_bytes`,
    which the handler refuses unread and so stay on the loop rather than wait in the queue."""

    def __init__(
        self,
        server: grpc.Server,
        handlers: Mapping[str, BatchHandler] | Mapping[str, PeerBatchHandler],
        *,
        name: str = "inline",
        nice: int = 0,
        with_peers: bool = False,
        large_bytes: int = 0,
        large_queue: int = 32,
        refused_bytes: int | None = None,
        large_owner: Callable[[Any], Hashable] | None = None,
    ) -> None:
        try:
            from grpc._cython import cygrpc

            core = server._cy_server  # the server's core object
            completion = cygrpc.CompletionQueue()
            core.register_completion_queue(completion)
            for method in handlers:
                core.register_method(method)
            self._receive = cygrpc.ReceiveMessageOperation
            self._send_metadata = cygrpc.SendInitialMetadataOperation
            self._send_message = cygrpc.SendMessageOperation
            self._send_status = cygrpc.SendStatusFromServerOperation
            self._queue_shutdown = cygrpc.CompletionType.queue_shutdown
            self._queue_timeout = cygrpc.CompletionType.queue_timeout
        except (ImportError, AttributeError, TypeError) as exc:
            raise InlineUnavailable(f"grpcio {grpc.__version__}: {exc}") from None
        self._core, self._queue = core, completion
        self._handlers: dict[str, Any] = dict(handlers)
        self._with_peers = with_peers
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._large_bytes = large_bytes
        self._refused_bytes = refused_bytes if refused_bytes is not None else float("inf")
        self._large: queue.Queue[tuple[str, Any, bytes | None, Hashable] | None] = queue.Queue(large_queue)
        # `large_owner(peer)` names whose a call is (a uid): each owner holds a quarter of the queue
        # at most, so one caller's large requests cannot leave everyone else's refused.
        self._large_owner = large_owner
        self._large_per_owner = max(1, large_queue // 4)
        self._large_of: dict[Hashable, int] = {}
        self._large_lock = threading.Lock()
        self._large_thread = threading.Thread(target=self._serve_large, name=f"{name}-large", daemon=True)
        self._served_lock = threading.Lock()
        self._wanted_nice = nice
        self._niced = threading.Event()
        self.nice: int | None = None
        self.served = 0

    def start(self) -> None:
        for method in self._handlers:
            for _ in range(DEPTH):
                self._request(method)
        try:
            self._thread.start()
            if self._large_bytes:
                self._large_thread.start()
        except RuntimeError as exc:  # out of tasks: the caller leaves the methods to the sync server
            raise InlineUnavailable(f"no thread could be started for the inline loop: {exc}") from None
        self._niced.wait(5)

    def stop(self, timeout_s: float = 3.0) -> None:
        """End the loop. The server must have stopped: its core no longer hands out calls."""
        self._queue.shutdown()
        if self._thread.ident is not None:  # it may never have started (start() raised)
            self._thread.join(timeout_s)
        if self._large_thread.is_alive():
            try:
                self._large.put(None, timeout=timeout_s)
            except queue.Full:  # still deciding a full queue: it is a daemon thread and goes with the process
                return
            self._large_thread.join(timeout_s)

    def probe(self, target: str, method: str, request: bytes, timeout_s: float = 5.0) -> None:
        """One call to `method` through the loop, from a client in this process, must be answered OK.
        Construction only finds the names the loop uses in this grpcio; the probe proves they still
        behave as the loop expects (receive, hand over, send a message and a status) before any
        caller depends on them. Raises InlineUnavailable otherwise."""
        with grpc.insecure_channel(target) as channel:
            try:
                channel.unary_unary(method)(request, timeout=timeout_s)
                return
            except grpc.RpcError as exc:
                code, details = exc.code(), exc.details()
        raise InlineUnavailable(
            f"grpcio {grpc.__version__}: a probe call through the inline loop got {code.name}: {details}"
        )

    def _request(self, method: str) -> None:
        self._core.request_registered_call(self._queue, self._queue, method, (_NEW, method))

    def _take_nice(self) -> None:
        """The loop's own thread to its nice value (on Linux a nice value belongs to one thread)."""
        if self._wanted_nice:
            try:
                os.setpriority(os.PRIO_PROCESS, 0, self._wanted_nice)
            except OSError as exc:
                log.warning(
                    "the inline loop keeps nice %d (%s): under load gRPC's I/O threads will interrupt its "
                    "batches; give the daemon CAP_SYS_NICE or LimitNICE=%d",
                    os.getpriority(os.PRIO_PROCESS, 0),
                    exc.strerror,
                    self._wanted_nice,
                )
        self.nice = os.getpriority(os.PRIO_PROCESS, 0)
        self._niced.set()

    def _serve(self) -> None:
        self._take_nice()
        poll, timeout = self._queue.poll, self._queue_timeout
        arrived: list[tuple[str, Any, bytes | None]] = []  # (method, call, request)
        running = True
        while running:
            running = self._take(poll(), arrived)
            while running and arrived and len(arrived) < MAX_BATCH:
                event = poll(0)
                if event.completion_type == timeout:
                    break
                running = self._take(event, arrived)
            if arrived:
                self._answer_all(arrived)
                arrived.clear()

    def _take(self, event: Any, arrived: list[tuple[str, Any, bytes | None]]) -> bool:
        """Act on one event; False once the queue has shut down."""
        tag = event.tag
        if tag is None:
            return event.completion_type != self._queue_shutdown
        kind = tag[0]
        # A failed event: the server is shutting down (ask for no more calls), the caller went
        # away, or its message broke a core limit (the core has answered it).
        if kind == _NEW and event.success:
            method = tag[1]
            try:
                self._request(method)
            except Exception:  # the server is shutting down; the calls already asked for drain
                log.debug("no further %s calls requested", method, exc_info=True)
            call = event.call
            try:
                call.start_server_batch((self._receive(0),), (_MESSAGE, method, call))
            except Exception:  # the call ended under us; nothing to answer
                log.debug("inline call gone before its message", exc_info=True)
        elif kind == _MESSAGE and event.success:
            arrived.append((tag[1], tag[2], event.batch_operations[0].message()))
        return True

    def _answer_all(self, arrived: list[tuple[str, Any, bytes | None]]) -> None:
        by_method: dict[str, list[tuple[Any, bytes | None]]] = {}
        large = self._large_bytes
        for method, call, request in arrived:
            if large and request is not None and large < len(request) <= self._refused_bytes:
                refused = self._queue_large(method, call, request)
                if refused is not None:
                    detail = f"too many {refused}requests over {large} bytes are waiting; try again later"
                    self._send(call, (grpc.StatusCode.RESOURCE_EXHAUSTED, detail, None))
                continue
            by_method.setdefault(method, []).append((call, request))
        self._handle(by_method)

    def _serve_large(self) -> None:
        while (item := self._large.get()) is not None:
            method, call, request, owner = item
            try:
                self._handle({method: [(call, request)]})
            finally:
                with self._large_lock:
                    left = self._large_of[owner] - 1
                    if left:
                        self._large_of[owner] = left
                    else:
                        del self._large_of[owner]

    def _queue_large(self, method: str, call: Any, request: bytes) -> str | None:
        """Queue a large request for its thread; None, or whose requests fill the queue ("" for all)."""
        owner = None
        if self._large_owner is not None:
            try:
                owner = self._large_owner(call.peer())
            except Exception:  # a caller that cannot be named shares one quarter with the others like it
                owner = None
        with self._large_lock:
            if self._large_owner is not None and self._large_of.get(owner, 0) >= self._large_per_owner:
                return "of this caller's "
            try:
                self._large.put_nowait((method, call, request, owner))
            except queue.Full:
                return ""
            self._large_of[owner] = self._large_of.get(owner, 0) + 1
        return None

    def _handle(self, by_method: dict[str, list[tuple[Any, bytes | None]]]) -> None:
        for method, calls in by_method.items():
            try:
                requests = [request for _, request in calls]
                if self._with_peers:
                    answers = self._handlers[method](requests, [call.peer() for call, _ in calls])
                else:
                    answers = self._handlers[method](requests)
                if len(answers) != len(calls):
                    raise ValueError(f"{len(answers)} answers for {len(calls)} requests")
            except Exception:  # a bug in a handler must not end the loop
                log.exception("inline handler for %s failed", method)
                answers = [(grpc.StatusCode.INTERNAL, "internal error", None)] * len(calls)
            for (call, _), answer in zip(calls, answers, strict=True):
                self._send(call, answer)

    def _send(self, call: Any, answer: Answer) -> None:
        code, details, response = answer
        ops = [self._send_metadata((), 0)]
        if response is not None:
            ops.append(self._send_message(response, 0))
        ops.append(self._send_status((), _CODE_NUMBER[code], details.encode(), 0))
        try:
            call.start_server_batch(ops, (_SENT,))
        except Exception:  # the call ended under us (cancelled, server stopping)
            log.debug("inline answer not sent", exc_info=True)
            return
        with self._served_lock:
            self.served += 1
