"""The executor side of a replication round (:mod:`~pyspark_kudu.spark.replication.spark_rounds`).

What the tasks of a round run on a tablet server's host: serve each tablet server's requests
if this host really holds it (:func:`serve_host`, the instance-file check of DESIGN §1), and
get the staged write batches (and log entries for a lagging follower) those requests carry
as refs to this host, in one of two ways:

- **pulled** (``HostTask.pull``, whenever every source host runs a resident tablet server):
  the server serving the requests reads a batch staged on its own host from disk and
  fetches the others from their hosts' servers (:class:`PulledPayloads`), one batch at a
  time, as it resolves each request. No shuffle stage, and the bytes cross no JVM;
- **shuffled**: the two sides of a Spark shuffle that delivers them (:func:`emit_staged` on
  the staging host, :func:`land` on the destination), zipped with the barrier tasks.

A batch that cannot be had (its host was lost) leaves the requests needing it refused as
"not delivered", and only those.
The driver builds the stages; these functions are what Spark pickles into them, so they
import nothing of the driver side (the executor's daemon pre-imports this module).

Thread-safety: functions only; each call works on its own task's data.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark_kudu.errors import NetworkError
from pyspark_kudu.rpc.auth import secret_from_env
from pyspark_kudu.spark.host.dataplane import (
    REF_MAGIC,
    StagedBatches,
    StagedRef,
    read_staged,
    refs_of,
)
from pyspark_kudu.spark.host.handlers import PeerRequest, PeerResponse, handle_requests
from pyspark_kudu.spark.host.identity import current_host, local_data_root, run_pinned
from pyspark_kudu.spark.host.tserver_protocol import ADDRESS_ENV
from pyspark_kudu.tablet.memory import release_unused_memory
from pyspark_kudu.wal import WalOptions

__all__ = [
    "INLINE_BYTES",
    "LAND_BYTES",
    "HostTask",
    "Landed",
    "LandedPayloads",
    "PulledPayloads",
    "ServeResult",
    "barrier_partition",
    "barrier_with_data",
    "destination",
    "emit_staged",
    "land",
    "serve_encoded",
    "serve_host",
    "serve_in_process",
    "serve_task_remote",
    "unland",
    "where",
]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostTask:
    host: str
    items: tuple[tuple[str, str | None, tuple[PeerRequest, ...]], ...]
    options: WalOptions | None
    #: Pull the requests' staged batches (module docstring) from these resident tablet
    #: servers, by host: (host, ``host:port``) pairs.
    pull: bool = False
    sources: tuple[tuple[str, str], ...] = ()

ServeResult = list[tuple[str, list[PeerResponse] | None, str]]

#: Delivered payloads at least this large go to the resident tablet server as landed files
#: (it reads them from this host's page cache), smaller ones inside the call.
INLINE_BYTES = 64 << 10

#: Seconds one pulled batch may take to arrive before its requests are refused (a round has
#: its own deadline too, ``spark_rounds.DEFAULT_ROUND_TIMEOUT_S``).
_PULL_TIMEOUT_S = 120.0


class LandedPayloads(Mapping[str, bytes]):
    """Delivered payloads by staged path, landed ones read from their file when asked for
    (one request's batches at a time, not the whole round's)."""

    def __init__(self, payloads: Mapping[str, bytes | Landed]) -> None:
        self._payloads = dict(payloads)

    def __getitem__(self, key: str) -> bytes:
        data = self._payloads[key]
        if isinstance(data, Landed):
            with open(data.path, "rb") as f:
                return f.read()
        return data

    def __iter__(self) -> Iterator[str]:
        return iter(self._payloads)

    def __len__(self) -> int:
        return len(self._payloads)


class PulledPayloads(StagedBatches):
    """The staged batches ``task``'s requests refer to, by staged path: the ``given`` ones,
    else read from this host's disk when staged here, else fetched from their host's resident
    tablet server (``task.sources``), when asked for: over one client per server, opened
    at its first batch and kept until :meth:`close` (the task is served)."""

    def __init__(self, task: HostTask, given: Mapping[str, bytes]) -> None:
        from pyspark_kudu.spark.host.tserver_client import ServerClients

        super().__init__(ref for _, _, reqs in task.items for ref in refs_of(reqs))
        self._given = given
        self._sources = dict(task.sources)
        self.clients = ServerClients(secret_from_env() or b"")
        self.fetched = 0  # batches fetched from other hosts (tests, metrics)

    def close(self) -> None:
        self.clients.close()

    def __getitem__(self, key: str) -> bytes:
        if key in self._given:
            return self._given[key]
        return super().__getitem__(key)

    def _read(self, ref: StagedRef) -> bytes | None:
        return read_staged(ref) if ref.host == current_host() else self._fetch(ref)

    def _fetch(self, ref: StagedRef) -> bytes | None:
        from pyspark_kudu.errors import KuduError
        from pyspark_kudu.spark.host.tserver_client import fetch_staged
        from pyspark_kudu.spark.host.tserver_protocol import StagedRequest

        address = self._sources.get(ref.host, "")
        secret = self.clients.secret
        if not address or not secret:
            _log.warning("staged batch %s: no tablet server known on %s", ref.path, ref.host)
            return None
        try:
            data = fetch_staged(address, secret, StagedRequest(
                ref.encode()[len(REF_MAGIC):].decode()), timeout_s=_PULL_TIMEOUT_S,
                clients=self.clients)
        except KuduError as e:
            _log.warning("staged batch %s not fetched from %s: %s", ref.path, address, e)
            return None
        self.fetched += 1
        return data

    def __iter__(self) -> Iterator[str]:
        return iter(self._refs.keys() | self._given.keys())

    def __len__(self) -> int:
        return len(self._refs.keys() | self._given.keys())


def serve_host(task: HostTask, delivered: Mapping[str, bytes | Landed] | None = None,
               *, resident: bool = True) -> ServeResult:
    """Executor side: serve each tablet server's requests if this host really holds it.

    With ``resident`` (the default) and this host's resident tablet server known, the
    requests are served by that server (:func:`serve_in_process` there, one long-lived
    process whose open replicas stay warm across rounds and tasks); otherwise here."""
    address = os.environ.get(ADDRESS_ENV, "")
    secret = secret_from_env() if resident and address else b""
    if not secret:
        return serve_in_process(task, LandedPayloads(delivered or {}))
    landed: list[Landed] = []
    try:
        payloads: dict[str, bytes | Landed] = {}
        for path, data in (delivered or {}).items():
            if isinstance(data, bytes) and len(data) >= INLINE_BYTES:
                data = _land_bytes(data)
                landed.append(data)
            payloads[path] = data
        try:
            return serve_task_remote(address, secret, task, payloads)
        except NetworkError as e:
            # The server is gone although its executor runs (Raft requests are safe to
            # deliver again: appends and steps are idempotent). Serve here instead.
            _log.warning("resident tablet server %s unreachable, serving here: %s",
                         address, e)
            return serve_in_process(task, LandedPayloads(payloads))
    finally:
        for f in landed:
            with contextlib.suppress(OSError):
                os.remove(f.path)


def serve_task_remote(address: str, secret: bytes, task: HostTask,
                      payloads: Mapping[str, bytes | Landed] | None = None) -> ServeResult:
    """Have the resident tablet server at ``address`` serve ``task`` (its
    :func:`serve_encoded`), from a round task on its host or from the driver.

    Pickled: only this application's own processes call its servers, over a channel
    authenticated with the application's credential (``secret``).

    Raises:
        KuduError: the server could not be reached or refused the call (``NetworkError``
            when it is unreachable).
    """
    from pyspark_kudu.spark.host.tserver_client import serve_remote

    body = pickle.dumps((task, dict(payloads or {})), protocol=pickle.HIGHEST_PROTOCOL)
    out: ServeResult = pickle.loads(serve_remote(address, secret, body))
    return out


def serve_encoded(body: bytes,
                  note_root: Callable[[str, WalOptions | None], None] | None = None) -> bytes:
    """The resident server's side of :func:`serve_host`: a pickled ``(task, payloads)`` in,
    the pickled result out (the caller was authenticated with the cluster credential).
    ``note_root`` is told each data root the task serves, with its WAL options."""
    task, payloads = pickle.loads(body)
    if note_root is not None:
        for _, root_hint, _ in task.items:
            note_root(local_data_root(root_hint), task.options)
    out = serve_in_process(task, LandedPayloads(payloads))
    # A round's batches (pulled, decoded, applied) are garbage now: hand their pages back,
    # or the server's RSS stays at the high-water mark of its largest rounds.
    release_unused_memory()
    return pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)


def serve_in_process(task: HostTask, delivered: Mapping[str, bytes]) -> ServeResult:
    """Serve ``task`` in this process (the resident server's side of :func:`serve_host`)."""
    pulled = PulledPayloads(task, delivered) if task.pull else None
    if pulled is not None:
        delivered = pulled
    out: ServeResult = []
    try:
        for ts_uuid, root_hint, reqs in task.items:
            root = local_data_root(root_hint)
            res = run_pinned(root, ts_uuid,
                             lambda r, reqs=reqs: handle_requests(  # type: ignore[misc]
                                 r, reqs, host=current_host(), options=task.options,
                                 delivered=delivered))
            out.append((ts_uuid, res.value if res.ok else None, res.misplaced_reason))
    finally:
        if pulled is not None:
            pulled.close()
    return out


def _land_bytes(data: bytes) -> Landed:
    """``data`` in a private temporary file of this host (removed again if writing fails)."""
    fd, tmp = tempfile.mkstemp(prefix="pyspark-kudu-delivered-")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    return Landed(tmp)

def barrier_partition(it: Iterator[HostTask]) -> Iterator[list[tuple[str, Any, str]]]:
    for task in it:
        yield serve_host(task)

#: Delivered payloads at least this large are *landed* by the shuffle's reduce side: written
#: to a private temporary file on the destination host, which the barrier task of the same
#: Spark task reads back (and removes). Otherwise each would be pickled once more and cross
#: between Python and the JVM twice more on its way to the barrier task (~0.3 s per 60 MB
#: tablet-copy part measured, ``benchmarks/recovery.py``). Write batches stay far below.
LAND_BYTES = 8 << 20


@dataclass(frozen=True)
class Landed:
    path: str  # a temporary file on this host holding the payload


def land(it: Iterator[tuple[int, tuple[str, bytes]]]
          ) -> Iterator[list[tuple[int, tuple[str, bytes | Landed]]]]:
    """Reduce side of a delivery, on the destination host: this partition's payloads as one
    list (the barrier side zips one element per partition), large ones landed."""
    out: list[tuple[int, tuple[str, bytes | Landed]]] = []
    try:
        for d, (path, data) in it:
            if len(data) < LAND_BYTES:
                out.append((d, (path, data)))
                continue
            out.append((d, (path, _land_bytes(data))))
    except BaseException:
        unland(out)
        raise
    yield out


def unland(pairs: Sequence[tuple[int, tuple[str, bytes | Landed]]]) -> None:
    for _, (_, data) in pairs:
        if isinstance(data, Landed):
            with contextlib.suppress(OSError):
                os.remove(data.path)


def barrier_with_data(
    it: Iterator[tuple[HostTask, list[tuple[int, tuple[str, bytes | Landed]]]]],
) -> Iterator[list[tuple[str, Any, str]]]:
    for task, pairs in it:
        try:
            out = serve_host(task, {path: data for _, (path, data) in pairs})
        finally:
            unland(pairs)
        yield out

def emit_staged(items: Sequence[tuple[StagedRef, tuple[int, ...]]]
                 ) -> Iterator[tuple[int, tuple[str, bytes]]]:
    """Map side of a delivery: each staged batch this host holds, once per destination.
    A batch missing here is simply not emitted; its replicas report it undelivered."""
    for ref, dests in items:
        data = read_staged(ref)
        if data is None:
            _log.warning("staged batch %s is not on %s", ref.path, current_host())
            continue
        for d in dests:
            yield d, (ref.path, data)

def destination(k: int) -> int:
    return k

def where(_: object) -> str:
    return current_host()
