"""Audit log throughput and verify speed, against a plain unchained write() of the same lines.

1. Chained appends with group commit (background flusher, fdatasync every 256 records or 5 ms):
   records/s and p50/p99 append latency.
2. Baseline in the same run: the same lines written with one os.write() each and an fdatasync every
   256 records, no chain, no lock, no record building.
3. verify on a log of VERIFY_RECORDS records (default 1,000,000) written by the real writer.

Run: .venv/bin/python bench/audit.py [APPEND_RECORDS] [VERIFY_RECORDS]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from enforcer.audit import AuditWriter, WriterSettings, records
from enforcer.audit.verify import verify_directory
from enforcer.audit.writer import log_files

PAYLOAD = {
    "agent": "urn:adl:agent:acme:invoice-processor:1.2.0",
    "decision": "deny",
    "tool": "approve_invoice",
    "rules": ["tool.args_invalid"],
    "reasons": [{"rule": "tool.args_invalid", "pointer": "/tools/0/parameters", "document": "adl", "text": "x" * 60}],
    "args_digest": "sha256:" + "ab" * 32,
    "policy_digest": "sha256:" + "cd" * 32,
}
SETTINGS = WriterSettings(background_flush=True, group_records=256, group_ms=5.0)


def chained(directory: Path, count: int) -> tuple[float, list[float]]:
    latencies = []
    with AuditWriter(directory, directory.parent / "bench-key.pem", settings=SETTINGS) as writer:
        start = time.perf_counter()
        for _ in range(count):
            t = time.perf_counter_ns()
            writer.append(records.DECISION, PAYLOAD, corr="session-bench-0001")
            latencies.append((time.perf_counter_ns() - t) / 1000)
        writer.sync()
        elapsed = time.perf_counter() - start
    return count / elapsed, latencies


def plain(path: Path, lines: list[bytes]) -> tuple[float, list[float]]:
    latencies = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    start = time.perf_counter()
    for i, line in enumerate(lines, 1):
        t = time.perf_counter_ns()
        os.write(fd, line)
        if i % 256 == 0:
            os.fdatasync(fd)
        latencies.append((time.perf_counter_ns() - t) / 1000)
    os.fdatasync(fd)
    elapsed = time.perf_counter() - start
    os.close(fd)
    return len(lines) / elapsed, latencies


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1]


def main() -> None:
    append_count = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    verify_count = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        base = Path(tmp)
        rate, lat = chained(base / "chained", append_count)
        lines = [p.read_bytes().splitlines(keepends=True) for p in log_files(base / "chained")]
        same_lines = [line for chunk in lines for line in chunk][:append_count]
        plain_rate, plain_lat = plain(base / "plain.jsonl", same_lines)
        print(f"append {append_count} records, {len(same_lines[0])} bytes each")
        print("                          records/s   p50 us   p99 us")
        print(f"chained + group commit  {rate:>11,.0f} {pct(lat, 50):>8.1f} {pct(lat, 99):>8.1f}")
        print(f"plain write() baseline  {plain_rate:>11,.0f} {pct(plain_lat, 50):>8.1f} {pct(plain_lat, 99):>8.1f}")
        print(f"ratio plain/chained: {plain_rate / rate:.2f}x")

        vdir = base / "verify"
        build = time.perf_counter()
        fast = WriterSettings(background_flush=True, group_records=4096, group_ms=50.0, checkpoint_records=10_000)
        with AuditWriter(vdir, base / "bench-key.pem", settings=fast) as writer:
            for _ in range(verify_count):
                writer.append(records.DECISION, PAYLOAD)
        build = time.perf_counter() - build
        size = sum(p.stat().st_size for p in log_files(vdir))
        start = time.perf_counter()
        report = verify_directory(vdir)
        elapsed = time.perf_counter() - start
        print(
            f"verify: {report.records:,} records in {report.files} files ({size / 1e6:.0f} MB) in {elapsed:.2f} s "
            f"({report.records / elapsed:,.0f} records/s); intact={report.intact}; built in {build:.1f} s"
        )


if __name__ == "__main__":
    main()
