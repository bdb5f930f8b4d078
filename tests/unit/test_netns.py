"""The egress namespace's set-up without helper programs: default routes over rtnetlink, the host's
addresses from getifaddrs. Each case runs in a fresh network namespace on a thread of its own."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import psutil
import pytest

from enforcer.egress import netns
from enforcer.sandbox import namespaces

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root, and ip to compare with"
)
T = TypeVar("T")
IPV6 = os.path.exists("/proc/sys/net/ipv6")


def in_new_namespace(fn: Callable[[], T]) -> T:
    """Run fn in a new network namespace on a discarded thread: the namespace goes with it."""
    result: list[T] = []
    failure: list[BaseException] = []

    def inside() -> None:
        try:
            namespaces.unshare(namespaces.CLONE_NEWNET)
            namespaces.loopback_up()
            result.append(fn())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=inside)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


def routes() -> dict[str, Any]:
    return {
        "v4": json.loads(ip("-j", "-4", "route", "show", "table", "all")),
        "v6": json.loads(ip("-j", "-6", "route", "show", "table", "all")),
    }


def test_default_routes_are_the_ones_ip_adds() -> None:
    def with_ip() -> dict[str, Any]:
        ip("-4", "route", "add", "default", "dev", "lo", "src", "127.0.0.1")
        if IPV6:
            ip("-6", "route", "add", "default", "dev", "lo")
        return routes()

    def with_netlink() -> dict[str, Any]:
        netns.add_default_route(socket.AF_INET, "lo", source="127.0.0.1")
        if IPV6:
            netns.add_default_route(socket.AF_INET6, "lo")
        return routes()

    expected, got = in_new_namespace(with_ip), in_new_namespace(with_netlink)
    assert got == expected
    assert any(route["dst"] == "default" and route.get("prefsrc") == "127.0.0.1" for route in got["v4"])
    if IPV6:
        assert any(route["dst"] == "default" and route["dev"] == "lo" for route in got["v6"])


def test_a_route_the_kernel_refuses_raises_its_error() -> None:
    def twice() -> None:
        netns.add_default_route(socket.AF_INET, "lo", source="127.0.0.1")
        netns.add_default_route(socket.AF_INET, "lo", source="127.0.0.1")

    with pytest.raises(OSError) as raised:
        in_new_namespace(twice)
    assert raised.value.errno == errno.EEXIST

    def foreign_source() -> None:  # an address no interface has cannot be the preferred source
        netns.add_default_route(socket.AF_INET, "lo", source="192.0.2.77")

    with pytest.raises(OSError) as raised:
        in_new_namespace(foreign_source)
    assert raised.value.errno == errno.EINVAL


def test_the_agent_namespace_routes_everything_to_loopback() -> None:
    space = netns.create(filter_port=15001, dns_port=53)
    try:
        found: dict[str, Any] = {}

        def inside() -> None:
            namespaces.setns(space.netns_fd, namespaces.CLONE_NEWNET)
            found.update(routes())

        thread = threading.Thread(target=inside)
        thread.start()
        thread.join()
    finally:
        space.close()
    assert any(route["dst"] == "default" and route["dev"] == "lo" for route in found["v4"])
    assert space.ipv6 == IPV6
    if IPV6:
        assert any(route["dst"] == "default" and route["dev"] == "lo" for route in found["v6"])


def psutil_addresses() -> list[str]:
    found = set()
    for entries in psutil.net_if_addrs().values():
        for entry in entries:
            if entry.family in (socket.AF_INET, socket.AF_INET6):
                found.add(entry.address.split("%")[0])
    return sorted(found)


def test_interface_addresses_are_every_v4_and_v6_address() -> None:
    assert netns.interface_addresses() == psutil_addresses()

    def with_more() -> tuple[list[str], list[str]]:
        ip("addr", "add", "10.91.2.3/24", "dev", "lo")
        ip("addr", "add", "10.91.4.5/32", "dev", "lo")
        if IPV6:
            ip("-6", "addr", "add", "fd00:91::7/64", "dev", "lo", "nodad")
            ip("-6", "addr", "add", "fe80::91:1/64", "dev", "lo", "nodad")  # link scope: listed without a suffix
        return netns.interface_addresses(), psutil_addresses()

    ours, theirs = in_new_namespace(with_more)
    assert ours == theirs
    assert {"127.0.0.1", "10.91.2.3", "10.91.4.5"} <= set(ours)
    if IPV6:
        assert {"::1", "fd00:91::7", "fe80::91:1"} <= set(ours)


def test_nft_runs_in_the_calling_threads_namespace_as_the_program_does() -> None:
    """The rules go in through libnftables, not the nft program: same rules, nft's own errors."""

    def inside() -> tuple[str, str, str]:
        netns.nft(netns.ruleset())
        ours = netns.nft(f"list counters table inet {netns.TABLE}", json_output=True)
        program = subprocess.run(
            ["nft", "-j", "list", "counters", "table", "inet", netns.TABLE], capture_output=True, text=True, check=True
        ).stdout  # a child of this thread: in its namespace
        with pytest.raises(OSError) as raised:
            netns.nft("add rule inet nowhere nothing drop")
        return ours, program, str(raised.value)

    ours, program, error = in_new_namespace(inside)

    def counters(listed: str) -> list[dict[str, Any]]:
        return [item["counter"] for item in json.loads(listed)["nftables"] if "counter" in item]

    assert counters(ours) == counters(program) and {c["name"] for c in counters(ours)} == set(netns.COUNTERS)
    assert error.startswith("nft: Error:") and "nowhere" in error


def test_counters_listed_over_netlink_are_what_nft_lists() -> None:
    """The counters read with one nf_tables dump match nft's own listing, counts included, and only
    the table's own; an absent table has none, and the filter's reader then fails rather than
    report no drops."""

    def inside() -> tuple[dict[str, int], str, dict[str, int], str]:
        netns.nft(netns.ruleset())
        netns.add_default_route(socket.AF_INET, "lo", source="127.0.0.1")
        netns.nft(f"add counter inet {netns.TABLE} extra {{ packets 7 bytes 70 }}")
        netns.nft("add table inet other\nadd counter inet other udp_dropped { packets 5 bytes 5 }")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for _ in range(3):
                with contextlib.suppress(OSError):  # dropped by the rules (EPERM), and counted
                    sock.sendto(b"x", ("192.0.2.1", 9))
        listed = netns.list_counters()
        program = subprocess.run(
            ["nft", "-j", "list", "counters", "table", "inet", netns.TABLE], capture_output=True, text=True, check=True
        ).stdout
        absent = netns.list_counters("absent")
        table = f"inet {netns.TABLE}"
        netns.nft(f"delete table {table}\nadd table {table}\nadd counter {table} udp_dropped")
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            with pytest.raises(OSError) as raised:
                netns.read_counters(own)
        finally:
            os.close(own)
        return listed, program, absent, str(raised.value)

    listed, program, absent, error = in_new_namespace(inside)
    counters = [item["counter"] for item in json.loads(program)["nftables"] if "counter" in item]
    assert listed == {c["name"]: c["packets"] for c in counters}
    assert listed == {"quic_dropped": 0, "udp_dropped": 3, "other_dropped": 0, "extra": 7} and absent == {}
    assert "quic_dropped, other_dropped" in error


def test_the_drop_counters_are_read_inside_the_agents_namespace() -> None:
    space = netns.create(filter_port=15001, dns_port=53)
    try:
        assert netns.read_counters(space.netns_fd) == dict.fromkeys(netns.COUNTERS, 0)

        def send() -> None:  # dropped by the namespace's rules: it never reaches an interface
            namespaces.setns(space.netns_fd, namespaces.CLONE_NEWNET)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock, contextlib.suppress(OSError):
                sock.sendto(b"x", ("192.0.2.1", 9))

        thread = threading.Thread(target=send)
        thread.start()
        thread.join()
        assert netns.read_counters(space.netns_fd) == {"quic_dropped": 0, "udp_dropped": 1, "other_dropped": 0}
    finally:
        space.close()
