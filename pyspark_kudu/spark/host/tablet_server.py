"""The resident tablet server: this host's replicas, served to tasks on any host (DESIGN §1).

Writes, elections and configuration changes stay Spark tasks pinned to a replica's host
(DESIGN §3). Reads and file streams do not have to: a scan task Spark placed on another host
(it waited longer than ``spark.locality.wait`` behind another task, or a Python data source
task, which has no preferred locations at all) asks this server, which reads the replica
on its own host and streams the result. Where Spark puts a task changes speed, never
correctness -- kudu-spark's rule, and Spark's own for BlockManager blocks.

**Protocol**: Arrow Flight. ``DoGet`` with a :mod:`~pyspark_kudu.spark.host.tserver_protocol`
ticket: a scan (record batches of the projected columns) or a file range (batches of one
``chunk`` binary column: a served tablet copy's files, fetched by the target host,
:mod:`~pyspark_kudu.spark.host.copy_fetch`). ``DoAction("serve")``: a replication round's
requests for this host, handed over by the Spark task pinned here (the task stays the
unit of scheduling and placement; the server is where the replicas stay open, so a round
never pays for reopening them in whichever Python worker Spark picked, and one host keeps
one replica cache rather than one per worker). ``DoAction("remove_staging")``: remove
finished writes' staging directories (the driver's cleanup after a write; no Spark task,
so it never holds the executor slot the next write's round needs). ``DoAction("ping")``
answers the server's address, the data root it serves by default, what it served and its
memory (:func:`~pyspark_kudu.spark.host.replica_cache.memory_report`). Every call is
authenticated with the cluster's credential (:mod:`pyspark_kudu.rpc.auth`: HMAC
challenge-response, no secret or reusable token on the wire); without a credential no
server starts. With
``PYSPARK_KUDU_TLS_CERT/_KEY/_CA`` in the executor's environment
(``spark.executorEnv.*``; :mod:`pyspark_kudu.rpc.tls`) it serves TLS, the authentication
running inside it; a bad TLS configuration starts no server (the reason goes to stderr).

**Lifecycle**: :func:`start_resident` runs in the executor's Python daemon
(:mod:`~pyspark_kudu.spark.host.daemon`) before the daemon forks any worker. It forks one
child that serves until the daemon goes away, and exports the child's address as
``PYSPARK_KUDU_TSERVER_ADDRESS`` to every worker forked afterwards (the discovery task of a
``KuduContext`` reports it to the driver, which registers it with the master). The child
lives exactly as long as the executor: it is in the daemon's process group, which pyspark's
daemon SIGHUPs when the executor closes its stdin; the kernel sends it SIGKILL when the
daemon dies (``PR_SET_PDEATHSIG``); and it checks its parent every second as a last resort.
The daemon itself never loads gRPC: forking a process with gRPC threads is unsafe.

**Maintenance**: the server also runs its host's replicas' background maintenance
(:mod:`~pyspark_kudu.spark.host.maintenance_manager`: compactions and idle flushes, every
``PYSPARK_KUDU_MAINTENANCE_INTERVAL_S`` seconds, 5 by default, 0 for none) over the data
roots it has served.

**Applying**: requests served here apply committed entries for a bounded time and leave
the rest to the server's background applier
(:mod:`~pyspark_kudu.spark.host.background_apply`), which applies them in chunks between
requests: a round never waits minutes for a replica to apply a large write.

**Which data root**: the request's explicit root (``local[*]`` virtual tablet servers), else
this host's own (``PYSPARK_KUDU_DATA_ROOT``, else the application's ``spark.kudu.dataRoot``
carried in the request, else the default); the root's ``instance`` file must name the
requested tablet server, or nothing is read.

Thread-safety: the Flight server runs calls on gRPC's thread pool; every call opens its
replica under the replica's ``flock`` (:mod:`~pyspark_kudu.spark.host.replica_cache`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa

from pyspark_kudu.errors import InvalidArgumentError, KuduError, NotFoundError
from pyspark_kudu.rpc.tls import TlsConfig, location, server_kwargs, tls_from_env
from pyspark_kudu.spark.host import copy_traffic, server_lock
from pyspark_kudu.spark.host.background_apply import BackgroundApplier
from pyspark_kudu.spark.host.file_stream import STREAM_ADDRESS_ENV, FileStreamServer
from pyspark_kudu.spark.host.identity import current_host, local_data_root, verify_instance
from pyspark_kudu.spark.host.maintenance_manager import MaintenanceManager
from pyspark_kudu.spark.host.replica_cache import memory_report
from pyspark_kudu.spark.host.tserver_protocol import (
    ADDRESS_ENV,
    PREFETCH_ACTION,
    REMOVE_STAGING_ACTION,
    SERVE_ACTION,
    FileRequest,
    ScanRequest,
    StagedRequest,
    encode_error,
    parse_ticket,
)
from pyspark_kudu.tablet.memory import return_large_frees_to_os

__all__ = ["BACKGROUND_NICE_ENV", "FILE_CHUNK_BYTES", "LEADER_APPLY_ENV",
           "MAINTENANCE_INTERVAL_ENV", "serve", "start_resident"]

#: Bytes per batch of a file stream: large enough to amortise a batch's overhead, small
#: enough that neither side holds much of a file at once.
FILE_CHUNK_BYTES = 4 << 20
_START_TIMEOUT_S = 30.0
_PR_SET_PDEATHSIG = 1


def _flight_error(e: BaseException) -> Exception:
    import pyarrow.flight as fl

    err: Exception = fl.FlightServerError(f"{type(e).__name__}: {e}",
                                          extra_info=encode_error(e))
    return err


def _root_for(ts_uuid: str, root: str | None, conf_root: str | None) -> str:
    """The data root holding tablet server ``ts_uuid`` on this host, or NotFoundError."""
    chosen = local_data_root(root, conf_root)
    why = verify_instance(chosen, ts_uuid) if os.path.isdir(chosen) else (
        f"data root {chosen} does not exist on {current_host()}")
    if why:
        raise NotFoundError(f"tablet server {ts_uuid} is not served here: {why}")
    return chosen


def _scan(req: ScanRequest) -> Iterator[pa.RecordBatch]:
    from pyspark_kudu.spark.host.replica_scan import scan_replica

    root = _root_for(req.ts_uuid, req.root, req.data_root_conf)
    _note_root(root, None)
    return scan_replica(root, req.tablet_id, req.columns, req.predicates, req.snapshot,
                        req.known_commit, batch_rows=req.batch_rows,
                        require_index=req.require_index, trusted=req.trusted,
                        commit_term=req.commit_term)


def _shared_scan(req: ScanRequest) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """A scan for a client on this host, which reads the rowset files itself
    (:mod:`~pyspark_kudu.spark.host.shared_scan`)."""
    from pyspark_kudu.spark.host.replica_scan import plan_replica_scan
    from pyspark_kudu.spark.host.shared_scan import share_scan

    root = _root_for(req.ts_uuid, req.root, req.data_root_conf)
    _note_root(root, None)
    scanner = plan_replica_scan(root, req.tablet_id, req.columns, req.predicates,
                                req.snapshot, req.known_commit, batch_rows=req.batch_rows,
                                require_index=req.require_index, trusted=req.trusted,
                                commit_term=req.commit_term)
    return share_scan(root, req.tablet_id, scanner)


def _translating(it: Iterator[pa.RecordBatch], schema: pa.Schema | None = None,
                 first: pa.RecordBatch | None = None) -> Iterator[pa.RecordBatch]:
    """``first`` (already taken from ``it``), then ``it``'s batches, with exactly ``schema``
    when given (its metadata too); errors as Flight errors. ``it`` is closed when the client
    goes away, which releases a scan's files now."""
    try:
        if first is not None:
            yield first
        for batch in it:
            yield batch if schema is None else pa.RecordBatch.from_arrays(batch.columns,
                                                                          schema=schema)
    except (KuduError, OSError) as e:
        raise _flight_error(e) from e
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


def _serve(body: bytes) -> bytes:
    """A round task's requests, served against this host's replicas (see
    :func:`~pyspark_kudu.spark.host.round_tasks.serve_host`). The caller proved it holds the
    application's credential (every call is authenticated)."""
    from pyspark_kudu.spark.host.round_tasks import serve_encoded

    if _applier is None:
        return serve_encoded(body, _note_root)
    with _applier.foreground():
        return serve_encoded(body, _note_root)


def _prefetch(body: bytes) -> bool:
    """Start fetching a served tablet copy into a replica of this host ahead of the round
    that installs it (:func:`~pyspark_kudu.spark.host.copy_fetch.prefetch_served`); False
    if there is nothing to do (no such replica here, or it applied the copy's index
    already: installed). The caller proved it holds the application's credential."""
    from pyspark_kudu.spark.host.copy_fetch import ServedCopy, prefetch_served
    from pyspark_kudu.spark.host.handlers import tablet_dir
    from pyspark_kudu.spark.host.replica_apply import read_applied
    from pyspark_kudu.wal.meta import META_FILE

    req = json.loads(body)
    copy = ServedCopy.decode(str(req["manifest"]).encode("latin-1"))
    if copy is None:
        raise InvalidArgumentError("prefetch_copy needs a served tablet copy's manifest")
    root = _root_for(str(req["ts_uuid"]), req.get("root"), None)
    io = tablet_dir(root, copy.tablet_id)
    if not io.exists(META_FILE) or read_applied(io) >= int(req["index"]):
        return False
    prefetch_served(io, copy, busy=_applier.foreground if _applier is not None else None)
    return True


_applier: BackgroundApplier | None = None
#: Seconds a request served here applies committed entries itself on the leader's replica
#: in a round collecting per-row results (which a write waits for) before leaving the rest
#: to the background applier (10 by default); other requests leave it all.
LEADER_APPLY_ENV = "PYSPARK_KUDU_LEADER_APPLY_S"


#: Added to the nice value of the threads that apply and maintain replicas in the background
#: (the background applier, the maintenance manager): a write's rounds, the leader's apply
#: for its results and scans get the host's CPU first. 0 turns it off.
BACKGROUND_NICE_ENV = "PYSPARK_KUDU_BACKGROUND_NICE"
_BACKGROUND_NICE = 10


def background_nice() -> int:
    """The background threads' nice increment (``PYSPARK_KUDU_BACKGROUND_NICE``, 0-19)."""
    try:
        return min(max(int(os.environ.get(BACKGROUND_NICE_ENV, "") or _BACKGROUND_NICE), 0), 19)
    except ValueError:
        return _BACKGROUND_NICE


def _seconds_env(name: str, default: float) -> float:
    try:
        return max(float(os.environ.get(name, "") or default), 0.0)
    except ValueError:
        return default


def _start_background_apply() -> BackgroundApplier:
    """This server's background applier (``spark/host/background_apply``), used by every
    request it serves from now on."""
    global _applier
    from pyspark_kudu.spark.host.replica_apply import use_background_apply

    _applier = BackgroundApplier(leader_inline_s=_seconds_env(LEADER_APPLY_ENV, 10.0),
                                 nice=background_nice())
    use_background_apply(_applier)
    return _applier


#: Seconds between maintenance cycles of the resident server (0: no background maintenance).
MAINTENANCE_INTERVAL_ENV = "PYSPARK_KUDU_MAINTENANCE_INTERVAL_S"
_maintenance: MaintenanceManager | None = None
#: Longest a maintenance operation (or a compaction's next chunk) waits for this process's
#: tablet copies to be fetched (``copy_traffic``): a longer copy gets maintenance a chunk at
#: a time, never stops it.
MAINTENANCE_PAUSE_MAX_S = 30.0


def _note_root(root: str, options: Any) -> None:
    if _maintenance is not None and os.path.isdir(root):
        _maintenance.note(root, options)


def _start_maintenance() -> MaintenanceManager | None:
    """The background maintenance of this server's replicas (``spark/host/maintenance_manager``)."""
    global _maintenance
    interval = float(os.environ.get(MAINTENANCE_INTERVAL_ENV, "5") or 0)
    if interval <= 0:
        return None
    _maintenance = MaintenanceManager(
        interval_s=interval,
        pause=functools.partial(copy_traffic.wait_for_copies, MAINTENANCE_PAUSE_MAX_S),
        nice=background_nice())
    default_root = local_data_root()
    if os.path.isdir(default_root):
        _maintenance.note(default_root)
    _maintenance.start()
    return _maintenance


#: File streams served by this process and their bytes (``ping``: tests and benchmarks check
#: that a tablet copy travelled through the servers).
_file_stats = {"files_served": 0, "file_bytes_served": 0, "staged_served": 0,
               "staged_bytes_served": 0}
_stats_lock = threading.Lock()


def _file_path(req: FileRequest) -> str:
    """The local path of ``req``'s file (counted as a file served), or ``NotFoundError``."""
    root = _root_for(req.ts_uuid, req.root, req.data_root_conf)
    path = os.path.join(root, "tablets", req.tablet_id, req.path)
    if not os.path.isfile(path):
        raise NotFoundError(f"tablet {req.tablet_id} has no file {req.path!r} under {root}")
    with _stats_lock:
        _file_stats["files_served"] += 1
    return path


def _count_file_bytes(n: int) -> None:
    with _stats_lock:
        _file_stats["file_bytes_served"] += n


def _file(req: FileRequest) -> Iterator[pa.RecordBatch]:
    path = _file_path(req)
    # Read into Arrow buffers and wrapped without a copy: a tablet copy streams gigabytes.
    with pa.OSFile(path, "rb") as f:
        f.seek(req.offset)
        left = req.length
        while left is None or left > 0:
            chunk = f.read_buffer(FILE_CHUNK_BYTES if left is None
                                  else min(left, FILE_CHUNK_BYTES))
            if not chunk.size:
                break
            if left is not None:
                left -= chunk.size
            _count_file_bytes(chunk.size)
            yield _chunk_batch(chunk)


def _chunk_batch(chunk: pa.Buffer) -> pa.RecordBatch:
    """One ``chunk`` binary value wrapping ``chunk`` without a copy."""
    offsets = pa.py_buffer(struct.pack("<ii", 0, chunk.size))
    return pa.record_batch([pa.Array.from_buffers(pa.binary(), 1, [None, offsets, chunk])],
                           names=["chunk"])


def _remove_staging(body: bytes) -> int:
    """Remove the staging directories of the writes ``body`` names (JSON: ``write_ids``, and
    the data root as a request gives it: ``root``, ``data_root_conf``) on this host; how
    many there were (``dataplane.remove_staging``: a write id that is not a plain name is
    refused)."""
    from pyspark_kudu.spark.host.dataplane import remove_staging

    d = json.loads(body)
    root = local_data_root(d.get("root"), d.get("data_root_conf"))
    return remove_staging(root, [str(w) for w in d["write_ids"]])


#: Actions answered in JSON by a module function of the body.
_JSON_ACTIONS: dict[str, Callable[[bytes], dict[str, Any]]] = {
    PREFETCH_ACTION: lambda body: {"started": _prefetch(body)},
    REMOVE_STAGING_ACTION: lambda body: {"removed": _remove_staging(body)},
}


def _staged(req: StagedRequest) -> Iterator[pa.RecordBatch]:
    """A staged batch or log entry of this host, for a replica on another host: read and
    checked against its ref's size and CRC32C here (``dataplane.read_staged``)."""
    from pyspark_kudu.spark.host.dataplane import REF_MAGIC, StagedRef, read_staged

    ref = StagedRef.decode(REF_MAGIC + req.ref.encode())
    assert ref is not None
    data = read_staged(ref)
    if data is None:
        raise NotFoundError(f"staged batch {ref.path} is not on {current_host()} intact")
    with _stats_lock:
        _file_stats["staged_served"] += 1
        _file_stats["staged_bytes_served"] += len(data)
    buf = pa.py_buffer(data)
    for off in range(0, max(len(data), 1), FILE_CHUNK_BYTES):
        yield _chunk_batch(buf.slice(off, min(FILE_CHUNK_BYTES, len(data) - off)))


def _make_server(host: str, secret: bytes, tls: TlsConfig | None = None) -> Any:
    """A started :class:`TabletServerFlight` on ``host`` (ephemeral port), over TLS if there
    is a ``tls`` configuration. Imported lazily: only the server process (and clients) load
    gRPC."""
    import pyarrow.flight as fl

    from pyspark_kudu.rpc.auth import HmacServerAuthHandler, check_listen

    check_listen(host, secret)
    tls_kwargs = server_kwargs(tls, f"the tablet server on {host}")

    class TabletServerFlight(fl.FlightServerBase):  # type: ignore[misc]
        """Flight service of one host's tablet server(s); see the module docstring."""

        def __init__(self) -> None:
            super().__init__(location(f"{host}:0", tls),
                             auth_handler=HmacServerAuthHandler(secret), **tls_kwargs)
            self.served = 0
            self.rounds_served = 0
            self._lock = threading.Lock()
            # Tablet copies' file ranges, at disk speed; with TLS they stay on Flight.
            self.streams = None if tls is not None else FileStreamServer(
                host, secret, _file_path, _count_file_bytes)

        @property
        def stream_address(self) -> str:
            """The file stream server's ``host:port`` ("" with TLS: none runs)."""
            return "" if self.streams is None else self.streams.address

        def shutdown(self) -> None:
            if self.streams is not None:
                self.streams.shutdown()
            super().shutdown()

        def do_get(self, context: Any, ticket: fl.Ticket) -> fl.FlightDataStream:
            try:
                req = parse_ticket(ticket.ticket)
                if isinstance(req, ScanRequest) and req.share_files:
                    schema, it = _shared_scan(req)
                    with self._lock:
                        self.served += 1
                    return fl.GeneratorStream(schema, _translating(it, schema))
                it = (_scan(req) if isinstance(req, ScanRequest) else
                      _staged(req) if isinstance(req, StagedRequest) else _file(req))
                first = next(it, None)
            except (KuduError, OSError) as e:
                raise _flight_error(e) from e
            with self._lock:
                self.served += 1
            if first is None:
                # An empty result still needs a schema: the scan's, derived by the client.
                schema = pa.schema([pa.field("chunk", pa.binary())]) if isinstance(
                    req, (FileRequest, StagedRequest)) else pa.schema([])
                return fl.GeneratorStream(schema, iter(()))
            return fl.GeneratorStream(first.schema, _translating(it, first=first))

        def do_action(self, context: Any, action: fl.Action) -> Iterator[fl.Result]:
            if action.type == SERVE_ACTION:
                try:
                    out = _serve(action.body.to_pybytes())
                except (KuduError, OSError) as e:
                    raise _flight_error(e) from e
                with self._lock:
                    self.rounds_served += 1
                yield fl.Result(out)
                return
            handler = _JSON_ACTIONS.get(action.type)
            if handler is not None:
                try:
                    answer = handler(action.body.to_pybytes())
                except (KuduError, OSError, ValueError) as e:
                    raise _flight_error(e) from e
                yield fl.Result(json.dumps(answer).encode())
                return
            if action.type != "ping":
                raise _flight_error(InvalidArgumentError(
                    f"unknown tablet server action {action.type!r}"))
            body = {"address": f"{host}:{self.port}", "stream_address": self.stream_address,
                    "host": current_host(),
                    "data_root": local_data_root(), "served": self.served,
                    "rounds_served": self.rounds_served, "pid": os.getpid(), **_file_stats,
                    "memory": memory_report(),
                    "background_apply": _applier.report() if _applier is not None else {},
                    "maintenance_ops": [
                        {"tablet_id": op.tablet_id, "kind": op.kind,
                         "rowsets": list(op.rowsets), "seconds": op.seconds}
                        for op in (_maintenance.ops if _maintenance is not None else [])],
                    "maintenance_paused_s": round(_maintenance.paused_s, 3)
                    if _maintenance is not None else 0.0}
            yield fl.Result(json.dumps(body).encode())

        def list_actions(self, context: Any) -> list[tuple[str, str]]:
            return [("ping", "this server's address and default data root"),
                    (SERVE_ACTION, "serve a replication round task of this host"),
                    (PREFETCH_ACTION, "start fetching a served tablet copy into a replica "
                                      "of this host"),
                    (REMOVE_STAGING_ACTION, "remove finished writes' staging directories")]

    return TabletServerFlight()


def serve(host: str, secret: bytes, on_started: Any = None,
          tls: TlsConfig | None = None, on_stopping: Callable[[], object] | None = None
          ) -> None:
    """Run a tablet server on ``host`` until this process is told to stop (SIGTERM/SIGHUP)
    or its parent goes away. ``on_started(address)`` is called once it listens,
    ``on_stopping()`` once it was told to stop, before it stops listening. ``tls``: serve
    TLS with it (None: plain)."""
    return_large_frees_to_os()  # before its threads fill glibc's arenas (tablet.memory)
    server = _make_server(host, secret, tls)
    applier = _start_background_apply()
    maintenance = _start_maintenance()
    address = f"{host}:{server.port}"
    # Rounds served here stage tablet copies for other hosts to fetch from this server.
    os.environ[ADDRESS_ENV] = address
    _export_stream_address(server.stream_address)
    if on_started is not None:
        on_started(f"{address} {server.stream_address}".strip())
    parent = os.getppid()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        if os.getppid() != parent:
            break  # the daemon is gone (PDEATHSIG covers the normal case)
    if on_stopping is not None:
        on_stopping()
    if maintenance is not None:
        maintenance.stop()
    server.shutdown()
    applier.stop()


def _export_stream_address(address: str) -> None:
    if address:
        os.environ[STREAM_ADDRESS_ENV] = address
    else:
        os.environ.pop(STREAM_ADDRESS_ENV, None)


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def start_resident(env: Mapping[str, str] = os.environ) -> str | None:
    """In the executor's daemon, before it forks workers: fork this host's tablet server and
    export its address (``PYSPARK_KUDU_TSERVER_ADDRESS``) for the workers. Returns the
    address, or None (no credential configured, a bad TLS configuration, or the server
    could not start: reads from other hosts then fail over to other replicas and the reason
    goes to stderr).

    **One server per executor.** An executor runs one Python daemon per distinct worker
    environment: PySpark's SQL runners add ``SPARK_SIMPLIFIED_TRACEBACK``, so the tasks of
    ``mapInArrow`` and those of RDD stages (rounds) come from two daemons. Two servers on
    one data root would each run maintenance and background applies on the same replicas:
    measured at 50M rows, their compactions deleted each other's files and were dropped
    as conflicts (11 of 22 in two idle minutes, 343 s of CPU), after two conflicts a
    compaction held the replica's lock throughout, and each closed the other's cached
    replicas as stale (~70 reopens after the insert; none with one server). So the first
    daemon's server takes an exclusive lock (:mod:`~pyspark_kudu.spark.host.server_lock`:
    the executor, host, data root and credential) and publishes its address next to it; the
    executor's other daemon finds the lock held and exports that address instead of
    starting a second server. A server that dies releases the lock (the kernel drops it with the
    process); a server told to stop removes its lock file, and the files of servers that died
    are swept by the next daemon that takes a lock
    (:func:`~pyspark_kudu.spark.host.server_lock.sweep`).
    """
    from pyspark_kudu.rpc.auth import secret_from_env

    secret = secret_from_env(env)
    if not secret:
        # A daemon for Python work that is not pyspark-kudu's (a KuduContext puts the secret
        # in the environment of the workers it starts); the driver warns if a context's
        # discovery finds a host without a server.
        return None
    try:  # checked before forking: a bad configuration starts nothing
        tls = tls_from_env(env)
        server_kwargs(tls, "this host's tablet server")
    except KuduError as e:
        print(f"pyspark-kudu: this host's tablet server did not start: {e}", file=sys.stderr)
        return None
    lock_path = server_lock.lock_path(current_host(), secret)
    lock_fd = server_lock.take(lock_path, _START_TIMEOUT_S)
    if isinstance(lock_fd, str):  # another daemon's server serves this host: use it
        address, _, streams = lock_fd.partition(" ")
        os.environ[ADDRESS_ENV] = address
        _export_stream_address(streams)
        return address
    if lock_fd is None:
        print("pyspark-kudu: this host's tablet server did not start: another daemon holds "
              f"its lock ({lock_path}) but published no address", file=sys.stderr)
        return None
    os.setpgid(0, 0)  # the daemon's own group: its shutdown SIGHUPs the server too
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the server process: it alone holds the lock from here on
        os.close(r)
        code = 0
        try:
            _die_with_parent()
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)  # never read the daemon's stdin (the executor's commands)
            os.dup2(2, 1)  # nor write to its stdout (the executor reads the daemon's port)

            def started(address: str) -> None:
                server_lock.publish(lock_path, address)
                os.write(w, address.encode() + b"\n")
                os.close(w)

            serve(current_host(), secret, started, tls,
                  on_stopping=functools.partial(server_lock.release, lock_path, lock_fd))
        except BaseException as e:  # report and exit: never return into the daemon's code
            print(f"pyspark-kudu: tablet server stopped: {type(e).__name__}: {e}",
                  file=sys.stderr)
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    os.close(lock_fd)  # the server's copy keeps the lock; workers forked later have none
    address, _, streams = _read_line(r, _START_TIMEOUT_S).partition(" ")
    os.close(r)
    if not address:
        print("pyspark-kudu: this host's tablet server did not start", file=sys.stderr)
        return None
    os.environ[ADDRESS_ENV] = address
    _export_stream_address(streams)
    return address


def _read_line(fd: int, timeout_s: float) -> str:
    end = time.monotonic() + timeout_s
    buf = b""
    while b"\n" not in buf:
        left = end - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return ""
        chunk = os.read(fd, 256)
        if not chunk:
            return ""
        buf += chunk
    return buf.split(b"\n", 1)[0].decode()
