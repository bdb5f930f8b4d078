"""adl-enforcerd whose inline loop never sends an answer: what a grpcio release whose core calls kept
their names but changed behaviour would look like. Integration tests run the daemon through this."""

from __future__ import annotations

import sys
from typing import Any

from enforcer.daemon import spawner

_start = spawner.start


def _start_then_break(*args: Any, **kwargs: Any) -> Any:
    handle = _start(*args, **kwargs)
    from enforcer.daemon.inline import InlineUnary  # imports grpc: only once the spawner runs

    InlineUnary._send = lambda self, call, answer: None  # type: ignore[method-assign]
    return handle


spawner.start = _start_then_break

if __name__ == "__main__":
    from enforcer.cli.enforcerd import main

    sys.exit(main(sys.argv[1:]))
