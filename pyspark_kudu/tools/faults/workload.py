"""The fault run's workload: client threads issuing single-row writes and full-table reads,
each recorded in the history (:mod:`.history`) with its outcome.

Outcomes are classified strictly, because ``info`` (unknown) is where a harness can hide a
bug -- the checker accepts anything of an unknown outcome:

* ``ok``: the call returned; a ``RowWriteError`` rejecting this op's row is ``ok`` with that
  row's ``row_errors`` (the row was definitely not written);
* ``fail``: ``InvalidArgumentError``, raised before anything is proposed;
* ``info``: only the errors the project documents as outcome unknown
  (:data:`OUTCOME_UNKNOWN`: ``FencedError`` and ``RoundFailedError``, DESIGN §3.1, and
  ``TimedOutError``, a deadline);
* anything else is **unexpected**: the op is recorded ``info`` (nobody knows what it did)
  and :meth:`Workload.unexpected` carries its traceback, which fails the run.

Thread-safety: the client threads share the ``KuduContext``\\s (thread-safe) and the
:class:`HistoryWriter` (thread-safe); :meth:`Workload.unexpected` may be called from any
thread.
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from collections.abc import Iterable, Sequence
from typing import Any

from pyspark_kudu.errors import (
    FencedError,
    InvalidArgumentError,
    RoundFailedError,
    RowWriteError,
    TimedOutError,
)
from pyspark_kudu.tools.faults.history import HistoryWriter, Key, Value

__all__ = ["OUTCOME_UNKNOWN", "Workload"]

OUTCOME_UNKNOWN: tuple[type[Exception], ...] = (FencedError, RoundFailedError, TimedOutError)
"""The errors after which an operation's outcome is unknown (``info``)."""

_KEEP_TRACEBACKS = 5


class Workload:
    """``clients`` threads over ``sessions`` ((KuduContext, SparkSession) pairs: client
    ``i`` uses pair ``i % len(sessions)``, the final reader the first), writing ``table``
    (columns ``id`` bigint key, ``v`` string) over ``keys`` keys with the ``mix`` of op kinds,
    ``op_pause_s`` apart, until :meth:`join`."""

    def __init__(self, sessions: Sequence[tuple[Any, Any]], history: HistoryWriter, *,
                 table: str, seed: int, clients: int, keys: int,
                 mix: Sequence[tuple[str, float]], op_pause_s: float) -> None:
        from pyspark.sql.types import LongType, StringType, StructField, StructType

        self.sessions = list(sessions)
        self.history = history
        self.table = table
        self.seed = seed
        self.keys = keys
        self.mix = list(mix)
        self.op_pause_s = op_pause_s
        self.row = StructType([StructField("id", LongType(), False),
                               StructField("v", StringType(), True)])
        self.key_only = StructType([StructField("id", LongType(), False)])
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._unexpected: list[str] = []
        self._unexpected_count = 0
        self._acked: set[str] = set()
        self.threads = [threading.Thread(target=self._client, args=(f"c{i}",), daemon=True,
                                         name=f"fault-client-{i}")
                        for i in range(clients)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self, deadline_s: float) -> list[str]:
        """Stop and wait; returns the clients still blocked in a call after the deadline
        (their last op stays without completion: unknown outcome)."""
        self.stop.set()
        end = time.monotonic() + deadline_s
        for t in self.threads:
            t.join(max(0.0, end - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]

    def acked_clients(self) -> set[str]:
        """The clients that had at least one write acknowledged."""
        with self._lock:
            return set(self._acked)

    def unexpected(self) -> list[str]:
        """One line per op that raised an error outside :data:`OUTCOME_UNKNOWN` (the first
        few with their tracebacks); any fails the run."""
        with self._lock:
            more = self._unexpected_count - len(self._unexpected)
            return self._unexpected + ([f"... and {more} more"] if more > 0 else [])

    def _unexpected_error(self, op: int, client: str, kind: str, e: Exception) -> None:
        self.history.info(op, f"unexpected {type(e).__name__}: {e}")
        with self._lock:
            self._unexpected_count += 1
            if len(self._unexpected) < _KEEP_TRACEBACKS:
                tb = "".join(traceback.format_exception(e))
                self._unexpected.append(f"op #{op} ({client} {kind}) raised an error that is "
                                        f"not an outcome-unknown one:\n{tb}")

    def _session(self, client: str) -> tuple[Any, Any]:
        i = int(client[1:]) if client[1:].isdigit() else 0
        return self.sessions[i % len(self.sessions)]

    def _client(self, client: str) -> None:
        rng = random.Random(f"{self.seed}/{client}")
        kinds = [k for k, _ in self.mix]
        weights = [w for _, w in self.mix]
        seq = 0
        while not self.stop.is_set():
            kind = rng.choices(kinds, weights)[0]
            if kind == "read":
                self.read(client)
            else:
                seq += 1
                self.write(client, kind, rng.randrange(self.keys), f"{client}-{seq}")
            self.stop.wait(self.op_pause_s)  # pacing only

    def write(self, client: str, kind: str, key: int, value: str) -> None:
        val: Value = None if kind == "delete" else value
        kudu, spark = self._session(client)
        op = self.history.invoke(client, kind, [key], [val])
        try:
            if kind == "delete":
                df = spark.createDataFrame([(key,)], self.key_only)
            else:
                df = spark.createDataFrame([(key, value)], self.row)
            kudu.write(df, self.table, kind)
        except RowWriteError as e:
            rejected: dict[Key, str] = {}
            for _, row, status, _ in e.errors:
                rid = row.get("id")
                if isinstance(rid, int):
                    rejected[rid] = status
            if key in rejected:
                self.history.ok(op, row_errors=rejected)
            else:  # a single-row write rejected for another row: not a documented outcome
                self._unexpected_error(op, client, kind, e)
        except InvalidArgumentError as e:  # validated before anything was proposed
            self.history.fail(op, f"InvalidArgumentError: {e}")
        except OUTCOME_UNKNOWN as e:
            self.history.info(op, f"{type(e).__name__}: {e}")
        except Exception as e:
            self._unexpected_error(op, client, kind, e)
        else:
            self.history.ok(op)
            with self._lock:
                self._acked.add(client)

    def read(self, client: str) -> dict[Key, Value] | None:
        """A linearizable full-table read (with two writers, a READ_LATEST read may miss
        what the other acknowledged). None when it failed (recorded)."""
        keys = list(range(self.keys))
        kudu, _ = self._session(client)
        op = self.history.invoke(client, "read", keys)
        try:
            rows = kudu.read_table(self.table, read_mode="linearizable").collect()
        except OUTCOME_UNKNOWN as e:
            self.history.info(op, f"{type(e).__name__}: {e}")
            return None
        except Exception as e:
            self._unexpected_error(op, client, "read", e)
            return None
        return record_read(self.history, op, keys, rows)


def record_read(history: HistoryWriter, op: int, keys: Sequence[Key], rows: Iterable[Any]
                ) -> dict[Key, Value]:
    """Record a completed full read of ``keys`` (rows with ``id`` and ``v``; a key no row
    names reads as absent) and return its results."""
    results: dict[Key, Value] = dict.fromkeys(keys)
    for r in rows:
        results[int(r["id"])] = r["v"]
    history.ok(op, results=results)
    return results
