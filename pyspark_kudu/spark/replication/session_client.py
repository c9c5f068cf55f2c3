"""The client of a driver's session service (:mod:`~pyspark_kudu.spark.api.session_service`).

Callers: the ``kudu`` data source in Spark's Python workers (``describe``, ``commit``, ...)
and other clients forwarding work to the holder of a tablet's leadership lease
(``lead_commit``, ``lead_read``, ``lead_heal``, :mod:`~.lease_keeper`). The protocol,
shared with the service: Arrow Flight, authenticated like every Flight service of the
project (:mod:`pyspark_kudu.rpc.auth`: HMAC challenge-response over the application's
credential, ``PYSPARK_KUDU_SECRET``; no secret or reusable token on the wire); one
``DoAction`` per call, its type the method, its body JSON, its one result the JSON reply
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {type, message, family}}``.
With TLS (:mod:`pyspark_kudu.rpc.tls`) the address says so (``tls``) and carries the PEM of
the CA that signed the service's certificate (``tls_ca``, public, not in
:meth:`SessionAddress.public_dict`); a client verifies the service against that CA, else
against its own ``PYSPARK_KUDU_TLS_CA``, and a client configured with TLS never connects in
clear, whatever the address says.
Errors are rebuilt as the same :mod:`pyspark_kudu.errors` class (``RowWriteError`` with its
rows); anything else becomes a ``RemoteError`` naming the original type.

Thread-safety: :class:`SessionClient` holds no connection between calls and may be shared.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark_kudu import errors
from pyspark_kudu.errors import (
    CredentialError,
    InvalidArgumentError,
    KuduError,
    NetworkError,
    RemoteError,
    RowWriteError,
    ServiceUnavailableError,
    SessionUnreachableError,
    UsageError,
)
from pyspark_kudu.schema import Schema
from pyspark_kudu.spark.replication.write_summary import WriteSummary

__all__ = [
    "ReadPoint",
    "SessionAddress",
    "SessionClient",
    "TableInfo",
    "TabletInfo",
    "decode_error",
    "encode_error",
    "read_point_replicas",
]

_CONNECT_TIMEOUT_S = 10.0
_MAX_FOREIGN_MESSAGE = 4000

ReadPoint = tuple[str, int, "int | None"]
"""A linearizable read point of one tablet: the leader replica, the index of an empty entry
committed after the read began, and that entry's term (None from an older peer: then only
the leader replica may serve the read)."""


def read_point_replicas(leader: str, voters: Sequence[str], term: int | None
                        ) -> list[tuple[str, bool]]:
    """The replicas that may serve a linearizable read at a point of ``leader`` (each with
    whether it is the leader), in the order a scan tries them: the leader replica first;
    with the point's ``term``, the other ``voters`` too -- any replica whose log holds that
    entry at that term has the committed prefix (Log Matching), so a failed or unreachable
    leader replica does not fail the read. Without a term only the leader may serve it."""
    others = [(v, False) for v in voters if v != leader] if term is not None else []
    return [(leader, True), *others]


@dataclass(frozen=True)
class SessionAddress:
    """Where a session service listens, its secret (kept out of ``repr``), the master
    addresses of its KuduContext (to check ``kudu.master`` before any call), whether it
    serves TLS and the PEM of the CA its certificate is verified against."""

    host: str
    port: int
    secret: str = field(repr=False)
    masters: tuple[str, ...] = ()
    tls: bool = False
    tls_ca: str = field(default="", repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = {"host": self.host, "port": self.port, "secret": self.secret,
               "masters": list(self.masters)}
        if self.tls:
            out.update(tls=True, tls_ca=self.tls_ca)
        return out

    def public_dict(self) -> dict[str, Any]:
        """Everything but the secret (and the CA: other clients verify the service against
        their own): what other clients learn through the master's lease table (they call
        the service with their own application's credential)."""
        out = {"host": self.host, "port": self.port, "masters": list(self.masters)}
        if self.tls:
            out["tls"] = True
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SessionAddress:
        return cls(str(d["host"]), int(d["port"]), str(d["secret"]),
                   tuple(str(m) for m in d.get("masters") or ()), bool(d.get("tls")),
                   str(d.get("tls_ca") or ""))


@dataclass(frozen=True)
class TabletInfo:
    """One tablet as :meth:`SessionClient.describe` reports it.

    ``replicas``: the voters, the replicas a scan may read. ``leader`` is the replica the
    master lists as leader ("" if none reported a commit yet)
    and ``known_commit`` the commit index reported with it (None when unknown): a scan of
    the leader replica at that index sees every write this client committed.
    ``commit_term``: that entry's term, when the describing client leads the tablet (a
    follower holding the entry at that term may then serve the scan too).
    """

    tablet_id: str
    replicas: tuple[str, ...]
    leader: str = ""
    known_commit: int | None = None
    commit_term: int | None = None


@dataclass(frozen=True)
class TableInfo:
    """What the data source needs to plan a read or a write of one table."""

    table: str
    schema: Schema
    partition_schema: Mapping[str, Any]
    tablets: tuple[TabletInfo, ...]
    #: uuid -> (host, data root or None, resident tablet server address or "", location)
    tservers: Mapping[str, tuple[str, str | None, str, str | None]]
    staging_root: str | None  # the warehouse in local mode; None: each host's data root
    data_root_conf: str | None  # spark.kudu.dataRoot of the application, if set
    filter_pushdown: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table, "schema": self.schema.to_dict(),
            "partition_schema": dict(self.partition_schema),
            "tablets": [{"tablet_id": t.tablet_id, "replicas": list(t.replicas),
                         "leader": t.leader, "known_commit": t.known_commit,
                         "commit_term": t.commit_term}
                        for t in self.tablets],
            "tservers": {u: list(v) for u, v in self.tservers.items()},
            "staging_root": self.staging_root,
            "data_root_conf": self.data_root_conf, "filter_pushdown": self.filter_pushdown,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TableInfo:
        return cls(
            table=str(d["table"]), schema=Schema.from_dict(d["schema"]),
            partition_schema=dict(d["partition_schema"]),
            tablets=tuple(TabletInfo(str(t["tablet_id"]), tuple(t["replicas"]),
                                     str(t.get("leader") or ""), t.get("known_commit"),
                                     t.get("commit_term"))
                          for t in d["tablets"]),
            tservers={str(u): (str(v[0]), None if v[1] is None else str(v[1]),
                               str(v[2]) if len(v) > 2 else "",
                               None if len(v) < 4 or v[3] is None else str(v[3]))
                      for u, v in d["tservers"].items()},
            staging_root=d.get("staging_root"),
            data_root_conf=d.get("data_root_conf"),
            filter_pushdown=bool(d.get("filter_pushdown")),
        )


# == wire format ================================================================================


def encode_error(e: BaseException) -> dict[str, Any]:
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


def decode_error(d: Mapping[str, Any]) -> KuduError:
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
            InvalidArgumentError: the service refused the secret, the TLS handshake failed
                (``TlsHandshakeError``), or the TLS configuration is bad or missing.
        """
        import pyarrow as pa
        import pyarrow.flight as fl

        from pyspark_kudu.rpc.auth import connect
        from pyspark_kudu.rpc.tls import TlsHandshakeError

        a = self.address
        location, roots = _target(a)
        try:
            client = connect(location, a.secret.encode(), timeout_s=_CONNECT_TIMEOUT_S,
                             tls_root_certs=roots)
        except TlsHandshakeError as e:
            raise TlsHandshakeError(f"the kudu session service at {a.host}:{a.port}: {e}"
                                    ) from e
        except NetworkError as e:
            raise SessionUnreachableError(
                f"the kudu session service at {a.host}:{a.port} is not reachable ({e}): the "
                f"KuduContext that registered format('kudu') may be closed; create a new "
                f"one, and call the data source from its application") from e
        except CredentialError as e:
            raise CredentialError(
                f"the kudu session service at {a.host}:{a.port} refused the call: wrong "
                f"secret (only the data source its KuduContext registered, and clients of "
                f"applications sharing its PYSPARK_KUDU_SECRET, may call it): {e}") from e
        payload = json.dumps({"body": dict(body)}, separators=(",", ":"), default=str)
        try:
            # No deadline: a commit lasts as long as its replication rounds.
            results = list(client.do_action(fl.Action(method, payload.encode())))
            reply = json.loads(results[0].body.to_pybytes()) if results else {}
        except (pa.ArrowException, fl.FlightError, ValueError, IndexError) as e:
            raise ServiceUnavailableError(
                f"the call to the kudu session service at {a.host}:{a.port} broke during "
                f"{method!r} ({e}): its outcome is unknown (the KuduContext serving it may "
                f"have been closed)") from e
        finally:
            client.close()
        if reply.get("ok"):
            return reply.get("result")
        raise decode_error(reply.get("error") or {})

    def describe(self, table: str, *, write: bool = False) -> TableInfo:
        """What planning a read or, with ``write``, a write of ``table`` needs. ``write``
        announces the write (its commit or abort follows): the service's settle round
        waits for it (``ReplicationService.expect_write``)."""
        body: dict[str, Any] = {"table": table}
        if write:
            body["write"] = True
        return TableInfo.from_dict(self.call("describe", body))

    def server_addresses(self) -> dict[str, str]:
        """The tablet servers' current addresses (executors replaced since a scan was
        planned run new resident servers on new ports)."""
        return {str(k): str(v) for k, v in self.call("server_addresses", {}).items()}

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

    def read_points(self, table: str, tablet_ids: Sequence[str]) -> dict[str, ReadPoint]:
        """Per tablet: the leader replica and an index committed after this call began
        (asked of the leading client if another one leads)."""
        return self._points("read_points", table, tablet_ids)

    def register_scan(self, scan_id: str, hosts: Sequence[Sequence[str]],
                      tokens: Sequence[str]) -> None:
        """Register a ``format("kudu")`` scan's tokens (one per tablet) and their replicas'
        hosts, for :meth:`claim_tablet` (:mod:`pyspark_kudu.spark.api.scan_claims`)."""
        self.call("scan_register", {"scan_id": scan_id, "hosts": [list(h) for h in hosts],
                                    "tokens": list(tokens)})

    def claim_tablet(self, scan_id: str, part: int, host: str) -> tuple[int, str]:
        """The tablet (index, token) partition ``part`` of a registered scan reads, asked
        by a task running on ``host``."""
        out = self.call("scan_claim", {"scan_id": scan_id, "part": part, "host": host})
        return int(out[0]), str(out[1])

    def lead_commit(self, table: str, refs: Sequence[bytes], bad_rows: Sequence[str] = ()
                    ) -> WriteSummary:
        """Have this service's client replicate staged batches of tablets it leads."""
        return _summary(self.call("lead_commit", {"table": table, "refs": _b64(refs),
                                                  "bad_rows": list(bad_rows)}))

    def lead_read(self, table: str, tablet_ids: Sequence[str]) -> dict[str, ReadPoint]:
        """Per tablet: the leader replica and an index committed after this call began."""
        return self._points("lead_read", table, tablet_ids)

    def _points(self, method: str, table: str, tablet_ids: Sequence[str]
                ) -> dict[str, ReadPoint]:
        out = self.call(method, {"table": table, "tablet_ids": list(tablet_ids)})
        return {str(t): (str(p[0]), int(p[1]), None if len(p) < 3 or p[2] is None
                         else int(p[2])) for t, p in out.items()}

    def lead_heal(self, actions: Sequence[Mapping[str, Any]]
                  ) -> list[tuple[KuduError | None, float]]:
        """Carry out replication actions on tablets this service's client leads."""
        out = self.call("lead_heal", {"actions": [dict(a) for a in actions]})
        return [(None if err is None else decode_error(err), float(took))
                for err, took in out]


def _target(a: SessionAddress) -> tuple[str, bytes | None]:
    """The Flight location of ``a`` and the PEM roots to verify it against (None: plain).

    Raises:
        CredentialError: ``a`` serves TLS and no CA is known to verify it.
        InvalidArgumentError: a bad ``PYSPARK_KUDU_TLS_*`` configuration.
    """
    from pyspark_kudu.rpc.tls import CA_ENV, tls_from_env

    own = tls_from_env()
    if not a.tls and own is None:
        return f"grpc+tcp://{a.host}:{a.port}", None
    roots = a.tls_ca.encode() if a.tls_ca else own.ca_pem if own is not None else None
    if roots is None:
        raise CredentialError(
            f"the kudu session service at {a.host}:{a.port} serves TLS, but this process "
            f"has no CA to verify it: set {CA_ENV}")
    return f"grpc+tls://{a.host}:{a.port}", roots


def _b64(refs: Sequence[bytes]) -> list[str]:
    return [base64.b64encode(r).decode() for r in refs]


def _summary(d: Mapping[str, Any]) -> WriteSummary:
    return WriteSummary(int(d["rows_written"]), int(d["row_errors"]), int(d["tablets"]))
