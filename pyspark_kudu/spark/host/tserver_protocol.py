"""What a resident tablet server is asked, on the wire: scan and file-stream tickets.

Both kinds of request are Arrow Flight ``DoGet`` calls whose ticket is a small JSON
document; answers are Arrow record batch streams (DESIGN §1: reads and file streams go to a
host's resident tablet server, :mod:`~pyspark_kudu.spark.host.tablet_server`).

- ``{"kind": "scan", ...}``: :class:`ScanRequest`. Predicate values travel as Arrow IPC
  (one single-column batch per predicate), so timestamps, decimals, dates and binary keep
  their exact types; nothing is ever unpickled.
- ``{"kind": "file", ...}``: :class:`FileRequest`, a byte range of one file under a
  tablet's directory, streamed as batches of one ``chunk`` binary column.
- ``{"kind": "staged", ...}``: :class:`StagedRequest`, a write batch staged on the server's
  host (or a log entry of one of its replicas) that a round's replica on another host needs:
  the destination's server pulls it from here, streamed like a file
  (:mod:`~pyspark_kudu.spark.host.round_tasks`).

Errors: the server raises a Flight error whose ``extra_info`` is ``{"type", "message"}``
JSON; :func:`decode_flight_error` rebuilds the same :mod:`pyspark_kudu.errors` class.

Thread-safety: immutable values and pure functions.
"""

from __future__ import annotations

import base64
import json
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from pyspark_kudu import errors
from pyspark_kudu.errors import InvalidArgumentError, KuduError, RemoteError, UsageError
from pyspark_kudu.schema import Predicate, PredicateOp

__all__ = [
    "ADDRESS_ENV",
    "PREFETCH_ACTION",
    "REMOVE_STAGING_ACTION",
    "SERVE_ACTION",
    "FileRequest",
    "ScanRequest",
    "StagedRequest",
    "decode_error",
    "decode_predicates",
    "encode_error",
    "encode_predicates",
    "parse_ticket",
]

#: Set by the executor's daemon for every worker it forks: ``host:port`` of this host's
#: resident tablet server (absent when none runs, e.g. no credential was configured).
ADDRESS_ENV = "PYSPARK_KUDU_TSERVER_ADDRESS"

#: ``DoAction`` type of a round task's requests, served by its own host's tablet server
#: (:func:`~pyspark_kudu.spark.host.tserver_client.serve_remote`).
SERVE_ACTION = "serve"
#: ``DoAction`` type that starts fetching a served tablet copy into a replica of the
#: server's host ahead of its install round
#: (:func:`~pyspark_kudu.spark.host.tserver_client.prefetch_copy`).
PREFETCH_ACTION = "prefetch_copy"
#: ``DoAction`` type that removes finished writes' staging directories on the server's host
#: (:func:`~pyspark_kudu.spark.host.tserver_client.remove_staged`): cleanup needs no Spark
#: task, so it never holds an executor slot a next write's round is waiting for.
REMOVE_STAGING_ACTION = "remove_staging"


def _ipc(batch: pa.RecordBatch) -> str:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return base64.b64encode(sink.getvalue().to_pybytes()).decode()


def _unipc(text: str) -> pa.RecordBatch:
    table = pa.ipc.open_stream(base64.b64decode(text)).read_all()
    return table.combine_chunks().to_batches()[0] if table.num_rows else pa.record_batch(
        [pa.array([], type=table.schema.field(0).type)], schema=table.schema)


def encode_predicates(preds: Sequence[Predicate], types: Mapping[str, pa.DataType] | None = None
                      ) -> list[dict[str, Any]]:
    """Predicates as JSON-safe dicts; values as Arrow IPC typed by ``types`` (column ->
    type) when given, else inferred by Arrow."""
    out: list[dict[str, Any]] = []
    for p in preds:
        d: dict[str, Any] = {"column": p.column, "op": p.op.value}
        if p.op is PredicateOp.IN:
            values = list(p.value)
        elif p.op in (PredicateOp.IS_NULL, PredicateOp.IS_NOT_NULL):
            values = []
        else:
            values = [p.value]
        typ = (types or {}).get(p.column)
        arr = pa.array(values, type=typ) if typ is not None else pa.array(values)
        d["values"] = _ipc(pa.record_batch([arr], names=["v"]))
        out.append(d)
    return out


def decode_predicates(items: Sequence[Mapping[str, Any]]) -> list[Predicate]:
    out = []
    for d in items:
        op = PredicateOp(str(d["op"]))
        values = _unipc(str(d["values"])).column(0).to_pylist()
        if op is PredicateOp.IN:
            out.append(Predicate(str(d["column"]), op, tuple(values)))
        elif op in (PredicateOp.IS_NULL, PredicateOp.IS_NOT_NULL):
            out.append(Predicate(str(d["column"]), op))
        else:
            out.append(Predicate(str(d["column"]), op, values[0]))
    return out


#: Schema-metadata key of a shared scan's answer (``ScanRequest.share_files``): the JSON
#: description of the rowset files the server linked for the client
#: (:mod:`~pyspark_kudu.spark.host.shared_scan`).
FILES_KEY = b"pyspark_kudu.shared_files"


@dataclass(frozen=True)
class ScanRequest:
    """One replica scan: which tablet server (its uuid, and the data root the client knows
    for it, else the server host's own), which tablet, columns, predicates, and the read
    point (``snapshot``, or everything committed up to ``known_commit``; ``require_index``:
    the replica's log must reach it, a linearizable read). ``known_commit`` binds the
    replica when ``trusted`` (it is the leader's) or when its log holds that entry at
    ``commit_term`` (see :func:`~pyspark_kudu.spark.host.replica_apply.catch_up`).
    ``share_files``: the client runs on the server's host and reads the rowset files itself
    (:mod:`~pyspark_kudu.spark.host.shared_scan`)."""

    ts_uuid: str
    tablet_id: str
    columns: tuple[str, ...] | None
    predicates: tuple[Predicate, ...] = ()
    snapshot: int | None = None
    known_commit: int | None = None
    require_index: int | None = None
    batch_rows: int = 65536
    root: str | None = None
    data_root_conf: str | None = None
    types: Mapping[str, pa.DataType] = field(default_factory=dict, compare=False, repr=False)
    trusted: bool = False
    commit_term: int | None = None
    share_files: bool = False

    def to_ticket(self) -> bytes:
        return json.dumps({
            "kind": "scan", "ts_uuid": self.ts_uuid, "tablet_id": self.tablet_id,
            "columns": None if self.columns is None else list(self.columns),
            "predicates": encode_predicates(self.predicates, self.types),
            "snapshot": self.snapshot, "known_commit": self.known_commit,
            "require_index": self.require_index, "batch_rows": self.batch_rows,
            "root": self.root, "data_root_conf": self.data_root_conf,
            "trusted": self.trusted, "commit_term": self.commit_term,
            "share_files": self.share_files,
        }).encode()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ScanRequest:
        cols = d.get("columns")
        return cls(
            ts_uuid=str(d["ts_uuid"]), tablet_id=str(d["tablet_id"]),
            columns=None if cols is None else tuple(str(c) for c in cols),
            predicates=tuple(decode_predicates(d.get("predicates") or [])),
            snapshot=_opt_int(d.get("snapshot")), known_commit=_opt_int(d.get("known_commit")),
            require_index=_opt_int(d.get("require_index")),
            batch_rows=int(d.get("batch_rows") or 65536),
            root=_opt_str(d.get("root")), data_root_conf=_opt_str(d.get("data_root_conf")),
            trusted=d.get("trusted") is True, commit_term=_opt_int(d.get("commit_term")),
            share_files=d.get("share_files") is True)


@dataclass(frozen=True)
class FileRequest:
    """Bytes ``[offset, offset + length)`` (``length`` None: to the end) of ``path``, a
    relative path under the tablet's directory on tablet server ``ts_uuid``."""

    ts_uuid: str
    tablet_id: str
    path: str
    offset: int = 0
    length: int | None = None
    root: str | None = None
    data_root_conf: str | None = None

    def __post_init__(self) -> None:
        norm = posixpath.normpath(self.path)
        if (not self.path or self.path.startswith("/") or norm.startswith("..")
                or norm == "." or "\\" in self.path):
            raise InvalidArgumentError(
                f"file request path {self.path!r} is not a relative path inside the tablet "
                f"directory")
        if self.offset < 0 or (self.length is not None and self.length < 0):
            raise InvalidArgumentError(
                f"file request range offset={self.offset} length={self.length} is negative")

    def to_ticket(self) -> bytes:
        return json.dumps({"kind": "file", "ts_uuid": self.ts_uuid,
                           "tablet_id": self.tablet_id, "path": self.path,
                           "offset": self.offset, "length": self.length, "root": self.root,
                           "data_root_conf": self.data_root_conf}).encode()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FileRequest:
        return cls(str(d["ts_uuid"]), str(d["tablet_id"]), str(d["path"]),
                   int(d.get("offset") or 0), _opt_int(d.get("length")),
                   _opt_str(d.get("root")), _opt_str(d.get("data_root_conf")))


#: The only relative paths a :class:`StagedRequest` may name under a data root: staged write
#: batches, and log entries of a replica (``dataplane.wal_ref``).
STAGED_PREFIXES = ("staging/", "wal/")


@dataclass(frozen=True)
class StagedRequest:
    """One staged batch or log entry, named by its encoded
    :class:`~pyspark_kudu.spark.host.dataplane.StagedRef` (the JSON after the ref's magic);
    the server checks its size and CRC32C before sending it."""

    ref: str

    def __post_init__(self) -> None:
        try:
            path = str(json.loads(self.ref)[2])
        except (ValueError, IndexError, TypeError) as e:
            raise InvalidArgumentError(f"staged request ref {self.ref[:200]!r}: {e}") from e
        norm = posixpath.normpath(path)
        if (norm != path or not path.startswith(STAGED_PREFIXES) or "\\" in path
                or ".." in path.split("/")):
            raise InvalidArgumentError(
                f"staged request path {path!r} is not a staged batch or log entry")

    def to_ticket(self) -> bytes:
        return json.dumps({"kind": "staged", "ref": self.ref}).encode()


def parse_ticket(raw: bytes) -> ScanRequest | FileRequest | StagedRequest:
    """The request a ticket carries.

    Raises:
        InvalidArgumentError: not a ticket of this protocol.
    """
    try:
        d = json.loads(raw)
        kind = d.get("kind")
        if kind == "scan":
            return ScanRequest.from_dict(d)
        if kind == "file":
            return FileRequest.from_dict(d)
        if kind == "staged":
            return StagedRequest(str(d["ref"]))
    except (ValueError, KeyError, TypeError, AttributeError, pa.ArrowException) as e:
        raise InvalidArgumentError(f"unreadable tablet server ticket: {e}") from e
    raise InvalidArgumentError(f"unknown tablet server request kind {kind!r}")


def encode_error(e: BaseException) -> bytes:
    return json.dumps({"type": type(e).__name__, "message": str(e)[:4000],
                       "family": "usage" if isinstance(e, UsageError) else "remote"}).encode()


def decode_error(extra: bytes | None, fallback: str, address: str) -> KuduError:
    """The error a server's ``extra_info`` describes, as the same class where possible."""
    try:
        d = json.loads(extra or b"{}")
    except ValueError:
        d = {}
    name, msg = str(d.get("type", "")), str(d.get("message", "") or fallback)
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, KuduError):
        try:
            return cls(msg)
        except TypeError:
            pass
    base: type[KuduError] = InvalidArgumentError if d.get("family") == "usage" else RemoteError
    return base(f"{name or 'error'} from tablet server {address}: {msg}")


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _opt_str(v: Any) -> str | None:
    return None if v is None else str(v)
