"""WalStorage answers exactly like MemoryStorage (the reference) under random histories.

Each example runs one random sequence of appends (overwrites, gaps and compacted prefixes
included), compactions, snapshots created and installed, hard-state and configuration
changes, log GC, clean reopens and crash reopens against both implementations, and after
every step compares every ``Storage`` answer, errors included.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspark_kudu.consensus.messages import (
    ConfState,
    Entry,
    HardState,
    Snapshot,
    SnapshotMetadata,
)
from pyspark_kudu.consensus.raft_storage import MemoryStorage
from pyspark_kudu.wal import SyncPolicy, WalOptions, WalStorage
from pyspark_kudu.wal.format import HEADER_SIZE

# Two or three small entries per segment, and a cache smaller than one entry for half the
# examples: rolls, GC and disk reads happen all the time.
_SEGMENT = HEADER_SIZE + 120

_PICK = 12
_voters = st.sets(st.sampled_from(["a", "b", "c", "d"]), max_size=3)
_append = st.tuples(st.just("append"), st.integers(-5, 2), st.integers(1, 6),
                    st.integers(0, 4), st.binary(max_size=40))
_compact = st.tuples(st.just("compact"), st.integers(0, _PICK))
_create = st.tuples(st.just("create_snapshot"), st.integers(0, _PICK), _voters,
                    st.binary(max_size=8))
_STRATEGIES: dict[str, st.SearchStrategy[tuple[Any, ...]]] = {
    "append": _append,
    "compact": _compact,
    "create_snapshot": _create,
    "apply_snapshot": st.tuples(st.just("apply_snapshot"), st.integers(-2, 8),
                                st.integers(0, 5), _voters, st.binary(max_size=8)),
    "set_hard_state": st.tuples(st.just("set_hard_state"), st.integers(0, 3),
                                st.sampled_from(["", "a", "b"]), st.integers(0, 30)),
    "set_conf_state": st.tuples(st.just("set_conf_state"), _voters),
    "gc": st.tuples(st.just("gc")),
    "reopen": st.tuples(st.just("reopen")),
    "crash": st.tuples(st.just("crash")),
}
# Repetition weights the draw: mostly appends, and installed snapshots rarely wipe the log.
_KINDS = ["append"] * 8 + ["compact", "create_snapshot"] * 2 + list(_STRATEGIES)
_ops = st.sampled_from(_KINDS).flatmap(lambda kind: _STRATEGIES[kind])


def _position(lo: int, hi: int, pick: int) -> int:
    """Spread ``pick`` in ``[0, _PICK]`` over ``lo - 1 .. hi + 1``: mostly valid, edges too."""
    return lo - 1 + pick * (hi - lo + 2) // _PICK


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return ("ok", call())
    except Exception as e:  # the error type is part of the answer being compared
        return ("error", type(e).__name__)


def _answers(s: MemoryStorage | WalStorage) -> list[Any]:
    first, last = s.first_index(), s.last_index()
    out: list[Any] = [first, last, s.initial_state(), s.snapshot()]
    out += [_outcome(partial(s.term, i)) for i in range(first - 2, last + 3)]
    for lo in range(first - 1, last + 2):
        for hi in (lo, last + 1, last + 2):
            out.append(_outcome(partial(s.entries, lo, hi)))
    for max_size in (0, 40, 90):
        out.append(_outcome(partial(s.entries, first, last + 1, max_size)))
    return out


class _Pair:
    """The reference and the durable storage, driven identically."""

    def __init__(self, root: Path, options: WalOptions) -> None:
        self.root, self.options, self.generation = root, options, 0
        conf = ConfState.of(["a", "b", "c"])
        self.mem = MemoryStorage(conf)
        self.wal = WalStorage.open(str(self._dir()), options, conf_state=conf)

    def _dir(self) -> Path:
        return self.root / f"tablet-{self.generation}"

    def both(self, write: Callable[[MemoryStorage | WalStorage], Any]) -> None:
        want = _outcome(lambda: write(self.mem))
        got = _outcome(lambda: write(self.wal))
        assert got == want

    def step(self, op: tuple[Any, ...]) -> None:
        mem = self.mem
        kind = op[0]
        if kind == "append":
            _, delta, n, term, data = op
            lo = max(0, mem.last_index() + 1 + delta)
            ents = [Entry(term, i, data=data[: i % 41]) for i in range(lo, lo + n)]
            self.both(lambda s: s.append(ents))
        elif kind == "compact":
            index = _position(mem.first_index() - 1, mem.last_index(), op[1])
            self.both(lambda s: s.compact(index))
        elif kind == "create_snapshot":
            _, delta, voters, data = op
            index = _position(mem.snapshot().metadata.index, mem.last_index(), delta)
            self.both(lambda s: s.create_snapshot(index, ConfState.of(voters), data))
        elif kind == "apply_snapshot":
            _, delta, term, voters, data = op
            index = max(0, mem.snapshot().metadata.index + delta)
            snap = Snapshot(SnapshotMetadata(index, term, ConfState.of(voters)), data)
            self.both(lambda s: s.apply_snapshot(snap))
        elif kind == "set_hard_state":
            hs = HardState(op[1], op[2], op[3])
            self.both(lambda s: s.set_hard_state(hs))
        elif kind == "set_conf_state":
            cs = ConfState.of(op[1])
            self.both(lambda s: s.set_conf_state(cs))
        elif kind == "gc":
            self.wal.gc()
        elif kind == "reopen":
            self.wal.close()
            self.wal = WalStorage.open(str(self._dir()), self.options)
        else:
            self._crash_and_recover()

    def _crash_and_recover(self) -> None:
        # A copy taken while the storage is open is exactly what a crash leaves on disk.
        crashed = self._dir()
        self.generation += 1
        shutil.copytree(crashed, self._dir())
        self.wal.close()
        self.wal = WalStorage.open(str(self._dir()), self.options)
        # Term and vote are durable at once; the commit index is persisted lazily, so the
        # recovered one is whatever the last meta write carried.
        before, after = self.mem.hard_state, self.wal.hard_state
        assert (after.term, after.vote) == (before.term, before.vote)
        self.mem.set_hard_state(after)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(_ops, min_size=15, max_size=50), tiny_cache=st.booleans())
def test_wal_storage_answers_like_memory_storage(tmp_path: Path, ops: list[tuple[Any, ...]],
                                                 tiny_cache: bool) -> None:
    options = WalOptions(segment_size=_SEGMENT, sync_policy=SyncPolicy.NONE,
                         cache_bytes=10 if tiny_cache else 1 << 20)
    with tempfile.TemporaryDirectory(dir=tmp_path) as root:
        pair = _Pair(Path(root), options)
        try:
            for op in ops:
                pair.step(op)
                assert _answers(pair.wal) == _answers(pair.mem), op
        finally:
            pair.wal.close()
