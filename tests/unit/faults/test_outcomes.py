"""Only the documented outcome-unknown errors make an op ``info``; any other error fails the
run with its traceback (issue 19). And when a sample counts as "replication whole again".

No Spark: a client whose ``write`` / ``read_table`` raise what the test says. The
workload's own code (classification, history, tracebacks) is the product under test here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pyspark_kudu.errors import (
    FencedError,
    InvalidArgumentError,
    NotLeaderError,
    RoundFailedError,
    RowWriteError,
    TimedOutError,
)
from pyspark_kudu.tools.faults.history import HistoryWriter, load_history
from pyspark_kudu.tools.faults.sampler import clean_since, fully_replicated
from pyspark_kudu.tools.faults.workload import Workload


class _Client:
    """Raises ``error`` from every write and read (returns normally when None)."""

    def __init__(self, error: Exception | None) -> None:
        self.error = error

    def write(self, df: Any, table: str, kind: str) -> None:
        if self.error is not None:
            raise self.error

    def read_table(self, table: str, read_mode: str) -> _Client:
        return self

    def collect(self) -> list[dict[str, Any]]:
        if self.error is not None:
            raise self.error
        return [{"id": 1, "v": "a"}]

    def createDataFrame(self, rows: Any, schema: Any) -> Any:  # Spark's name
        return rows


def _run(tmp_path: Path, error: Exception | None, kind: str = "upsert"
         ) -> tuple[str, str, list[str]]:
    """One op that meets ``error``: (its outcome, its error text, the run's unexpected)."""
    client = _Client(error)
    with HistoryWriter(tmp_path / "history.jsonl") as history:
        w = Workload([(client, client)], history, table="t", seed=1, clients=1, keys=3,
                     mix=[("upsert", 1.0)], op_pause_s=0.0)
        if kind == "read":
            w.read("c0")
        else:
            w.write("c0", kind, 1, "c0-1")
    (op,) = load_history(tmp_path / "history.jsonl")[1]
    return op.outcome, op.error, w.unexpected()


@pytest.mark.parametrize("error", [
    FencedError("tablet t: a newer leader took over"),
    RoundFailedError("tablet t: no majority"),
    TimedOutError("round did not finish before its deadline"),
], ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("kind", ["upsert", "read"])
def test_outcome_unknown_errors_make_an_op_info_and_do_not_fail_the_run(
    tmp_path: Path, error: Exception, kind: str,
) -> None:
    outcome, text, unexpected = _run(tmp_path, error, kind)
    assert outcome == "info" and text.startswith(type(error).__name__)
    assert unexpected == []


@pytest.mark.parametrize("error", [
    KeyError("id"),
    NotLeaderError("not the leader"),
    RuntimeError("Py4JJavaError: job aborted"),
], ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("kind", ["upsert", "read"])
def test_any_other_error_is_recorded_info_and_fails_the_run_with_its_traceback(
    tmp_path: Path, error: Exception, kind: str,
) -> None:
    outcome, text, unexpected = _run(tmp_path, error, kind)
    assert outcome == "info" and text.startswith(f"unexpected {type(error).__name__}")
    (report,) = unexpected
    assert "not an outcome-unknown one" in report and "Traceback" in report
    assert type(error).__name__ in report


def test_a_validation_error_is_a_definite_failure(tmp_path: Path) -> None:
    outcome, _, unexpected = _run(tmp_path, InvalidArgumentError("bad row"))
    assert outcome == "fail" and unexpected == []


def test_a_row_error_for_the_ops_own_key_is_ok_with_that_row_rejected(tmp_path: Path) -> None:
    own = RowWriteError("1 row failed", [("t", {"id": 1}, "AlreadyPresent", "dup")], 0)
    outcome, _, unexpected = _run(tmp_path, own, "insert")
    assert outcome == "ok" and unexpected == []
    other = RowWriteError("1 row failed", [("t", {"id": 2}, "AlreadyPresent", "dup")], 0)
    outcome, _, unexpected = _run(tmp_path / "other", other, "insert")
    assert outcome == "info" and len(unexpected) == 1


def test_only_the_first_few_tracebacks_are_kept_but_every_one_is_counted(
    tmp_path: Path,
) -> None:
    client = _Client(KeyError("id"))
    with HistoryWriter(tmp_path / "history.jsonl") as history:
        w = Workload([(client, client)], history, table="t", seed=1, clients=1, keys=3,
                     mix=[("upsert", 1.0)], op_pause_s=0.0)
        for i in range(8):
            w.write("c0", "upsert", 1, f"c0-{i}")
    got = w.unexpected()
    assert len(got) == 6 and got[-1] == "... and 3 more", got[-1]


_CLEAN = {"under_replicated": 0, "unavailable": 0, "recovering": 0, "tablets": 2,
          "voters_on_down_hosts": 0, "failed_voters": 0}


def test_replication_is_whole_again_only_on_two_clean_samples_after_the_fault() -> None:
    samples = [{"t": float(t), **_CLEAN} for t in range(10)]
    assert clean_since(samples, 8.0) and not clean_since(samples, 8.5)
    failed = [*samples[:-1], {**samples[-1], "failed_voters": 1}]
    assert not fully_replicated(failed[-1]) and not clean_since(failed, 0.0), (
        "a voter marked failed but not yet reported: ksck still calls it healthy")
    assert not clean_since([*samples, {"t": 10.0, "error": "master busy"}], 0.0)
