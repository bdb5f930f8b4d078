"""The agent's network namespace: loopback only, every route pointing at loopback, and nftables
rules that send every TCP connection and every DNS query to the egress filter's listeners there and
drop (and count) everything else.

The filter's process creates the namespace, opens its listeners inside it, and then returns to its
own namespace: a socket stays in the namespace it was created in, so the filter accepts in the
agent's namespace and dials out from its own.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
from dataclasses import dataclass

from ..sandbox import namespaces

DNS_PORT = 53
FILTER_PORT = 15001  # the capture listener: privileged ports are out of an agent's reach, this one is taken first
TABLE = "adl_egress"
COUNTERS = ("quic_dropped", "udp_dropped", "other_dropped")


def ruleset(filter_port: int = FILTER_PORT, dns_port: int = DNS_PORT) -> str:
    """nftables rules for the agent's namespace. DNS to any address (loopback resolvers included) goes
    to the stub; every other TCP connection, to loopback too, goes to the filter (an agent cannot
    listen on TCP, so loopback holds nothing of its own, and "the host's localhost" is decided and
    audited like any other destination); the output
    hook then lets only loopback traffic (which is all the redirected traffic is) and the replies of
    connections it accepted leave (a redirected IPv4 connection's source is 0.0.0.0: lo's address
    has host scope, so its replies are not addressed to loopback)."""
    return f"""\
table inet {TABLE} {{
  counter quic_dropped {{ }}
  counter udp_dropped {{ }}
  counter other_dropped {{ }}
  chain capture {{
    type nat hook output priority -100; policy accept;
    meta l4proto {{ tcp, udp }} th dport 53 redirect to :{dns_port}
    meta l4proto tcp redirect to :{filter_port}
  }}
  chain leave {{
    type filter hook output priority 0; policy drop;
    ct direction reply accept
    ip daddr 127.0.0.0/8 accept
    ip6 daddr ::1 accept
    udp dport 443 counter name "quic_dropped" drop
    meta l4proto udp counter name "udp_dropped" drop
    counter name "other_dropped" drop
  }}
}}
"""


def missing_tools() -> list[str]:
    """The programs the namespace setup needs that this host lacks."""
    return [tool for tool in ("nft", "ip") if _which(tool) is None]


def _which(tool: str) -> str | None:
    return shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin:/usr/bin:/bin")


@dataclass
class AgentNamespace:
    netns_fd: int  # handed to the launcher: the agent's child joins it with setns
    tcp: list[socket.socket]
    dns_udp: list[socket.socket]
    dns_tcp: list[socket.socket]
    ipv6: bool

    def close(self) -> None:
        for sock in (*self.tcp, *self.dns_udp, *self.dns_tcp):
            sock.close()
        os.close(self.netns_fd)


def create(filter_port: int = FILTER_PORT, dns_port: int = DNS_PORT) -> AgentNamespace:
    """Create the namespace and its listeners; the calling thread ends up back in its own namespace.
    Call from a single-threaded process (unshare affects the calling thread only)."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        namespaces.unshare(namespaces.CLONE_NEWNET)
        try:
            agent_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            namespaces.loopback_up()
            _run([_which("ip") or "ip", "-4", "route", "add", "default", "dev", "lo", "src", "127.0.0.1"])
            ipv6 = _ipv6_route()
            _run([_which("nft") or "nft", "-f", "-"], ruleset(filter_port, dns_port))
            tcp = [_listen(socket.AF_INET, "127.0.0.1", filter_port, socket.SOCK_STREAM)]
            dns_udp = [_listen(socket.AF_INET, "127.0.0.1", dns_port, socket.SOCK_DGRAM)]
            dns_tcp = [_listen(socket.AF_INET, "127.0.0.1", dns_port, socket.SOCK_STREAM)]
            if ipv6:
                tcp.append(_listen(socket.AF_INET6, "::1", filter_port, socket.SOCK_STREAM))
                dns_udp.append(_listen(socket.AF_INET6, "::1", dns_port, socket.SOCK_DGRAM))
                dns_tcp.append(_listen(socket.AF_INET6, "::1", dns_port, socket.SOCK_STREAM))
        finally:
            namespaces.setns(home, namespaces.CLONE_NEWNET)
    finally:
        os.close(home)
    return AgentNamespace(agent_fd, tcp, dns_udp, dns_tcp, ipv6)


def _ipv6_route() -> bool:
    """IPv6 where the host has it; without it the namespace has no IPv6 route at all (nothing leaks)."""
    if not os.path.exists("/proc/sys/net/ipv6"):
        return False
    try:
        _run([_which("ip") or "ip", "-6", "route", "add", "default", "dev", "lo"])
    except OSError:
        return False
    return True


def _listen(family: int, address: str, port: int, kind: int) -> socket.socket:
    sock = socket.socket(family, kind | socket.SOCK_CLOEXEC)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    if kind == socket.SOCK_STREAM:
        sock.listen(1024)
    return sock


def _run(argv: list[str], stdin: str | None = None) -> None:
    result = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=10, check=False)
    if result.returncode != 0:
        raise OSError(f"{' '.join(argv)}: {result.stderr.strip() or f'exit {result.returncode}'}")


def read_counters(netns_fd: int) -> dict[str, int]:
    """Packets the namespace's rules dropped, by counter. Runs nft inside the agent's namespace from
    a short-lived thread so the caller's namespace never changes."""
    found: dict[str, int] = {}
    errors: list[str] = []

    def inside() -> None:
        try:
            namespaces.setns(netns_fd, namespaces.CLONE_NEWNET)
            result = subprocess.run(
                [_which("nft") or "nft", "-j", "list", "counters", "table", "inet", TABLE],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
            for item in json.loads(result.stdout or "{}").get("nftables", []):
                counter = item.get("counter")
                if counter and counter.get("name") in COUNTERS:
                    found[counter["name"]] = int(counter.get("packets", 0))
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            errors.append(str(exc))

    # A thread that changed namespace is discarded with it: its namespace never leaks to others.
    thread = threading.Thread(target=inside, name="egress-counters")
    thread.start()
    thread.join()
    if errors:
        raise OSError(f"reading the namespace's drop counters failed: {errors[0]}")
    return found
