"""The creation guard's helper thread (creation_guard.WideRights): every call it is handed runs on
that thread, whose Landlock domain is the wider one, never on the caller's; what it raises reaches
the caller."""

from __future__ import annotations

import os
import threading

import pytest

from enforcer.sandbox.creation_guard import WideRights


def test_calls_run_on_the_helper_thread() -> None:
    wide = WideRights()
    helper = wide.call(threading.get_ident)
    assert helper != threading.get_ident()
    assert wide.call(threading.get_ident) == helper  # one thread, for every call
    assert wide.call(os.getpid) == os.getpid()


def test_what_a_call_raises_reaches_the_caller_and_the_helper_serves_on(tmp_path: os.PathLike[str]) -> None:
    wide = WideRights()
    with pytest.raises(FileNotFoundError):
        wide.open(os.path.join(tmp_path, "missing"), os.O_RDONLY)
    fd = wide.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert os.get_inheritable(fd) is False  # opened close-on-exec
    finally:
        os.close(fd)
