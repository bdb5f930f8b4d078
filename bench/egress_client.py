"""The measuring client of bench/egress.py, run once directly and once inside a sandbox.

Setup latency: a new connection, one 'PING' line, until 'PONG' arrives (connect + first byte), by
name, so a filtered run includes what the filter adds. Throughput: one connection reading BYTES.
Rate: CONCURRENCY threads each opening new connections (connect, PING, PONG, close) for one second
after a warm-up; connections per second. Prints one JSON object, with the connections opened in all
and the client's own CPU time (so bench/egress.py can tell what the rest of the run cost).
"""

from __future__ import annotations

import json
import resource
import socket
import sys
import threading
import time

OPENED = [0]  # connections opened in all


def rate(address: tuple[str, int], concurrency: int, seconds: float = 1.0) -> float:
    """New connections per second with `concurrency` clients, each waiting for its PONG."""
    counts = [0] * concurrency
    start = threading.Barrier(concurrency + 1)
    deadline = [0.0]

    def client(i: int) -> None:
        start.wait()
        while time.perf_counter() < deadline[0]:
            with socket.create_connection(address, timeout=10) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.sendall(b"PING\n")
                if sock.recv(16) != b"PONG\n":
                    raise SystemExit("bad PONG")
            counts[i] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    began = time.perf_counter()
    deadline[0] = began + seconds
    start.wait()
    for t in threads:
        t.join()
    OPENED[0] += sum(counts)
    return sum(counts) / (time.perf_counter() - began)


def main() -> None:
    host, port, connections, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    concurrency = int(sys.argv[5]) if len(sys.argv) > 5 else 16
    address = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4]
    rate(address, concurrency, 0.3)  # warm-up: threads, caches, the filter's worker pool
    per_second = rate(address, concurrency)
    setup_us = []
    for _ in range(connections):
        started = time.perf_counter_ns()
        with socket.create_connection(address, timeout=10) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(b"PING\n")
            if sock.recv(16) != b"PONG\n":
                raise SystemExit("bad PONG")
            setup_us.append((time.perf_counter_ns() - started) / 1000)
    buffer = bytearray(1 << 20)
    view = memoryview(buffer)
    with socket.create_connection(address, timeout=30) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        started = time.perf_counter_ns()
        sock.sendall(f"BULK {size}\n".encode())
        received = 0
        while received < size:
            n = sock.recv_into(view)
            if n == 0:
                break
            received += n
        elapsed = (time.perf_counter_ns() - started) / 1e9
    own = resource.getrusage(resource.RUSAGE_SELF)
    report = {"setup_us": setup_us, "bytes": received, "seconds": elapsed, "rate": per_second}
    report.update(connections=OPENED[0] + connections + 1, cpu_s=own.ru_utime + own.ru_stime)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
