"""Learn mode end to end: a realistic agent (workspace reads and writes, git, an HTTPS request
through the lab's egress filter) learned once, then run under the learned policy with no denial,
and under that policy minus one grant with exactly that denial recorded."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from ..helpers.netlab import NetLab, needs_nft
from ..helpers.sandbox import Sandbox, give_to_agent, needs_root

pytestmark = [needs_root, needs_nft]


def landlock_denials(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        r["payload"]
        for r in records
        if r["intent"] == "adl.enforcer.decision" and r["payload"].get("mechanism") == "landlock"
    ]


def agent_code(ws: Path, ca: str) -> str:
    return (
        "import pathlib, subprocess, time\n"
        f"ws = pathlib.Path({str(ws)!r})\n"
        "print(sorted(p.read_text().strip() for p in ws.glob('*.txt') if p.name != 'secret.txt'))\n"
        "(ws / 'report.md').write_text('written by the agent')\n"
        "tests = subprocess.run(['python3', '-B', '-m', 'unittest', 'discover', '-s', str(ws)],\n"
        "                       capture_output=True, text=True)\n"
        "print('tests', tests.returncode, tests.stderr.strip().splitlines()[-1:])\n"
        # The lab's network namespace has no fork events (see enforcer/sandbox/proc_events.py): git
        # stays until the observer has read its events, or the learned policy could miss it.
        "alive = subprocess.Popen(['git', 'hash-object', '--stdin'], stdin=subprocess.PIPE,\n"
        "                         stdout=subprocess.DEVNULL)\n"
        "time.sleep(0.5)\n"
        "alive.communicate(b'x')\n"
        "git = subprocess.run(['git', '-C', str(ws), 'status', '--short'], capture_output=True, text=True)\n"
        "print('git', git.returncode, git.stdout.count('\\n'))\n"
        "for host in ('api.example.test', 'other.example.test'):\n"
        f"    r = subprocess.run(['curl', '-sS', '--noproxy', '*', '--max-time', '5', '--cacert', {ca!r},\n"
        "                        f'https://{host}/'], capture_output=True, text=True)\n"
        "    print(host, r.returncode, r.stdout.strip()[:40])\n"
    )


def test_learn_then_run_clean_then_one_grant_less_is_exactly_one_denial(net_sandbox: Sandbox, netlab: NetLab) -> None:
    box = net_sandbox
    ws = box.ws
    for name in ("a.txt", "b.txt"):
        (ws / name).write_text(name)
    # The agent's own interpreter runs them: the agent's identity cannot reach a private one.
    (ws / "test_agent.py").write_text(
        "import unittest\n\nclass T(unittest.TestCase):\n    def test_ok(self):\n        self.assertEqual(1 + 1, 2)\n"
    )
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    give_to_agent(ws)  # git refuses a repository its user does not own
    ca = str(netlab.ca_dir / "lab-ca.pem")
    permissions = json.loads(json.dumps(box.permissions))
    # The start policy: the agent's command, the lab's CA and one host; no workspace, no git.
    permissions["filesystem"]["allowed_paths"] = [
        p
        for p in permissions["filesystem"]["allowed_paths"]
        if "workspace" not in p["path"] and "reference" not in p["path"]
    ]
    # No denied paths: with them, the plan walks every allowed tree for names to mask, and the
    # interpreter's library (learned as a tree) is larger than that walk may be.
    del permissions["filesystem"]["denied_paths"]
    permissions["network"]["allowed_hosts"] = ["api.example.test"]
    permissions["resource_limits"]["max_duration_sec"] = 60
    permissions["extensions"] = {"adl-enforcer.runtime": {"presets": ["python", "git", "tmp"]}}
    start = box.policy(permissions=permissions)
    learned_path = box.root / "learned.adl.json"
    code = agent_code(ws, ca)

    learned_run = box.python(code, args=("--learn", str(learned_path)), policy=start)
    assert learned_run.code == 0, learned_run.err
    assert "LEARN MODE" in learned_run.err and f"+++ {learned_path}" in learned_run.out
    assert "git 0" in learned_run.out and "api.example.test 0" in learned_run.out
    assert "tests 0 ['OK']" in learned_run.out, learned_run.out
    assert "other.example.test 6" in learned_run.out  # the start policy's denial stays while learning
    layers = {layer["name"]: layer for layer in learned_run.record("launch")["payload"]["layers"]}
    assert layers["filesystem"]["status"] == "learning"
    result = next(r["payload"] for r in learned_run.records if r["payload"].get("rules") == ["learn.result"])
    assert "other.example.test" in result["added_hosts"]

    learned = json.loads(learned_path.read_text())
    grants = learned["permissions"]["filesystem"]["allowed_paths"]
    assert {"path": f"{ws}/**", "access": "read_write"} in grants
    assert any(c.endswith("/git") for c in learned["permissions"]["execution"]["allowed_commands"])
    assert "other.example.test" in learned["permissions"]["network"]["allowed_hosts"]
    (ws / "report.md").unlink()

    clean = box.python(code, policy=learned_path)
    assert clean.code == 0, clean.err
    assert "git 0" in clean.out and "other.example.test 0" in clean.out, clean.out + clean.err
    assert "tests 0 ['OK']" in clean.out, clean.out + clean.err
    # none but device ioctls (isatty on /dev/null), which no policy grants
    refused = [d for d in landlock_denials(clean.records) if d["access"] != "ioctl"]
    assert refused == [], refused
    assert clean.record("exit")["payload"]["kernel_denials"]["available"]  # the reader did listen

    # One grant less: the workspace. Exactly that denial, naming the path, right, pid, command, rule.
    learned["permissions"]["filesystem"]["allowed_paths"] = [g for g in grants if g["path"] != f"{ws}/**"]
    (box.root / "minus.adl.json").write_text(json.dumps(learned))
    minus = box.python(
        "import pathlib\n" + f"print(pathlib.Path({str(ws / 'a.txt')!r}).read_text())",
        policy=box.root / "minus.adl.json",
    )
    assert minus.code == 1 and "PermissionError" in minus.err
    [denial] = landlock_denials(minus.records)
    assert denial["path"] == str(ws / "a.txt") and denial["access"] == "read" and denial["blockers"] == ["fs.read_file"]
    assert denial["command"] == "python3" and denial["pid"] > 0 and denial["rules"] == ["fs.not_allowed"]
    assert denial["grant"]["value"] == {"path": str(ws / "a.txt"), "access": "read"}


def test_learn_is_refused_with_production(sandbox: Sandbox) -> None:
    r = sandbox.python("print(1)", args=("--learn", str(sandbox.root / "out.json"), "--production"))
    assert r.code == 125 and "--learn is refused with --production" in r.err
    assert not (sandbox.root / "out.json").exists()
