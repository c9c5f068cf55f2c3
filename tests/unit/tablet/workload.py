"""A deterministic workload in phases, shared by the crash tests and their child process."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import pyarrow as pa

from pyspark_kudu.schema import ColumnSchema, Schema
from pyspark_kudu.tablet import (
    CRASH_ENV,
    LogRecord,
    OpType,
    Tablet,
    TabletOptions,
    encode_write_batch,
)

from .filelog import FileLog

SCHEMA = Schema(
    (
        ColumnSchema("id", "int64", nullable=False),
        ColumnSchema("grp", "string", nullable=False, default="-"),
        ColumnSchema("v", "int64"),
    ),
    ("id",),
)
OPTIONS = TabletOptions(flush_threshold_bytes=0, row_group_rows=8, compaction_target_rows=40)


def write(t: Tablet, op: OpType, ids: list[int], v: int = 0) -> int:
    """Append one batch of ``op`` on ``ids`` (column ``v`` = ``v``) to the tablet's
    ``MemoryLog`` and apply it; returns its index."""
    index = t.applied_index + 1
    data = encode_write_batch(SCHEMA, op, pa.table({"id": ids, "v": [v] * len(ids)}))
    assert t.log is not None
    t.log.append((index, data))  # type: ignore[attr-defined]
    assert t.apply(index, data).ok
    return index
TABLET_ID = "t-crash"


@dataclass(frozen=True)
class Phase:
    kind: str  # apply | flush | compact
    lo: int = 0
    hi: int = 0


PHASES = (
    Phase("apply", 1, 10),
    Phase("flush"),
    Phase("apply", 11, 20),
    Phase("flush"),
    Phase("apply", 21, 30),
    Phase("compact", 15),
    Phase("apply", 31, 40),
    Phase("flush"),
)


def entry(index: int) -> LogRecord:
    """Entry ``index`` of the workload: a random batch, or a no-op every seventh index."""
    if index % 7 == 0:
        return LogRecord(index, b"", term=1)
    rnd = random.Random(index)
    n = rnd.randint(1, 12)
    ops = [rnd.choice(list(OpType)) for _ in range(n)]
    table = pa.table({
        "id": [rnd.randint(0, 60) for _ in range(n)],
        "v": [rnd.choice([None, rnd.randint(0, 1000)]) for _ in range(n)],
    })
    return LogRecord(index, encode_write_batch(SCHEMA, ops, table), term=1)


def run_phases(tablet: Tablet, log: FileLog, phases: range, crash_phase: int = -1,
               crash_at: str = "") -> None:
    for i in phases:
        if i == crash_phase:
            os.environ[CRASH_ENV] = crash_at
        p = PHASES[i]
        if p.kind == "apply":
            for index in range(p.lo, p.hi + 1):
                rec = entry(index)
                log.append(rec)  # durable in the log first, then applied (Raft order)
                tablet.apply(rec.index, rec.data)
        elif p.kind == "flush":
            tablet.flush()
        else:
            tablet.compact(history_retention_index=p.lo)


def open_or_create(root: str, log: FileLog) -> Tablet:
    try:
        return Tablet.open(root, TABLET_ID, log=log, options=OPTIONS)
    except Exception:
        return Tablet.create(root, TABLET_ID, SCHEMA, log=log, options=OPTIONS)
