"""The inline unary loop: served on a real grpcio server over a unix socket, beside the sync
server's own handlers, and stopped cleanly."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from enforcer.daemon.inline import MAX_BATCH, Answer, InlineUnary, InlineUnavailable

ECHO = "/t.Test/Echo"


def _echo_one(data: bytes | None) -> Answer:
    if data == b"refuse":
        return grpc.StatusCode.PERMISSION_DENIED, "refused: ✗", None
    return grpc.StatusCode.OK, "", b"echo:" + (data or b"")


def _echo(messages: Sequence[bytes | None]) -> list[Answer]:
    if b"crash" in messages:
        raise RuntimeError("handler bug")
    if b"slow" in messages:
        time.sleep(0.3)
    return [_echo_one(m) for m in messages]


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
    # The loop counts a call after handing its answer to the core, so the caller may see it first.
    deadline = time.monotonic() + 5
    while loop.served < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
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


def test_a_caller_that_gave_up_does_not_stop_the_loop(served) -> None:
    channel, loop, _ = served
    echo = channel.unary_unary(ECHO)
    with pytest.raises(grpc.RpcError) as late:
        echo(b"slow", timeout=0.05)  # answered after the caller's deadline: the send finds the call gone
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    time.sleep(0.4)
    assert echo(b"after", timeout=5) == b"echo:after"
    assert loop._thread.is_alive()


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


def test_the_probe_passes_on_a_working_loop_and_fails_on_one_that_never_answers(
    served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, loop, _ = served
    target = f"unix:{tmp_path / 's.sock'}"
    loop.probe(target, ECHO, b"probe", timeout_s=5)
    with pytest.raises(InlineUnavailable, match="got PERMISSION_DENIED: refused"):
        loop.probe(target, ECHO, b"refuse", timeout_s=5)
    # What a grpcio whose core calls changed behaviour would look like: nothing is ever sent.
    monkeypatch.setattr(loop, "_send", lambda call, answer: None)
    started = time.monotonic()
    with pytest.raises(InlineUnavailable, match=r"got (DEADLINE_EXCEEDED|CANCELLED)"):
        loop.probe(target, ECHO, b"probe", timeout_s=0.5)
    assert time.monotonic() - started < 5


def test_refuses_a_server_without_a_core() -> None:
    with pytest.raises(InlineUnavailable):
        InlineUnary(object(), {ECHO: _echo})  # type: ignore[arg-type]


def test_requests_that_arrive_together_are_handled_together(tmp_path: Path) -> None:
    sizes: list[int] = []
    first, sent = threading.Event(), threading.Event()

    def slow_first(messages: Sequence[bytes | None]) -> list[Answer]:
        sizes.append(len(messages))
        if not first.is_set():  # hold the loop until the other calls are sent and queue up behind this one
            first.set()
            sent.wait(10)
            time.sleep(0.2)
        return [_echo_one(m) for m in messages]

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    loop = InlineUnary(server, {ECHO: slow_first})
    server.add_insecure_port(f"unix:{tmp_path / 's.sock'}")
    server.start()
    loop.start()
    try:
        with grpc.insecure_channel(f"unix:{tmp_path / 's.sock'}") as channel:
            echo = channel.unary_unary(ECHO)
            head = echo.future(b"head", timeout=10)
            assert first.wait(5)
            calls = [echo.future(b"%d" % i, timeout=10) for i in range(100)]
            sent.set()
            assert head.result() == b"echo:head"
            assert [c.result() for c in calls] == [b"echo:%d" % i for i in range(100)]
    finally:
        server.stop(grace=1).wait(3)
        loop.stop()
    assert sum(sizes) == 101 and max(sizes) > 1 and max(sizes) <= MAX_BATCH


# Serves one echo on a loop asked for nice -5; prints the nice values of the loop's thread (as the
# loop reports it and as /proc shows it) and of the main thread.
NICE_PROBE = """
import logging, os, sys
from concurrent import futures
import grpc
from enforcer.daemon.inline import InlineUnary
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
loop = InlineUnary(server, {"/t.Test/Echo": lambda ms: [(grpc.StatusCode.OK, "", m) for m in ms]}, nice=-5)
server.add_insecure_port("unix:" + sys.argv[1])
server.start()
loop.start()
with grpc.insecure_channel("unix:" + sys.argv[1]) as channel:
    assert channel.unary_unary("/t.Test/Echo")(b"x", timeout=5) == b"x"
stat = open(f"/proc/self/task/{loop._thread.native_id}/stat").read()
print("nice", loop.nice, int(stat.rsplit(")", 1)[1].split()[16]), os.getpriority(os.PRIO_PROCESS, 0))
server.stop(None)
loop.stop()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="lowering a nice value needs root (CI runs as root)")
def test_the_loop_alone_takes_its_nice_value(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", NICE_PROBE, str(tmp_path / "s.sock")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-4:] == ["nice", "-5", "-5", "0"], done.stdout


@pytest.mark.skipif(shutil.which("capsh") is None or os.geteuid() != 0, reason="needs root and capsh")
def test_a_loop_that_may_not_lower_its_nice_value_keeps_it_and_says_so(tmp_path: Path) -> None:
    command = shlex.join([sys.executable, "-c", NICE_PROBE, str(tmp_path / "s.sock")])
    done = subprocess.run(
        ["capsh", "--drop=cap_sys_nice", "--", "-c", f"exec {command}"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-4:] == ["nice", "0", "0", "0"], done.stdout
    assert "the inline loop keeps nice 0 (Permission denied)" in done.stdout
    assert "LimitNICE=-5" in done.stdout


def test_large_requests_are_handled_beside_the_loop_which_keeps_answering(tmp_path: Path) -> None:
    release = threading.Event()
    holding = threading.Event()

    def handler(messages: Sequence[bytes | None]) -> list[Answer]:
        if any(m and m.startswith(b"L") for m in messages):
            holding.set()
            release.wait(10)  # a large request that takes long to decide
        return [_echo_one(m) for m in messages]

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    loop = InlineUnary(server, {ECHO: handler}, large_bytes=64, large_queue=1, refused_bytes=200)
    server.add_insecure_port(f"unix:{tmp_path / 's.sock'}")
    server.start()
    loop.start()
    try:
        with grpc.insecure_channel(f"unix:{tmp_path / 's.sock'}") as channel:
            echo = channel.unary_unary(ECHO)
            large = b"L" * 100
            first = echo.future(large, timeout=20)
            assert holding.wait(5)
            waiting = echo.future(large, timeout=20)  # fills the queue of one
            deadline = time.monotonic() + 5
            while loop._large.qsize() < 1 and time.monotonic() < deadline:
                time.sleep(0.005)
            with pytest.raises(grpc.RpcError) as refused:
                echo(large, timeout=5)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "over 64 bytes are waiting" in refused.value.details()
            started = time.monotonic()
            assert [echo(b"small %d" % i, timeout=5) for i in range(20)] == [b"echo:small %d" % i for i in range(20)]
            assert time.monotonic() - started < 3  # answered while the large one is still being decided
            # over refused_bytes: the handler refuses those unread, so they stay on the loop, never queued
            assert echo(b"R" * 300, timeout=5) == b"echo:" + b"R" * 300
            assert not first.done()
            release.set()
            assert first.result() == b"echo:" + large and waiting.result() == b"echo:" + large
    finally:
        release.set()
        server.stop(grace=1).wait(3)
        loop.stop()
    assert not loop._large_thread.is_alive()


def test_a_loop_whose_threads_cannot_start_is_unavailable_and_stops_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of tasks (the unit's TasksMax, a pids cgroup), Thread.start() raises RuntimeError: the
    daemon must hear InlineUnavailable and leave Check to the sync server, not end with a traceback."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    loop = InlineUnary(server, {ECHO: _echo}, name="test-inline", large_bytes=64)
    server.add_insecure_port(f"unix:{tmp_path / 's.sock'}")
    server.start()
    real_start = threading.Thread.start

    def no_large_thread(thread: threading.Thread) -> None:
        if thread.name == "test-inline-large":
            raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", no_large_thread)
    try:
        with pytest.raises(InlineUnavailable, match="no thread could be started"):
            loop.start()
    finally:
        server.stop(grace=1).wait(3)
        loop.stop()
    assert not loop._thread.is_alive(), "the loop that did start is stopped with the server"
