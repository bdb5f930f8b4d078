"""The launch socket: adl-exec --daemon connects here.

A plain unix socket, not gRPC, because the daemon must learn the caller's uid from the kernel
(SO_PEERCRED) and receive its stdin, stdout and stderr (SCM_RIGHTS). The agent runs as that uid.
The daemon decides here (known agent, max_concurrent), registers the session, answers LaunchReply,
and hands the order to the spawner; the session's supervisor sends SessionEnded on this connection.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..audit import AuditUnavailable
from ..policy import Policy
from ..sandbox.session import record_refusal
from ..v1 import enforcer_pb2 as pb
from .auditsink import AuditSink
from .framing import FrameError, peer_credentials, recv_frame, send_frame
from .registry import SessionLimit, SessionRegistry
from .spawner import SpawnerHandle
from .store import PolicyStore

log = logging.getLogger("adl-enforcerd")
MAX_ARGV = 4096


class LaunchServer:
    def __init__(
        self,
        path: Path,
        store: PolicyStore,
        registry: SessionRegistry,
        sink: AuditSink,
        spawner: SpawnerHandle,
        serving: Callable[[], bool],
    ) -> None:
        self.path = path
        self.store, self.registry, self.sink, self.spawner = store, registry, sink, spawner
        self._serving = serving
        self._listener: socket.socket | None = None
        self._stop = threading.Event()

    def start(self, mode: int, gid: int | None) -> None:
        self.path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.path))
        os.chmod(self.path, mode)
        if gid is not None:
            os.chown(self.path, -1, gid)
        listener.listen(64)
        listener.settimeout(0.2)
        self._listener = listener
        threading.Thread(target=self._accept, name="launch-accept", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.close()
        self.path.unlink(missing_ok=True)

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), name="launch", daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        fds: list[int] = []
        try:
            conn.settimeout(10)
            _pid, uid, gid = peer_credentials(conn)
            frame = recv_frame(conn, max_fds=3)
            if frame is None:
                return
            data, fds = frame
            try:
                request = pb.LaunchRequest.FromString(data)
            except Exception:
                self._refuse(conn, "the launch request is not a valid LaunchRequest", [])
                return
            conn.settimeout(None)
            self._launch(conn, request, fds, uid, gid)
        except (OSError, FrameError) as exc:
            log.warning("launch connection failed: %s", exc)
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            conn.close()

    def _launch(self, conn: socket.socket, request: pb.LaunchRequest, fds: list[int], uid: int, gid: int) -> None:
        argv = list(request.argv)
        if len(fds) != 3:
            self._refuse(conn, "attach stdin, stdout and stderr to the launch request", argv)
            return
        if not argv or len(argv) > MAX_ARGV:
            self._refuse(conn, f"argv must hold 1 to {MAX_ARGV} arguments", argv)
            return
        if not self._serving():
            self._refuse(conn, "the daemon is not serving (audit log or policies unavailable)", argv)
            return
        entry = self.store.snapshot.resolve(request.agent)
        if entry is None:
            self._refuse(conn, f"no policy is loaded for agent {request.agent!r}", argv)
            return
        limits = entry.policy.limits
        try:
            session = self.registry.register(
                entry.key, limits.max_concurrent if limits else None, uid, gid, tuple(argv), int(time.time() * 1000)
            )
        except SessionLimit as exc:
            self._refuse(conn, str(exc), argv, entry.policy)
            return
        order = {
            "session": session.session,
            "agent": entry.key,
            "adl": entry.adl_document,
            "aaif": entry.aaif_document,
            "policy_digest": entry.policy.digest,
            "argv": argv,
            "environ": dict(request.environ),
            "cwd": request.cwd or "/",
            "uid": uid,
            "gid": gid,
            "accept_unenforced": list(request.accept_unenforced),
            "pids_max": request.pids_max or 512,
        }
        try:
            send_frame(
                conn,
                pb.LaunchReply(
                    accepted=True,
                    session=session.session,
                    session_token=session.token,
                    policy_digest=entry.policy.digest,
                ).SerializeToString(),
            )
            self.spawner.launch(order, [*fds, conn.fileno()])
        except (OSError, FrameError) as exc:
            self.registry.end(session.session)
            with contextlib.suppress(OSError, FrameError):
                send_frame(
                    conn,
                    pb.SessionEnded(
                        session=session.session, reason="refused", exit_code=125, detail=f"spawner unavailable: {exc}"
                    ).SerializeToString(),
                )

    def _refuse(self, conn: socket.socket, reason: str, argv: list[str], policy: Policy | None = None) -> None:
        with contextlib.suppress(AuditUnavailable):
            record_refusal(self.sink, policy, "launch", reason, argv)
        with contextlib.suppress(OSError, FrameError):
            send_frame(conn, pb.LaunchReply(accepted=False, refusal=reason).SerializeToString())
