"""How fast one API caller grows the daemon's audit log, and what another caller sees meanwhile.

A real adl-enforcerd (the tests' set-up, in a temporary directory). One unprivileged uid (the
flooder) calls Check from THREADS threads as fast as the daemon answers, for SECONDS; a second uid
calls Check every 10 ms at the same time. Prints the log's growth (bytes/s, records/s), the
flooder's answers by status, and the other caller's answers by status and how many of its
decisions have a record. With --disk MIB the audit log lives on a tmpfs of that size, so the flood
can fill it: the run then says what the other caller saw once it was full.

Run (as root): .venv/bin/python bench/audit_flood.py [SECONDS] [THREADS] [--disk MIB]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OTHER_UID = 64000 + os.getpid() % 1000  # no account needed: setpriv takes a number

CLIENT = """
import json, sys, threading, time, collections
import grpc
from enforcer.v1 import enforcer_pb2 as pb, enforcer_pb2_grpc as pb_grpc
path, seconds, threads, pause = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
codes, ids = collections.Counter(), []
lock = threading.Lock()
def run(i):
    stub = pb_grpc.EnforcerStub(grpc.insecure_channel("unix:" + path))
    request = pb.CheckRequest(agent="Fast", tool=pb.ToolCall(name="read_note",
                              arguments_json=json.dumps({"name": "note-%d" % i})))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            reply = stub.Check(request, timeout=5)
            code = "OK"
            if pause:
                with lock:
                    ids.append(reply.decision_id)
        except grpc.RpcError as exc:
            code = exc.code().name
        with lock:
            codes[code] += 1
        if pause:
            time.sleep(pause)
workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
for w in workers: w.start()
for w in workers: w.join()
print(json.dumps({"codes": codes, "ids": ids}))
"""


def audit_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def main() -> None:
    sys.path.insert(0, str(REPO))
    from tests.helpers.daemon import RunningDaemon
    from tests.helpers.sandbox import AGENT_GID, AGENT_UID, Sandbox, agent_tmp_dir

    args = sys.argv[1 : sys.argv.index("--disk")] if "--disk" in sys.argv else sys.argv[1:]
    seconds = float(args[0]) if args else 5.0
    threads = int(args[1]) if len(args) > 1 else 4
    disk = int(sys.argv[sys.argv.index("--disk") + 1]) if "--disk" in sys.argv else 0
    with agent_tmp_dir() as tmp:
        root = Path(tmp)
        daemon = RunningDaemon(root, Sandbox(root / "box"))
        daemon.write_agents()
        daemon.extra_env["ADL_ENFORCER_AGENT_CALLERS"] = json.dumps({"*": [f"uid:{AGENT_UID}", f"uid:{OTHER_UID}"]})
        if disk:
            daemon.audit.mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={disk}m", "tmpfs", str(daemon.audit)], check=True)
        try:
            daemon.start()
            count = len(daemon.records())
            size = audit_bytes(daemon.audit)

            def client(uid: int, threads: int, pause: float) -> subprocess.Popen[str]:
                as_user = ["setpriv", f"--reuid={uid}", f"--regid={AGENT_GID}", "--clear-groups"]
                argv = [sys.executable, "-c", CLIENT, str(daemon.api), str(seconds), str(threads), str(pause)]
                return subprocess.Popen([*as_user, *argv], stdout=subprocess.PIPE, text=True, cwd=REPO)

            started = time.monotonic()
            flooder, other = client(AGENT_UID, threads, 0.0), client(OTHER_UID, 1, 0.01)
            flood, calm = json.loads(flooder.communicate()[0]), json.loads(other.communicate()[0])
            took = time.monotonic() - started
            grown = audit_bytes(daemon.audit) - size
            health = daemon.health()
            records = daemon.records()
            written = len(records) - count
            by_uid = Counter(r["payload"].get("caller_uid") for r in records[count:])
            recorded = {r["payload"].get("decision_id") for r in records[count:]}
            print(f"{took:.1f} s, flooder {threads} threads: {dict(flood['codes'])}")
            kept = sum(i in recorded for i in calm["ids"])
            print(f"other uid: {dict(calm['codes'])}, {kept} of its decisions recorded")
            rates = f"{grown / took:,.0f} B/s, {written / took:,.0f} records/s"
            print(f"log grew {grown} bytes, {written} records: {rates}")
            print(f"records by caller_uid: {dict(by_uid)}; health after: {health}")
        finally:
            daemon.cleanup()
            if disk:
                subprocess.run(["umount", "-l", str(daemon.audit)], check=False)


if __name__ == "__main__":
    main()
