"""The writer's settings and when its periodic jobs fall due: group commit (fdatasync every
`group_records` records or `group_ms` milliseconds), checkpoints, and rotation by size and age.
Pure: the writer passes where it stands."""

from __future__ import annotations

from typing import NamedTuple

from ..quick_dataclass import dataclass


@dataclass(frozen=True)
class WriterSettings:
    group_records: int = 256
    group_ms: float = 5.0
    checkpoint_records: int = 1000
    checkpoint_seconds: float = 60.0
    rotate_bytes: int = 64 * 1024 * 1024
    rotate_seconds: float = 24 * 3600.0
    background_flush: bool = False  # a thread that honours group_ms while the log is idle
    lock_wait_s: float = -1  # an append or sync waiting longer for another one fails (-1: no limit)


class Due(NamedTuple):
    """The earliest time, seq and size at which a group commit, checkpoint or rotation may be due:
    three cheap tests per append instead of six. Early is harmless (the *_due functions decide and
    the writer computes this again after them)."""

    ns: int
    seq: int
    size: int


def next_due(
    settings: WriterSettings,
    *,
    now: int,
    seq: int,
    unsynced: int,
    last_sync_ns: int,
    since_checkpoint: int,
    last_checkpoint_ns: int,
    file_started_ns: int,
    flusher_busy: bool,
) -> Due:
    """While the flusher is still syncing the last group (`flusher_busy`), the next group is looked
    at a group later; the flusher pulls that in when done."""
    synced_ns = now if flusher_busy else last_sync_ns
    return Due(
        min(
            synced_ns + int(settings.group_ms * 1e6),
            last_checkpoint_ns + int(settings.checkpoint_seconds * 1e9),
            file_started_ns + int(settings.rotate_seconds * 1e9),
        ),
        seq
        + min(
            settings.group_records - (0 if flusher_busy else unsynced),
            settings.checkpoint_records - since_checkpoint,
        ),
        settings.rotate_bytes,
    )


def group_commit_due(settings: WriterSettings, *, now: int, unsynced: int, last_sync_ns: int) -> bool:
    return unsynced >= settings.group_records or now - last_sync_ns >= settings.group_ms * 1e6


def checkpoint_due(settings: WriterSettings, *, now: int, since_checkpoint: int, last_checkpoint_ns: int) -> bool:
    return (
        since_checkpoint >= settings.checkpoint_records or now - last_checkpoint_ns >= settings.checkpoint_seconds * 1e9
    )


def rotation_due(settings: WriterSettings, *, now: int, size: int, file_started_ns: int) -> bool:
    return size >= settings.rotate_bytes or now - file_started_ns >= settings.rotate_seconds * 1e9
