"""Launch cost: adl-exec against bwrap and a bare /bin/true, in one run (needs root and bubblewrap).

Prints medians of N runs for:
  bare         /bin/true (fork + exec from this process)
  bwrap        bwrap --unshare-all --ro-bind / / /bin/true, whole run
  adl-exec     the adl-exec command, whole run (interpreter start-up, imports, audit log included)
  interpreter  python -c pass, and python -c 'import enforcer.cli.exec' (the import path adl-exec pays)
  setup cold   bench/launch_once.py, once per fresh interpreter: the stage forked before the policy
               code is imported, as adl-exec does; plan + launch timed from inside (cold caches, as
               every adl-exec run is)
  setup        in-process: build the plan and run /bin/true in the sandbox (cgroup, stage order, namespaces,
               masks, Landlock, seccomp, exec, wait, cleanup): sandbox setup without interpreter start-up.
               adl-exec forks the stage and guardian ahead, while it imports the policy code; here they
               are forked just before each timed run (and that fork is timed on its own line), then
               again with the fork on the launch path, and with a denied pattern and a writable grant,
               which adds the creation guard
  creation     inside a sandbox, the cost of creating a file (open O_CREAT + close) with and
               without the creation guard, and of opening an existing file without O_CREAT

Run: .venv/bin/python bench/launch.py detail [N]

`bench/launch.py memory [ROUNDS [OTHER_TREE]]`: each enforcer process's USS and PSS during a `sleep`
session, without and with the egress filter, alternating with OTHER_TREE's (PYTHONPATH).

`bench/launch.py daemon [ROUNDS [OTHER_TREE]]`: `adl-exec --daemon -- /bin/true` against a running
adl-enforcerd (the tests' daemon set-up, in a temporary directory), interleaved with `python -c pass`
and bwrap, and with OTHER_TREE's client (PYTHONPATH; compile its bytecode first, as the client runs as
the agents' test user) against the same daemon; then the USS and PSS of each enforcer process of a
daemon session running `sleep` (its supervisor and the processes under it).

The default, `.venv/bin/python bench/launch.py [ROUNDS]`, times whole runs interleaved: each round
runs every command below once, in a rotated order, and each figure is reported as its median and the
median and range of its per-round ratio to `python -c pass` and to bwrap timed in the same round:
  adl-exec, same documents     the compiled-policy cache holds them (the usual case)
  adl-exec, allowed hosts      the same, with the egress filter up (DNS stub, capture, relay)
  adl-exec, new documents      cache off: read, validate, compile, plan, launch
  adl-exec, refused            a command the policy does not allow (validation cached)
and firejail and Codex's sandbox when installed (see other_sandboxes()), then the USS (private memory)
and PSS summed over the sandbox's own processes while a session runs `sleep`: adl-exec without and
with the egress filter, and each other sandbox. This process imports the enforcer, so pages of the
libraries it maps too (cryptography's module) count as shared here, as they are beside any other
enforcer process; `bench/session_smaps.py` counts a session whose files nothing else maps.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from enforcer.documents import load_policy
from enforcer.sandbox import launcher
from enforcer.sandbox.plan import build_plan, load_baseline
from enforcer.sandbox.stage import Prepared, new_session_id, prepare
from enforcer.session import host_features

REPO = Path(__file__).resolve().parent.parent
AGENT = 65534  # nobody/nogroup: the agent never runs as root
USER = f"{AGENT}:{AGENT}"
BASELINE = REPO / "policies" / "runtime-baseline.yaml"
POLICY = {
    "adl_spec": "0.3.0",
    "name": "Bench",
    "description": "runs /bin/true",
    "version": "1.0.0",
    "data_classification": {"sensitivity": "internal"},
    "permissions": {
        "filesystem": {"allowed_paths": [{"path": "/tmp/**", "access": "read"}], "denied_paths": []},
        "execution": {"allowed_commands": ["true"], "allow_shell": False},
        "resource_limits": {"max_memory_mb": 64, "max_duration_sec": 10},
    },
}


def median_ms(fn: Callable[[], object], n: int, before: Callable[[], object] = lambda: None) -> float:
    """Median wall time of fn(before()), where before() runs untimed."""
    fn(before())  # warm caches
    samples = []
    for _ in range(n):
        ready = before()
        start = time.perf_counter()
        fn(ready)
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


CREATE_LOOP = """
import os, time
base = {base!r}
n = {n}
start = time.perf_counter()
for i in range(n):
    os.close(os.open(f"{{base}}/f{{i}}", os.O_CREAT | os.O_WRONLY, 0o600))
created = time.perf_counter() - start
start = time.perf_counter()
for i in range(n):
    os.close(os.open(f"{{base}}/f{{i}}", os.O_RDONLY))
print((created / n) * 1e6, (time.perf_counter() - start) / n * 1e6)
"""


def creation_cost(env: dict[str, str], guarded: bool, n: int = 2000) -> tuple[float, float]:
    """(µs per created file, µs per plain open) measured inside a sandbox, on tmpfs so the disk's
    noise does not hide the guard's cost."""
    base = Path(tempfile.mkdtemp(dir="/dev/shm")) / ("guarded" if guarded else "plain")
    base.mkdir()
    base.parent.chmod(0o711)  # the agent runs as AGENT (never root): it must reach and own its files
    os.chown(base, AGENT, AGENT)
    doc = json.loads(json.dumps(POLICY))
    doc["permissions"]["execution"]["allowed_commands"] = ["python3"]
    doc["permissions"]["filesystem"] = {
        "allowed_paths": [{"path": f"{base}/**", "access": "read_write"}],
        "denied_paths": [f"{base}/**/*.pem"] if guarded else [],
    }
    policy = base.with_suffix(".adl.json")
    policy.write_text(json.dumps(doc))
    code = CREATE_LOOP.format(base=str(base), n=n)
    out = subprocess.run(
        [sys.executable, "-m", "enforcer.cli.exec", "--adl", str(policy), "--user", USER, "--", "python3", "-c", code],
        check=True,
        env=env,
        capture_output=True,
        text=True,
    ).stdout.split()
    shutil.rmtree(base.parent)
    return float(out[0]), float(out[1])


def run(argv: list[str], env: dict[str, str] | None = None, *_: object) -> None:
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL)


def cold_setup_ms(policy: Path, n: int) -> float:
    once = [sys.executable, str(REPO / "bench" / "launch_once.py"), str(policy), str(BASELINE)]
    samples = [float(subprocess.run(once, check=True, capture_output=True, text=True).stdout) for _ in range(n + 1)]
    return statistics.median(samples[1:])


def uss_kib(pid: int, fields: tuple[str, ...] = ("Private_Clean:", "Private_Dirty:")) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith(fields))


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out


def session_uss_mib(
    argv: list[str],
    env: dict[str, str],
    per_process: list[tuple[str, float, float]] | None = None,
    cwd: str | None = None,
) -> tuple[float, float]:
    """(USS, PSS) summed over adl-exec and every process under it but the agent (`sleep`),
    mid-session. Pages the enforcer's own processes share after a fork count in neither one's USS;
    PSS splits them. `per_process` receives (command line, USS, PSS) for each."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, cwd=cwd)
    try:
        time.sleep(1.5)
        uss = pss = 0
        for pid in descendants(proc.pid):
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() == "sleep":
                        continue
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                own, proportional = uss_kib(pid), uss_kib(pid, ("Pss:",))
            except OSError:
                continue
            uss += own
            pss += proportional
            if per_process is not None:
                per_process.append((command, own / 1024, proportional / 1024))
        return uss / 1024, pss / 1024
    finally:
        proc.wait(timeout=30)


def other_sandboxes() -> dict[str, list[str]]:
    """The other sandboxes installed here, as command prefixes: firejail, and Codex's sandbox when
    CODEX_BIN names its native binary (it keeps helper files under $HOME/.codex, which must not be
    below /tmp)."""
    found: dict[str, list[str]] = {}
    if shutil.which("firejail"):
        found["firejail --net=none"] = ["firejail", "--quiet", "--noprofile", "--net=none"]
    if os.environ.get("CODEX_BIN"):
        found["codex sandbox"] = [os.environ["CODEX_BIN"], "sandbox", "--"]
    return found


def interleaved(rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="adl-bench-launch-") as tmp:
        # An installed package has its bytecode cached; without it every module is compiled from
        # source on every run (PYTHONDONTWRITEBYTECODE=1 in the environment would hide that).
        env = {
            **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
            "ADL_ENFORCER_AUDIT_DIR": f"{tmp}/audit",
            "ADL_ENFORCER_AUDIT_KEY": f"{tmp}/key.pem",
            "ADL_ENFORCER_CACHE_DIR": f"{tmp}/cache",
        }
        plain = Path(tmp) / "bench.adl.json"
        plain.write_text(json.dumps(POLICY))
        net_doc = json.loads(json.dumps(POLICY))
        net_doc["permissions"]["execution"]["allowed_commands"] = ["true", "sleep"]
        net_doc["permissions"]["network"] = {"allowed_hosts": ["example.com"], "allowed_ports": [443]}
        net = Path(tmp) / "net.adl.json"
        net.write_text(json.dumps(net_doc))
        sleeper_doc = json.loads(json.dumps(POLICY))
        sleeper_doc["permissions"]["execution"]["allowed_commands"] = ["sleep"]
        sleeper = Path(tmp) / "sleep.adl.json"
        sleeper.write_text(json.dumps(sleeper_doc))

        def adl_exec(policy: Path, *command: str) -> list[str]:
            return [sys.executable, "-m", "enforcer.cli.exec", "--adl", str(policy), "--user", USER, "--", *command]

        commands: dict[str, tuple[list[str], dict[str, str], int]] = {
            "python -c pass": ([sys.executable, "-c", "pass"], env, 0),
            "bwrap --unshare-all": (["bwrap", "--unshare-all", "--ro-bind", "/", "/", "/bin/true"], env, 0),
            "adl-exec, same documents": (adl_exec(plain, "/bin/true"), env, 0),
            "adl-exec, allowed hosts": (adl_exec(net, "/bin/true"), env, 0),
            "adl-exec, new documents": (adl_exec(plain, "/bin/true"), {**env, "ADL_ENFORCER_CACHE_DIR": "off"}, 0),
            "adl-exec, refused": (adl_exec(plain, "/bin/cat", "/etc/hostname"), env, 125),
        }
        others = other_sandboxes()
        for name, prefix in others.items():
            commands[name] = ([*prefix, "/bin/true"], env, 0)
        for argv, environ, expected in commands.values():  # warm the page cache and the policy cache
            code = subprocess.run(argv, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
            if code != expected:
                raise SystemExit(f"{argv}: exit code {code}, expected {expected}")
        names = list(commands)
        samples: dict[str, list[float]] = {name: [] for name in names}
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                argv, environ, _ = commands[name]
                start = time.perf_counter()
                subprocess.run(argv, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                samples[name].append((time.perf_counter() - start) * 1000)
        # The sessions measured below hit the policy cache, as the usual launch does.
        subprocess.run(adl_exec(sleeper, "sleep", "0"), env=env, check=True, stdout=subprocess.DEVNULL)
        memory = {
            "no network": session_uss_mib(adl_exec(sleeper, "sleep", "3"), env),
            "egress filter": session_uss_mib(adl_exec(net, "sleep", "3"), env),
            "bwrap --unshare-all": session_uss_mib(
                ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "sleep", "3"], env
            ),
            **{name: session_uss_mib([*prefix, "sleep", "3"], env) for name, prefix in others.items()},
        }

    def ratio(name: str, base: str) -> str:
        per_round = [a / b for a, b in zip(samples[name], samples[base], strict=True)]
        return f"{statistics.median(per_round):6.2f}x ({min(per_round):.2f}-{max(per_round):.2f})"

    print(f"whole runs, {rounds} interleaved rounds: median ms; per-round ratio median (range)")
    print(f"  {'command':<28} {'ms':>8}   {'vs python -c pass':<22} {'vs bwrap':<22}")
    for name in names:
        print(
            f"  {name:<28} {statistics.median(samples[name]):8.1f}   "
            f"{ratio(name, 'python -c pass'):<22} {ratio(name, 'bwrap --unshare-all'):<22}"
        )
    print("the sandbox's own processes during a session, summed (MiB):   USS      PSS")
    for name, (uss, pss) in memory.items():
        print(f"  {name:<58} {uss:8.1f} {pss:8.1f}")


def daemon_runs(rounds: int, other_tree: str | None = None) -> None:
    sys.path.insert(0, str(REPO))
    from tests.helpers.daemon import RunningDaemon
    from tests.helpers.sandbox import Sandbox, agent_tmp_dir

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with agent_tmp_dir() as tmp:  # the caller (the agent's uid) must reach the launch socket in it
        running = RunningDaemon(Path(tmp), Sandbox(Path(tmp) / "box"))
        running.box.permissions["execution"]["allowed_commands"] = ["true", "sleep"]
        running.write_agents(max_concurrent=None)
        try:
            running.start()
            commands = {
                "python -c pass": [sys.executable, "-c", "pass"],
                "bwrap --unshare-all": ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "/bin/true"],
                "adl-exec --daemon": running.exec_argv("/bin/true"),
            }
            environs = {name: env for name in commands}
            if other_tree:  # the client of another tree of the project (e.g. an unpacked git archive)
                commands["other tree's client"] = running.exec_argv("/bin/true")
                environs["other tree's client"] = {**env, "PYTHONPATH": other_tree}
            for name, argv in commands.items():
                subprocess.run(argv, env=environs[name], check=True, stdout=subprocess.DEVNULL, cwd=tmp)
            names = list(commands)
            samples: dict[str, list[float]] = {name: [] for name in names}
            for r in range(rounds):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    start = time.perf_counter()
                    subprocess.run(commands[name], env=environs[name], check=True, stdout=subprocess.DEVNULL, cwd=tmp)
                    samples[name].append((time.perf_counter() - start) * 1000)
            memory = daemon_session_memory(running.exec_argv("sleep", "3"), running.proc.pid, env, tmp)
        finally:
            running.cleanup()

    def ratio(name: str, base: str) -> str:
        per_round = [a / b for a, b in zip(samples[name], samples[base], strict=True)]
        return f"{statistics.median(per_round):5.2f}x ({min(per_round):.2f}-{max(per_round):.2f})"

    print(f"whole runs, {rounds} interleaved rounds: median ms; per-round ratio median (range)")
    for name in names:
        against_other = f"   vs other tree's client {ratio(name, names[-1])}" if other_tree else ""
        print(
            f"  {name:<22} {statistics.median(samples[name]):8.1f}   vs python -c pass "
            f"{ratio(name, 'python -c pass')}{against_other}"
        )
    print("a daemon session running `sleep`, 1.5 s in, its enforcer processes (MiB):   USS    PSS")
    for role, own, proportional in memory:
        print(f"  {role:<70} {own:6.1f} {proportional:6.1f}")
    print(f"  {'summed':<70} {sum(m[1] for m in memory):6.1f} {sum(m[2] for m in memory):6.1f}")


def daemon_session_memory(
    argv: list[str], daemon: int, env: dict[str, str], cwd: str
) -> list[tuple[str, float, float]]:
    """(role, USS, PSS) of each enforcer process of one daemon session: its supervisor (the fork
    of the spawner in the session's helpers cgroup) and every process under it but the agent."""
    client = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL)
    try:
        time.sleep(1.5)
        supervisors = []
        for pid in descendants(daemon):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/cgroup") as f:
                if ".helpers/session-" in f.read():
                    supervisors.append(pid)
        if len(supervisors) != 1:
            raise SystemExit(f"expected one session's supervisor under the daemon, found {supervisors}")
        (supervisor,) = supervisors
        rows = []
        for pid in descendants(supervisor):
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "sleep":
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
            if pid == supervisor:
                role = "supervisor"
            elif "enforcerd" in command:  # a fork: named by its uid and its pid in the session
                role = f"fork of the supervisor, uid {status['Uid'].split()[0]}, pid {status['NSpid'].split()[-1]}"
            else:
                role = command[:70]
            rows.append((role, uss_kib(pid) / 1024, uss_kib(pid, ("Pss:",)) / 1024))
        return rows
    finally:
        client.wait(timeout=30)


def memory_per_process(rounds: int, other_tree: str | None) -> None:
    """Each enforcer process's USS and PSS during a `sleep` session, without and with the egress
    filter, for this tree and OTHER_TREE (PYTHONPATH) alternately."""
    trees = {"this tree": None, **({"other tree": other_tree} if other_tree else {})}
    with tempfile.TemporaryDirectory(prefix="adl-bench-memory-") as tmp:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(ADL_ENFORCER_AUDIT_DIR=f"{tmp}/audit", ADL_ENFORCER_AUDIT_KEY=f"{tmp}/key.pem")
        sleeper = json.loads(json.dumps(POLICY))
        sleeper["permissions"]["execution"]["allowed_commands"] = ["sleep"]
        net = json.loads(json.dumps(sleeper))
        net["permissions"]["network"] = {"allowed_hosts": ["example.com"], "allowed_ports": [443]}
        for name, doc in (("sleep", sleeper), ("net", net)):
            (Path(tmp) / f"{name}.adl.json").write_text(json.dumps(doc))
        for r in range(-1, rounds):  # round -1 fills each tree's policy cache, unreported
            for tree, path in trees.items():
                environ = {**env, "ADL_ENFORCER_CACHE_DIR": f"{tmp}/cache-{tree.split()[0]}"}
                if path:
                    environ["PYTHONPATH"] = path
                for name in ("sleep", "net"):
                    argv = [sys.executable, "-m", "enforcer.cli.exec", "--adl", f"{tmp}/{name}.adl.json"]
                    if r < 0:
                        subprocess.run([*argv, "--user", USER, "--", "sleep", "0"], env=environ, check=True, cwd=tmp)
                        continue
                    rows: list[tuple[str, float, float]] = []
                    # From the temporary directory: `python -m` puts the working directory first on sys.path.
                    uss, pss = session_uss_mib([*argv, "--user", USER, "--", "sleep", "3"], environ, rows, cwd=tmp)
                    print(f"round {r + 1}, {tree}, {'egress filter' if name == 'net' else 'no network'}: "
                          f"USS {uss:.1f} PSS {pss:.1f} MiB")  # fmt: skip
                    for command, own, proportional in rows:
                        print(f"  {own:6.1f} {proportional:6.1f}  {command[:100]}")


def main() -> None:
    if sys.argv[1:2] == ["memory"]:
        memory_per_process(int(sys.argv[2]) if len(sys.argv) > 2 else 2, sys.argv[3] if len(sys.argv) > 3 else None)
        return
    if sys.argv[1:2] == ["daemon"]:
        daemon_runs(int(sys.argv[2]) if len(sys.argv) > 2 else 10, sys.argv[3] if len(sys.argv) > 3 else None)
        return
    if sys.argv[1:2] != ["detail"]:
        interleaved(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
        return
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    with tempfile.TemporaryDirectory() as tmp:
        policy_path = Path(tmp) / "bench.adl.json"
        policy_path.write_text(json.dumps(POLICY))
        env = {**os.environ, "ADL_ENFORCER_AUDIT_DIR": f"{tmp}/audit", "ADL_ENFORCER_AUDIT_KEY": f"{tmp}/key.pem"}
        adl_exec = [sys.executable, "-m", "enforcer.cli.exec", "--adl", str(policy_path), "--user", USER]
        adl_exec += ["--", "/bin/true"]
        policy = load_policy(policy_path)
        baseline = load_baseline(BASELINE)
        features = host_features()

        guarded_doc = json.loads(json.dumps(POLICY))
        guarded_doc["permissions"]["filesystem"] = {
            "allowed_paths": [{"path": f"{tmp}/**", "access": "read_write"}],
            "denied_paths": [f"{tmp}/**/*.pem"],
        }
        guarded_path = Path(tmp) / "guarded.adl.json"
        guarded_path.write_text(json.dumps(guarded_doc))
        guarded_policy = load_policy(guarded_path)

        def setup(prepared: Prepared | None, chosen=policy) -> None:  # type: ignore[no-untyped-def]
            plan = build_plan(chosen, ["/bin/true"], baseline=baseline, environ={}, features=features)
            session = prepared.session if prepared else new_session_id()
            outcome = launcher.run(plan, session, prepared=prepared, uid=AGENT, gid=AGENT)
            assert outcome.exit_code == 0

        def forked_ahead() -> Prepared:
            prepared = prepare(new_session_id())
            time.sleep(0.05)  # the stage joins its cgroup and builds its filters: adl-exec gives it ~250 ms
            return prepared

        results = {
            "bare /bin/true": median_ms(lambda _: run(["/bin/true"]), n),
            "bwrap --unshare-all": median_ms(
                lambda _: run(["bwrap", "--unshare-all", "--ro-bind", "/", "/", "/bin/true"]), n
            ),
            "adl-exec (whole run)": median_ms(lambda _: run(adl_exec, env), n),
            "python -c pass": median_ms(lambda _: run([sys.executable, "-c", "pass"]), n),
            "python -c 'import enforcer.cli.exec_embedded'": median_ms(
                lambda _: run([sys.executable, "-c", "import enforcer.cli.exec_embedded"]), n
            ),
            "sandbox setup, as adl-exec (cold)": cold_setup_ms(policy_path, n),
            "sandbox setup, in-process": median_ms(setup, n, forked_ahead),
            "  (forking stage + guardian ahead)": median_ms(lambda _: prepare(new_session_id()).discard(), n),
            "sandbox setup, forked on the launch path": median_ms(setup, n),
            "sandbox setup with creation guard": median_ms(lambda p: setup(p, guarded_policy), n, forked_ahead),
        }
        plain_create, plain_open = creation_cost(env, guarded=False)
        guarded_create, guarded_open = creation_cost(env, guarded=True)
    bwrap = results["bwrap --unshare-all"]
    print(f"medians of {n} runs (ms); ratio against bwrap's whole run")
    for name, value in results.items():
        print(f"  {name:<46} {value:8.2f}  {value / bwrap:6.2f}x")
    print("inside the sandbox, microseconds per call (2,000 files on tmpfs)")
    print(f"  create (O_CREAT), no guard      {plain_create:8.1f}")
    print(f"  create (O_CREAT), creation guard {guarded_create:7.1f}  {guarded_create / plain_create:6.1f}x")
    print(f"  open existing, no guard         {plain_open:8.1f}")
    print(f"  open existing, creation guard   {guarded_open:8.1f}  {guarded_open / plain_open:6.1f}x")


if __name__ == "__main__":
    main()
