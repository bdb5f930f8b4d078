"""The inline unary loop: served on a real grpcio server over a unix socket, beside the sync
server's own handlers, and stopped cleanly."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from enforcer.daemon.inline import InlineUnary, InlineUnavailable

ECHO = "/t.Test/Echo"


def _echo(data: bytes | None) -> tuple[grpc.StatusCode, str, bytes | None]:
    if data == b"refuse":
        return grpc.StatusCode.PERMISSION_DENIED, "refused: ✗", None
    if data == b"crash":
        raise RuntimeError("handler bug")
    return grpc.StatusCode.OK, "", b"echo:" + (data or b"")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[grpc.Channel, InlineUnary, grpc.Server]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    sync = grpc.unary_unary_rpc_method_handler(lambda request, context: b"sync:" + request)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Test", {"Sync": sync, "Echo": sync}),))
    loop = InlineUnary(server, {ECHO: _echo}, name="test-inline")
    server.add_insecure_port(f"unix:{tmp_path / 's.sock'}")
    server.start()
    loop.start()
    channel = grpc.insecure_channel(f"unix:{tmp_path / 's.sock'}")
    try:
        yield channel, loop, server
    finally:
        channel.close()
        server.stop(grace=1).wait(3)
        loop.stop()


def test_inline_method_is_served_by_the_loop_and_others_by_the_sync_server(served) -> None:
    channel, loop, _ = served
    assert channel.unary_unary(ECHO)(b"a", timeout=5) == b"echo:a"
    assert channel.unary_unary("/t.Test/Sync")(b"b", timeout=5) == b"sync:b"
    assert loop.served == 1  # the sync server's handler for Echo was never reached


def test_statuses_and_a_failing_handler_do_not_end_the_loop(served) -> None:
    channel = served[0]
    echo = channel.unary_unary(ECHO)
    with pytest.raises(grpc.RpcError) as refused:
        echo(b"refuse", timeout=5)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert refused.value.details() == "refused: ✗"
    with pytest.raises(grpc.RpcError) as crashed:
        echo(b"crash", timeout=5)
    assert crashed.value.code() == grpc.StatusCode.INTERNAL
    assert echo(b"still", timeout=5) == b"echo:still"


def test_many_concurrent_calls(served) -> None:
    channel = served[0]
    echo = channel.unary_unary(ECHO)
    calls = [echo.future(str(i).encode(), timeout=10) for i in range(200)]  # more than DEPTH in flight
    assert [c.result() for c in calls] == [b"echo:" + str(i).encode() for i in range(200)]


def test_stop_ends_the_thread(served) -> None:
    channel, loop, server = served
    assert channel.unary_unary(ECHO)(b"x", timeout=5) == b"echo:x"
    server.stop(grace=1).wait(3)
    loop.stop()
    assert not loop._thread.is_alive()


def test_refuses_a_server_without_a_core() -> None:
    with pytest.raises(InlineUnavailable):
        InlineUnary(object(), {ECHO: _echo})  # type: ignore[arg-type]
