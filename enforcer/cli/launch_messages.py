"""The launch socket's messages (proto/enforcer/v1/enforcer.proto: LaunchRequest, LaunchReply,
SessionEnded) in protobuf's wire format, for `adl-exec --daemon`.

The client sends one message and reads two, all flat: reading and writing them here spares every
launch through the daemon the import of the protobuf runtime and the generated module. The daemon
keeps the generated classes; tests/unit/test_launch_messages.py checks both directions against them.
Decoding follows proto3: absent fields are defaults, the last occurrence of a field wins, unknown
fields are skipped, strings must be UTF-8; anything malformed raises ValueError.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's own import is a noticeable part of the client's start-up
if TYPE_CHECKING:
    from typing import Any

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
_UINT32, _UINT64 = (1 << 32) - 1, (1 << 64) - 1
_MAX_FIELD_NUMBER = (1 << 29) - 1


class _Message:
    """A flat, immutable message compared by value, its fields in _FIELDS in the .proto's order
    (what a frozen dataclass gives, without the dataclasses module, which imports inspect)."""

    _FIELDS: tuple[str, ...] = ()

    def _set(self, **values: Any) -> None:
        for name in self._FIELDS:
            object.__setattr__(self, name, values[name])

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def fields(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._FIELDS}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Message) and type(other) is type(self) and self.fields() == other.fields()

    def __hash__(self) -> int:
        return hash(tuple(self.fields().values()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.fields().items())})"


class LaunchReply(_Message):
    _FIELDS = ("accepted", "session", "session_token", "refusal", "policy_digest")
    accepted: bool
    session: str
    session_token: str
    refusal: str
    policy_digest: str

    def __init__(
        self, accepted: bool = False, session: str = "", session_token: str = "", refusal: str = "",
        policy_digest: str = "",
    ) -> None:  # fmt: skip
        self._set(
            accepted=accepted, session=session, session_token=session_token, refusal=refusal,
            policy_digest=policy_digest,
        )  # fmt: skip


class SessionEnded(_Message):
    _FIELDS = (
        "session", "reason", "exit_code", "signal", "duration_ms", "creations_refused", "detail", "kernel_denials_json",
    )  # fmt: skip
    session: str
    reason: str
    exit_code: int
    signal: int
    duration_ms: int
    creations_refused: int
    detail: str
    kernel_denials_json: str

    def __init__(
        self, session: str = "", reason: str = "", exit_code: int = 0, signal: int = 0, duration_ms: int = 0,
        creations_refused: int = 0, detail: str = "", kernel_denials_json: str = "",
    ) -> None:  # fmt: skip
        self._set(
            session=session, reason=reason, exit_code=exit_code, signal=signal, duration_ms=duration_ms,
            creations_refused=creations_refused, detail=detail, kernel_denials_json=kernel_denials_json,
        )  # fmt: skip


# field number: (name, type), as in the .proto
_REPLY = {1: ("accepted", "bool"), 2: ("session", "string"), 3: ("session_token", "string"),
          4: ("refusal", "string"), 5: ("policy_digest", "string")}  # fmt: skip
_ENDED = {1: ("session", "string"), 2: ("reason", "string"), 3: ("exit_code", "int32"), 4: ("signal", "int32"),
          5: ("duration_ms", "uint64"), 6: ("creations_refused", "uint32"), 7: ("detail", "string"),
          8: ("kernel_denials_json", "string")}  # fmt: skip


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _bytes_field(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | _LENGTH) + _varint(len(data)) + data


def encode_launch_request(
    agent: str, argv: list[str], environ: dict[str, str], cwd: str, accept_unenforced: list[str], pids_max: int
) -> bytes:
    """A LaunchRequest; proto3 leaves fields at their default out. ValueError for a pids_max that
    is not a uint32; UnicodeEncodeError for a string that is not valid Unicode."""
    if not 0 <= pids_max <= _UINT32:
        raise ValueError(f"pids_max {pids_max} is out of range for uint32")
    out = bytearray()
    if agent:
        out += _bytes_field(1, agent.encode())
    for arg in argv:
        out += _bytes_field(2, arg.encode())
    for key, value in environ.items():  # a map entry is a message: key = 1, value = 2
        entry = (_bytes_field(1, key.encode()) if key else b"") + (_bytes_field(2, value.encode()) if value else b"")
        out += _bytes_field(3, entry)
    if cwd:
        out += _bytes_field(4, cwd.encode())
    for domain in accept_unenforced:
        out += _bytes_field(5, domain.encode())
    if pids_max:
        out += _varint(6 << 3 | _VARINT) + _varint(pids_max)
    return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("truncated varint")
        if shift >= 70:
            raise ValueError("varint longer than 10 bytes")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value & _UINT64, at


def _decode(data: bytes, schema: dict[int, tuple[str, str]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    at = 0
    while at < len(data):
        key, at = _read_varint(data, at)
        number, wire = key >> 3, key & 7
        if not 0 < number <= _MAX_FIELD_NUMBER:  # as protobuf's parser: corrupt, not an unknown field
            raise ValueError(f"field number {number} is out of range")
        if wire == _VARINT:
            value, at = _read_varint(data, at)
        elif wire == _LENGTH:
            size, at = _read_varint(data, at)
            if at + size > len(data):
                raise ValueError("truncated length-delimited field")
            raw, at = data[at : at + size], at + size
        elif wire in (_FIXED64, _FIXED32):
            at += 8 if wire == _FIXED64 else 4
            if at > len(data):
                raise ValueError("truncated fixed-width field")
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if number not in schema:
            continue  # unknown field
        name, kind = schema[number]
        if kind == "string":
            if wire != _LENGTH:
                raise ValueError(f"{name}: wire type {wire} for a string")
            found[name] = raw.decode("utf-8")  # strict: UnicodeDecodeError is a ValueError
            continue
        if wire != _VARINT:
            raise ValueError(f"{name}: wire type {wire} for an integer")
        if kind == "bool":
            found[name] = value != 0
        elif kind == "int32":
            value &= _UINT32
            found[name] = value - (1 << 32) if value >= 1 << 31 else value
        elif kind == "uint32":
            found[name] = value & _UINT32
        else:
            found[name] = value
    return found


def decode_launch_reply(data: bytes) -> LaunchReply:
    return LaunchReply(**_decode(data, _REPLY))


def decode_session_ended(data: bytes) -> SessionEnded:
    return SessionEnded(**_decode(data, _ENDED))
