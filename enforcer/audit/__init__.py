"""The tamper-evident audit log: writer, masking, verification, queries and session evidence."""

from .masking import Masker
from .writer import AuditUnavailable, AuditWriter, Entry, Receipt, WriterSettings

__all__ = ["AuditUnavailable", "AuditWriter", "Entry", "Masker", "Receipt", "WriterSettings"]
