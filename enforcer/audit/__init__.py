"""The tamper-evident audit log: writer, masking, verification, queries and session evidence."""

from .appender import Appender, AuditUnavailable, Entry, Receipt
from .masking import Masker
from .writer import AuditWriter, WriterSettings

__all__ = ["Appender", "AuditUnavailable", "AuditWriter", "Entry", "Masker", "Receipt", "WriterSettings"]
