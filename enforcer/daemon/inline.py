"""Hot unary methods served on one thread of their own, straight from gRPC's core.

grpcio's sync server hands every call between its polling thread and a pool thread several times
(new call, request message, sent status), each a wake-up and an interpreter-lock hand-over. For a
method that never blocks, such as Check, those hand-offs cost more than deciding and auditing
together: on these 2-core machines a bare echo served this way went from 4,615 to 8,153 calls/s
at 16 callers (bench/check.py prints both stacks). So the hot methods are registered on the
server's core and served by one thread that polls a completion queue of its own and runs the
handler where the request arrives. Everything else (streaming, health, reflection, methods that
wait) stays with the sync server.

This drives grpcio's Cython layer (grpc._cython.cygrpc) with the same calls grpc._server makes;
that layer is not a public API. `attach` refuses with InlineUnavailable when a grpcio release
lacks what it needs; the caller then leaves those methods to the sync server's handlers (same
answers, lower throughput) and says so.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

import grpc

log = logging.getLogger(__name__)

# A handler gets the request's bytes (None if the caller sent no message) and returns the status,
# its details, and the response's bytes (None with a status other than OK).
Handler = Callable[[bytes | None], tuple[grpc.StatusCode, str, bytes | None]]

# Calls requested ahead per method, so a new call never waits for the loop to ask for it.
DEPTH = 32

_NEW, _MESSAGE, _SENT = 0, 1, 2
# The core's number for each status (StatusCode.value is an enum property: slow on a hot path).
_CODE_NUMBER = {code: code.value[0] for code in grpc.StatusCode}


class InlineUnavailable(Exception):
    """This grpcio does not offer what the inline loop needs."""


class InlineUnary:
    """Serves `handlers` (full method name -> handler) for `server`. Build before server.start(),
    call start() after it, and stop() after the server has stopped."""

    def __init__(self, server: grpc.Server, handlers: Mapping[str, Handler], *, name: str = "inline") -> None:
        try:
            from grpc._cython import cygrpc

            core = server._cy_server  # type: ignore[attr-defined]  # the server's core object
            queue = cygrpc.CompletionQueue()
            core.register_completion_queue(queue)
            for method in handlers:
                core.register_method(method)
            self._receive = cygrpc.ReceiveMessageOperation
            self._send_metadata = cygrpc.SendInitialMetadataOperation
            self._send_message = cygrpc.SendMessageOperation
            self._send_status = cygrpc.SendStatusFromServerOperation
            self._queue_shutdown = cygrpc.CompletionType.queue_shutdown
        except (ImportError, AttributeError, TypeError) as exc:
            raise InlineUnavailable(f"grpcio {grpc.__version__}: {exc}") from None
        self._core, self._queue = core, queue
        self._handlers = dict(handlers)
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.served = 0

    def start(self) -> None:
        for method in self._handlers:
            for _ in range(DEPTH):
                self._request(method)
        self._thread.start()

    def stop(self, timeout_s: float = 3.0) -> None:
        """End the loop. The server must have stopped: its core no longer hands out calls."""
        self._queue.shutdown()
        self._thread.join(timeout_s)

    def _request(self, method: str) -> None:
        self._core.request_registered_call(self._queue, self._queue, method, (_NEW, method))

    def _serve(self) -> None:
        poll, handlers, receive = self._queue.poll, self._handlers, self._receive
        while True:
            event = poll()
            tag = event.tag
            if tag is None:
                if event.completion_type == self._queue_shutdown:
                    return
                continue
            kind = tag[0]
            # A failed event: the server is shutting down (ask for no more calls), the caller went
            # away, or its message broke a core limit (the core has answered it).
            if kind == _NEW and event.success:
                try:
                    self._request(tag[1])
                except Exception:  # the server is shutting down; the calls already asked for drain
                    log.debug("no further %s calls requested", tag[1], exc_info=True)
                call = event.call
                call.start_server_batch((receive(0),), (_MESSAGE, call, handlers[tag[1]]))
            elif kind == _MESSAGE and event.success:
                self._answer(tag[1], tag[2], event.batch_operations[0].message())

    def _answer(self, call: object, handler: Handler, request: bytes | None) -> None:
        try:
            code, details, response = handler(request)
        except Exception:  # a bug in a handler must not end the loop
            log.exception("inline handler failed")
            code, details, response = grpc.StatusCode.INTERNAL, "internal error", None
        ops = [self._send_metadata((), 0)]
        if response is not None:
            ops.append(self._send_message(response, 0))
        ops.append(self._send_status((), _CODE_NUMBER[code], details.encode(), 0))
        try:
            call.start_server_batch(ops, (_SENT,))  # type: ignore[attr-defined]
        except Exception:  # the call ended under us (cancelled, server stopping)
            log.debug("inline answer not sent", exc_info=True)
            return
        self.served += 1
