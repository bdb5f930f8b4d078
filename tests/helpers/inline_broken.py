"""adl-enforcerd whose inline loop never sends an answer: what a grpcio release whose core calls kept
their names but changed behaviour would look like. Integration tests run the daemon through this.
With ADL_TEST_INLINE=hold the loop keeps the calls it gets and never answers them, so the start
probe waits out its whole deadline; otherwise the answer is dropped (the call ends at once)."""

from __future__ import annotations

import os
import sys
from typing import Any

from enforcer.daemon import spawner

_start = spawner.start


def _start_then_break(*args: Any, **kwargs: Any) -> Any:
    handle = _start(*args, **kwargs)
    from enforcer.daemon.inline import InlineUnary  # imports grpc: only once the spawner runs

    if os.environ.get("ADL_TEST_INLINE") == "hold":
        held: list[Any] = []
        InlineUnary._answer_all = lambda self, arrived: held.extend(arrived)  # type: ignore[method-assign]
    else:
        InlineUnary._send = lambda self, call, answer: None  # type: ignore[method-assign]
    return handle


spawner.start = _start_then_break

if __name__ == "__main__":
    from enforcer.cli.enforcerd import main

    sys.exit(main(sys.argv[1:]))
