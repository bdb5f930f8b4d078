"""A hostile member of the socket group floods the daemon with requests it must record: the audit
log every caller shares must grow only by that caller's budget, every decision still has its record,
what was refused beyond the budget is counted in a summary written when the window ends (not with
the caller's next record), and another uid is recorded in full meanwhile."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import pytest

from enforcer.daemon.quota import RECORD_BASE_BYTES
from enforcer.framing import recv_frame, send_frame
from enforcer.v1 import enforcer_pb2 as pb

from ..helpers.daemon import REPO, RunningDaemon
from ..helpers.sandbox import AGENT_GID, AGENT_UID

pytestmark = [
    pytest.mark.daemon,
    pytest.mark.skipif(os.geteuid() != 0, reason="the daemon needs root (cgroups, namespaces)"),
]

OTHER_UID = 64000 + os.getpid() % 1000  # a second caller; setpriv needs no account for a number
BUDGET = 256 << 10  # bytes of decision records per uid and window
WINDOW_S = 4.0
FLOOD_S = 2.0

# Calls Check as fast as the daemon answers (pause 0) or every `pause` seconds, from `threads`
# threads, and prints each answer's status and every decision id it was given.
CLIENT = """
import collections, json, sys, threading, time
import grpc
from enforcer.v1 import enforcer_pb2 as pb, enforcer_pb2_grpc as pb_grpc
path, seconds, threads, pause = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
codes, ids, lock = collections.Counter(), [], threading.Lock()
def run(i):
    stub = pb_grpc.EnforcerStub(grpc.insecure_channel("unix:" + path))
    request = pb.CheckRequest(agent="Fast", tool=pb.ToolCall(name="read_note", arguments_json='{"name": "n"}'))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            reply = stub.Check(request, timeout=10)
            with lock:
                codes["OK"] += 1
                ids.append(reply.decision_id)
        except grpc.RpcError as exc:
            with lock:
                codes[exc.code().name] += 1
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    codes["details:" + exc.details()[:60]] += 1
        time.sleep(pause)
workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
for w in workers: w.start()
for w in workers: w.join()
print(json.dumps({"codes": codes, "ids": ids}))
"""


def _client(daemon: RunningDaemon, uid: int, threads: int, pause: float) -> subprocess.Popen[str]:
    as_user = ["setpriv", f"--reuid={uid}", f"--regid={AGENT_GID}", "--clear-groups"]
    argv = [sys.executable, "-c", CLIENT, str(daemon.api), str(FLOOD_S), str(threads), str(pause)]
    return subprocess.Popen([*as_user, *argv], stdout=subprocess.PIPE, text=True, cwd=REPO)


def _refusals(daemon: RunningDaemon) -> list[dict[str, Any]]:
    return [r["payload"] for r in daemon.records() if r["intent"] == "adl.enforcer.refused"]


def test_one_uids_flood_of_checks_is_bounded_counted_on_time_and_another_uid_is_recorded_in_full(
    daemon: RunningDaemon,
) -> None:
    daemon.stop()
    daemon.extra_env.update(
        {
            "ADL_ENFORCER_AGENT_CALLERS": json.dumps({"*": [f"uid:{AGENT_UID}", f"uid:{OTHER_UID}"]}),
            "ADL_ENFORCER_MAX_REQUEST_BYTES": str(64 << 10),
            "ADL_ENFORCER_CHECK_AUDIT_BYTES_PER_UID": str(BUDGET),
            "ADL_ENFORCER_AUDIT_BUDGET_WINDOW_S": str(WINDOW_S),
        }
    )
    daemon.start()
    started = time.monotonic()
    flooder, other = _client(daemon, AGENT_UID, 4, 0.0), _client(daemon, OTHER_UID, 1, 0.02)
    flood, calm = json.loads(flooder.communicate(timeout=60)[0]), json.loads(other.communicate(timeout=60)[0])
    # The summary is written when the flooder's window ends, although it sends nothing more.
    time.sleep(max(0.0, started + WINDOW_S + 1.5 - time.monotonic()))
    records = [r["payload"] for r in daemon.records()]
    decisions = [r for r in records if r.get("decision_id", "").startswith("dec-")]
    by_uid = Counter(r.get("caller_uid") for r in decisions)
    print(f"flooder {dict(flood['codes'])}, other {dict(calm['codes'])}, decision records {dict(by_uid)}")

    refused = flood["codes"].get("RESOURCE_EXHAUSTED", 0)
    assert refused > 0, f"one uid's flood was never refused: {dict(flood['codes'])}, {by_uid[AGENT_UID]} records"
    assert flood["codes"]["OK"] + refused == sum(v for k, v in flood["codes"].items() if ":" not in k)
    assert any("audit budget" in k for k in flood["codes"]), flood["codes"]
    # Bounded: the flooder's records fit its budget (a record costs its request and RECORD_BASE_BYTES).
    assert 0 < by_uid[AGENT_UID] <= BUDGET // RECORD_BASE_BYTES, by_uid
    # Provable: every decision the flooder was answered has its record; nothing refused was decided.
    recorded = {r["decision_id"] for r in decisions}
    assert set(flood["ids"]) <= recorded and by_uid[AGENT_UID] == flood["codes"]["OK"]
    # Another uid meanwhile: every Check answered and recorded.
    assert set(calm["codes"]) == {"OK"} and calm["codes"]["OK"] > 20, calm["codes"]
    assert set(calm["ids"]) <= recorded and by_uid[OTHER_UID] == calm["codes"]["OK"]
    # Accountable: one record when the refusals begin, one summary counting them when the window ends.
    ours = [r for r in _refusals(daemon) if r.get("caller_uid") == AGENT_UID]
    onset = [r for r in ours if "checks_refused" not in r]
    (summary,) = [r for r in ours if "checks_refused" in r]
    assert len(onset) == 1 and "refused undecided" in onset[0]["refusal"], onset
    assert summary["checks_refused"] == refused and summary["window_s"] == WINDOW_S, summary
    assert not [r for r in _refusals(daemon) if r.get("caller_uid") == OTHER_UID]


def _refuse_launch(daemon: RunningDaemon) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as conn:
        conn.settimeout(30)
        conn.connect(str(daemon.launch))
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            request = pb.LaunchRequest(agent="Sandboxed", argv=["cat"], cwd="/")  # a root caller: refused
            send_frame(conn, request.SerializeToString(), [null] * 3)
        finally:
            os.close(null)
        frame = recv_frame(conn)
    assert frame is not None and not pb.LaunchReply.FromString(frame[0]).accepted


def test_launch_refusals_counted_only_are_written_when_the_window_ends(daemon: RunningDaemon) -> None:
    """Before, a uid's counted refusals were written only with its next detailed refusal: a flood
    that stopped left its count unwritten for as long as the uid stayed quiet."""
    daemon.stop()
    daemon.extra_env.update({"ADL_ENFORCER_LAUNCH_REFUSALS_PER_UID": "5", "ADL_ENFORCER_AUDIT_BUDGET_WINDOW_S": "2"})
    daemon.start()
    started = time.monotonic()
    for _ in range(30):
        _refuse_launch(daemon)
    assert time.monotonic() - started < 2, "the refusals must fall in one window"
    time.sleep(max(0.0, started + 3.5 - time.monotonic()))
    ours = [r for r in _refusals(daemon) if r.get("caller_uid") == 0]
    detailed = [r for r in ours if "argv" in r]
    (summary,) = [r for r in ours if "refusals_counted_only" in r]
    assert len(detailed) == 5, len(detailed)
    assert summary["refusals_counted_only"] == 25 and summary["window_s"] == 2, summary


def test_counts_of_a_window_still_open_are_written_when_the_daemon_stops(daemon: RunningDaemon) -> None:
    daemon.stop()
    daemon.extra_env.update({"ADL_ENFORCER_LAUNCH_REFUSALS_PER_UID": "5"})  # the window: 60 s
    daemon.start()
    for _ in range(8):
        _refuse_launch(daemon)
    assert daemon.stop() == 0
    (summary,) = [r for r in _refusals(daemon) if "refusals_counted_only" in r]
    assert summary["refusals_counted_only"] == 3 and summary["caller_uid"] == 0, summary
