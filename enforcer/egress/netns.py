"""The agent's network namespace: loopback only, every route pointing at loopback, and nftables
rules that send every TCP connection and every DNS query to the egress filter's listeners there and
drop (and count) everything else.

The filter's process creates the namespace, opens its listeners inside it, and then returns to its
own namespace: a socket stays in the namespace it was created in, so the filter accepts in the
agent's namespace and dials out from its own.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import shutil
import socket
import struct
import threading

from ..quick_dataclass import dataclass
from ..sandbox import namespaces, netlink

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
    """The programs the namespace setup needs that this host lacks: nftables (its library, which the
    nft program runs on, is what the filter loads)."""
    return [tool for tool in ("nft",) if _which(tool) is None]


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
            add_default_route(socket.AF_INET, "lo", source="127.0.0.1")
            ipv6 = _ipv6_route()
            nft(ruleset(filter_port, dns_port))
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
        add_default_route(socket.AF_INET6, "lo")
    except OSError:
        return False
    return True


# rtnetlink (linux/netlink.h, linux/rtnetlink.h)
_RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol, scope, type, flags
_RTM_NEWROUTE = 24
_NLM_F_EXCL, _NLM_F_CREATE = 0x200, 0x400
_RT_TABLE_MAIN, _RTPROT_BOOT, _RTN_UNICAST = 254, 3, 1
_RT_SCOPE_UNIVERSE, _RT_SCOPE_LINK = 0, 253
_RTA_OIF, _RTA_PREFSRC = 4, 7


def add_default_route(family: int, device: str, source: str | None = None) -> None:
    """Add a default route through `device` in the calling thread's network namespace, as `ip route
    add default dev DEVICE [src SOURCE]` does (same table, protocol, scope and type), over rtnetlink
    rather than by running ip. OSError with the kernel's answer if it refuses."""
    # A directly connected route: link scope for IPv4; IPv6 routes are always universe scope.
    scope = _RT_SCOPE_LINK if family == socket.AF_INET else _RT_SCOPE_UNIVERSE
    body = _RTMSG.pack(family, 0, 0, 0, _RT_TABLE_MAIN, _RTPROT_BOOT, scope, _RTN_UNICAST, 0)
    body += netlink.attribute(_RTA_OIF, struct.pack("=I", socket.if_nametoindex(device)))
    if source is not None:
        body += netlink.attribute(_RTA_PREFSRC, socket.inet_pton(family, source))
    flags = netlink.NLM_F_REQUEST | netlink.NLM_F_ACK | _NLM_F_EXCL | _NLM_F_CREATE
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE) as sock:
        sock.settimeout(10)
        sock.sendto(netlink.message(_RTM_NEWROUTE, flags, 1, body), (0, 0))
        reply = sock.recv(65536)
    kind, sequence, payload = next(netlink.messages(reply), (None, None, b""))
    if kind != netlink.NLMSG_ERROR or sequence != 1:
        raise OSError(f"adding the default route: unexpected netlink answer (type {kind})")
    code = netlink.error_code(payload)
    if code != 0:  # the acknowledgement carries 0; an error, the negative errno
        raise OSError(-code, f"adding the default route through {device}: {os.strerror(-code)}")


class _Ifaddrs(ctypes.Structure):
    pass


_Ifaddrs._fields_ = [
    ("ifa_next", ctypes.POINTER(_Ifaddrs)),
    ("ifa_name", ctypes.c_char_p),
    ("ifa_flags", ctypes.c_uint),
    ("ifa_addr", ctypes.c_void_p),
    ("ifa_netmask", ctypes.c_void_p),
    ("ifa_ifu", ctypes.c_void_p),
    ("ifa_data", ctypes.c_void_p),
]
_SOCKADDR_FAMILY = struct.Struct("=H")
_ADDRESS_AT = {socket.AF_INET: (4, 4), socket.AF_INET6: (8, 16)}  # sockaddr_in / sockaddr_in6: offset, size
_libc = ctypes.CDLL(None, use_errno=True)
_libc.getifaddrs.argtypes = (ctypes.POINTER(ctypes.POINTER(_Ifaddrs)),)
_libc.freeifaddrs.argtypes = (ctypes.POINTER(_Ifaddrs),)
_libc.freeifaddrs.restype = None


def interface_addresses() -> list[str]:
    """Every IPv4 and IPv6 address of every interface in the calling thread's network namespace, as
    getifaddrs(3) lists them (without an IPv6 scope suffix), sorted, without duplicates."""
    head = ctypes.POINTER(_Ifaddrs)()
    if _libc.getifaddrs(ctypes.byref(head)) != 0:
        code = ctypes.get_errno() or errno.EIO
        raise OSError(code, f"getifaddrs: {os.strerror(code)}")
    found = set()
    try:
        entry = head
        while entry:
            address = entry.contents.ifa_addr
            if address:
                (family,) = _SOCKADDR_FAMILY.unpack(ctypes.string_at(address, _SOCKADDR_FAMILY.size))
                if family in _ADDRESS_AT:
                    offset, size = _ADDRESS_AT[family]
                    found.add(socket.inet_ntop(family, ctypes.string_at(address + offset, size)))
            entry = entry.contents.ifa_next
    finally:
        _libc.freeifaddrs(head)
    return sorted(found)


def _listen(family: int, address: str, port: int, kind: int) -> socket.socket:
    sock = socket.socket(family, kind | socket.SOCK_CLOEXEC)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    if kind == socket.SOCK_STREAM:
        sock.listen(1024)
    return sock


NFT_LIBRARY = "libnftables.so.1"  # what the nft program runs on (nftables)
_NFT_CTX_OUTPUT_JSON = 1 << 4  # nftables/libnftables.h


@functools.cache
def _libnftables() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL(NFT_LIBRARY)
    except OSError as exc:
        raise OSError(f"the egress filter needs {NFT_LIBRARY} (nftables): {exc}") from None
    lib.nft_ctx_new.argtypes, lib.nft_ctx_new.restype = (ctypes.c_uint32,), ctypes.c_void_p
    lib.nft_ctx_free.argtypes, lib.nft_ctx_free.restype = (ctypes.c_void_p,), None
    for name in ("nft_ctx_buffer_output", "nft_ctx_buffer_error"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = (ctypes.c_void_p,), ctypes.c_int
    for name in ("nft_ctx_get_output_buffer", "nft_ctx_get_error_buffer"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = (ctypes.c_void_p,), ctypes.c_char_p
    lib.nft_ctx_output_get_flags.argtypes, lib.nft_ctx_output_get_flags.restype = (ctypes.c_void_p,), ctypes.c_uint
    lib.nft_ctx_output_set_flags.argtypes, lib.nft_ctx_output_set_flags.restype = (ctypes.c_void_p, ctypes.c_uint), None
    lib.nft_run_cmd_from_buffer.argtypes = (ctypes.c_void_p, ctypes.c_char_p)
    lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
    return lib


def nft(commands: str, *, json_output: bool = False) -> str:
    """Run nft commands in the calling thread's network namespace through libnftables, as `nft -f -`
    (or `nft -j`) would, without starting the program; their output. OSError with nft's own error
    message if they fail."""
    lib = _libnftables()
    ctx = lib.nft_ctx_new(0)
    if not ctx:
        raise OSError("nft: no libnftables context")
    try:
        lib.nft_ctx_buffer_output(ctx)
        lib.nft_ctx_buffer_error(ctx)
        if json_output:
            lib.nft_ctx_output_set_flags(ctx, lib.nft_ctx_output_get_flags(ctx) | _NFT_CTX_OUTPUT_JSON)
        if lib.nft_run_cmd_from_buffer(ctx, commands.encode()) != 0:
            error = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode(errors="replace").strip()
            raise OSError(f"nft: {error or 'the commands failed'}")
        return (lib.nft_ctx_get_output_buffer(ctx) or b"").decode(errors="replace")
    finally:
        lib.nft_ctx_free(ctx)


# nf_tables over netlink (linux/netfilter/nfnetlink.h, linux/netfilter/nf_tables.h)
_NETLINK_NETFILTER = 12
_NFNL_SUBSYS_NFTABLES = 10
_NFT_MSG_NEWOBJ, _NFT_MSG_GETOBJ = 18, 19
_NFPROTO_INET = 1
_NFGENMSG = struct.Struct("!BBH")  # family, version, resource id (big-endian)
_NFTA_OBJ_TABLE, _NFTA_OBJ_NAME, _NFTA_OBJ_TYPE, _NFTA_OBJ_DATA = 1, 2, 3, 4
_NFT_OBJECT_COUNTER = 1
_NFTA_COUNTER_PACKETS = 2


def list_counters(table: str = TABLE) -> dict[str, int]:
    """Packets counted by each named counter of an inet table in the calling thread's network
    namespace (none for a table that is not there): one nf_tables object dump over netlink, as `nft
    list counters table inet TABLE` reads them, without starting libnftables. OSError with the
    kernel's answer if it refuses."""
    body = _NFGENMSG.pack(_NFPROTO_INET, 0, 0)
    body += netlink.attribute(_NFTA_OBJ_TABLE, table.encode() + b"\0")
    body += netlink.attribute(_NFTA_OBJ_TYPE, struct.pack("!I", _NFT_OBJECT_COUNTER))
    request = netlink.message(
        (_NFNL_SUBSYS_NFTABLES << 8) | _NFT_MSG_GETOBJ, netlink.NLM_F_REQUEST | netlink.NLM_F_DUMP, 1, body
    )
    found: dict[str, int] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, _NETLINK_NETFILTER) as sock:
        sock.settimeout(10)
        sock.sendto(request, (0, 0))
        while True:
            for kind, sequence, payload in netlink.messages(sock.recv(65536)):
                if sequence != 1:
                    raise OSError(f"listing the namespace's counters: unexpected netlink answer (type {kind})")
                if kind == netlink.NLMSG_DONE:
                    return found
                if kind == netlink.NLMSG_ERROR:
                    code = netlink.error_code(payload)
                    if code == 0:
                        continue
                    raise OSError(-code, f"listing the counters of table inet {table}: {os.strerror(-code)}")
                if kind != (_NFNL_SUBSYS_NFTABLES << 8) | _NFT_MSG_NEWOBJ:
                    continue
                fields = netlink.attributes(payload[_NFGENMSG.size :])
                if (
                    fields.get(_NFTA_OBJ_TABLE, b"").rstrip(b"\0") != table.encode()
                    or fields.get(_NFTA_OBJ_TYPE) != struct.pack("!I", _NFT_OBJECT_COUNTER)
                    or _NFTA_OBJ_NAME not in fields
                ):
                    continue
                packets = netlink.attributes(fields.get(_NFTA_OBJ_DATA, b"")).get(_NFTA_COUNTER_PACKETS)
                if packets is None or len(packets) != 8:
                    raise OSError("listing the namespace's counters: a counter without its packet count")
                found[fields[_NFTA_OBJ_NAME].rstrip(b"\0").decode()] = struct.unpack("!Q", packets)[0]


def read_counters(netns_fd: int) -> dict[str, int]:
    """Packets the namespace's rules dropped, by counter. Reads them inside the agent's namespace
    from a short-lived thread so the caller's namespace never changes."""
    found: dict[str, int] = {}
    errors: list[str] = []

    def inside() -> None:
        try:
            namespaces.setns(netns_fd, namespaces.CLONE_NEWNET)
            listed = list_counters()
            missing = [name for name in COUNTERS if name not in listed]
            if missing:
                raise OSError(f"the namespace has no counter {', '.join(missing)}")
            found.update((name, listed[name]) for name in COUNTERS)
        except (OSError, ValueError) as exc:
            errors.append(str(exc))

    # A thread that changed namespace is discarded with it: its namespace never leaks to others.
    thread = threading.Thread(target=inside, name="egress-counters")
    thread.start()
    thread.join()
    if errors:
        raise OSError(f"reading the namespace's drop counters failed: {errors[0]}")
    return found
