"""The session service: the user's driver process, as seen from the ``kudu`` data source.

DESIGN §4: a Python data source runs ``schema()``, ``reader()``, ``writer()`` and
``commit()`` in *separate Python worker processes* on the driver host, never in the process
that holds the :class:`~pyspark_kudu.spark.api.context.KuduContext` (its master client, its
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
                   leadership lease of (:mod:`~pyspark_kudu.spark.replication.lease_keeper`); the
                   caller discards its staging
``lead_read``      linearizable read points of tablets this client leads
``lead_heal``      replication actions on tablets this client leads
``scan_register``  a ``format("kudu")`` scan's tokens, and ``scan_claim``: the tablet a task
                   of it reads, chosen on the task's host (:mod:`~.scan_claims`)
=================  ===========================================================================

The ``lead_*`` methods serve *other clients* (other KuduContexts, possibly of other
applications): the master's lease table tells them this service's address (never its
secret). A client asked to lead a tablet whose lease it no longer holds answers
``NotLeaderError`` before proposing anything, and the caller routes again.

Decisions:

- **Transport**: Arrow Flight (one ``DoAction`` per call, JSON bodies), like the master and
  the resident tablet servers, bound to ``127.0.0.1`` (or the address in
  ``spark.kudu.sessionService.host``, for clients in other hosts' drivers that forward to
  this one, :mod:`~pyspark_kudu.spark.replication.lease_keeper`) on an ephemeral port. A
  call may take as long as a replication round, so calls have no deadline.
- **Authentication**: :mod:`pyspark_kudu.rpc.auth` (HMAC challenge-response, then a
  single-use token per call: no secret or reusable token on the wire) over the
  application's credential (``PYSPARK_KUDU_SECRET``, which the ``KuduContext`` passes as
  ``secret``). The data source classes this session registered carry it (as class
  attributes pickled by value, see :func:`~pyspark_kudu.spark.api.registration.register`);
  clients of other applications forward to this one only if they were given the same
  credential (``spark.executorEnv.PYSPARK_KUDU_SECRET``).
- **TLS** (optional, :mod:`pyspark_kudu.rpc.tls`): with ``PYSPARK_KUDU_TLS_CERT/_KEY/_CA``
  in the driver's environment the service serves TLS, the authentication running inside
  it; its address then carries the CA's PEM, so the data source verifies the service
  whatever its workers' environment.
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

The service depends on a small interface, :class:`SessionBackend` (what a
:class:`~pyspark_kudu.spark.api.context.KuduContext` offers), never on the context itself;
the client side and the wire format live in
:mod:`~pyspark_kudu.spark.replication.session_client`.

Thread-safety: :class:`SessionService` is thread-safe (the backend's methods are, and each
stream's ledger entry is updated under its own lock).
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any, Protocol
from urllib.parse import quote

import pyarrow as pa

from pyspark_kudu.errors import InvalidArgumentError, KuduError, RowWriteError
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.rpc.tls import FROM_ENV, TlsConfig, TlsSetting, resolve_tls, server_kwargs
from pyspark_kudu.spark.api.scan_claims import ScanClaims
from pyspark_kudu.spark.host.dataplane import Staged, StagedRef, decode_staged
from pyspark_kudu.spark.replication.session_client import (
    ReadPoint,
    SessionAddress,
    TableInfo,
    encode_error,
)
from pyspark_kudu.spark.replication.write_service import WriteSummary

__all__ = [
    "FILTER_PUSHDOWN_CONF",
    "SERVICE_HOST_CONF",
    "SessionBackend",
    "SessionService",
    "StreamLedger",
]

_log = logging.getLogger(__name__)

FILTER_PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
SERVICE_HOST_CONF = "spark.kudu.sessionService.host"
_SHUTDOWN_WAIT_S = 10.0


class SessionBackend(Protocol):
    """What the service needs of the client it serves (a ``KuduContext`` offers it)."""

    @property
    def warehouse(self) -> str: ...

    @property
    def master_addresses(self) -> tuple[str, ...]: ...

    def describe(self, table: str) -> TableInfo: ...

    def expect_write(self) -> None: ...

    def expected_write_ended(self) -> None: ...

    def server_addresses(self) -> dict[str, str]: ...

    def commit_staged(self, table: str, staged: Sequence[Staged],
                      bad_rows: Sequence[str] = (), *, forwarded: bool = False
                      ) -> WriteSummary: ...

    def discard_staged(self, write_id: str) -> None: ...

    def read_points(self, table: str, tablet_ids: Sequence[str], *, forwarded: bool = False
                    ) -> dict[str, ReadPoint]: ...

    def execute_replication_actions(self, actions: Sequence[dict[str, Any]], *,
                                    forwarded: bool = False
                                    ) -> list[tuple[KuduError | None, float]]: ...


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


def _flight_server(service: SessionService, host: str, secret: bytes,
                   tls: TlsConfig | None) -> Any:
    """The Flight server of ``service`` on ``host`` (ephemeral port), started; over TLS if
    there is a ``tls`` configuration. gRPC is imported here: workers that only call the
    service need not load the server side."""
    import pyarrow.flight as fl

    from pyspark_kudu.rpc.auth import HmacServerAuthHandler, check_listen
    from pyspark_kudu.rpc.tls import location

    check_listen(host, secret)
    tls_kwargs = server_kwargs(tls, "the kudu session service")

    class SessionFlight(fl.FlightServerBase):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(location(f"{host}:0", tls),
                             auth_handler=HmacServerAuthHandler(secret), **tls_kwargs)

        def do_action(self, context: Any, action: fl.Action) -> Any:
            try:
                request = json.loads(action.body.to_pybytes() or b"{}")
                body = request.get("body") or {} if isinstance(request, dict) else {}
                result = service.dispatch(str(action.type), body)
                reply: dict[str, Any] = {"ok": True, "result": result}
            except KuduError as e:
                reply = {"ok": False, "error": encode_error(e)}
            except Exception as e:  # a bug or a Spark failure: report it rather than hang up
                _log.exception("kudu session service call failed")
                reply = {"ok": False, "error": encode_error(e)}
            yield fl.Result(json.dumps(reply, separators=(",", ":"), default=str).encode())

    return SessionFlight()


class SessionService:
    """Serves one :class:`KuduContext` to the ``kudu`` data source and to clients that
    forward to it (see the module docstring).

    Listens on ``host`` (default ``127.0.0.1``) only, on an ephemeral port, from
    construction until :meth:`close`; calls must authenticate with ``secret`` (the
    application's ``PYSPARK_KUDU_SECRET``; a random one if not given). ``tls``: serve TLS
    with this configuration, by default the environment's (``PYSPARK_KUDU_TLS_*``); None
    serves plain ``grpc+tcp``.

    Raises:
        InvalidArgumentError: ``host`` cannot be listened on, or a bad TLS configuration
            (naming the setting).
    """

    def __init__(self, kudu: SessionBackend, *, secret: str | None = None,
                 host: str = "127.0.0.1", tls: TlsSetting = FROM_ENV) -> None:
        self._kudu = kudu
        self.tls = resolve_tls(tls)
        self.secret = secret or secrets.token_hex(32)
        self._ledger = StreamLedger(kudu.warehouse)
        self._locks_guard = threading.Lock()
        self._stream_locks: dict[tuple[str, str], threading.Lock] = {}
        self._host = host
        self.scans = ScanClaims()
        try:
            self._server = _flight_server(self, host, self.secret.encode(), self.tls)
        except (OSError, pa.ArrowException) as e:
            raise InvalidArgumentError(
                f"{SERVICE_HOST_CONF}={host!r}: the kudu session service cannot listen there "
                f"({e}); name an address of this driver host") from e

    @property
    def address(self) -> SessionAddress:
        tls = self.tls
        return SessionAddress(self._host, int(self._server.port), self.secret,
                              tuple(self._kudu.master_addresses), tls is not None,
                              tls.ca_pem.decode("ascii", "replace") if tls else "")

    def close(self) -> None:
        """Stop listening. Calls in flight finish on their own: Flight's shutdown waits for
        them, so it runs on its own thread and this waits for it only a little."""
        t = threading.Thread(target=self._server.shutdown, name="kudu-session-shutdown",
                             daemon=True)
        t.start()
        t.join(timeout=_SHUTDOWN_WAIT_S)

    def __enter__(self) -> SessionService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- methods ---------------------------------------------------------------------------
    def dispatch(self, method: str, body: Mapping[str, Any]) -> Any:
        """Run one call (also usable in-process, e.g. by tests)."""
        match method:
            case "describe":
                if body.get("write"):  # a write's plan: its commit (or abort) follows
                    self._kudu.expect_write()
                return self.describe(str(body["table"])).to_dict()
            case "server_addresses":
                return self._kudu.server_addresses()
            case "commit":
                return asdict(self.commit(str(body["table"]), _refs(body), _bad(body),
                                          _ids(body)))
            case "abort":
                self._kudu.expected_write_ended()
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
                return {t: list(point) for t, point in points.items()}
            case "scan_register":
                self.scans.register(str(body["scan_id"]),
                                    [[str(h) for h in hs] for hs in body["hosts"]],
                                    [str(t) for t in body["tokens"]])
                return None
            case "scan_claim":
                j, token = self.scans.claim(str(body["scan_id"]), int(body["part"]),
                                            str(body["host"]))
                return [j, token]
            case "lead_heal":
                done = self._kudu.execute_replication_actions(
                    [dict(a) for a in body["actions"]], forwarded=True)
                return [[None if e is None else encode_error(e), took] for e, took in done]
        raise InvalidArgumentError(f"unknown session service method {method!r}")

    def describe(self, table: str) -> TableInfo:
        return self._kudu.describe(table)

    def commit(self, table: str, refs: Sequence[Staged], bad_rows: Sequence[str],
               write_ids: Sequence[str]) -> WriteSummary:
        try:
            return self._kudu.commit_staged(table, refs, bad_rows)
        finally:
            self._kudu.expected_write_ended()  # e.g. no rows: nothing was submitted
            self._discard(refs, write_ids)

    def _discard(self, refs: Sequence[Staged], write_ids: Sequence[str]) -> None:
        """Remove a committed or replayed write's staging, if it staged any file (a write
        whose batches all came inline did not: no cleanup job)."""
        if any(isinstance(r, StagedRef) for r in refs):
            self.abort(write_ids)

    def abort(self, write_ids: Sequence[str]) -> None:
        for wid in dict.fromkeys(write_ids):
            self._kudu.discard_staged(wid)

    def commit_stream(self, table: str, stream_id: str, batch_id: int,
                      refs: Sequence[Staged], bad_rows: Sequence[str],
                      write_ids: Sequence[str]) -> WriteSummary | None:
        """Commit micro-batch ``batch_id`` of ``stream_id`` unless already recorded."""
        with self._stream_lock(table, stream_id):
            last = self._ledger.last_batch(table, stream_id)
            if last is not None and batch_id <= last:
                _log.info("stream %s of table %s: batch %d already committed (last %d); "
                          "acknowledging the replay without writing", stream_id, table,
                          batch_id, last)
                self._kudu.expected_write_ended()
                self._discard(refs, write_ids)
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


def _refs(body: Mapping[str, Any]) -> list[Staged]:
    out = []
    for text in body.get("refs") or []:
        ref = decode_staged(base64.b64decode(text))
        if ref is None:
            raise InvalidArgumentError(
                "commit carries a value that is neither a staged-batch ref nor an inline batch")
        out.append(ref)
    return out


def _bad(body: Mapping[str, Any]) -> list[str]:
    return [str(r) for r in body.get("bad_rows") or []]


def _ids(body: Mapping[str, Any]) -> list[str]:
    return [str(w) for w in body.get("write_ids") or []]
