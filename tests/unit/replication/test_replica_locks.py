"""A replica's two locks (``spark/host/replica_cache``, "Two locks per replica"): rounds that
apply nothing hold only the log's, so they never wait for the background applier's apply or
a MemRowSet flush (which hold the tablet's); requests that apply hold both.

Measured before the split: the 1-row writes right after a 10M-row upsert waited 0.5-1.5 s
for replicas whose background applier was flushing that upsert's MemRowSet.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyspark_kudu.spark.host import handlers, replica_cache
from pyspark_kudu.spark.host.background_apply import BackgroundApplier
from pyspark_kudu.spark.host.handlers import replica_storage, tablet_dir
from pyspark_kudu.spark.host.replica_apply import read_applied, write_applied
from pyspark_kudu.spark.host.replica_cache import clear_cache, open_replica
from pyspark_kudu.spark.replication.peer_transport import DirectTransport
from tests.unit.replication.test_background_apply import (
    OPTS,
    TS,
    _batches,
    _drain,
    _group,
    _installed,
)
from tests.unit.replication.test_tablet_writes import _rows
from tests.waiting import wait_until


@pytest.fixture
def applier() -> Iterator[BackgroundApplier]:
    """This process's applier, run only when a test calls it."""
    with _installed(leader_inline_s=0.0, chunk_s=0.0, start=False) as bg:
        yield bg
    clear_cache()


@contextlib.contextmanager
def _tablets_held(transport: DirectTransport) -> Iterator[None]:
    """Every replica's tablet lock, held by this thread as a background flush holds it."""
    with contextlib.ExitStack() as stack:
        for ts in TS:
            root = transport.roots[ts]
            stack.enter_context(open_replica(root, tablet_dir(root, "t"), "t", OPTS,
                                             mutate=False, mode="tablet"))
        yield


def _in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # handed to the test
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_rounds_that_apply_nothing_go_on_while_every_tablet_is_busy(
    tmp_path: Path, applier: BackgroundApplier,
) -> None:
    transport, lead = _group(tmp_path)
    first = lead.propose(_batches(2))
    applied_before = {ts: read_applied(tablet_dir(transport.roots[ts], "t")) for ts in TS}
    with _tablets_held(transport):
        writer, got = _in_thread(lambda: lead.propose(_batches(3)[2:]))
        writer.join(60)
        assert not writer.is_alive(), "a replication round waited for the tablets' locks"
        assert got and not isinstance(got[0], BaseException), got
        (position,) = got[0]
        assert position[0] > first[-1][0]
        # Nothing was applied meanwhile: the writes wait in the log for the applier.
        assert {ts: read_applied(tablet_dir(transport.roots[ts], "t"))
                for ts in TS} == applied_before
        # A round collecting per-row results applies on the leader's replica: it waits.
        collector, results = _in_thread(lambda: lead.take_results([position[0]]))
        collector.join(0.5)
        assert collector.is_alive() and not results, (
            "a round applying on a replica whose tablet lock is held did not wait for it")
    collector.join(60)
    assert not collector.is_alive(), "the round collecting results never ended"
    assert results and not isinstance(results[0], BaseException), results
    assert position[0] in results[0]
    _drain(applier)
    for ts in TS:
        with replica_storage(transport.roots[ts], "t", OPTS) as st:
            assert read_applied(tablet_dir(transport.roots[ts], "t")) == (
                st.initial_state()[0].commit), ts


def test_a_configuration_entry_committing_in_a_log_only_request_is_applied_in_full(
    tmp_path: Path, applier: BackgroundApplier, monkeypatch: pytest.MonkeyPatch,
) -> None:
    transport, lead = _group(tmp_path)
    positions = lead.propose(_batches(3))
    calls: list[tuple[str, bool]] = []
    real = handlers._handle_locked

    def recording(root: str, req: handlers.PeerRequest, *args: Any) -> Any:
        calls.append((req.kind.name, args[-1]))  # (kind, log lock only)
        return real(root, req, *args)

    monkeypatch.setattr(handlers, "_handle_locked", recording)
    lead.remove_replica("ts-c")
    lead.heartbeat()
    # ts-b learned the commit of the configuration entry in a STEP holding only the log
    # lock; it ran again holding both, and applied everything up to that entry.
    assert ("STEP", True) in calls and ("STEP", False) in calls, calls
    with replica_storage(transport.roots["ts-b"], "t", OPTS) as st:
        assert st.initial_state()[1].voters == frozenset({"ts-a", "ts-b"})
    assert read_applied(tablet_dir(transport.roots["ts-b"], "t")) > positions[-1][0]


def test_the_background_applier_applies_through_a_configuration_entry_in_its_backlog(
    tmp_path: Path,
) -> None:
    # A configuration entry is applied by the request that commits it, so the applier meets
    # one only where a replica lost its record of what it applied (a crash between the
    # apply and the ``applied`` file): simulated by rewinding that file.
    transport, lead = _group(tmp_path)
    first = lead.propose(_batches(3))
    lead.remove_replica("ts-c")
    lead.propose(_batches(5)[3:])
    lead.heartbeat()
    root = transport.roots["ts-b"]
    io = tablet_dir(root, "t")
    with replica_storage(root, "t", OPTS) as st:
        commit = st.initial_state()[0].commit
    assert read_applied(io) == commit
    clear_cache()
    write_applied(io, first[0][0])
    try:
        with _installed(leader_inline_s=0.0, chunk_s=600.0, start=False) as bg:
            bg.schedule(root, "t", OPTS)
            _drain(bg)
            assert read_applied(io) == commit
            with open_replica(root, io, "t", OPTS, mutate=False) as h:
                got = h.open_tablet(root, "t", commit).scan_table().to_pylist()
            assert sorted(got, key=lambda r: r["id"]) == _rows(transport.roots["ts-a"])
            with replica_storage(root, "t", OPTS) as st:
                assert st.initial_state()[1].voters == frozenset({"ts-a", "ts-b"})
    finally:
        clear_cache()


def test_a_request_failing_with_a_replica_makes_the_one_waiting_for_it_reopen_it(
    tmp_path: Path,
) -> None:
    root = str(tmp_path / "ts-a")
    io = tablet_dir(root, "t1")
    key = (root, "t1")
    with replica_storage(root, "t1", OPTS) as st:
        st.append([])  # create the WAL
    waiter: threading.Thread | None = None
    seen: list[Any] = []
    with pytest.raises(OSError, match="disk gone"):
        with open_replica(root, io, "t1", OPTS, mutate=True) as failing:
            def wait_for_it() -> None:
                with open_replica(root, io, "t1", OPTS, mutate=False, mode="wal") as h:
                    seen.append(h)

            waiter = threading.Thread(target=wait_for_it, daemon=True)
            waiter.start()
            wait_until(lambda: replica_cache._holdings[key].users == 2, 30,
                       "the second request joining the replica's holding")
            raise OSError("disk gone")
    assert waiter is not None
    waiter.join(30)
    assert not waiter.is_alive(), "the waiting request never got the replica"
    assert seen and seen[0] is not failing, "the failed handle was served again"
    assert key not in replica_cache._holdings and key not in replica_cache._in_use
    clear_cache()


def test_threads_in_every_mode_exclude_what_they_must_and_lose_no_append(
    tmp_path: Path,
) -> None:
    """Six threads use two replicas in random modes; some requests fail (their holding is
    broken and reopened). Whoever holds a replica's log lock is alone on its log, whoever
    holds its tablet lock alone on its tablet; every append of a request that did not fail
    is in the log afterwards, in order; no holding, or handle in use, is left behind."""
    import random
    import time

    from pyspark_kudu.consensus.messages import Entry

    roots = [str(tmp_path / "ts-a"), str(tmp_path / "ts-b")]
    for root in roots:
        with replica_storage(root, "t1", OPTS) as st:
            st.append([])
    guard = threading.Lock()
    inside: dict[tuple[str, str], int] = {}  # (root, "wal" | "tablet") -> users now
    appended: dict[str, list[bytes]] = {root: [] for root in roots}
    violations: list[str] = []
    parts = {"wal": ("wal",), "tablet": ("tablet",), "full": ("wal", "tablet")}

    def enter(root: str, mode: str) -> None:
        with guard:
            for part in parts[mode]:
                inside[(root, part)] = inside.get((root, part), 0) + 1
                if inside[(root, part)] > 1:
                    violations.append(f"two users of the {part} of {root}")

    def leave(root: str, mode: str) -> None:
        with guard:
            for part in parts[mode]:
                inside[(root, part)] -= 1

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for k in range(60):
            root = rng.choice(roots)
            mode = rng.choice(("wal", "tablet", "full"))
            fail = rng.random() < 0.1
            try:
                with open_replica(root, tablet_dir(root, "t1"), "t1", OPTS,
                                  mutate=mode != "tablet", mode=mode) as h:  # type: ignore[arg-type]
                    enter(root, mode)
                    try:
                        if mode != "tablet":
                            data = f"{seed}-{k}".encode()
                            h.storage.append([Entry(1, h.storage.last_index() + 1,
                                                    data=data)])
                            if not fail:
                                with guard:
                                    appended[root].append(data)
                        time.sleep(rng.random() * 0.002)  # hold it a moment
                    finally:
                        leave(root, mode)
                    if fail:
                        raise RuntimeError("injected")
            except RuntimeError:
                pass

    threads = [threading.Thread(target=worker, args=(s,), daemon=True) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a thread never got its replica (deadlock)"
    assert not violations, violations[:5]
    assert not replica_cache._holdings and not replica_cache._in_use
    for root in roots:
        with replica_storage(root, "t1", OPTS) as st:
            logged = [e.data for e in st.entries(st.first_index(), st.last_index() + 1)]
        kept = [d for d in logged if d]
        # Appends of failed requests may be there too (written before the failure).
        assert [d for d in kept if d in set(appended[root])] == appended[root], root
    clear_cache()
