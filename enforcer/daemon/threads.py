"""Worker threads when the daemon is out of tasks.

Thread.start() raises RuntimeError ("can't start new thread") once the unit's TasksMax or a pids
cgroup is full, and every session's processes count against the unit's tasks. grpcio's sync server
starts its pool's threads from the thread that polls for calls: a RuntimeError there ends that
thread, and with it every method the sync server answers (health, Status, WaitApproval), for good.
This pool never raises for want of a thread: the call waits in the queue for a thread that is
already running, and the daemon's main loop starts the missing ones once tasks are free again.
"""

from __future__ import annotations

import logging
from concurrent import futures

log = logging.getLogger("adl-enforcerd")


class TaskLimitedPool(futures.ThreadPoolExecutor):
    """A ThreadPoolExecutor whose submit() queues the call when no new thread can start."""

    start_failures = 0  # threads that could not start, over the pool's life

    def _adjust_thread_count(self) -> None:
        try:
            super()._adjust_thread_count()
        except RuntimeError as exc:
            self.start_failures += 1
            if self.start_failures & (self.start_failures - 1) == 0:  # the 1st, 2nd, 4th, 8th...
                log.error(
                    "%s: no thread could start (%s; %d times so far): calls wait for a busy thread",
                    self._thread_name_prefix,
                    exc,
                    self.start_failures,
                )

    def catch_up(self) -> None:
        """Start a thread for calls still queued, if one can start now."""
        if not self._shutdown and not self._work_queue.empty() and len(self._threads) < self._max_workers:
            self._adjust_thread_count()
