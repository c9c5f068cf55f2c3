"""Check a fault run's history against the table it left: is every result explainable?

Rules, checked per key (rows of a Kudu table are independent registers: Kudu offers no
multi-row atomicity, so a multi-row write is checked as one write per key):

1. **No fabricated data**: every value a read returned (intermediate reads and the final
   table) was written to that key by some operation. Writes use unique values, so a value
   nobody wrote means the storage invented, mixed up or resurrected it.
2. **Nothing from a definitely-failed op is visible**: a value whose only writer failed
   (``fail``: rejected before being proposed, or rejected for that row) is never read.
3. **No lost acknowledged write**: the final value of a key was written by an op that could
   have been the last write; an acknowledged write invoked after every possible writer of
   the final value completed was lost (for a final "absent", after every delete).
4. **Linearizability** of each key's history under a register model (Knossos / Porcupine
   style, after Wing & Gong): there is a total order of the acknowledged operations and a
   subset of the unknown-outcome (``info``) writes that respects real time (an op that
   completed before another was invoked comes first) and in which every read returns the
   latest write. Model: ``upsert v`` sets v; ``insert v`` needs the key absent and sets v;
   ``delete`` needs it present and removes it (Kudu rejects the others per row); ``read``
   must see the current value. ``info`` ops may take effect at any time after their
   invocation or never; ``fail`` ops never take effect. The table starts empty.

Rules 1-3 give precise explanations of the common failures; rule 4 catches the rest (stale
reads, values reappearing, reads from the future). The search is a depth-first search over
(linearized set, register value) with memoisation, bounded by ``max_states`` per key; a key
whose search hits the bound is reported *inconclusive*, never valid.

Thread-safety: pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark_kudu.tools.faults.history import Key, Op, Value

__all__ = [
    "FABRICATED",
    "FAILED_VISIBLE",
    "FINAL_CLIENT",
    "LOST_WRITE",
    "NON_LINEARIZABLE",
    "CheckResult",
    "Violation",
    "check",
    "final_read",
]

LOST_WRITE = "lost-acknowledged-write"
FAILED_VISIBLE = "failed-write-visible"
FABRICATED = "fabricated-value"
NON_LINEARIZABLE = "non-linearizable"
FINAL_CLIENT = "final"
_DEFAULT_MAX_STATES = 200_000


@dataclass(frozen=True)
class Violation:
    """One problem: its kind, the key, the ops involved and what went wrong."""

    kind: str
    key: Key
    ops: tuple[int, ...]
    explanation: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "key": self.key, "ops": list(self.ops),
                "explanation": self.explanation}


@dataclass(frozen=True)
class CheckResult:
    """The verdict. ``valid`` needs no violation and no inconclusive key."""

    violations: tuple[Violation, ...]
    inconclusive: tuple[Key, ...]
    keys: int
    ops: int
    states: int = 0
    per_key_ops: Mapping[Key, int] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return not self.violations and not self.inconclusive

    def to_dict(self) -> dict[str, Any]:
        return {"valid": self.valid, "violations": [v.to_dict() for v in self.violations],
                "inconclusive_keys": list(self.inconclusive), "keys": self.keys,
                "ops": self.ops, "search_states": self.states}


def final_read(contents: Mapping[Key, Value], ops: Sequence[Op],
               keys: Iterable[Key] = ()) -> Op:
    """The final table contents as one read op after every finished op. Keys the
    history wrote (or ``keys`` names) and the table lacks are read as absent."""
    finite = [t for o in ops for t in (o.invoke, o.complete) if not math.isinf(t)]
    t = max(finite, default=0.0) + 1.0
    all_keys = list(dict.fromkeys([*keys, *(k for o in ops for k in o.keys), *contents]))
    return Op(id=-1, client=FINAL_CLIENT, kind="read", keys=tuple(all_keys), values=(),
              invoke=t, complete=t, outcome="ok",
              results={k: contents.get(k) for k in all_keys})


@dataclass(frozen=True)
class _KOp:
    """One op restricted to one key: what the register model sees."""

    op: Op
    kind: str
    value: Value  # the written value, or the value a read saw
    inv: float
    ret: float  # inf when the op never completed or its outcome is unknown
    required: bool  # acknowledged: must be linearized; else (info) optional


def _key_ops(ops: Sequence[Op]) -> dict[Key, list[_KOp]]:
    by_key: dict[Key, list[_KOp]] = {}
    for op in ops:
        if op.kind == "read":
            if op.outcome != "ok":
                continue  # a read that failed or whose answer is unknown constrains nothing
            for k in dict.fromkeys([*op.keys, *op.results]):
                by_key.setdefault(k, []).append(
                    _KOp(op, "read", op.results.get(k), op.invoke, op.complete, True))
            continue
        for k, v in zip(op.keys, op.values, strict=True):
            outcome = op.outcome_for(k)
            if outcome == "fail":
                by_key.setdefault(k, [])
                continue
            value = None if op.kind == "delete" else v
            ok = outcome == "ok"
            by_key.setdefault(k, []).append(_KOp(
                op, op.kind, value, op.invoke, op.complete if ok else math.inf, ok))
    for kops in by_key.values():
        kops.sort(key=lambda x: (x.inv, x.op.id))
    return by_key


def check(ops: Sequence[Op], final: Mapping[Key, Value] | None = None, *,
          keys: Iterable[Key] = (), max_states: int = _DEFAULT_MAX_STATES) -> CheckResult:
    """Check ``ops`` (and, if given, the ``final`` table contents: key -> value) against
    the rules of the module docstring. ``keys`` names keys to read as absent at the end
    even if no op touched them."""
    all_ops = list(ops)
    if final is not None:
        all_ops.append(final_read(final, ops, keys))
    by_key = _key_ops(all_ops)
    writers = _writers(all_ops)
    violations: list[Violation] = []
    inconclusive: list[Key] = []
    states = 0
    for key in sorted(by_key, key=lambda k: (str(type(k)), k)):
        found = _check_reads(key, by_key[key], writers)
        if final is not None:
            found += _check_lost(key, by_key[key], final.get(key))
        if found:
            violations.extend(found)
            continue  # the simple rules explain it better than the search would
        verdict, n, why = _linearize(key, by_key[key], max_states)
        states += n
        if verdict is None:
            inconclusive.append(key)
        elif not verdict:
            assert why is not None
            violations.append(why)
    return CheckResult(tuple(violations), tuple(inconclusive), len(by_key), len(ops), states,
                       {k: len(v) for k, v in by_key.items()})


# == rules 1-3 ====================================================================================


def _writers(ops: Sequence[Op]) -> dict[tuple[Key, Value], list[tuple[Op, str]]]:
    """(key, value) -> the ops that wrote it with their outcome for that key."""
    out: dict[tuple[Key, Value], list[tuple[Op, str]]] = {}
    for op in ops:
        if op.kind in ("insert", "upsert"):
            for k, v in zip(op.keys, op.values, strict=True):
                out.setdefault((k, v), []).append((op, op.outcome_for(k)))
    return out


def _check_reads(key: Key, kops: Sequence[_KOp],
                 writers: Mapping[tuple[Key, Value], list[tuple[Op, str]]]) -> list[Violation]:
    out = []
    for r in kops:
        if r.kind != "read" or r.value is None:
            continue
        ws = writers.get((key, r.value), [])
        where = "the final table" if r.op.client == FINAL_CLIENT else f"read {r.op.describe()}"
        if not ws:
            elsewhere = sorted({o.id for (k, v), lst in writers.items() if v == r.value
                                and k != key for o, _ in lst})
            note = (f"; that value was written to another key by ops {elsewhere}"
                    if elsewhere else "")
            out.append(Violation(FABRICATED, key, (r.op.id, *elsewhere),
                                 f"{where} returned {r.value!r} for key {key!r}, a value no "
                                 f"operation wrote to that key{note}"))
        elif all(outcome == "fail" for _, outcome in ws):
            failed = ws[0][0]
            out.append(Violation(FAILED_VISIBLE, key, (r.op.id, failed.id),
                                 f"{where} returned {r.value!r} for key {key!r}, written only "
                                 f"by {failed.describe()}, which definitely failed "
                                 f"({failed.row_errors.get(key) or failed.error or 'fail'})"))
    return out


def _check_lost(key: Key, kops: Sequence[_KOp], final: Value) -> list[Violation]:
    writes = [w for w in kops if w.kind != "read"]
    if final is None:
        candidates = [w for w in writes if w.kind == "delete"]
        what = "absent"
    else:
        candidates = [w for w in writes if w.kind != "delete" and w.value == final]
        what = repr(final)
        if not candidates:
            return []  # fabricated or failed-visible: reported by _check_reads
    # An acknowledged write invoked after every possible writer of the final value had
    # completed must have come later in any order, so its value (or a later one) would be
    # final: it was lost.
    lost = [w for w in writes if w.required and w not in candidates
            and not (final is None and w.kind == "delete")
            and all(c.ret < w.inv for c in candidates)]
    if not lost:
        return []
    last = max(lost, key=lambda w: w.inv)
    by = ("no delete could explain it" if final is None and not candidates else
          "its possible writers " + "; ".join(c.op.describe() for c in candidates[:3])
          + " all completed before that write was invoked")
    return [Violation(LOST_WRITE, key, (last.op.id, *(c.op.id for c in candidates[:3])),
                      f"acknowledged {last.op.describe()} is lost: key {key!r} is {what} in "
                      f"the final table and {by}"
                      + (f" ({len(lost)} acknowledged writes lost on this key)"
                         if len(lost) > 1 else ""))]


# == rule 4: linearizability =====================================================================


def _step(k: _KOp, state: Value) -> tuple[bool, Value]:
    """The register model: (allowed, next state)."""
    if k.kind == "read":
        return k.value == state, state
    if k.kind == "upsert":
        return True, k.value
    if k.kind == "insert":
        return state is None, k.value
    return state is not None, None  # delete


def _why_not(k: _KOp, state: Value) -> str:
    if k.kind == "read":
        return f"it saw {k.value!r} but the key holds {state!r} at that point"
    if k.kind == "insert":
        return f"an acknowledged insert needs the key absent, but it holds {state!r}"
    return "an acknowledged delete needs the key present, but it is absent"


def _linearize(key: Key, kops: Sequence[_KOp], max_states: int
               ) -> tuple[bool | None, int, Violation | None]:
    """Depth-first search for a linearization (see the module docstring). Returns
    (verdict or None when the bound was hit, states visited, violation if not)."""
    n = len(kops)
    inv = [k.inv for k in kops]
    ret = [k.ret for k in kops]
    need = 0
    for i, k in enumerate(kops):
        if k.required:
            need |= 1 << i
    if not need:
        return True, 0, None
    seen: set[tuple[int, Value]] = set()
    stack: list[tuple[int, Value, int]] = [(0, None, -1)]
    best: tuple[int, int, Value, int] = (-1, 0, None, -1)  # (required done, mask, state, last)
    while stack:
        mask, state, last = stack.pop()
        if mask & need == need:
            return True, len(seen), None
        if (mask, state) in seen:
            continue
        seen.add((mask, state))
        if len(seen) > max_states:
            return None, len(seen), None
        done_req = bin(mask & need).count("1")
        if done_req > best[0]:
            best = (done_req, mask, state, last)
        # The next op must be invoked before the earliest completion among pending ops.
        horizon = min((ret[j] for j in range(n) if not mask >> j & 1), default=math.inf)
        nxt = []
        for i in range(n):
            if inv[i] > horizon:
                break  # sorted by invocation
            if mask >> i & 1:
                continue
            allowed, new_state = _step(kops[i], state)
            if allowed:
                nxt.append((mask | 1 << i, new_state, i))
        stack.extend(reversed(nxt))
    return False, len(seen), _explain(key, kops, best)


def _explain(key: Key, kops: Sequence[_KOp], best: tuple[int, int, Value, int]) -> Violation:
    done_req, mask, state, last = best
    n = len(kops)
    pending = [i for i in range(n) if not mask >> i & 1]
    required = [i for i in pending if kops[i].required]
    # The acknowledged op that must come next (it completes first) but cannot.
    horizon = min(kops[i].ret for i in pending)
    stuck = [i for i in required if kops[i].inv <= horizon and not _step(kops[i], state)[0]]
    blocker = min(stuck or required, key=lambda i: kops[i].ret)
    b = kops[blocker]
    after = (f"after {kops[last].op.describe()}" if last >= 0 else "at the start")
    total = sum(1 for k in kops if k.required)
    ops = [b.op.id]
    if last >= 0:
        ops.append(kops[last].op.id)
    src = [k for k in kops if k.kind != "read" and b.kind == "read" and k.value == b.value]
    ops += [k.op.id for k in src if k.op.id not in ops]
    reason = (_why_not(b, state) if stuck else
              "every order that places it leads to a contradiction later")
    text = (f"key {key!r}: no order of its {n} operations that respects real time explains "
            f"the results. At best {done_req} of {total} acknowledged operations fit; "
            f"{after} the key holds {state!r}, and {b.op.describe()} cannot take effect "
            f"next: {reason}")
    if b.kind == "read" and b.value is not None and src:
        if all(s.inv > b.ret for s in src):
            text += " (its value was written only after the read had returned)"
        else:
            newer = [w for w in kops if w.kind != "read" and w.required and w not in src
                     and all(s.ret < w.inv for s in src) and w.ret < b.inv]
            if newer:
                text += (f" (a stale read: {newer[-1].op.describe()} had replaced that "
                         f"value before the read began)")
                ops.append(newer[-1].op.id)
    return Violation(NON_LINEARIZABLE, key, tuple(ops), text)
