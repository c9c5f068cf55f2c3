"""What a write did and how far it got: the values :mod:`.write_service` returns and the
session service sends to clients.

Their own module, with nothing heavy imported, because
:mod:`.session_client` needs them and the driver's Python workers that plan and commit a
``format("kudu")`` write import that client: from :mod:`.write_service` they would import
the whole replication, tablet and WAL code (~0.4 s per fresh worker; PySpark starts fresh
ones after a minute idle).

Thread-safety: immutable values.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WriteProgress", "WriteSummary"]


@dataclass(frozen=True)
class WriteSummary:
    """What a write did: rows written, rows refused (per-row errors), tablets touched."""

    rows_written: int
    row_errors: int
    tablets: int


@dataclass(frozen=True)
class WriteProgress:
    """How far a write got: rows and batches committed so far, out of the totals."""

    rows_done: int
    rows_total: int
    batches_done: int
    batches_total: int
