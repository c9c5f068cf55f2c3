"""The session service: the user's driver process, as seen from the ``kudu`` data source.

DESIGN §4: a Python data source runs ``schema()``, ``reader()``, ``writer()`` and
``commit()`` in *separate Python worker processes* on the driver host, never in the process
that holds the :class:`~pyspark_kudu.spark.context.KuduContext` (its master client, its
tablets' leader state, its replication service). So the context runs this small service and
the data source calls it:

=================  ===========================================================================
``describe``       a table's schema, partition schema, tablets (replicas, leader, the commit
                   index this client knows: read-your-writes), tablet servers and staging root
``commit``         replicate the batches writer tasks staged (``KuduContext.commit_staged``),
                   then discard the staging; returns the ``WriteSummary`` or the error
``abort``          discard the staging of a failed write
``commit_stream``  ``commit`` of one streaming micro-batch, exactly once per
                   ``(table, stream id, batch id)`` (see below)
``read_points``    per tablet, the leader replica and an empty entry's index committed after
                   the call began (``kudu.readMode=linearizable``)
``lead_commit``    another client's staged batches, for tablets this client holds the
                   leadership lease of (:mod:`.leases`); the caller discards its staging
``lead_read``      linearizable read points of tablets this client leads
``lead_heal``      replication actions on tablets this client leads
=================  ===========================================================================

The ``lead_*`` methods serve *other clients* (other KuduContexts, possibly of other
applications): the master's lease table hands them this service's address and secret. A
client asked to lead a tablet whose lease it no longer holds answers ``NotLeaderError``
before proposing anything, and the caller routes again.

Decisions:

- **Transport**: a threaded TCP server bound to ``127.0.0.1`` (or the address in
  ``spark.kudu.sessionService.host``, for clients in other hosts' drivers that forward to
  this one, :mod:`.leases`) on an ephemeral port, one request per connection,
  length-prefixed JSON. Chosen over Arrow Flight because the callers
  are short-lived Python workers forked by Spark (no gRPC threads to start in them) and the
  bodies are small JSON documents; a call may take as long as a replication round, so the
  connection has no read deadline once authenticated.
- **Authentication**: a random per-application secret (``secrets.token_hex(32)``) sent as the
  first bytes of every connection and compared in constant time (``hmac.compare_digest``)
  before the body is read. Only the data source classes this session registered carry it
  (as class attributes pickled by value, see :func:`register`).
- **Errors** travel as ``{type, message}`` and are rebuilt by the client as the same
  :mod:`pyspark_kudu.errors` class (``RowWriteError`` with its ``errors`` and
  ``rows_written``); anything else becomes a ``RemoteError`` naming the original type.
  Spark then wraps the error of ``commit()`` in its own exception: the user sees the class
  name and message in the text of the exception ``save()`` raises.
- **Streaming exactly once**: the committed micro-batches of a stream are recorded under
  ``<warehouse>/streams/<table>/<stream id>.json`` (atomic replace) *after* the batch
  committed. Spark runs micro-batches of one query strictly in order and, after a restart
  from its checkpoint, replays at most the batches it had not recorded as committed; so a
  batch id at or below the recorded one is a replay and is acknowledged without writing.
  Remaining window: a crash after the replication committed and before the record is
  written replays that one batch; with ``upsert`` (the default), ``insert_ignore``,
  ``update``, ``update_ignore`` or ``delete_ignore`` the replay rewrites what it wrote
  (no later batch has run yet) and is harmless; with ``insert`` it reports its rows as
  ``AlreadyPresent`` and with ``delete`` as ``NotFound``. A batch whose rows partly failed
  (``RowWriteError``) is recorded too: the replication happened, and replaying it could only
  repeat or worsen the row errors. A *new* checkpoint needs a new stream id: the default
  stream id is the checkpoint's query id, so that happens by itself; an explicit
  ``kudu.streamId`` must be changed, or the new query's first batches count as replays.

Thread-safety: :class:`SessionService` is thread-safe (the context's methods are, and each
stream's ledger entry is updated under its own lock); :class:`SessionClient` holds no
connection between calls and may be shared.
"""

from __future__ import annotations

import base64
import contextlib
import hmac
import json
import logging
import secrets
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from pyspark_kudu import errors
from pyspark_kudu.errors import (
    InvalidArgumentError,
    KuduError,
    RemoteError,
    RowWriteError,
    ServiceUnavailableError,
    UsageError,
)
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.schema import Schema
from pyspark_kudu.spark.dataplane import StagedRef

if TYPE_CHECKING:  # pragma: no cover - the context imports Spark; workers need not
    from pyspark_kudu.spark.context import KuduContext, WriteSummary

__all__ = [
    "FILTER_PUSHDOWN_CONF",
    "SERVICE_HOST_CONF",
    "SessionAddress",
    "SessionClient",
    "SessionService",
    "SessionUnreachableError",
    "StreamLedger",
    "TableInfo",
    "TabletInfo",
    "register",
]

_log = logging.getLogger(__name__)

FILTER_PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
SERVICE_HOST_CONF = "spark.kudu.sessionService.host"
_MAGIC = b"KSS1"
_LEN = struct.Struct(">I")
_MAX_FRAME = 1 << 30  # refs are ~200 bytes each: a billion-row write stays far below this
_AUTH_TIMEOUT_S = 10.0
_CONNECT_TIMEOUT_S = 10.0
_MAX_FOREIGN_MESSAGE = 4000


@dataclass(frozen=True)
class SessionAddress:
    """Where a session service listens, its secret (kept out of ``repr``) and the master
    addresses of its KuduContext (to check ``kudu.master`` before any call)."""

    host: str
    port: int
    secret: str = field(repr=False)
    masters: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "secret": self.secret,
                "masters": list(self.masters)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SessionAddress:
        return cls(str(d["host"]), int(d["port"]), str(d["secret"]),
                   tuple(str(m) for m in d.get("masters") or ()))


class SessionUnreachableError(ServiceUnavailableError):
    """No connection to the session service could be made: the request was never sent."""


@dataclass(frozen=True)
class TabletInfo:
    """One tablet as :meth:`SessionClient.describe` reports it.

    ``leader`` is the replica the master lists as leader ("" if none reported a commit yet)
    and ``known_commit`` the commit index reported with it (None when unknown): a scan of
    the leader replica at that index sees every write this client committed.
    """

    tablet_id: str
    replicas: tuple[str, ...]
    leader: str = ""
    known_commit: int | None = None


@dataclass(frozen=True)
class TableInfo:
    """What the data source needs to plan a read or a write of one table."""

    table: str
    schema: Schema
    partition_schema: Mapping[str, Any]
    tablets: tuple[TabletInfo, ...]
    tservers: Mapping[str, tuple[str, str | None]]  # uuid -> (host, data root or None)
    staging_root: str | None  # the warehouse in local mode; None: each host's data root
    data_root_conf: str | None  # spark.kudu.dataRoot of the application, if set
    filter_pushdown: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table, "schema": self.schema.to_dict(),
            "partition_schema": dict(self.partition_schema),
            "tablets": [{"tablet_id": t.tablet_id, "replicas": list(t.replicas),
                         "leader": t.leader, "known_commit": t.known_commit}
                        for t in self.tablets],
            "tservers": {u: [h, r] for u, (h, r) in self.tservers.items()},
            "staging_root": self.staging_root,
            "data_root_conf": self.data_root_conf, "filter_pushdown": self.filter_pushdown,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TableInfo:
        return cls(
            table=str(d["table"]), schema=Schema.from_dict(d["schema"]),
            partition_schema=dict(d["partition_schema"]),
            tablets=tuple(TabletInfo(str(t["tablet_id"]), tuple(t["replicas"]),
                                     str(t.get("leader") or ""), t.get("known_commit"))
                          for t in d["tablets"]),
            tservers={str(u): (str(v[0]), None if v[1] is None else str(v[1]))
                      for u, v in d["tservers"].items()},
            staging_root=d.get("staging_root"),
            data_root_conf=d.get("data_root_conf"),
            filter_pushdown=bool(d.get("filter_pushdown")),
        )


# == wire format ================================================================================


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def _send_json(sock: socket.socket, obj: Any) -> None:
    payload = json.dumps(obj, separators=(",", ":"), default=str).encode()
    sock.sendall(_LEN.pack(len(payload)) + payload)


def _recv_json(sock: socket.socket) -> Any:
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if n > _MAX_FRAME:
        raise InvalidArgumentError(f"session service frame of {n} bytes exceeds {_MAX_FRAME}")
    return json.loads(_recv_exact(sock, n))


def _encode_error(e: BaseException) -> dict[str, Any]:
    message = str(e)
    if not isinstance(e, KuduError) and len(message) > _MAX_FOREIGN_MESSAGE:
        # e.g. a Py4J error carrying pages of JVM stack trace: the head says what failed
        message = message[:_MAX_FOREIGN_MESSAGE] + " ... (truncated; see the driver log)"
    out: dict[str, Any] = {"type": type(e).__name__, "message": message,
                           "family": "usage" if isinstance(e, UsageError) else "remote"}
    if isinstance(e, RowWriteError):
        out["errors"] = [list(x) for x in e.errors]
        out["rows_written"] = e.rows_written
    return out


def _decode_error(d: Mapping[str, Any]) -> KuduError:
    name, msg = str(d.get("type", "")), str(d.get("message", ""))
    if name == "RowWriteError":
        errs = [(str(t), dict(r), str(s), str(m)) for t, r, s, m in d.get("errors", [])]
        return RowWriteError(msg, errs, int(d.get("rows_written", 0)))
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, KuduError) and cls is not RowWriteError:
        try:
            return cls(msg)
        except TypeError:  # a class with another constructor: keep name and text
            pass
    base: type[KuduError] = InvalidArgumentError if d.get("family") == "usage" else RemoteError
    return base(f"{name} in the kudu session service: {msg}")


# == client (data source workers) ===============================================================


class SessionClient:
    """Calls one session service; used by the data source in Spark's Python workers."""

    def __init__(self, address: SessionAddress) -> None:
        self.address = address

    def call(self, method: str, body: Mapping[str, Any]) -> Any:
        """One request; returns the result or raises the service's error rebuilt.

        Raises:
            SessionUnreachableError: no connection could be made (its KuduContext was
                closed, or this code does not run on the driver host): nothing was sent.
            ServiceUnavailableError: the connection broke during the call: its outcome is
                unknown.
            InvalidArgumentError: the service refused the secret.
        """
        a = self.address
        try:
            conn = socket.create_connection((a.host, a.port), timeout=_CONNECT_TIMEOUT_S)
        except OSError as e:
            raise SessionUnreachableError(
                f"the kudu session service at {a.host}:{a.port} is not reachable ({e}): the "
                f"KuduContext that registered format('kudu') may be closed; create a new "
                f"one, and call the data source from its application") from e
        try:
            with conn as s:
                s.settimeout(None)  # a commit lasts as long as its replication rounds
                s.sendall(_MAGIC + a.secret.encode())
                _send_json(s, {"method": method, "body": dict(body)})
                reply = _recv_json(s)
        except (OSError, EOFError) as e:
            raise ServiceUnavailableError(
                f"the connection to the kudu session service at {a.host}:{a.port} broke "
                f"during {method!r} ({e}): its outcome is unknown (the KuduContext serving "
                f"it may have been closed)") from e
        if reply.get("ok"):
            return reply.get("result")
        raise _decode_error(reply.get("error") or {})

    def describe(self, table: str) -> TableInfo:
        return TableInfo.from_dict(self.call("describe", {"table": table}))

    def commit(self, table: str, refs: Sequence[bytes], bad_rows: Sequence[str],
               write_ids: Sequence[str]) -> WriteSummary:
        """Replicate staged batches of one write (then discard its staging)."""
        out = self.call("commit", {"table": table, "refs": _b64(refs),
                                   "bad_rows": list(bad_rows), "write_ids": list(write_ids)})
        return _summary(out)

    def abort(self, write_ids: Sequence[str]) -> None:
        self.call("abort", {"write_ids": list(write_ids)})

    def commit_stream(self, table: str, stream_id: str, batch_id: int, refs: Sequence[bytes],
                      bad_rows: Sequence[str], write_ids: Sequence[str]) -> WriteSummary | None:
        """``commit`` of micro-batch ``batch_id``; None if it was committed before (replay)."""
        out = self.call("commit_stream", {
            "table": table, "stream_id": stream_id, "batch_id": int(batch_id),
            "refs": _b64(refs), "bad_rows": list(bad_rows), "write_ids": list(write_ids)})
        return None if out is None else _summary(out)

    def read_points(self, table: str, tablet_ids: Sequence[str]) -> dict[str, tuple[str, int]]:
        """Per tablet: the leader replica and an index committed after this call began
        (asked of the leading client if another one leads)."""
        return self._points("read_points", table, tablet_ids)

    def lead_commit(self, table: str, refs: Sequence[bytes], bad_rows: Sequence[str] = ()
                    ) -> WriteSummary:
        """Have this service's client replicate staged batches of tablets it leads."""
        return _summary(self.call("lead_commit", {"table": table, "refs": _b64(refs),
                                                  "bad_rows": list(bad_rows)}))

    def lead_read(self, table: str, tablet_ids: Sequence[str]) -> dict[str, tuple[str, int]]:
        """Per tablet: the leader replica and an index committed after this call began."""
        return self._points("lead_read", table, tablet_ids)

    def _points(self, method: str, table: str, tablet_ids: Sequence[str]
                ) -> dict[str, tuple[str, int]]:
        out = self.call(method, {"table": table, "tablet_ids": list(tablet_ids)})
        return {str(t): (str(ts), int(i)) for t, (ts, i) in out.items()}

    def lead_heal(self, actions: Sequence[Mapping[str, Any]]
                  ) -> list[tuple[KuduError | None, float]]:
        """Carry out replication actions on tablets this service's client leads."""
        out = self.call("lead_heal", {"actions": [dict(a) for a in actions]})
        return [(None if err is None else _decode_error(err), float(took))
                for err, took in out]


def _b64(refs: Sequence[bytes]) -> list[str]:
    return [base64.b64encode(r).decode() for r in refs]


def _summary(d: Mapping[str, Any]) -> WriteSummary:
    # Imported here: the context imports this module to register the data source.
    from pyspark_kudu.spark.context import WriteSummary

    return WriteSummary(int(d["rows_written"]), int(d["row_errors"]), int(d["tablets"]))


# == service (driver) ===========================================================================


class StreamLedger:
    """The last committed micro-batch of each (table, stream), one small JSON file each.

    Thread-safety: not by itself; :class:`SessionService` serialises each stream's updates.
    """

    def __init__(self, warehouse: str) -> None:
        self._io = FileIO(warehouse).child("streams")

    @staticmethod
    def _parts(table: str, stream_id: str) -> tuple[str, str]:
        # Table names may hold any character; quote them (dots too: no "." or "..").
        return quote(table, safe="").replace(".", "%2E"), f"{stream_id}.json"

    def last_batch(self, table: str, stream_id: str) -> int | None:
        parts = self._parts(table, stream_id)
        if not self._io.exists(*parts):
            return None
        return int(json.loads(self._io.read_bytes(*parts))["last_batch_id"])

    def record(self, table: str, stream_id: str, batch_id: int) -> None:
        doc = {"table": table, "stream_id": stream_id, "last_batch_id": int(batch_id),
               "recorded_at": time.time()}
        self._io.atomic_write(json.dumps(doc).encode(), *self._parts(table, stream_id))


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    service: SessionService


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server = self.server
        assert isinstance(server, _Server)
        service = server.service
        sock: socket.socket = self.request
        expected = _MAGIC + service.secret.encode()
        sock.settimeout(_AUTH_TIMEOUT_S)
        try:
            got = _recv_exact(sock, len(expected))
        except (OSError, EOFError):
            return
        if not hmac.compare_digest(got, expected):
            _log.warning("kudu session service refused a call with a wrong secret")
            _send_json(sock, {"ok": False, "error": {
                "type": "InvalidArgumentError", "family": "usage",
                "message": "the kudu session service refused the call: wrong secret (only the "
                           "data source registered by this application's KuduContext may "
                           "call it)"}})
            return
        try:
            request = _recv_json(sock)
        except (OSError, EOFError, ValueError, KuduError) as e:
            _log.warning("kudu session service: unreadable request: %s", e)
            return
        sock.settimeout(None)
        if not isinstance(request, dict):
            request = {}
        try:
            result = service.dispatch(str(request.get("method", "")), request.get("body") or {})
            reply: dict[str, Any] = {"ok": True, "result": result}
        except KuduError as e:
            reply = {"ok": False, "error": _encode_error(e)}
        except Exception as e:  # a bug or a Spark failure: report it rather than hang up
            _log.exception("kudu session service call failed")
            reply = {"ok": False, "error": _encode_error(e)}
        try:
            _send_json(sock, reply)
        except OSError as e:
            _log.warning("kudu session service: caller went away before the reply: %s", e)


class SessionService:
    """Serves one :class:`KuduContext` to the ``kudu`` data source (see the module docstring).

    Listens on ``host`` (default ``127.0.0.1``) only, on an ephemeral port, from
    construction until :meth:`close`.
    """

    def __init__(self, kudu: KuduContext, *, secret: str | None = None,
                 host: str = "127.0.0.1") -> None:
        self._kudu = kudu
        self.secret = secret or secrets.token_hex(32)
        self._ledger = StreamLedger(kudu.warehouse)
        self._locks_guard = threading.Lock()
        self._stream_locks: dict[tuple[str, str], threading.Lock] = {}
        try:
            self._server = _Server((host, 0), _Handler)
        except OSError as e:
            raise InvalidArgumentError(
                f"{SERVICE_HOST_CONF}={host!r}: the kudu session service cannot listen there "
                f"({e}); name an address of this driver host") from e
        self._server.service = self
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="kudu-session-service", daemon=True)
        self._thread.start()

    @property
    def address(self) -> SessionAddress:
        host, port = self._server.server_address[:2]
        return SessionAddress(str(host), int(port), self.secret,
                              tuple(self._kudu.master.addresses))

    def close(self) -> None:
        """Stop listening and wait for the accept loop (calls in flight finish on their own)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> SessionService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- methods ---------------------------------------------------------------------------
    def dispatch(self, method: str, body: Mapping[str, Any]) -> Any:
        """Run one call (also usable in-process, e.g. by tests)."""
        match method:
            case "describe":
                return self.describe(str(body["table"])).to_dict()
            case "commit":
                return asdict(self.commit(str(body["table"]), _refs(body), _bad(body),
                                          _ids(body)))
            case "abort":
                self.abort(_ids(body))
                return None
            case "commit_stream":
                out = self.commit_stream(str(body["table"]), str(body["stream_id"]),
                                         int(body["batch_id"]), _refs(body), _bad(body),
                                         _ids(body))
                return None if out is None else asdict(out)
            case "lead_commit":
                return asdict(self._kudu.commit_staged(str(body["table"]), _refs(body),
                                                       _bad(body), forwarded=True))
            case "read_points" | "lead_read":
                points = self._kudu.read_points(str(body["table"]),
                                                [str(t) for t in body["tablet_ids"]],
                                                forwarded=method == "lead_read")
                return {t: [ts, i] for t, (ts, i) in points.items()}
            case "lead_heal":
                done = self._kudu.execute_replication_actions(
                    [dict(a) for a in body["actions"]], forwarded=True)
                return [[None if e is None else _encode_error(e), took] for e, took in done]
        raise InvalidArgumentError(f"unknown session service method {method!r}")

    def describe(self, table: str) -> TableInfo:
        kudu = self._kudu
        locs = kudu.master.get_table(table)
        sc = kudu.spark.sparkContext
        local = (sc.master or "").startswith("local")
        pushdown = str(kudu.spark.conf.get(FILTER_PUSHDOWN_CONF, "false")).lower() == "true"
        return TableInfo(
            table=table, schema=locs.table.schema,
            partition_schema=dict(locs.table.partition_schema),
            tablets=tuple(TabletInfo(t.tablet_id, tuple(r.ts_uuid for r in t.replicas),
                                     t.leader, t.committed_index or None)
                          for t in locs.tablets),
            tservers={s.uuid: (s.host, s.root) for s in kudu.servers},
            staging_root=kudu.warehouse if local else None,
            data_root_conf=sc.getConf().get("spark.kudu.dataRoot", None),
            filter_pushdown=pushdown,
        )

    def commit(self, table: str, refs: Sequence[StagedRef], bad_rows: Sequence[str],
               write_ids: Sequence[str]) -> WriteSummary:
        try:
            return self._kudu.commit_staged(table, refs, bad_rows)
        finally:
            self.abort(write_ids)

    def abort(self, write_ids: Sequence[str]) -> None:
        for wid in dict.fromkeys(write_ids):
            self._kudu.discard_staged(wid)

    def commit_stream(self, table: str, stream_id: str, batch_id: int,
                      refs: Sequence[StagedRef], bad_rows: Sequence[str],
                      write_ids: Sequence[str]) -> WriteSummary | None:
        """Commit micro-batch ``batch_id`` of ``stream_id`` unless already recorded."""
        with self._stream_lock(table, stream_id):
            last = self._ledger.last_batch(table, stream_id)
            if last is not None and batch_id <= last:
                _log.info("stream %s of table %s: batch %d already committed (last %d); "
                          "acknowledging the replay without writing", stream_id, table,
                          batch_id, last)
                self.abort(write_ids)
                return None
            try:
                summary = self.commit(table, refs, bad_rows, write_ids)
            except RowWriteError:
                self._ledger.record(table, stream_id, batch_id)  # applied, with row errors
                raise
            self._ledger.record(table, stream_id, batch_id)
            return summary

    def _stream_lock(self, table: str, stream_id: str) -> threading.Lock:
        with self._locks_guard:
            return self._stream_locks.setdefault((table, stream_id), threading.Lock())


def _refs(body: Mapping[str, Any]) -> list[StagedRef]:
    out = []
    for text in body.get("refs") or []:
        ref = StagedRef.decode(base64.b64decode(text))
        if ref is None:
            raise InvalidArgumentError("commit carries a value that is not a staged-batch ref")
        out.append(ref)
    return out


def _bad(body: Mapping[str, Any]) -> list[str]:
    return [str(r) for r in body.get("bad_rows") or []]


def _ids(body: Mapping[str, Any]) -> list[str]:
    return [str(w) for w in body.get("write_ids") or []]


# == registration ===============================================================================


@contextlib.contextmanager
def _active(spark: Any) -> Iterator[None]:
    """Make ``spark`` the JVM's active session on this thread for the block, then restore.

    Spark checks a data source name against the *active* session's registry, so registering
    ``kudu`` in a ``newSession()`` of an application that registered it already fails unless
    that new session is the active one."""
    jss = spark._jvm.org.apache.spark.sql.SparkSession
    previous = jss.getActiveSession()
    jss.setActiveSession(spark._jsparkSession)
    try:
        yield
    finally:
        if previous.isDefined():
            jss.setActiveSession(previous.get())
        else:
            jss.clearActiveSession()


def register(kudu: KuduContext) -> SessionService:
    """Start ``kudu``'s session service and register ``format("kudu")`` bound to it.

    The registered class is a subclass of
    :class:`~pyspark_kudu.spark.datasource.KuduDataSource` created at run time whose class
    attributes carry this service's address and secret; cloudpickle pickles such a class by
    value, so Spark's planning workers, commit workers and executors receive them. Only the
    master of ``kudu`` is reachable through it (``kudu.master`` naming another is an error).
    Registering again (another KuduContext) replaces the previous binding. Also turns on
    ``spark.sql.python.filterPushdown.enabled`` (unless the application set it) so that
    predicates prune tablets. Close the returned service when the context closes.
    """
    # Imported here: the data source module imports this one for the client side.
    from pyspark_kudu.spark.datasource import bound_source

    conf = kudu.spark.sparkContext.getConf()
    service = SessionService(kudu, host=conf.get(SERVICE_HOST_CONF, "127.0.0.1") or "127.0.0.1")
    try:
        with _active(kudu.spark):
            kudu.spark.dataSource.register(bound_source(service.address))
        if not kudu.spark.sparkContext.getConf().contains(FILTER_PUSHDOWN_CONF):
            kudu.spark.conf.set(FILTER_PUSHDOWN_CONF, "true")
    except BaseException:
        service.close()
        raise
    return service

