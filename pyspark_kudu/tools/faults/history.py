"""Operation histories of a fault run: what every client asked, when, and what came back.

The format follows Jepsen's: every operation is written as **two JSON lines**, one when it
is invoked and one when it completes, each flushed (and fsynced) at once, so a run that
crashes or hangs still leaves its history on disk. An operation whose completion line is
missing is loaded as ``info`` (its outcome is unknown) that never completed.

Outcomes:

* ``ok``: acknowledged. For a write, committed on a majority; for a read, the values seen.
* ``fail``: definitely **not** applied (e.g. a validation error raised before anything was
  proposed, or a per-row rejection such as a duplicate key on ``insert``).
* ``info``: unknown: the write may or may not have been applied, now or later. The harness
  records it after ``FencedError``, ``RoundFailedError`` or ``TimedOutError`` (and after an
  unexpected error, which also fails the run: :mod:`.workload`).

A write names one or more keys with one value each (``None`` for a delete); a write that
failed for some of its rows (Kudu's per-row errors) records those keys in ``row_errors``:
they are ``fail`` while the other keys are ``ok``. A read names the keys it looked at and
what it saw for each (``None``: absent).

Times are seconds on the monotonic clock since the history was opened (``t0``); the header
line carries the wall-clock start for the report.

Thread-safety: :class:`HistoryWriter` is thread-safe (one lock around id allocation and
each append); :class:`Op` values are immutable.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

__all__ = [
    "KINDS",
    "OUTCOMES",
    "HistoryWriter",
    "Key",
    "Op",
    "Value",
    "load_history",
]

Key = int | str
Value = str | None
Kind = Literal["insert", "upsert", "delete", "read"]
Outcome = Literal["ok", "fail", "info"]

KINDS: tuple[str, ...] = ("insert", "upsert", "delete", "read")
OUTCOMES: tuple[str, ...] = ("ok", "fail", "info")


@dataclass(frozen=True)
class Op:
    """One operation of one client.

    ``complete`` is ``math.inf`` for an operation that never completed (crash, hang): its
    effect, if any, may happen at any time after ``invoke``. ``results`` (reads) maps each
    key read to the value seen. ``row_errors`` (writes) maps keys rejected per row to the
    status the tablet gave.
    """

    id: int
    client: str
    kind: str
    keys: tuple[Key, ...]
    values: tuple[Value, ...]
    invoke: float
    complete: float
    outcome: str
    results: Mapping[Key, Value] = field(default_factory=dict)
    row_errors: Mapping[Key, str] = field(default_factory=dict)
    error: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"op {self.id}: unknown kind {self.kind!r}; use one of {KINDS}")
        if self.outcome not in OUTCOMES:
            raise ValueError(f"op {self.id}: unknown outcome {self.outcome!r}; use {OUTCOMES}")
        if self.kind != "read" and len(self.keys) != len(self.values):
            raise ValueError(f"op {self.id}: {len(self.keys)} keys but {len(self.values)} "
                             f"values; a write has one value per key (None for a delete)")
        if self.complete < self.invoke:
            raise ValueError(f"op {self.id}: completes ({self.complete}) before it is invoked "
                             f"({self.invoke})")

    @property
    def is_write(self) -> bool:
        return self.kind != "read"

    def outcome_for(self, key: Key) -> str:
        """This op's outcome for one key: a per-row rejection makes it ``fail``."""
        if self.outcome == "ok" and key in self.row_errors:
            return "fail"
        return self.outcome

    def describe(self) -> str:
        """A one-line human description, e.g. ``#12 c1 upsert 3='c1-7' ok [1.20, 1.85]``."""
        if self.kind == "read":
            what = ", ".join(f"{k}={self.results.get(k)!r}" for k in self.keys
                             if k in self.results) or ", ".join(map(str, self.keys))
        elif self.kind == "delete":
            what = ", ".join(map(str, self.keys))
        else:
            what = ", ".join(f"{k}={v!r}" for k, v in zip(self.keys, self.values, strict=True))
        end = "never" if math.isinf(self.complete) else f"{self.complete:.2f}"
        return (f"#{self.id} {self.client} {self.kind} {what} {self.outcome} "
                f"[{self.invoke:.2f}, {end}]")


class HistoryWriter:
    """Appends invocations and completions to ``path`` as they happen.

    Use :meth:`invoke` before calling the system and exactly one of :meth:`ok`,
    :meth:`fail`, :meth:`info` after. Each line is flushed and fsynced before the call
    returns, so what the system acknowledged is on disk before the next op starts.
    """

    def __init__(self, path: Path, meta: Mapping[str, Any] | None = None) -> None:
        self.path = path
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self._next = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f: TextIO = open(path, "a", encoding="utf-8")  # closed in close()
        self._write({"type": "header", "wall_start": time.time(), **(meta or {})})

    def now(self) -> float:
        """Seconds since this history started (the time base of every op)."""
        return time.monotonic() - self.t0

    def _write(self, rec: Mapping[str, Any]) -> None:
        line = json.dumps(rec, sort_keys=True)
        with self._lock:
            self._f.write(line + "\n")
            self._f.flush()
            os.fsync(self._f.fileno())

    def invoke(self, client: str, kind: str, keys: Sequence[Key],
               values: Sequence[Value] = ()) -> int:
        """Record that ``client`` starts ``kind`` on ``keys``; returns the op id."""
        if kind not in KINDS:
            raise ValueError(f"unknown op kind {kind!r}; use one of {KINDS}")
        with self._lock:
            op_id = self._next
            self._next += 1
        self._write({"type": "invoke", "id": op_id, "client": client, "kind": kind,
                     "keys": list(keys), "values": list(values),
                     "time": self.now()})
        return op_id

    def ok(self, op_id: int, results: Mapping[Key, Value] | None = None,
           row_errors: Mapping[Key, str] | None = None) -> None:
        """The op was acknowledged (a read: ``results`` are what it saw)."""
        self._complete(op_id, "ok", results=results, row_errors=row_errors)

    def fail(self, op_id: int, error: str) -> None:
        """The op was definitely not applied."""
        self._complete(op_id, "fail", error=error)

    def info(self, op_id: int, error: str) -> None:
        """The op's outcome is unknown: it may or may not have been applied."""
        self._complete(op_id, "info", error=error)

    def _complete(self, op_id: int, outcome: str, *, results: Mapping[Key, Value] | None = None,
                  row_errors: Mapping[Key, str] | None = None, error: str = "") -> None:
        rec: dict[str, Any] = {"type": outcome, "id": op_id, "time": self.now()}
        if results is not None:
            rec["results"] = [[k, v] for k, v in results.items()]
        if row_errors:
            rec["row_errors"] = [[k, s] for k, s in row_errors.items()]
        if error:
            rec["error"] = error[:500]
        self._write(rec)

    def close(self) -> None:
        with self._lock:
            self._f.close()

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _key_of(raw: Any) -> Key:
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise ValueError(f"history key {raw!r} is neither an int nor a string")
    return raw


def ops_from_records(records: Iterable[Mapping[str, Any]]) -> list[Op]:
    """Pair invoke and completion records into ops (sorted by invoke time). An invocation
    without completion becomes ``info`` with ``complete = inf``; a torn last line is the
    caller's to skip (see :func:`load_history`)."""
    invoked: dict[int, Mapping[str, Any]] = {}
    done: dict[int, Mapping[str, Any]] = {}
    for rec in records:
        typ = rec.get("type")
        if typ == "invoke":
            invoked[int(rec["id"])] = rec
        elif typ in OUTCOMES:
            done[int(rec["id"])] = rec
    ops = []
    for op_id, inv in invoked.items():
        end = done.get(op_id)
        outcome = str(end["type"]) if end else "info"
        ops.append(Op(
            id=op_id, client=str(inv["client"]), kind=str(inv["kind"]),
            keys=tuple(_key_of(k) for k in inv["keys"]),
            values=tuple(inv.get("values", ())),
            invoke=float(inv["time"]),
            complete=float(end["time"]) if end else math.inf,
            outcome=outcome,
            results={_key_of(k): v for k, v in (end or {}).get("results", [])},
            row_errors={_key_of(k): str(s) for k, s in (end or {}).get("row_errors", [])},
            error=str((end or {}).get("error", "" if end else "never completed")),
        ))
    ops.sort(key=lambda o: (o.invoke, o.id))
    return ops


def load_history(path: Path) -> tuple[dict[str, Any], list[Op]]:
    """The header and the ops of a history file. A torn final line (the writer crashed
    mid-write) is ignored; a bad line elsewhere is an error."""
    header: dict[str, Any] = {}
    records = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines) - 1:
                break  # torn tail of a crashed writer
            raise ValueError(f"{path}:{n + 1}: not a JSON history line: {line[:80]!r}") from None
        if rec.get("type") == "header":
            header = rec
        else:
            records.append(rec)
    return header, ops_from_records(records)
