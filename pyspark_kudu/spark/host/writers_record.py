"""Which host wrote which log entries of a replica: ``<tablet>/writers``.

One ``<host> <first> <last>`` line per append, written by the pinned request that appended
(:mod:`~pyspark_kudu.spark.host.handlers`), so tests (and operators) can check that only the
replica's own host ever wrote its log (DESIGN §3).

Thread-safety: appends under the replica's lock (the caller's); reads are snapshots.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark_kudu.consensus.messages import Entry
from pyspark_kudu.fileio import FileIO, open_private

__all__ = ["WRITERS_FILE", "read_writers", "record_writer"]

WRITERS_FILE = "writers"


def record_writer(io: FileIO, host: str, entries: Sequence[Entry]) -> None:
    """Append ``<host> <first> <last>`` for ``entries`` to the writers record under ``io``."""
    with open_private(io.local_path(WRITERS_FILE), "a") as f:
        f.write(f"{host} {entries[0].index} {entries[-1].index}\n")


def read_writers(root: str, tablet_id: str) -> list[tuple[str, int, int]]:
    """The ``(host, first, last)`` lines of a replica's writers record."""
    io = FileIO(root).child("tablets", tablet_id)
    if not io.exists(WRITERS_FILE):
        return []
    out = []
    for line in io.read_bytes(WRITERS_FILE).decode().splitlines():
        host, first, last = line.split()
        out.append((host, int(first), int(last)))
    return out
