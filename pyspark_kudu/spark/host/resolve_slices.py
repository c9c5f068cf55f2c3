"""A request's staged batches, resolved a slice at a time on the replica's host.

A round carries a write's batches as refs (:mod:`~pyspark_kudu.spark.host.dataplane`), and
the driver's leader sends a follower every entry it lacks in one message: for a large write,
the whole write's share of the tablet. Resolving all of a request's refs before serving it
held every batch a host takes in a round at once -- measured during a 20M-row composite-key
insert on the 6-worker cluster, 150 delivered batches, 333 MiB of one tablet server's heap,
growing with the size of the write (two servers were OOM-killed at 2.6-2.8 GB during a
50M-row insert). So :mod:`~pyspark_kudu.spark.host.handlers` serves a PERSIST's entries, and
a STEP's append messages, in slices of at most :data:`RESOLVE_SLICE_BYTES` of batches (at
least one entry): each slice is resolved, appended (for a follower: stepped as an append
message of its own, preceded by the entry before it, as Raft allows), and released before the
next is resolved. A slice that cannot be resolved fails the request as before, leaving the
slices before it in the log: a prefix of the leader's entries, which Raft treats like a
message cut short (a follower's) or a leader that crashed while appending (the leader's own).

Thread-safety: pure functions; a :class:`Resolver` only reads its delivered batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace

from pyspark_kudu.consensus.messages import Entry, Message, MessageType
from pyspark_kudu.errors import KuduError
from pyspark_kudu.spark.host.dataplane import StagedRef, contains_ref, resolve_refs

__all__ = ["RESOLVE_SLICE_BYTES", "NotResolved", "Resolver", "append_slices", "entry_slices"]

#: Bytes of staged batches a request resolves (holds) at a time (module docstring).
RESOLVE_SLICE_BYTES = 16 << 20


class NotResolved(Exception):
    """A staged batch of the request was not delivered or arrived damaged (``cause``).
    Not a :class:`KuduError`, so that it passes a handler's replica-failure handling: the
    replica's files are fine, the request is refused."""

    def __init__(self, cause: KuduError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class Resolver:
    """Resolves a request's refs against the round's delivered batches (all of what it is
    given: callers hand it one slice at a time)."""

    def __init__(self, delivered: Mapping[str, bytes]) -> None:
        self._delivered = delivered

    def entries(self, entries: Sequence[Entry]) -> tuple[Entry, ...]:
        if not contains_ref(entries):
            return tuple(entries)
        try:
            return resolve_refs(entries, self._delivered)
        except KuduError as e:
            raise NotResolved(e) from None

    def message(self, m: Message) -> Message:
        return replace(m, entries=self.entries(m.entries)) if m.entries else m


def _batch_bytes(e: Entry) -> int:
    """Bytes ``e`` stands for once resolved (a ref: its batch's)."""
    ref = StagedRef.decode(e.data)
    return len(e.data) if ref is None else ref.size


def entry_slices(entries: Sequence[Entry], max_bytes: int | None = None
                 ) -> Iterator[Sequence[Entry]]:
    """``entries`` in consecutive slices of at most ``max_bytes`` resolved bytes
    (:data:`RESOLVE_SLICE_BYTES` by default), at least one entry each."""
    max_bytes = RESOLVE_SLICE_BYTES if max_bytes is None else max_bytes
    start, size = 0, 0
    for k, e in enumerate(entries):
        n = _batch_bytes(e)
        if k > start and size + n > max_bytes:
            yield entries[start:k]
            start, size = k, 0
        size += n
    if start < len(entries):
        yield entries[start:]


def append_slices(m: Message, max_bytes: int | None = None) -> Iterator[Message]:
    """An append message as consecutive append messages of at most ``max_bytes`` of
    resolved entries each, every one naming the entry before its first as Raft's
    consistency check (``index``/``log_term``); other messages, and appends without refs,
    unchanged."""
    if m.type != MessageType.APP or not contains_ref(m.entries):
        yield m
        return
    index, log_term = m.index, m.log_term
    for part in entry_slices(m.entries, max_bytes):
        yield replace(m, index=index, log_term=log_term, entries=tuple(part))
        index, log_term = part[-1].index, part[-1].term
