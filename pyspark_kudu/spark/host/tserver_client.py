"""Calls to a host's resident tablet server (:mod:`~pyspark_kudu.spark.host.tablet_server`).

Runs wherever a read runs: scan tasks on any executor, the driver, tools. Each call opens an
authenticated Flight client (:func:`pyspark_kudu.rpc.auth.connect`: one handshake, ~1 ms on
loopback) and closes it when the stream ends; clients are not kept between calls, so a
worker forked later never inherits a live gRPC channel. The one exception is a caller making
many calls in a row that owns a :class:`ServerClients` and closes it when done (a request
pulling its staged batches from other hosts' servers). With ``PYSPARK_KUDU_TLS_CA`` in this
process's environment (:mod:`pyspark_kudu.rpc.tls`) every call is made over TLS and the
server's certificate verified against that CA.

Errors: a server's :mod:`pyspark_kudu.errors` error comes back as the same class
(``ServiceUnavailableError`` for a lagging or failed replica, ``NotFoundError`` for a replica
or tablet server not on that host, ...); an unreachable server is a ``NetworkError``; a
refused credential or a failed TLS handshake an ``InvalidArgumentError`` (a
``CredentialError``).

Thread-safety: functions only; each call has its own client, except calls given one
:class:`ServerClients`, which must come from one thread.
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.flight as fl

from pyspark_kudu.errors import KuduError, NetworkError, ServiceUnavailableError, TimedOutError
from pyspark_kudu.rpc.auth import connect
from pyspark_kudu.rpc.tls import TlsHandshakeError, location, tls_from_env
from pyspark_kudu.schema import Predicate, Schema
from pyspark_kudu.spark.host.tserver_protocol import (
    FILES_KEY,
    PREFETCH_ACTION,
    REMOVE_STAGING_ACTION,
    SERVE_ACTION,
    FileRequest,
    ScanRequest,
    StagedRequest,
    decode_error,
)
from pyspark_kudu.tablet.scan import combine, rowset_batches

__all__ = ["ServerClients", "fetch_file", "fetch_file_buffers", "fetch_staged", "ping",
           "prefetch_copy",
           "read_shared", "remove_staged", "scan_remote", "scan_shared", "serve_remote"]

_CONNECT_TIMEOUT_S = 10.0


def _connect(address: str, secret: bytes, timeout_s: float) -> fl.FlightClient:
    """An authenticated client of the tablet server at ``address``; over TLS if this
    process has a TLS configuration (``PYSPARK_KUDU_TLS_*``)."""
    tls = tls_from_env()
    try:
        return connect(location(address, tls), secret, timeout_s=timeout_s,
                       tls_root_certs=tls.ca_pem if tls is not None else None)
    except TlsHandshakeError as e:
        raise TlsHandshakeError(f"tablet server {address}: {e}") from e


def _translate(e: Exception, address: str, what: str) -> KuduError:
    if isinstance(e, KuduError):
        return e
    if isinstance(e, fl.FlightUnavailableError):
        return NetworkError(f"tablet server {address} is unreachable during {what}: {e}")
    if isinstance(e, fl.FlightTimedOutError):
        return TimedOutError(f"tablet server {address} timed out during {what}: {e}")
    extra = getattr(e, "extra_info", None)
    return decode_error(extra, str(e), address)


class ServerClients:
    """Authenticated clients of tablet servers, one per address, opened when first needed
    and kept until :meth:`close`: for a caller making many calls in a row. Measured in a
    50M-row composite-key insert, where a client per staged batch pulled was opened and
    closed: closing them was 4% of the tablet servers' GIL-held time, opening them 0.5%.
    A client whose call failed is closed and not used again."""

    def __init__(self, secret: bytes) -> None:
        self.secret = secret
        self._clients: dict[str, fl.FlightClient] = {}
        self.opened = 0  # clients opened so far (tests, metrics)

    def get(self, address: str) -> fl.FlightClient:
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = _connect(address, self.secret,
                                                       _CONNECT_TIMEOUT_S)
            self.opened += 1
        return client

    def discard(self, address: str) -> None:
        client = self._clients.pop(address, None)
        if client is not None:
            client.close()

    def close(self) -> None:
        while self._clients:
            self._clients.popitem()[1].close()

    def __enter__(self) -> ServerClients:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stream(address: str, secret: bytes, ticket: bytes, what: str,
            timeout_s: float | None, clients: ServerClients | None = None
            ) -> Iterator[pa.RecordBatch]:
    """The batches of one ``DoGet``, on a client of its own (closed at the end) or on
    ``clients``' client of ``address`` (kept unless the call fails)."""
    client = _connect(address, secret, _CONNECT_TIMEOUT_S) if clients is None \
        else clients.get(address)
    ok = False
    try:
        try:
            reader = client.do_get(fl.Ticket(ticket), fl.FlightCallOptions(timeout=timeout_s))
            for chunk in reader:
                yield chunk.data
            ok = True
        except (pa.ArrowException, fl.FlightError) as e:
            raise _translate(e, address, what) from e
    finally:
        if clients is None:
            client.close()
        elif not ok:
            clients.discard(address)


def scan_remote(address: str, secret: bytes, req: ScanRequest, *,
                timeout_s: float | None = None) -> Iterator[pa.RecordBatch]:
    """The batches of ``req`` read by the tablet server at ``address`` (``host:port``).

    Raises:
        NetworkError: the server is unreachable (before or during the stream).
        KuduError: the server's own error, rebuilt (e.g. ServiceUnavailableError).
    """
    yield from _stream(address, secret, req.to_ticket(), f"a scan of {req.tablet_id}",
                       timeout_s)


def scan_shared(address: str, secret: bytes, req: ScanRequest, *,
                timeout_s: float | None = None) -> Iterator[pa.RecordBatch]:
    """The batches of ``req`` (``share_files`` set: the caller runs on that server's host),
    the rowset files the server shared read here (:func:`read_shared`), the rest (its
    MemRowSet rows) streamed.

    Raises:
        NetworkError: the server is unreachable.
        KuduError: the server's own error, rebuilt; ServiceUnavailableError when a shared
            file is not readable here (before any batch).
    """
    what = f"a scan of {req.tablet_id}"
    client = _connect(address, secret, _CONNECT_TIMEOUT_S)
    files: Iterator[pa.RecordBatch] = iter(())
    try:
        try:
            reader = client.do_get(fl.Ticket(req.to_ticket()),
                                   fl.FlightCallOptions(timeout=timeout_s))
            described = (reader.schema.metadata or {}).get(FILES_KEY)
            if described is not None:
                files = read_shared(described, req.columns, req.predicates, req.batch_rows)
            for chunk in reader:
                yield chunk.data.replace_schema_metadata(None)
        except (pa.ArrowException, fl.FlightError) as e:
            raise _translate(e, address, what) from e
    finally:
        client.close()
    try:
        yield from files
    finally:
        close = getattr(files, "close", None)
        if close is not None:
            close()


def fetch_file(address: str, secret: bytes, req: FileRequest, *,
               timeout_s: float | None = None) -> Iterator[bytes]:
    """The bytes of ``req``'s file range, in chunks, from the tablet server at ``address``."""
    for batch in _stream(address, secret, req.to_ticket(), f"a file stream of {req.path}",
                         timeout_s):
        yield from batch.column(0).to_pylist()


def fetch_file_buffers(address: str, secret: bytes, req: FileRequest, *,
                       timeout_s: float | None = None) -> Iterator[pa.Buffer]:
    """:func:`fetch_file` without copying: each chunk as the Arrow buffer it arrived in
    (valid while the caller holds it), for streaming a file to disk (tablet copy)."""
    yield from _chunks(address, secret, req.to_ticket(), f"a file stream of {req.path}",
                       timeout_s)


def _chunks(address: str, secret: bytes, ticket: bytes, what: str,
            timeout_s: float | None, clients: ServerClients | None = None
            ) -> Iterator[pa.Buffer]:
    """The ``chunk`` values of a file-like stream, as the Arrow buffers they arrived in."""
    for batch in _stream(address, secret, ticket, what, timeout_s, clients):
        col = batch.column(0)
        for k in range(len(col)):
            yield col[k].as_buffer()


def fetch_staged(address: str, secret: bytes, req: StagedRequest, *,
                 timeout_s: float | None = None, clients: ServerClients | None = None
                 ) -> bytes:
    """A staged batch (or log entry) from the tablet server of its host, at ``address``
    (over ``clients``' client of that server if given, else a client of its own).

    Raises:
        NetworkError: the server is unreachable.
        NotFoundError: the server's host does not hold it intact.
    """
    return b"".join(_chunks(address, secret, req.to_ticket(), "a staged batch transfer",
                            timeout_s, clients))


def serve_remote(address: str, secret: bytes, body: bytes) -> bytes:
    """Have this host's resident tablet server serve a round task (``body`` and the answer
    are :func:`~pyspark_kudu.spark.host.round_tasks.serve_host`'s encoding).

    Raises:
        NetworkError: the server is unreachable.
        KuduError: the server's own error, rebuilt.
    """
    client = _connect(address, secret, _CONNECT_TIMEOUT_S)
    try:
        (res,) = list(client.do_action(fl.Action(SERVE_ACTION, body)))
        out: bytes = res.body.to_pybytes()
        return out
    except (pa.ArrowException, fl.FlightError) as e:
        raise _translate(e, address, "serving a round task") from e
    finally:
        client.close()


def prefetch_copy(address: str, secret: bytes, ts_uuid: str, root: str | None,
                  manifest: bytes, index: int, *, timeout_s: float = _CONNECT_TIMEOUT_S
                  ) -> bool:
    """Have the resident tablet server at ``address`` start fetching the served tablet copy
    ``manifest`` (an ``INSTALL_COPY`` entry's data) into tablet server ``ts_uuid``'s replica
    (data root ``root``, None: the host's), to be installed at log index ``index``; returns
    whether it started (see :func:`~pyspark_kudu.spark.host.copy_fetch.prefetch_served`).

    Raises:
        NetworkError: the server is unreachable.
        KuduError: the server's own refusal, rebuilt.
    """
    body = json.dumps({"ts_uuid": ts_uuid, "root": root, "index": index,
                       "manifest": manifest.decode("latin-1")}).encode()
    answer = _json_action(address, secret, PREFETCH_ACTION, body, timeout_s,
                          "prefetching a tablet copy")
    return bool(answer["started"])


def remove_staged(address: str, secret: bytes, write_ids: Sequence[str], root: str | None,
                  data_root_conf: str | None = None, *,
                  timeout_s: float = _CONNECT_TIMEOUT_S) -> int:
    """Have the resident tablet server at ``address`` remove the staging directories of
    ``write_ids`` on its host (data root ``root``, None: the host's, or ``data_root_conf``);
    returns how many it removed.

    Raises:
        NetworkError: the server is unreachable.
        KuduError: the server's own refusal (a write id that is not a plain name), rebuilt.
    """
    body = json.dumps({"write_ids": list(write_ids), "root": root,
                       "data_root_conf": data_root_conf}).encode()
    answer = _json_action(address, secret, REMOVE_STAGING_ACTION, body, timeout_s,
                          "removing staged batches")
    return int(answer["removed"])


def ping(address: str, secret: bytes, *, timeout_s: float = _CONNECT_TIMEOUT_S
         ) -> dict[str, Any]:
    """The server's own description (address, host, default data root, scans served)."""
    return _json_action(address, secret, "ping", b"", timeout_s, "ping")


def _json_action(address: str, secret: bytes, action: str, body: bytes, timeout_s: float,
                 what: str) -> dict[str, Any]:
    """The JSON answer of the server at ``address`` to one ``DoAction``."""
    client = _connect(address, secret, timeout_s)
    try:
        (res,) = list(client.do_action(fl.Action(action, body),
                                       fl.FlightCallOptions(timeout=timeout_s)))
        return dict(json.loads(res.body.to_pybytes()))
    except (pa.ArrowException, fl.FlightError) as e:
        raise _translate(e, address, what) from e
    finally:
        client.close()


def read_shared(described: bytes, columns: Sequence[str] | None,
                predicates: Sequence[Predicate], batch_rows: int
                ) -> Iterator[pa.RecordBatch]:
    """The task's side of a shared scan (:mod:`~pyspark_kudu.spark.host.shared_scan`):
    opens every file ``described`` (a ``FILES_KEY`` value) names and removes their
    directory *now*, then returns an iterator reading them with the
    scan's ``columns`` and ``predicates``, ``batch_rows`` rows at most per batch.

    Raises:
        ServiceUnavailableError: a file could not be opened here (nothing was read).
    """
    d = json.loads(described)
    opened: list[tuple[pa.NativeFile, Mapping[str, Any]]] = []
    try:
        for f in d["files"]:
            opened.append((pa.OSFile(f["path"]), f))
    except OSError as e:
        for fh, _ in opened:
            fh.close()
        raise ServiceUnavailableError(
            f"the rowset files a tablet server shared are not readable here ({e})") from e
    finally:
        shutil.rmtree(d["dir"], ignore_errors=True)
    return _read(opened, Schema.from_dict(d["schema"]), int(d["snapshot"]), columns,
                 predicates, batch_rows)


def _read(opened: list[tuple[pa.NativeFile, Mapping[str, Any]]], schema: Schema,
          snapshot: int, columns: Sequence[str] | None, predicates: Sequence[Predicate],
          batch_rows: int) -> Iterator[pa.RecordBatch]:
    try:
        cols = tuple(schema.names if columns is None else columns)
        user = combine([p.bind(schema).to_expression(schema) for p in predicates])
        fmt = ds.ParquetFileFormat()
        for fh, f in opened:
            dead = np.frombuffer(base64.b64decode(f["dead"]), dtype="<i8")
            yield from rowset_batches(fmt.make_fragment(fh), schema, cols, user, snapshot,
                                      int(f["max_ts"]), f["min_end"], dead, batch_rows)
    finally:
        for fh, _ in opened:
            fh.close()
