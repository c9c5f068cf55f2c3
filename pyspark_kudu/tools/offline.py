"""Reading a master catalog from its directory, without starting a master (``--master-dir``).

Like Kudu's ``kudu local_replica`` tools, this is for a catalog that **no process has open**:
the embedded master of a driver that has stopped, or a stopped standalone master. Rules:

1. Layouts accepted: an embedded master's warehouse (``DIR/masters/<id>/``, the directory
   given as ``spark.kudu.warehouse``), a standalone master's ``--data-dir``
   (``DIR/catalog/`` plus ``DIR/instance``), or one replica's storage directory
   (``DIR/meta``). Anything else is refused; nothing is ever created.
2. No Raft runs: no election, no new term, no entry is appended. The catalog is the
   replica's Raft snapshot plus its log replayed through the master's own pure
   :func:`~pyspark_kudu.master.catalog.apply_entry` / ``apply_conf_change``, exactly as a
   restarting replica applies it.
3. Only committed entries are applied. A group whose sole voter is this replica committed
   every entry it made durable (the embedded default); otherwise the bound is the commit
   index the replica last wrote to ``meta``, which after a crash may lag the true one, so
   the newest operations can be missing. With several replicas the most advanced one wins.
4. "Read-only-ish": opening the storage runs WAL recovery, which cuts a torn tail left by a
   crash (what the next master start would do anyway). Never point this at a directory a
   running driver or master is using -- recovery could cut a frame being written.

Thread-safety: :func:`read_catalog_dir` is a function with no shared state.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from pyspark_kudu.consensus.messages import EntryType, decode_conf_change
from pyspark_kudu.errors import InvalidArgumentError
from pyspark_kudu.master.catalog import Catalog, apply_conf_change, apply_entry
from pyspark_kudu.master.catalog_replica import open_storage
from pyspark_kudu.master.embedded import MASTERS_DIR

__all__ = ["OfflineCatalog", "ReplicaState", "read_catalog_dir"]

_META = "meta"


@dataclass(frozen=True)
class ReplicaState:
    """One master replica's directory as found on disk."""

    id: str
    directory: str
    term: int
    commit: int
    last_index: int
    catalog_index: int


@dataclass(frozen=True)
class OfflineCatalog:
    """The catalog of the most advanced replica, and what was found for every replica."""

    directory: str
    catalog: Catalog
    replicas: tuple[ReplicaState, ...]
    chosen: str


def _replica_dirs(directory: str) -> list[tuple[str, str]]:
    masters = os.path.join(directory, MASTERS_DIR)
    if os.path.isdir(masters):
        found = [(m, os.path.join(masters, m)) for m in sorted(os.listdir(masters))
                 if os.path.isfile(os.path.join(masters, m, _META))]
        if found:
            return found
    catalog = os.path.join(directory, "catalog")
    if os.path.isfile(os.path.join(catalog, _META)):
        node_id = os.path.basename(os.path.normpath(directory))
        try:
            with open(os.path.join(directory, "instance"), encoding="utf-8") as f:
                node_id = str(json.load(f).get("master_id") or node_id)
        except (OSError, ValueError):
            pass
        return [(node_id, catalog)]
    if os.path.isfile(os.path.join(directory, _META)):
        return [(os.path.basename(os.path.normpath(directory)), directory)]
    raise InvalidArgumentError(
        f"no master catalog under {directory}: expected {directory}/{MASTERS_DIR}/<id>/meta "
        f"(an embedded master's warehouse, spark.kudu.warehouse), {directory}/catalog/meta "
        f"(a standalone master's --data-dir) or {directory}/meta; pass one of those to "
        f"--master-dir, or use --master for running masters")


def _read_replica(node_id: str, directory: str) -> tuple[ReplicaState, Catalog]:
    storage = open_storage(directory)
    try:
        snap = storage.snapshot()
        hard, conf = storage.initial_state()
        last = storage.last_index()
        # Rule 3: a sole voter committed whatever it made durable.
        commit = last if conf.voters == frozenset({node_id}) else min(hard.commit, last)
        catalog = Catalog.from_snapshot(snap.data)
        lo = max(snap.metadata.index, catalog.index) + 1
        for e in storage.entries(lo, commit + 1) if commit >= lo else []:
            if e.type is EntryType.CONF_CHANGE:
                catalog = apply_conf_change(catalog, decode_conf_change(e.data), e.index)
            else:
                catalog, _ = apply_entry(catalog, e.data, e.index)
        return ReplicaState(node_id, directory, hard.term, commit, last, catalog.index), catalog
    finally:
        close = getattr(storage, "close", None)  # WalStorage closes; the protocol has none
        if callable(close):
            close()


def read_catalog_dir(directory: str) -> OfflineCatalog:
    """The catalog stored under ``directory`` (see the module rules).

    Raises:
        InvalidArgumentError: ``directory`` holds no master catalog.
        CorruptionError: a replica's ``meta`` or WAL fails its checks.
    """
    directory = os.path.abspath(directory)
    if not os.path.isdir(directory):
        raise InvalidArgumentError(
            f"--master-dir {directory} is not a directory; pass the warehouse directory of an "
            f"embedded master or the --data-dir of a standalone master")
    states: list[ReplicaState] = []
    best: tuple[int, str, Catalog] | None = None
    for node_id, d in _replica_dirs(directory):
        state, catalog = _read_replica(node_id, d)
        states.append(state)
        if best is None or catalog.index > best[0]:
            best = (catalog.index, node_id, catalog)
    assert best is not None  # _replica_dirs returns at least one directory or raises
    return OfflineCatalog(directory, best[2], tuple(states), best[1])
