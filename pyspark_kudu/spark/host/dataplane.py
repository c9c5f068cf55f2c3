"""The data plane of a write: batches encoded on executors, moved by Spark shuffles only.

DESIGN §3 step 1-2: a write's rows are routed to tablets and encoded **once, on the executors
that hold them**, and every replica's host receives each batch through a Spark shuffle. Rows
never pass through the driver, except a small write's (below a size threshold, inline
batches). The pieces:

1. **Staging** (:func:`stage_batches`, run by ``mapInArrow`` where the DataFrame's partitions
   are): rows are routed to tablets and each tablet's rows are encoded as write batches of at
   most ``max_rows`` rows, written to ``<data root>/staging/<write id>/`` on that host. The
   task returns one small :class:`StagedRef` per batch (host, path, size, CRC32C, rows,
   operation). A task whose batches total at most ``small_write_bytes`` returns them
   inline instead (:class:`InlineBatch`, the small-write path): they travel inside their
   Raft entries and need neither step 3's shuffle nor step 4's cleanup.
2. **Proposal**: the driver proposes each ref as the *data of a Raft entry*. The leader's log
   in the driver therefore holds refs of a few hundred bytes, not rows.
3. **Delivery** (``SparkTransport._run_with_data`` in
   :mod:`~pyspark_kudu.spark.replication.spark_rounds`): a round whose requests carry ref
   entries is one job of two stages. The map stage runs a
   task pinned to each staging host that reads the staged files and emits
   ``(destination host, bytes)`` for every replica host that needs them; Spark shuffles
   them. The barrier stage zips the pinned per-host requests with the shuffle's partitions
   (one partition per destination host: the pinned side's location decides where the task
   runs), and each task substitutes the delivered bytes for the refs (:func:`resolve_refs`,
   CRC checked) before the replica sees them. So the WAL of every replica holds the real
   batch; a ref is never written to a log (the replica refuses one, :func:`contains_ref`).
4. **Cleanup** (:func:`remove_staging`, :class:`StagingJanitor`): once the write returned,
   each host's resident tablet server removes its staging directories (a Flight action, not
   a Spark task: the next write's round does not wait behind it). A follower that missed
   the batch is later caught up from the leader replica's log, not from staging: the
   leader replica answers ``READ_ENTRIES`` with refs to its log entries (:func:`wal_ref`)
   and the same shuffle moves them from its host to the follower's.

A staged file lost with its host (its executor gone for good) makes the round fail before
anything of its batch is visible. ``KuduContext.write`` then stages the rows of the input
partitions that staged there again, from the DataFrame's lineage, elsewhere (staged files
are named after their input partition, :attr:`StagedRef.part`); other writers (the ``kudu``
data source's commit has no lineage) fail with a clear error, and the caller may retry.

Thread-safety: module functions are pure or touch only their task's files.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import google_crc32c
import pyarrow as pa
from pyspark import SparkContext, TaskContext

from pyspark_kudu.consensus.messages import Entry, Message
from pyspark_kudu.errors import CorruptionError, InvalidArgumentError
from pyspark_kudu.fileio import make_private_dirs, open_private
from pyspark_kudu.partitioning import Partitioner
from pyspark_kudu.schema import Schema
from pyspark_kudu.spark.host.identity import current_host, local_data_root
from pyspark_kudu.tablet import OpType, encode_write_batch

__all__ = [
    "INLINE_MAGIC",
    "REF_MAGIC",
    "SMALL_WRITE_BYTES",
    "STAGING_DIR",
    "InlineBatch",
    "InlineOverflowError",
    "Staged",
    "StagedBatches",
    "StagedRef",
    "StagingJanitor",
    "contains_ref",
    "decode_staged",
    "read_staged",
    "refs_in",
    "refs_of",
    "remove_staging",
    "resolve_refs",
    "stage_batches",
    "staging_schema",
    "wal_ref",
]

_log = logging.getLogger(__name__)

REF_MAGIC = b"\x00KREF1"
STAGING_DIR = "staging"


@dataclass(frozen=True)
class StagedRef:
    """Where one encoded write batch waits to be replicated (the data of a ref entry)."""

    host: str
    root: str
    path: str  # relative to root: staging/<write id>/<name>
    size: int
    crc: int
    rows: int
    tablet: int  # partition index of the tablet
    op: int = 0  # the OpType of every row (0: not a staged write, e.g. a log entry)

    def encode(self) -> bytes:
        return REF_MAGIC + json.dumps(
            [self.host, self.root, self.path, self.size, self.crc, self.rows, self.tablet,
             self.op]).encode()

    @staticmethod
    def decode(data: bytes) -> StagedRef | None:
        """The ref in an entry's data, or None if the data is not a ref."""
        if not data.startswith(REF_MAGIC):
            return None
        host, root, path, size, crc, rows, tablet, op = json.loads(data[len(REF_MAGIC):])
        return StagedRef(str(host), str(root), str(path), int(size), int(crc), int(rows),
                         int(tablet), int(op))

    def entry_data(self) -> bytes:
        """What the batch's Raft entry carries until the round delivers it: the ref."""
        return self.encode()

    @property
    def part(self) -> int | None:
        """The input partition (Spark's partition id of the staging task) whose rows the
        batch holds, when staging named its file after it (``p<id>-...``); else None."""
        name = os.path.basename(self.path)
        head, sep, _ = name.partition("-")
        if not sep or not head.startswith("p") or not head[1:].isdigit():
            return None
        return int(head[1:])


INLINE_MAGIC = b"\x00KINL1"
SMALL_WRITE_BYTES = 1 << 20
"""Default of ``small_write_bytes``: a staging task whose encoded batches total at most
this many bytes returns them inline (see :class:`InlineBatch`); measured in
``benchmarks/replication.py``."""


@dataclass(frozen=True)
class InlineBatch:
    """An encoded write batch small enough to travel inside its Raft entry (the small-write
    path, docs/design.md §3.1): staging returns it to the driver instead of writing a file,
    and the round carries it to every replica in the entry's data, with no shuffle stage.
    The replicas' logs receive exactly what a staged batch would have delivered."""

    data: bytes  # the encoded write batch: the entry's data
    rows: int
    tablet: int
    op: int

    def encode(self) -> bytes:
        head = json.dumps([self.rows, self.tablet, self.op]).encode()
        return INLINE_MAGIC + len(head).to_bytes(4, "big") + head + self.data

    @staticmethod
    def decode(data: bytes) -> InlineBatch | None:
        if not data.startswith(INLINE_MAGIC):
            return None
        start = len(INLINE_MAGIC) + 4
        end = start + int.from_bytes(data[len(INLINE_MAGIC):start], "big")
        rows, tablet, op = json.loads(data[start:end])
        return InlineBatch(bytes(data[end:]), int(rows), int(tablet), int(op))

    def entry_data(self) -> bytes:
        """What the batch's Raft entry carries: the batch itself."""
        return self.data


Staged = StagedRef | InlineBatch
"""What a staging task returns per write batch: a ref to a staged file, or the batch."""


def decode_staged(data: bytes) -> Staged | None:
    """The staged ref or inline batch in ``data`` (a staging task's output), or None."""
    return StagedRef.decode(data) or InlineBatch.decode(data)


def staging_schema() -> str:
    """The row type ``stage_batches`` yields (a Spark DDL string)."""
    return "ref binary, bad_row string"


class InlineOverflowError(Exception):
    """Raised by :func:`stage_batches` with ``files=False`` when the batches outgrow
    ``small_write_bytes``: the caller stages the write with a Spark job instead."""


def stage_batches(schema: Schema, partitioner: Partitioner, op: OpType, write_id: str,
                  root: str | None, max_rows: int, small_write_bytes: int = 0, *,
                  files: bool = True
                  ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of the staging job (see module docstring, step 1).

    Each output row is either an encoded :class:`StagedRef` or :class:`InlineBatch`
    (``ref``) or, for a row no range partition covers, that row as JSON (``bad_row``): Kudu
    reports those per row. A task whose encoded batches total at most ``small_write_bytes``
    returns them all inline and writes no file; once its batches pass that size, it stages
    every batch (held ones too) as a file, so a large write's rows never go through the
    driver. ``small_write_bytes=0`` always stages.

    Encoding validates the rows (types, nulls, key columns) and raises
    :class:`InvalidArgumentError` naming the problem, which fails the job before anything
    is proposed.

    ``files=False`` (the driver encoding a local DataFrame's rows, outside any task): never
    writes a file; :class:`InlineOverflowError` once the batches pass ``small_write_bytes``.
    """
    out_schema = pa.schema([pa.field("ref", pa.binary()), pa.field("bad_row", pa.string())])

    def one(ref: bytes) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(
            [pa.array([ref], pa.binary()), pa.array([None], pa.string())], schema=out_schema)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        data_root = local_data_root(root) if files else ""
        host = current_host()
        task = TaskContext.get()
        # Files are named after the input partition, so a write can stage that partition
        # again from the DataFrame's lineage if this host is lost before the batches commit.
        prefix = f"p{task.partitionId()}-" if task is not None else ""
        pending: dict[int, list[pa.Table]] = {}
        counts: dict[int, int] = {}
        held: list[InlineBatch] = []  # while this task's output may still go inline
        held_bytes = 0
        inline = small_write_bytes > 0

        def to_file(b: InlineBatch) -> pa.RecordBatch:
            rel = os.path.join(STAGING_DIR, write_id, f"{prefix}{uuid.uuid4().hex}.bin")
            full = os.path.join(data_root, rel)
            make_private_dirs(os.path.dirname(full))
            with open_private(full, "wb") as f:
                f.write(b.data)
            return one(StagedRef(host, data_root, rel, len(b.data),
                                 google_crc32c.value(b.data), b.rows, b.tablet, b.op).encode())

        def flush(pidx: int, rows: pa.Table) -> Iterator[pa.RecordBatch]:
            nonlocal held_bytes, inline
            b = InlineBatch(encode_write_batch(schema, op, rows, key_order=True), rows.num_rows,
                            pidx, int(op))
            if inline and held_bytes + len(b.data) <= small_write_bytes:
                held.append(b)
                held_bytes += len(b.data)
                return
            if not files:
                raise InlineOverflowError(
                    f"{held_bytes + len(b.data)} bytes of batches, more than {small_write_bytes}")
            if inline:  # too large for the small-write path after all
                inline = False
                for h in held:
                    yield to_file(h)
                held.clear()
            yield to_file(b)

        for batch in batches:
            if batch.num_rows == 0:
                continue
            for pidx, part in partitioner.split_batch(batch).items():
                if pidx < 0:
                    rows = [json.dumps(r, default=str) for r in part.to_pylist()]
                    yield pa.RecordBatch.from_arrays(
                        [pa.array([None] * len(rows), pa.binary()), pa.array(rows)],
                        schema=out_schema)
                    continue
                pending.setdefault(pidx, []).append(part)
                counts[pidx] = counts.get(pidx, 0) + part.num_rows
                if counts[pidx] >= max_rows:
                    table = pa.concat_tables(pending.pop(pidx))
                    full_batches = table.num_rows // max_rows * max_rows
                    for off in range(0, full_batches, max_rows):
                        yield from flush(pidx, table.slice(off, max_rows))
                    rest = table.slice(full_batches)
                    counts[pidx] = rest.num_rows
                    pending[pidx] = [rest] if rest.num_rows else []
        for pidx in sorted(pending):
            if counts.get(pidx):
                yield from flush(pidx, pa.concat_tables(pending[pidx]))
        for h in held:
            yield one(h.encode())

    return run


_WAL_PREFIX = "wal/"
WAL_REF_MIN_BYTES = 4096


def wal_ref(host: str, root: str, tablet_id: str, entry: Entry) -> StagedRef:
    """A ref to a log entry of a replica on ``host``: catch-up moves a lagging follower's
    missing entries by the same shuffle as staged batches, not through the driver."""
    return StagedRef(host, root, f"{_WAL_PREFIX}{tablet_id}/{entry.index}", len(entry.data),
                     google_crc32c.value(entry.data), 0, -1)


def _read_wal_entry(ref: StagedRef) -> bytes | None:
    from pyspark_kudu.fileio import FileIO
    from pyspark_kudu.spark.host.replica_cache import open_replica

    tablet_id, index = ref.path[len(_WAL_PREFIX):].rsplit("/", 1)
    root = local_data_root(ref.root)
    if not os.path.isdir(os.path.join(root, "tablets", tablet_id)):
        return None
    try:
        with open_replica(root, FileIO(root).child("tablets", tablet_id), tablet_id, None,
                          mutate=False, mode="wal") as handle:
            (entry,) = handle.storage.entries(int(index), int(index) + 1)
    except Exception:  # compacted, damaged, or no such replica here: not deliverable
        _log.warning("log entry %s is not readable on %s", ref.path, current_host(),
                     exc_info=True)
        return None
    return entry.data


def read_staged(ref: StagedRef) -> bytes | None:
    """The staged batch (or log entry), or None if this host does not have it intact."""
    if ref.path.startswith(_WAL_PREFIX):
        data = _read_wal_entry(ref)
    else:
        try:
            with open(os.path.join(local_data_root(ref.root), ref.path), "rb") as f:
                data = f.read()
        except OSError:
            return None
    if data is None:
        return None
    if len(data) != ref.size or google_crc32c.value(data) != ref.crc:
        return None
    return data


def refs_in(messages: Iterable[Message], entries: Iterable[Entry]) -> list[StagedRef]:
    """The staged refs carried by these entries and messages' entries."""
    out = []
    for e in (*entries, *(e for m in messages for e in m.entries)):
        ref = StagedRef.decode(e.data)
        if ref is not None:
            out.append(ref)
    return out


class CarriesEntries(Protocol):
    """A request that may carry refs: a ``PeerRequest`` (its entries and messages')."""

    @property
    def messages(self) -> Sequence[Message]: ...

    @property
    def entries(self) -> Sequence[Entry]: ...


def refs_of(requests: Iterable[CarriesEntries]) -> Iterator[StagedRef]:
    """The staged refs that every one of ``requests`` carries, request by request."""
    for r in requests:
        yield from refs_in(r.messages, r.entries)


class StagedBatches(Mapping[str, bytes]):
    """The staged batches ``refs`` name, by staged path, each read when asked for (as a
    tablet server serving a round resolves them a slice at a time: see
    :mod:`~pyspark_kudu.spark.host.resolve_slices`) and never kept. One that cannot be had
    intact is missing, so the request naming it is refused as "not delivered". This one
    reads this host's staged files; subclasses get them elsewhere too (:meth:`_read`)."""

    def __init__(self, refs: Iterable[StagedRef]) -> None:
        self._refs = {ref.path: ref for ref in refs}

    def __getitem__(self, key: str) -> bytes:
        data = self._read(self._refs[key])
        if data is None:
            raise KeyError(key)
        return data

    def _read(self, ref: StagedRef) -> bytes | None:
        return read_staged(ref)

    def __iter__(self) -> Iterator[str]:
        return iter(self._refs)

    def __len__(self) -> int:
        return len(self._refs)


def contains_ref(entries: Iterable[Entry]) -> bool:
    return any(e.data.startswith(REF_MAGIC) for e in entries)


def resolve_refs(entries: Sequence[Entry], delivered: Mapping[str, bytes]) -> tuple[Entry, ...]:
    """``entries`` with every ref replaced by its delivered batch (CRC and size checked).

    Raises:
        CorruptionError: a batch was not delivered or does not match its ref; the caller
            reports it and writes nothing.
    """
    out = []
    for e in entries:
        ref = StagedRef.decode(e.data)
        if ref is None:
            out.append(e)
            continue
        data = delivered.get(ref.path)
        if data is None:
            raise CorruptionError(
                f"entry {e.index}: staged batch {ref.path} from {ref.host} was not delivered "
                f"(its executor may have been lost); retry the write")
        if len(data) != ref.size or google_crc32c.value(data) != ref.crc:
            raise CorruptionError(
                f"entry {e.index}: staged batch {ref.path} from {ref.host} arrived damaged "
                f"({len(data)} bytes, expected {ref.size} with CRC32C {ref.crc})")
        out.append(replace(e, data=data))
    return tuple(out)


def remove_staging(root: str | None, write_ids: Sequence[str]) -> int:
    """Remove the staging directories of ``write_ids`` under this host's data root."""
    base = os.path.join(local_data_root(root), STAGING_DIR)
    removed = 0
    for wid in write_ids:
        if not wid or os.sep in wid or wid in (".", ".."):
            raise InvalidArgumentError(f"bad write id {wid!r}")
        path = os.path.join(base, wid)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed


def _remove_task(payload: tuple[str | None, tuple[str, ...]]) -> int:
    root, ids = payload
    return remove_staging(root, ids)


class StagingJanitor:
    """Removes finished writes' staging directories in the background, on every
    tablet-server host (a staging task that Spark retried may have left files on any of
    them), so a write does not wait for its cleanup.

    Each host's resident tablet server removes them on a Flight action
    (:func:`~pyspark_kudu.spark.host.tserver_client.remove_staged`): no Spark task, so the
    cleanup never holds the one executor slot the next write's round waits for (a pinned
    cleanup job in front of the next round cost a small write ~0.55 s). A host whose server
    is unknown or does not answer gets a pinned Spark job, as before; a lost host keeps its
    files until a later cleanup reaches it.

    ``addresses``: ``{host: resident server address}`` now (None: every host gets the job);
    ``secret``: the cluster credential for those calls; ``conf_root``: the application's
    ``spark.kudu.dataRoot``, for servers that resolve the root as a request does.

    Thread-safety: ``remove`` may be called from any thread; ``close`` waits for the queue.
    """

    def __init__(self, sc: SparkContext, hosts: Sequence[str], root: str | None, *,
                 addresses: Callable[[], Mapping[str, str]] | None = None,
                 secret: bytes = b"", conf_root: str | None = None) -> None:
        self._sc = sc
        self._hosts = sorted(set(hosts))
        self._root = root
        self._addresses = addresses
        self._secret = secret
        self._conf_root = conf_root
        #: Cleanups done by a resident server / by a pinned Spark task, per host.
        self.by_server: dict[str, int] = {}
        self.by_job: dict[str, int] = {}
        self._queue: list[str] = []
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="kudu-staging-janitor",
                                        daemon=True)
        self._thread.start()

    def remove(self, write_id: str) -> None:
        with self._cv:
            self._queue.append(write_id)
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return
                ids, self._queue = tuple(self._queue), []
            try:
                self._clean(ids)
            except Exception as e:  # a lost host keeps its files until the next cleanup
                _log.warning("removing staged batches of %d writes failed: %s", len(ids), e)

    def _clean(self, ids: tuple[str, ...]) -> None:
        from pyspark_kudu.spark.host.tserver_client import remove_staged
        from pyspark_kudu.spark.pinned import pinned_rdd

        known = dict(self._addresses()) if self._addresses is not None and self._secret \
            else {}
        left = []
        done: set[str] = set()  # servers that answered (one call per server)
        for host in sorted(set(self._hosts) | set(known)):
            address = known.get(host)
            if address is not None and address in done:
                continue
            if address is not None:
                try:
                    remove_staged(address, self._secret, ids, self._root, self._conf_root)
                    done.add(address)
                    self.by_server[host] = self.by_server.get(host, 0) + 1
                    continue
                except Exception as e:  # not answering: the job below reaches the host
                    _log.info("tablet server %s did not remove staged batches: %s",
                              address, e)
            left.append(host)
        if left:
            pinned_rdd(self._sc, [((self._root, ids), [h]) for h in left]
                       ).map(_remove_task).collect()
            for h in left:
                self.by_job[h] = self.by_job.get(h, 0) + 1
