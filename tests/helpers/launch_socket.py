"""A stand-in for adl-enforcerd's launch socket, for testing the adl-exec --daemon client."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from pathlib import Path

from enforcer.framing import recv_frame, send_frame
from enforcer.v1 import enforcer_pb2 as pb


class ScriptedDaemon:
    """A launch socket that answers one connection with the frames it is given (None: close), and
    notes the request and what each descriptor that came with it is."""

    def __init__(self, directory: Path, answers: list[bytes | None]) -> None:
        self.path = directory / f"launch-{uuid.uuid4().hex[:8]}.sock"
        self.answers = answers
        self.request: pb.LaunchRequest | None = None
        self.received: list[os.stat_result] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.path))
        self.listener.listen(1)
        self.listener.settimeout(30)  # a client that never comes does not hold the test for ever
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            frame = recv_frame(conn, max_fds=4)
            assert frame is not None
            for fd in frame[1]:
                self.received.append(os.fstat(fd))
                os.close(fd)
            self.request = pb.LaunchRequest.FromString(frame[0])
            for answer in self.answers:
                if answer is None:
                    return
                send_frame(conn, answer)

    def close(self) -> None:
        self.thread.join(timeout=10)
        self.listener.close()
        self.path.unlink(missing_ok=True)
