"""A test "internet" the tests build themselves, never touching the machine's own namespace.

Two named network namespaces joined by a veth pair:
  outer     where adl-exec (and so the egress filter) runs: 192.0.2.1, 2001:db8:ff::1, routes to
            the test ranges through the veth; a "host" HTTP service on its 127.0.0.1:8081 and an
            abstract unix socket
  internet  the servers: DNS on 198.51.100.53, HTTP/HTTPS on every address (198.51.100.10-12,
            203.0.113.10, 203.0.113.200, 10.77.0.10, 2001:db8:1::10), UDP sinks on 443 and 9999
The filter's upstream is the lab's DNS server and the documentation ranges count as public
(ADL_ENFORCER_PUBLIC_TEST_RANGES), so nothing but the lab is ever reached.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .sandbox import agent_tmp_dir

REPO = Path(__file__).resolve().parents[2]
DNS_SERVER = "198.51.100.53"
WEB = [
    "198.51.100.10", "198.51.100.11", "198.51.100.12", "198.51.100.20", "203.0.113.10", "203.0.113.200", "10.77.0.10"
]  # fmt: skip
WEB6 = "2001:db8:1::10"
ZONE: dict[str, dict[str, list[str]]] = {
    "api.example.test": {"A": ["198.51.100.10"], "AAAA": [WEB6]},
    "other.example.test": {"A": ["198.51.100.11"]},
    "sub.example.test": {"A": ["198.51.100.12"]},
    "a.sub.example.test": {"A": ["198.51.100.12"]},
    "b.sub.example.test": {"A": ["198.51.100.12"]},
    "deep.x.sub.example.test": {"A": ["198.51.100.12"]},
    "v6only.example.test": {"AAAA": [WEB6]},
    "rebind-loopback.example.test": {"A": ["127.0.0.1"]},
    "rebind-metadata.example.test": {"A": ["169.254.169.254"]},
    "rebind-private.example.test": {"A": ["10.77.0.10"]},
    "rebind-mapped.example.test": {"AAAA": ["::ffff:127.0.0.1"]},
    "rebind-own.example.test": {"A": ["192.0.2.1"]},
    "api.eu.example.test": {"A": ["203.0.113.10"]},
    "api.us.example.test": {"A": ["198.51.100.10"]},
    "api.nowhere.test": {"A": ["203.0.113.200"]},
    "en.wikipedia.example.test": {"A": ["198.51.100.20"]},  # the research agent example's (scripts/demo.sh)
}
REGIONS = {
    "regions": {
        "EU": {"hosts": ["*.eu.example.test"], "networks": ["203.0.113.0/28"]},
        "US": {"hosts": ["*.us.example.test", "*.example.test"], "networks": ["198.51.100.0/24"]},
    }
}
needs_nft = pytest.mark.skipif(
    subprocess.run(["sh", "-c", "command -v nft && command -v ip"], capture_output=True).returncode != 0,
    reason="the egress filter needs nftables and iproute2 (scripts/setup.sh installs them)",
)


def ip(*args: str, netns: str | None = None) -> None:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip()}")


def self_signed(directory: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "adl-enforcer test lab")])
    now = datetime.datetime.now(datetime.UTC)
    sans = [x509.DNSName(n) for n in ZONE] + [x509.DNSName("*.example.test")]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in [*WEB, WEB6]]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "lab-cert.pem", directory / "lab-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


class NetLab:
    def __init__(self, directory: Path) -> None:
        tag = secrets.token_hex(3)
        self.outer, self.internet = f"adlt-o-{tag}", f"adlt-i-{tag}"
        self.directory = directory
        self.log = directory / "servers.jsonl"
        self.log.touch()
        self.regions = directory / "regions.json"
        self.regions.write_text(json.dumps(REGIONS))
        self.cert, self.key = self_signed(directory)
        self.ca_dir = directory / "ca"  # readable from inside the sandbox (policies grant it)
        self.ca_dir.mkdir()
        (self.ca_dir / "lab-ca.pem").write_bytes(self.cert.read_bytes())
        self._servers: list[subprocess.Popen[str]] = []

    def wrap(self) -> list[str]:
        """Prefix that runs a command in the outer namespace (nsenter changes only the network namespace)."""
        return ["nsenter", f"--net=/run/netns/{self.outer}"]

    def env(self) -> dict[str, str]:
        return {
            "ADL_ENFORCER_UPSTREAM_DNS": f"{DNS_SERVER}:53",
            "ADL_ENFORCER_PUBLIC_TEST_RANGES": "198.51.100.0/24,203.0.113.0/24,2001:db8::/32",
        }

    def start(self) -> None:
        ip("netns", "add", self.outer)
        ip("netns", "add", self.internet)
        for ns in (self.outer, self.internet):
            ip("link", "set", "lo", "up", netns=ns)
        ip("link", "add", "vo", "type", "veth", "peer", "name", "vi", "netns", self.internet, netns=self.outer)
        ip("addr", "add", "192.0.2.1/24", "dev", "vo", netns=self.outer)
        ip("-6", "addr", "add", "2001:db8:ff::1/64", "dev", "vo", "nodad", netns=self.outer)
        ip("addr", "add", "192.0.2.2/24", "dev", "vi", netns=self.internet)
        ip("-6", "addr", "add", "2001:db8:ff::2/64", "dev", "vi", "nodad", netns=self.internet)
        for address in [DNS_SERVER, *WEB]:
            ip("addr", "add", f"{address}/32", "dev", "vi", netns=self.internet)
        ip("-6", "addr", "add", f"{WEB6}/128", "dev", "vi", "nodad", netns=self.internet)
        ip("link", "set", "vo", "up", netns=self.outer)
        ip("link", "set", "vi", "up", netns=self.internet)
        for network in ("198.51.100.0/24", "203.0.113.0/24", "10.77.0.0/24"):
            ip("route", "add", network, "dev", "vo", netns=self.outer)
        ip("-6", "route", "add", "2001:db8:1::/64", "dev", "vo", netns=self.outer)
        zone = self.directory / "zone.json"
        zone.write_text(json.dumps(ZONE))
        internet = [
            "--role", "internet", "--zone", str(zone), "--dns", DNS_SERVER,
            "--cert", str(self.cert), "--key", str(self.key), "--log", str(self.log),
        ]  # fmt: skip
        self._serve(self.internet, internet)
        self._serve(self.outer, ["--role", "outer", "--log", str(self.log)])

    def _serve(self, netns: str, args: list[str]) -> None:
        proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{netns}", sys.executable, "-m", "tests.helpers.netlab_servers", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        self._servers.append(proc)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"lab servers in {netns} did not start")

    def stop(self) -> None:
        for proc in self._servers:
            if proc.stdin:
                proc.stdin.close()
            proc.kill()
            proc.wait(timeout=10)
        for ns in (self.outer, self.internet):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)

    def server_events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def in_outer(self, *argv: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.wrap(), *argv], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def netlab() -> Iterator[NetLab]:
    if os.geteuid() != 0:
        pytest.skip("the network lab needs root")
    with agent_tmp_dir() as directory:  # the sandboxed agent (not root) reads the lab's CA
        lab = NetLab(directory)
        try:
            lab.start()
            yield lab
        finally:
            lab.stop()


@pytest.fixture
def net_sandbox(sandbox: Any, netlab: NetLab) -> Any:
    """A sandbox run in the lab's outer namespace, allowed curl, the lab's CA and a few lab hosts."""
    sandbox.wrap, sandbox.env = netlab.wrap(), netlab.env()
    sandbox.permissions["execution"]["allowed_commands"].append("curl")
    sandbox.permissions["filesystem"]["allowed_paths"].append({"path": f"{netlab.ca_dir}/**", "access": "read"})
    sandbox.permissions["environment"]["allowed_variables"].extend(["HTTP_PROXY", "HTTPS_PROXY", "http_proxy"])
    sandbox.permissions["network"] = {
        "allowed_hosts": ["api.example.test", "*.sub.example.test"],
        "allowed_ports": [80, 443],
    }
    return sandbox


def payloads(result: Any, kind: str) -> list[dict[str, Any]]:
    """The payloads of one kind of record (net.dns, net.connect, net.close, net.summary) in a run."""
    return [r["payload"] for r in result.records if r["intent"] == f"adl.enforcer.{kind}"]
