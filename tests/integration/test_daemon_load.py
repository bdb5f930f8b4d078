"""Load: 16 concurrent clients against a real daemon (60 s under --full, 10 s otherwise;
ADL_ENFORCER_LOAD_SECONDS overrides both): zero errors, RSS stable."""

from __future__ import annotations

import os
import threading
import time

import grpc
import psutil
import pytest

from enforcer.v1 import enforcer_pb2 as pb

from ..helpers.budgets import seconds
from ..helpers.daemon import RunningDaemon, tool_request

CLIENTS = 16
SECONDS = float(os.environ.get("ADL_ENFORCER_LOAD_SECONDS") or seconds(60, short=10))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.daemon,
    pytest.mark.skipif(os.geteuid() != 0, reason="the daemon needs root"),
]


def test_sixteen_clients_for_a_minute(daemon: RunningDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    assert daemon.proc is not None
    process = psutil.Process(daemon.proc.pid)
    requests = [
        tool_request("Sandboxed", "read_note", {"name": "n", "count": 1}),
        tool_request("Sandboxed", "rm_rf", {}),
        tool_request("Fast", "pay", {"amount": 5}),
        pb.CheckRequest(agent="Sandboxed", file=pb.FileAccess(path="/etc/shadow")),
    ]
    expected = [pb.ALLOW, pb.DENY, pb.ALLOW, pb.DENY]
    errors: list[str] = []
    counts = [0] * CLIENTS
    stop = threading.Event()
    warm = threading.Barrier(CLIENTS + 1)

    def client(i: int) -> None:
        stub = daemon.enforcer()
        n = 0
        try:
            for _ in range(20):
                stub.Check(requests[0], timeout=10)
        finally:
            warm.wait(30)
        while not stop.is_set():
            k = n % len(requests)
            try:
                reply = stub.Check(requests[k], timeout=10)
                if reply.decision != expected[k]:
                    errors.append(f"client {i}: decision {reply.decision} for request {k}")
            except grpc.RpcError as exc:
                errors.append(f"client {i}: {exc.code()}: {exc.details()}")
            n += 1
        counts[i] = n

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    warm.wait(30)
    rss_start = process.memory_info().rss
    started = time.monotonic()
    settle = min(10.0, SECONDS / 4)  # thread pools, channels and caches fill during the first seconds
    time.sleep(settle)
    rss_settled = process.memory_info().rss
    time.sleep(SECONDS - settle)
    stop.set()
    for t in threads:
        t.join(30)
    elapsed = time.monotonic() - started
    rss_end = process.memory_info().rss
    total = sum(counts)
    with capsys.disabled():
        print(
            f"\nload: {CLIENTS} clients, {elapsed:.0f} s, {total} checks ({total / elapsed:.0f}/s), "
            f"{len(errors)} errors; daemon RSS {rss_start / 2**20:.1f} MiB at start, {rss_settled / 2**20:.1f} MiB "
            f"after {settle:.0f} s, {rss_end / 2**20:.1f} MiB at the end"
        )
    assert errors == [], errors[:5]
    assert total > CLIENTS * 100
    assert rss_end < rss_settled * 1.05 + 2 * 2**20, (rss_start, rss_settled, rss_end)  # no growth once settled
