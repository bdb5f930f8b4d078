"""Netlink messages and attributes (linux/netlink.h), as the kernel audit reader, the process
events connector and the egress namespace's routes and counters speak them. The standard library
opens netlink sockets but builds no message; pyroute2 would be a large dependency for four
requests, so the framing is here, once."""

from __future__ import annotations

import struct
from collections.abc import Iterator

HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port
ATTRIBUTE = struct.Struct("=HH")  # length, type
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLM_F_DUMP = 0x300
_TYPE_MASK = 0x3FFF  # an attribute's type without its nested and byte-order flags


def message(kind: int, flags: int, sequence: int, body: bytes) -> bytes:
    return HEADER.pack(HEADER.size + len(body), kind, flags, sequence, 0) + body


def messages(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(type, sequence, payload) of each whole message in one datagram; stops at a malformed one."""
    at = 0
    while at + HEADER.size <= len(data):
        length, kind, _flags, sequence, _port = HEADER.unpack_from(data, at)
        if length < HEADER.size or at + length > len(data):
            return
        yield kind, sequence, data[at + HEADER.size : at + length]
        at += (length + 3) & ~3


def error_code(payload: bytes) -> int:
    """An NLMSG_ERROR's code: 0 for an acknowledgement, a negative errno otherwise."""
    return struct.unpack_from("=i", payload)[0]


def attribute(kind: int, data: bytes) -> bytes:
    size = ATTRIBUTE.size + len(data)
    return ATTRIBUTE.pack(size, kind) + data + b"\0" * (-size % 4)


def attributes(data: bytes) -> dict[int, bytes]:
    """Attribute type (flags cleared) -> its data, for each attribute in `data`."""
    found: dict[int, bytes] = {}
    at = 0
    while at + ATTRIBUTE.size <= len(data):
        size, kind = ATTRIBUTE.unpack_from(data, at)
        if size < ATTRIBUTE.size:
            break
        found[kind & _TYPE_MASK] = data[at + ATTRIBUTE.size : at + size]
        at += (size + 3) & ~3
    return found
