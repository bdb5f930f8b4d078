"""One sandboxed /bin/true launched the way adl-exec launches it, timed from inside.

The stage and guardian are forked first, while the interpreter is small; the policy code is imported
after (in adl-exec those imports overlap the stage's own on the other core). Then the plan and the
launch (cgroup, stage order, namespaces, masks, Landlock, seccomp, exec, wait, cleanup) are timed.
Prints milliseconds. Run by bench/launch.py: launch_once.py POLICY BASELINE
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from enforcer.sandbox.stage import new_session_id, prepare


def main() -> None:
    prepared = prepare(new_session_id())
    from enforcer.documents import load_policy
    from enforcer.sandbox import launcher
    from enforcer.sandbox.plan import build_plan, load_baseline
    from enforcer.session import host_features

    policy = load_policy(Path(sys.argv[1]))
    baseline = load_baseline(Path(sys.argv[2]))
    features = host_features()
    start = time.perf_counter()
    plan = build_plan(policy, ["/bin/true"], baseline=baseline, environ={}, features=features)
    outcome = launcher.run(plan, prepared.session, prepared=prepared, uid=65534, gid=65534)  # never root
    elapsed = time.perf_counter() - start
    prepared.discard()
    assert outcome.exit_code == 0, outcome
    print(f"{elapsed * 1000:.3f}")


if __name__ == "__main__":
    main()
