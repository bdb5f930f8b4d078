"""One thread driving non-blocking sockets: epoll(7), timers on a heap, and work posted by other
threads (woken through a pipe). Every callback runs on the loop's thread, so what it touches needs no
lock against the loop itself; a callback must never block.

Level-triggered epoll: a callback that leaves readiness unconsumed is called again at the next
poll, so each one must either consume what woke it or stop asking for it.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable

Handler = Callable[[int], None]  # called with the epoll event mask
# Cancelled timers stay in the heap until their time; past this many (and half the heap) it is rebuilt,
# so timers an agent's connections set and cancel cannot pile up.
_COMPACT_AFTER = 1024


class Timer:
    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False


class Loop:
    """The epoll set, the timer heap and the posted work of one loop thread. `wake` is a pipe
    (read end, write end) the loop watches: post() writes to it, as may whoever wants the loop to
    look at its state again (stop)."""

    def __init__(self, wake: tuple[int, int]) -> None:
        self._epoll = select.epoll()  # close-on-exec
        self._wake = wake
        os.set_blocking(wake[0], False)
        os.set_blocking(wake[1], False)
        self._handlers: dict[int, Handler] = {}
        self._masks: dict[int, int] = {}
        self._timers: list[tuple[float, int, Timer]] = []
        self._cancelled = 0
        self._order = itertools.count()
        self._posted: deque[Callable[[], None]] = deque()
        self._poked = threading.Event()  # a byte is in the wake pipe, not yet read
        self._gate = threading.Lock()  # a poke never writes to the pipe's numbers once they are closed
        self._closed = False
        self._posting_closed = False
        self._closed_in_batch: set[int] = set()
        self.on_wake: Callable[[], None] = lambda: None  # after posted work, at each wake
        self._epoll.register(wake[0], select.EPOLLIN)
        self.thread_id: int | None = None

    # -- descriptors

    def watch(self, fd: int, mask: int, handler: Handler) -> None:
        """Call `handler` when `fd` is ready for `mask` (registers, or changes the registration)."""
        if fd in self._handlers:
            if self._masks[fd] != mask:
                self._epoll.modify(fd, mask)
                self._masks[fd] = mask
        else:
            self._epoll.register(fd, mask)
            self._masks[fd] = mask
        self._handlers[fd] = handler

    def forget(self, fd: int) -> None:
        """Stop watching `fd` (before it is closed). An event for it already read in this round is
        dropped: the number may be reused by a descriptor opened before the round ends."""
        if self._handlers.pop(fd, None) is not None:
            del self._masks[fd]
            with contextlib.suppress(OSError):
                self._epoll.unregister(fd)
            self._closed_in_batch.add(fd)

    def watched(self) -> int:
        return len(self._handlers)

    # -- timers

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(when, callback)
        heapq.heappush(self._timers, (when, next(self._order), timer))
        return timer

    def cancel(self, timer: Timer | None) -> None:
        if timer is not None and not timer.cancelled:
            timer.cancelled = True
            self._cancelled += 1
            if self._cancelled > _COMPACT_AFTER and self._cancelled * 2 > len(self._timers):
                self._timers = [entry for entry in self._timers if not entry[2].cancelled]
                heapq.heapify(self._timers)
                self._cancelled = 0

    def timers(self) -> int:
        """Timers set and not yet run or cancelled."""
        return len(self._timers) - self._cancelled

    # -- from other threads

    def post(self, callback: Callable[[], None]) -> bool:
        """Run `callback` on the loop's thread soon (thread-safe). False: the loop has ended, or is
        ending (close_posting()), and will not run it; what it was to do is the caller's."""
        with self._gate:
            if self._closed or self._posting_closed:
                return False
            self._posted.append(callback)
        self.poke()
        return True

    def pending(self) -> bool:
        """Whether work was posted and has not run yet."""
        return bool(self._posted)

    def close_posting(self) -> list[Callable[[], None]]:
        """Take no more posted work; return what was posted and never ran (the loop is ending)."""
        with self._gate:
            self._posting_closed = True
            left = list(self._posted)
            self._posted.clear()
        return left

    def poke(self) -> None:
        """Wake the loop (thread-safe): it runs posted work and `on_wake`."""
        if self._poked.is_set():
            return
        with self._gate:
            if self._closed:
                return  # the loop has ended: nothing will run what was posted
            self._poked.set()
            with contextlib.suppress(BlockingIOError):  # full: a wake is pending anyway
                os.write(self._wake[1], b"x")

    # -- running

    def run_once(self) -> None:
        """Wait for the next events or timer, then run their callbacks."""
        timeout = -1.0
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
            self._cancelled -= 1
        if self._timers:
            timeout = max(0.0, self._timers[0][0] - time.monotonic())
        events = self._epoll.poll(timeout)
        self._closed_in_batch.clear()
        for fd, mask in events:
            if fd == self._wake[0]:
                self._woken()
                continue
            if fd in self._closed_in_batch:
                continue
            handler = self._handlers.get(fd)
            if handler is not None:
                handler(mask)
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                self._cancelled -= 1
                continue
            timer.cancelled = True  # run once; a later cancel() is a no-op
            timer.callback()

    def _woken(self) -> None:
        # Drained before the flag is cleared: a poke whose byte is drained here and that set the
        # flag again would otherwise leave it set with the pipe empty, and every later poke (the
        # stop's among them) would take the flag for a pending wake and write nothing.
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake[0], 4096):
                pass
        self._poked.clear()
        while self._posted:
            self._posted.popleft()()
        self.on_wake()

    def close(self) -> None:
        """Release the epoll set and the wake pipe; the loop runs no more."""
        with self._gate:
            self._closed = True
            self._epoll.close()
            for end in self._wake:
                with contextlib.suppress(OSError):
                    os.close(end)
        self._handlers.clear()
        self._masks.clear()
        self._timers.clear()
        self._posted.clear()
