"""The fault harness's history checker (issue 8, "Proof"): hand-built histories that must
pass and must fail, the history file round trip, and a property test: histories produced by
a register whose operations take effect inside their intervals are linearizable."""

from __future__ import annotations

import math
import random
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_kudu.tools.faults.checker import (
    FABRICATED,
    FAILED_VISIBLE,
    LOST_WRITE,
    NON_LINEARIZABLE,
    check,
)
from pyspark_kudu.tools.faults.history import HistoryWriter, Key, Op, Value, load_history

INF = math.inf


def w(i: int, kind: str, key: Key, value: Value, inv: float, ret: float,
      outcome: str = "ok", client: str = "c0", row_error: str | None = None) -> Op:
    return Op(i, client, kind, (key,), (None if kind == "delete" else value,), inv,
              INF if outcome == "info" and ret == INF else ret, outcome,
              row_errors={key: row_error} if row_error else {})


def r(i: int, key: Key, seen: Value, inv: float, ret: float, client: str = "c1") -> Op:
    return Op(i, client, "read", (key,), (), inv, ret, "ok", results={key: seen})


def kinds(ops: list[Op], final: dict[Key, Value] | None) -> list[str]:
    return [v.kind for v in check(ops, final).violations]


# == must pass ====================================================================================


def test_sequential_writes_and_reads_with_the_matching_final_table_pass() -> None:
    ops = [w(0, "insert", 1, "a", 0, 1), r(1, 1, "a", 2, 3), w(2, "upsert", 1, "b", 4, 5),
           w(3, "delete", 1, None, 6, 7), r(4, 1, None, 8, 9), w(5, "insert", 1, "c", 10, 11)]
    result = check(ops, {1: "c"})
    assert result.valid, result.violations


def test_a_read_concurrent_with_a_write_may_see_either_value() -> None:
    base = [w(0, "upsert", 1, "a", 0, 1), w(1, "upsert", 1, "b", 2, 6)]
    assert check([*base, r(2, 1, "a", 3, 4)], {1: "b"}).valid
    assert check([*base, r(2, 1, "b", 3, 4)], {1: "b"}).valid


def test_an_unknown_outcome_write_may_take_effect_late_or_never() -> None:
    applied_late = [w(0, "upsert", 1, "a", 0, 1), w(1, "upsert", 1, "x", 2, INF, "info"),
                    r(2, 1, "a", 3, 4), r(3, 1, "x", 5, 6)]
    assert check(applied_late, {1: "x"}).valid
    never = [w(0, "upsert", 1, "a", 0, 1), w(1, "upsert", 1, "x", 2, INF, "info"),
             r(2, 1, "a", 3, 4)]
    assert check(never, {1: "a"}).valid


def test_an_unknown_delete_explains_an_absent_key() -> None:
    ops = [w(0, "insert", 1, "a", 0, 1), w(1, "delete", 1, None, 2, INF, "info")]
    assert check(ops, {}).valid


def test_a_rejected_row_of_a_write_is_not_applied_but_its_other_rows_are() -> None:
    multi = Op(1, "c0", "insert", (1, 2), ("dup", "fresh"), 2, 3, "ok",
               row_errors={1: "AlreadyPresent"})
    ops = [w(0, "insert", 1, "a", 0, 1), multi]
    assert check(ops, {1: "a", 2: "fresh"}).valid


# == must fail ====================================================================================


def test_a_lost_acknowledged_write_is_reported_with_the_write() -> None:
    ops = [w(0, "upsert", 1, "a", 0, 1), w(1, "upsert", 1, "b", 2, 3)]
    result = check(ops, {1: "a"})
    assert [v.kind for v in result.violations] == [LOST_WRITE]
    v = result.violations[0]
    assert v.key == 1 and 1 in v.ops and "lost" in v.explanation


def test_an_acknowledged_insert_missing_from_the_final_table_is_lost() -> None:
    assert kinds([w(0, "insert", 7, "a", 0, 1)], {}) == [LOST_WRITE]


def test_an_acknowledged_delete_whose_key_is_back_is_lost() -> None:
    ops = [w(0, "insert", 1, "a", 0, 1), w(1, "delete", 1, None, 2, 3)]
    assert kinds(ops, {1: "a"}) == [LOST_WRITE]


def test_a_visible_failed_write_is_reported() -> None:
    ops = [w(0, "upsert", 1, "a", 0, 1), w(1, "upsert", 1, "b", 2, 3, "fail")]
    assert kinds(ops, {1: "b"}) == [FAILED_VISIBLE]
    read = [w(0, "upsert", 1, "a", 0, 1), w(1, "upsert", 1, "b", 2, 3, "fail"),
            r(2, 1, "b", 4, 5)]
    assert FAILED_VISIBLE in kinds(read, None)


def test_a_fabricated_value_is_reported() -> None:
    ops = [w(0, "upsert", 1, "a", 0, 1), r(1, 1, "zzz", 2, 3)]
    assert kinds(ops, None) == [FABRICATED]
    assert kinds([w(0, "upsert", 1, "a", 0, 1)], {1: "a", 99: "ghost"}) == [FABRICATED]


def test_a_value_read_under_the_wrong_key_is_fabricated() -> None:
    ops = [w(0, "upsert", 1, "a", 0, 1), w(1, "upsert", 2, "b", 0, 1), r(2, 1, "b", 2, 3)]
    (v,) = check(ops, None).violations
    assert v.kind == FABRICATED and "another key" in v.explanation


def test_a_stale_read_is_not_linearizable() -> None:
    ops = [w(0, "upsert", 1, "a", 0, 1), w(1, "upsert", 1, "b", 2, 3), r(2, 1, "a", 4, 5)]
    result = check(ops, {1: "b"})
    (v,) = result.violations
    assert v.kind == NON_LINEARIZABLE and v.key == 1
    assert "stale read" in v.explanation and 2 in v.ops


def test_a_read_of_the_future_is_not_linearizable() -> None:
    ops = [r(0, 1, "a", 0, 1), w(1, "upsert", 1, "a", 2, 3)]
    (v,) = check(ops, {1: "a"}).violations
    assert v.kind == NON_LINEARIZABLE and "after the read had returned" in v.explanation


def test_a_value_that_comes_back_after_an_overwrite_is_not_linearizable() -> None:
    ops = [w(0, "upsert", 1, "a", 0, 1), w(1, "upsert", 1, "b", 2, 3), r(2, 1, "b", 4, 5),
           r(3, 1, "a", 6, 7), r(4, 1, "b", 8, 9)]
    assert kinds(ops, {1: "b"}) == [NON_LINEARIZABLE]


def test_two_reads_disagreeing_on_the_order_of_concurrent_writes_fail() -> None:
    # Writes a and b overlap; reader 1 sees a then b, reader 2 sees b then a.
    ops = [w(0, "upsert", 1, "a", 0, 10), w(1, "upsert", 1, "b", 0, 10, client="c1"),
           r(2, 1, "a", 1, 2), r(3, 1, "b", 3, 4),
           r(4, 1, "b", 1, 2, client="c2"), r(5, 1, "a", 3, 4, client="c2")]
    assert kinds(ops, None) == [NON_LINEARIZABLE]


def test_an_acknowledged_insert_over_a_present_key_is_not_linearizable() -> None:
    ops = [w(0, "insert", 1, "a", 0, 1), w(1, "insert", 1, "b", 2, 3)]
    assert kinds(ops, {1: "b"}) == [NON_LINEARIZABLE]


def test_a_search_over_its_bound_is_inconclusive_not_valid() -> None:
    ops = [w(i, "upsert", 1, f"v{i}", 0, INF, "info") for i in range(12)]
    ops.append(r(12, 1, "nope-never-written-but-checked-late", 50, 51))
    writes = [w(100 + i, "upsert", 1, f"u{i}", 0, 40, client=f"c{i}") for i in range(10)]
    result = check([*ops[:12], *writes], {1: "u3"}, max_states=50)
    assert not result.valid and result.inconclusive == (1,)


# == history files ================================================================================


def test_history_round_trips_and_an_unfinished_op_is_unknown(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path, {"seed": 7}) as h:
        a = h.invoke("c0", "upsert", [1], ["a"])
        h.ok(a)
        b = h.invoke("c0", "insert", [1, 2], ["x", "y"])
        h.ok(b, row_errors={1: "AlreadyPresent"})
        c = h.invoke("c1", "read", [1, 2])
        h.ok(c, results={1: "a", 2: "y"})
        d = h.invoke("c1", "delete", [2], [None])
        h.fail(d, "InvalidArgumentError: bad")
        h.invoke("c0", "upsert", [3], ["crash"])  # never completes
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"type": "ok", "id"')  # a torn last line
    header, ops = load_history(path)
    assert header["seed"] == 7
    by_id = {o.id: o for o in ops}
    assert by_id[1].outcome_for(1) == "fail" and by_id[1].outcome_for(2) == "ok"
    assert by_id[2].results == {1: "a", 2: "y"}
    assert by_id[3].outcome == "fail" and "bad" in by_id[3].error
    assert by_id[4].outcome == "info" and math.isinf(by_id[4].complete)
    assert check(ops, {1: "a", 2: "y"}).valid


# == property =====================================================================================


@st.composite
def linearizable_histories(draw: st.DrawFn) -> tuple[list[Op], dict[Key, Value]]:
    """A register per key; each op takes effect at a point inside its interval (an unknown
    op: maybe, at a point after its invocation); results follow that order."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 30))
    keys = draw(st.integers(1, 3))
    state: dict[Key, Value] = {}
    events = []
    for i in range(n):
        point = i * 1.0 + rng.random() * 0.5
        events.append((point, i))
    ops = []
    for point, i in sorted(events):
        key = rng.randrange(keys)
        inv = point - rng.random() * 3
        ret = point + rng.random() * 3
        kind = rng.choice(["insert", "upsert", "delete", "read", "read"])
        client = f"c{i % 3}"
        if kind == "read":
            ops.append(Op(i, client, "read", (key,), (), inv, ret, "ok",
                          results={key: state.get(key)}))
            continue
        value = None if kind == "delete" else f"v{i}"
        unknown = rng.random() < 0.2
        allowed = (kind == "upsert" or (kind == "insert" and key not in state)
                   or (kind == "delete" and key in state))
        applied = allowed and (not unknown or rng.random() < 0.5)
        if applied:
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
        if unknown:
            ops.append(Op(i, client, kind, (key,), (value,), inv, INF, "info"))
        elif allowed:
            ops.append(Op(i, client, kind, (key,), (value,), inv, ret, "ok"))
        else:  # Kudu rejects the row: definitely not applied
            ops.append(Op(i, client, kind, (key,), (value,), inv, ret, "ok",
                          row_errors={key: "AlreadyPresent" if kind == "insert"
                                      else "NotFound"}))
    return ops, dict(state)


@settings(max_examples=150, deadline=None)
@given(linearizable_histories())
def test_histories_of_a_real_register_are_linearizable(
        h: tuple[list[Op], dict[Key, Value]]) -> None:
    ops, final = h
    result = check(ops, final)
    assert result.valid, [v.explanation for v in result.violations]


@settings(max_examples=60, deadline=None)
@given(linearizable_histories(), st.integers(0, 10**6))
def test_dropping_an_acknowledged_write_from_the_final_table_is_caught(
        h: tuple[list[Op], dict[Key, Value]], pick: int) -> None:
    ops, final = h
    last: dict[Key, Op] = {}
    for o in ops:
        if o.kind in ("insert", "upsert") and o.outcome_for(o.keys[0]) == "ok":
            last[o.keys[0]] = o
    candidates = [k for k, o in last.items() if final.get(k) == o.values[0]
                  and all(p.complete < o.invoke for p in ops
                          if p is not o and p.kind != "read" and p.keys[0] == k
                          and p.outcome_for(k) != "fail")]
    if not candidates:
        return
    key = candidates[pick % len(candidates)]
    broken = {k: v for k, v in final.items() if k != key}
    assert not check(ops, broken).valid
