"""adl-exec --daemon's own reading and writing of the launch socket's messages, against the
generated protobuf classes the daemon uses."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from google.protobuf.message import DecodeError

from enforcer.cli import launch_messages as wire
from enforcer.v1 import enforcer_pb2 as pb

TEXT = ["", "a", "é", "日本語", "x" * 200, "with\nnewline", "nul\0byte", "🙂" * 70]


def random_text(rng: random.Random) -> str:
    return rng.choice(TEXT) + "".join(
        chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0xD800)])) for _ in range(rng.randrange(0, 5))
    )


def test_launch_requests_parse_as_the_daemon_reads_them() -> None:
    rng = random.Random(27)
    for _ in range(300):
        fields = {
            "agent": random_text(rng),
            "argv": [random_text(rng) for _ in range(rng.randrange(0, 6))],
            "environ": {random_text(rng): random_text(rng) for _ in range(rng.randrange(0, 6))},
            "cwd": random_text(rng),
            "accept_unenforced": [rng.choice(["network", "resources", ""]) for _ in range(rng.randrange(0, 3))],
            "pids_max": rng.choice([0, 1, 127, 128, 512, 300_000, 2**32 - 1]),
        }
        ours = wire.encode_launch_request(**fields)  # type: ignore[arg-type]
        parsed = pb.LaunchRequest.FromString(ours)
        assert parsed.agent == fields["agent"] and list(parsed.argv) == fields["argv"]
        assert dict(parsed.environ) == fields["environ"] and parsed.cwd == fields["cwd"]
        assert list(parsed.accept_unenforced) == fields["accept_unenforced"] and parsed.pids_max == fields["pids_max"]
        # What the generated class writes for the same request, byte for byte (fields in number order).
        reference = pb.LaunchRequest(**fields).SerializeToString(deterministic=True)  # type: ignore[arg-type]
        if len(fields["environ"]) <= 1:  # map order may differ between writers; content checked above
            assert ours == reference


def test_out_of_range_and_unencodable_requests_are_refused() -> None:
    with pytest.raises(ValueError, match="pids_max"):
        wire.encode_launch_request("a", ["true"], {}, "/", [], -1)
    with pytest.raises(ValueError, match="pids_max"):
        wire.encode_launch_request("a", ["true"], {}, "/", [], 2**32)
    with pytest.raises(UnicodeEncodeError):
        wire.encode_launch_request("a", ["\udcff"], {}, "/", [], 1)


def test_replies_read_as_the_generated_classes_read_them() -> None:
    rng = random.Random(28)
    for _ in range(300):
        reply = pb.LaunchReply(
            accepted=rng.random() < 0.5,
            session=random_text(rng),
            session_token=random_text(rng),
            refusal=random_text(rng),
            policy_digest=random_text(rng),
        )
        ours = wire.decode_launch_reply(reply.SerializeToString())
        assert ours.fields() == {f: getattr(reply, f) for f in ours.fields()}
        ended = pb.SessionEnded(
            session=random_text(rng),
            reason=rng.choice(["exit", "signal", "oom", "timeout", "pids_limit", "refused", "lost"]),
            exit_code=rng.choice([0, 1, 125, 137, 255, -1, -(2**31), 2**31 - 1]),
            signal=rng.choice([0, 9, 15, -3]),
            duration_ms=rng.choice([0, 1, 999, 2**40, 2**64 - 1]),
            creations_refused=rng.choice([0, 5, 2**32 - 1]),
            detail=random_text(rng),
            kernel_denials_json=random_text(rng),
        )
        got = wire.decode_session_ended(ended.SerializeToString())
        assert got.fields() == {f: getattr(ended, f) for f in got.fields()}


def test_defaults_unknown_fields_and_repeats_follow_proto3() -> None:
    assert wire.decode_launch_reply(b"") == wire.LaunchReply()
    newer = pb.LaunchReply(accepted=True, session="s").SerializeToString()
    unknown = b"\x98\x06\x07" + b"\xa2\x06\x02hi" + b"\xa9\x06" + b"\0" * 8 + b"\xad\x06" + b"\0" * 4  # 99..101
    assert wire.decode_launch_reply(unknown + newer + unknown) == wire.LaunchReply(accepted=True, session="s")
    twice = pb.LaunchReply(session="first").SerializeToString() + pb.LaunchReply(session="last").SerializeToString()
    assert wire.decode_launch_reply(twice).session == pb.LaunchReply.FromString(twice).session == "last"


@pytest.mark.parametrize(
    "data",
    [
        b"\x12\x05abc",  # a string cut short
        b"\x08",  # a varint with nothing after its key
        b"\x08\xff",  # a varint cut short
        b"\x08" + b"\xff" * 10 + b"\x01",  # a varint longer than ten bytes
        b"\x12\x02\xff\xfe",  # a string that is not UTF-8
        b"\x0b",  # a group (wire type 3)
        b"\x00\x00",  # field number 0
        b"\x0a\x01x",  # a string where a bool is declared
        b"\x10\x01",  # a varint where a string is declared
        b"\x80\x80\x80\x80\x10\x00",  # field number 2**29, past protobuf's largest
    ],
)
def test_malformed_replies_raise(data: bytes) -> None:
    with pytest.raises(ValueError):
        wire.decode_launch_reply(data)


def test_the_daemon_client_imports_no_protobuf_documents_or_cgroups() -> None:
    code = (
        "import sys; sys.argv = ['adl-exec']; from enforcer.cli import exec as e, exec_daemon; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('google', 'grpc') "
        "or m in ('enforcer.v1.enforcer_pb2', 'enforcer.documents', 'enforcer.sandbox.cgroups')))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_a_field_number_protobuf_rejects_is_no_default_end_of_session() -> None:
    """Field numbers past 2**29 - 1 are malformed for protobuf's own parser: this one must not skip
    them as unknown fields and report an exit code from a corrupt message either."""
    corrupt = b"\x82\x80\x80\x80\x10\x04exit" + pb.SessionEnded(reason="signal", exit_code=137).SerializeToString()
    with pytest.raises(DecodeError):
        pb.SessionEnded.FromString(corrupt)
    with pytest.raises(ValueError):
        wire.decode_session_ended(corrupt)
