"""A scan task's side of a read: the closest eligible replica, local or remote (DESIGN §1).

Both read paths (``KuduContext.read_table`` and ``spark.read.format("kudu")``) plan one
:class:`TabletScan` per tablet and run :func:`read_tablet` in the task, wherever Spark put
it -- kudu-spark's scan token and scanner (STYLE.md):

1. **Order** (seed "Location-aware clients", :func:`~pyspark_kudu.master.locations.closeness`):
   a replica on the task's own host first (Kudu's client rule: only if their locations agree
   or one has none), then the task host's location, then the longest common location
   prefix; ties by a hash of (task host, tablet server), so tasks on different hosts spread
   over different replicas, and the same task retried asks the same one first.
2. **Local or remote**: a replica on this host whose data root opens here and whose
   ``instance`` file names its tablet server is read by this process: its host's resident
   tablet server plans the scan and shares the rowset files, which the task decodes itself
   (:mod:`~.shared_scan`; without a resident server the whole scan runs here). Any other
   replica is streamed by its host's resident tablet server (:mod:`~.tablet_server`). Both
   calls are authenticated with the cluster's credential from this worker's environment.
3. **Read-your-writes**: the leader replica is read up to the commit index the client
   knows (its log is the leader's log). A follower's log may hold uncommitted entries up to
   that index, so it is read *at* that index as a snapshot; it first learns that index is
   committed if its log holds that entry at the term the planner saw (``commit_term``: Log
   Matching), so a write is readable from any replica that made it durable even when the
   leader's host is gone. A follower without the entry refuses
   (``ServiceUnavailableError``) and the next replica is tried. A linearizable read
   (``require``) names only the leader replica and needs its log to reach the read point.
4. **Failing over**: a replica that refuses, is missing, lags, or whose server is
   unreachable *before its first batch* is skipped for the next one; the task fails only
   when none serves, with every replica's reason. A stream that breaks after its first
   batch fails the task (Spark retries it whole, so no row is returned twice).

Thread-safety: functions only.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace

import pyarrow as pa

from pyspark_kudu.errors import (
    CredentialError,
    InvalidArgumentError,
    KuduError,
    NetworkError,
    NotFoundError,
    ServiceUnavailableError,
    TimedOutError,
)
from pyspark_kudu.master.locations import closeness
from pyspark_kudu.rpc.auth import SECRET_ENV, secret_from_env
from pyspark_kudu.schema import Predicate
from pyspark_kudu.spark.host.identity import current_host, local_data_root, verify_instance
from pyspark_kudu.spark.host.replica_scan import scan_replica
from pyspark_kudu.spark.host.tserver_protocol import ScanRequest

__all__ = ["ReplicaChoice", "TabletScan", "order_replicas", "read_tablet",
           "read_tablet_refreshing"]

_SKIPPABLE = (ServiceUnavailableError, NotFoundError, NetworkError, TimedOutError, OSError)


@dataclass(frozen=True)
class ReplicaChoice:
    """A replica a scan may read: its tablet server, the data root the client knows for it
    (local-mode virtual servers; None: the server host's own root), whether it leads, its
    host, its resident tablet server's address (``host:port``, "" if unknown) and location."""

    ts_uuid: str
    root: str | None
    leader: bool
    host: str = ""
    address: str = ""
    location: str | None = None


@dataclass(frozen=True)
class TabletScan:
    """One tablet to read: the scan token a planning side hands a task."""

    table: str
    tablet_id: str
    replicas: tuple[ReplicaChoice, ...]
    columns: tuple[str, ...] | None
    predicates: tuple[Predicate, ...] = ()
    snapshot: int | None = None
    known_commit: int | None = None
    require: bool = False  # the replica's log must reach known_commit (linearizable)
    batch_rows: int = 65536
    data_root_conf: str | None = None
    host_locations: Mapping[str, str | None] = field(default_factory=dict)
    types: Mapping[str, pa.DataType] = field(default_factory=dict)
    commit_term: int | None = None  # the term of entry known_commit, when the planner knows

    def preferred_hosts(self) -> list[str]:
        """Every replica's host, for Spark's preferred locations (leader first)."""
        return list(dict.fromkeys(r.host for r in sorted(self.replicas, key=lambda r: not r.leader)
                                  if r.host))


def order_replicas(scan: TabletScan, host: str) -> list[ReplicaChoice]:
    """``scan``'s replicas in the order a task on ``host`` tries them (module rule 1)."""
    here = scan.host_locations.get(host)

    def key(r: ReplicaChoice) -> tuple[int, bytes]:
        tie = hashlib.blake2b(f"{host}|{r.ts_uuid}".encode(), digest_size=8).digest()
        return closeness(r.host, r.location, host, here), tie

    return sorted(scan.replicas, key=key)


def _local_root(choice: ReplicaChoice, scan: TabletScan, host: str) -> tuple[str | None, str]:
    """The data root to read ``choice`` from in this process, or None and why not."""
    if choice.root is not None:
        root = choice.root
    elif choice.host == host:
        root = local_data_root(None, scan.data_root_conf)
    else:
        return None, f"on {choice.host or 'an unknown host'}"
    try:
        if not os.path.isdir(root):
            return None, f"data root {root} is not on this host"
        why = verify_instance(root, choice.ts_uuid)
    except OSError as e:
        return None, f"data root {root} is not readable here ({e})"
    return (None, why) if why else (root, "")


#: ``server`` (default): a replica on the task's own host is planned by the host's resident
#: tablet server, which keeps it open, and its files shared with the task; ``process``: the
#: whole scan in the task's process (it opens the replica itself).
LOCAL_SCANS_ENV = "PYSPARK_KUDU_LOCAL_SCANS"


def _via_server() -> bool:
    return os.environ.get(LOCAL_SCANS_ENV, "server") != "process"


def read_tablet(scan: TabletScan, host: str | None = None,
                secret: bytes | None = None) -> Iterator[pa.RecordBatch]:
    """The rows of ``scan`` from the first replica that serves them (module docstring),
    streamed: batches are read from the replica as they are consumed.

    Raises:
        ServiceUnavailableError: no replica served the scan (the message has every reason).
        InvalidArgumentError: the user's snapshot is older than the history kept, or the
            tablet server refused this worker's credential.
    """
    host = host or current_host()
    secret = secret if secret is not None else secret_from_env()
    tried: list[str] = []
    for choice in order_replicas(scan, host):
        snapshot, known = scan.snapshot, scan.known_commit
        implicit = not choice.leader and snapshot is None and known is not None
        if implicit:
            # A follower's log past its own commit index may hold uncommitted entries: read
            # it at the known index, as a snapshot.
            snapshot = known
        root, why = _local_root(choice, scan, host)
        shared = root is not None and bool(choice.address) and bool(secret) and _via_server()
        if shared:
            root, why = None, "read through its host's resident tablet server"
        require = scan.known_commit if scan.require else None
        it: Iterator[pa.RecordBatch]
        try:
            if root is not None:
                it = scan_replica(root, scan.tablet_id, scan.columns, scan.predicates,
                                  snapshot, known, batch_rows=scan.batch_rows,
                                  require_index=require, trusted=choice.leader,
                                  commit_term=scan.commit_term)
            elif not choice.address:
                tried.append(f"{choice.ts_uuid}: {why}, and its host has no known tablet "
                             f"server address")
                continue
            elif not secret:
                tried.append(f"{choice.ts_uuid}: {why}, and this worker has no {SECRET_ENV} "
                             f"to call its tablet server with")
                continue
            else:
                from pyspark_kudu.spark.host.tserver_client import scan_remote, scan_shared

                it = (scan_shared if shared else scan_remote)(choice.address, secret, ScanRequest(
                    choice.ts_uuid, scan.tablet_id, scan.columns, scan.predicates, snapshot,
                    known, require, scan.batch_rows, choice.root, scan.data_root_conf,
                    scan.types, trusted=choice.leader, commit_term=scan.commit_term,
                    share_files=shared))
            first = next(it, None)
        except _SKIPPABLE as e:
            tried.append(f"{choice.ts_uuid}: {type(e).__name__}: {e}")
            continue
        except CredentialError:
            raise  # this worker and that server do not share the credential: say so
        except InvalidArgumentError as e:
            if not implicit:
                raise  # the user's snapshot is older than the history kept
            tried.append(f"{choice.ts_uuid}: {e}")  # our snapshot: try another replica
            continue
        try:
            if first is not None:
                yield first
                yield from it  # a break from here on fails the task: Spark retries it whole
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()
        return
    raise ServiceUnavailableError(
        f"table {scan.table}, tablet {scan.tablet_id}: no replica served a scan from this "
        f"task on {host} ({'; '.join(tried)})")


#: How long a scan task keeps asking for its replicas' current addresses when none served.
REFRESH_DEADLINE_S = 30.0
_REFRESH_PAUSE_S = 1.0


def read_tablet_refreshing(scan: TabletScan,
                           refresh: Callable[[], Mapping[str, str]] | None,
                           deadline_s: float = REFRESH_DEADLINE_S
                           ) -> Iterator[pa.RecordBatch]:
    """:func:`read_tablet`, for a task whose scan token may be stale: a replica's host
    whose executor was replaced runs a new resident tablet server on a new port, so the
    address in the token no longer answers. When no replica served the scan, ``refresh``
    (the planning side's current ``{tablet server: address}``, e.g. the session service's
    ``describe``, which learns replaced executors) is asked and the scan tried again, a
    second apart, until ``deadline_s``. Only before the first batch: a scan that fails
    later fails its task, and Spark runs it again whole.

    Raises:
        ServiceUnavailableError: no replica served the scan within ``deadline_s``.
    """
    deadline = time.monotonic() + deadline_s
    while True:
        it = read_tablet(scan)
        try:
            first = next(it, None)
        except ServiceUnavailableError:
            if refresh is None or time.monotonic() >= deadline:
                raise
            time.sleep(_REFRESH_PAUSE_S)
            try:
                fresh = refresh()
            except KuduError:  # the planning side is busy or gone: try the old addresses
                continue
            scan = replace(scan, replicas=tuple(
                replace(r, address=fresh.get(r.ts_uuid) or r.address) for r in scan.replicas))
            continue
        if first is not None:
            yield first
            yield from it
        return

