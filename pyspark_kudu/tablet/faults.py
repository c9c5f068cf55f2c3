"""Injected crash points for testing crash safety with real processes.

Setting the environment variable ``PYSPARK_KUDU_CRASH_AT`` to one of :data:`CRASH_POINTS` makes
the process call ``os._exit(CRASH_EXIT_CODE)`` when it reaches that point: no ``finally``
blocks, no buffered-file flushes, no atexit hooks, which is as close to a power cut as a test
can get without a VM (Kudu's ``--fault_crash_*`` flags play the same role). With the variable
unset the check is one dictionary lookup.

Thread-safety: reads the environment only.
"""

from __future__ import annotations

import os

__all__ = ["CRASH_ENV", "CRASH_EXIT_CODE", "CRASH_POINTS", "crash_point"]

CRASH_ENV = "PYSPARK_KUDU_CRASH_AT"
CRASH_EXIT_CODE = 86

CRASH_POINTS = (
    "flush.start",  # before anything is written
    "flush.after_rowset",  # new rowset file written, deltas and superblock not
    "flush.after_deltas",  # rowset and delta files written, superblock not
    "flush.after_superblock",  # superblock replaced, memory not yet switched
    "compact.start",  # after the pre-compaction flush, before outputs are written
    "compact.after_outputs",  # output rowsets written, superblock not
    "compact.after_superblock",  # superblock replaced, inputs not yet deleted
    "compact.during_delete",  # first input file deleted, the others not
)


def crash_point(name: str) -> None:
    """Exit the process immediately if ``PYSPARK_KUDU_CRASH_AT`` names this point."""
    if os.environ.get(CRASH_ENV) == name:
        os._exit(CRASH_EXIT_CODE)
