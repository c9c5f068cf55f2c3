"""Fixtures and helpers shared by the WAL tests: real files under ``tmp_path``, no mocks."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyspark_kudu.consensus.messages import Entry
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.wal import SyncPolicy, WalOptions
from pyspark_kudu.wal.format import FRAME_OVERHEAD, HEADER_SIZE

DATA_SIZE = 20
FRAME_SIZE = FRAME_OVERHEAD + DATA_SIZE
SMALL_SEGMENT = HEADER_SIZE + 4 * FRAME_SIZE
"""Room for exactly four test frames: the fifth entry rolls to a new segment."""


def make_entries(lo: int, hi: int, term: int = 1) -> list[Entry]:
    """Entries ``[lo, hi)`` with ``DATA_SIZE`` bytes of data naming their term and index."""
    return [Entry(term, i, data=f"t{term}i{i}".encode().ljust(DATA_SIZE, b"."))
            for i in range(lo, hi)]


def frame_offset(k: int) -> int:
    """Offset of the ``k``-th (0-based) test frame in its segment."""
    return HEADER_SIZE + k * FRAME_SIZE


@pytest.fixture
def wal_io(tmp_path: Path) -> FileIO:
    return FileIO(str(tmp_path / "wal"))


@pytest.fixture
def small_segments() -> WalOptions:
    return WalOptions(segment_size=SMALL_SEGMENT, sync_policy=SyncPolicy.FDATASYNC)
