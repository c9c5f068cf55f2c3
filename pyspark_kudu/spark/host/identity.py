"""Tablet-server identity on an executor host: the data root and its ``instance`` file.

A tablet server is a data root on one host, identified by the UUID in ``<root>/instance``
(DESIGN §1), never by an executor id (those change with every application). Every pinned
task first calls :func:`verify_instance`: if the host it landed on does not hold the tablet
server it was aimed at, it touches nothing and reports ``misplaced`` (:class:`PinnedResult`).

Where the data root comes from, in order: the task's explicit root (``local[*]`` virtual
tablet servers carry theirs in the payload), the ``PYSPARK_KUDU_DATA_ROOT`` environment
variable of the executor (set per worker on the test cluster), then the Spark conf
``spark.kudu.dataRoot`` (same on every host: passed by the caller, or, in any Python worker
a ``KuduContext`` started, read from ``PYSPARK_KUDU_CONF_DATA_ROOT``, which the context sets
from that conf in ``SparkContext.environment``; a separate variable so that a worker's own
``PYSPARK_KUDU_DATA_ROOT`` keeps precedence), then ``/tmp/pyspark-kudu`` -- in local mode
only: a cluster's discovery refuses to fall back to it (``cluster=True``), since ``/tmp`` may
be cleared on reboot, taking the tablet server's identity and replicas with it.

Security: a data root holds the replicas' WAL, metadata and rows. :func:`ensure_instance`
creates it (and everything below it, through :class:`~pyspark_kudu.fileio.FileIO`) private
to the executor's user, and refuses a local root another user owns or every user may write to --
the default root lives in ``/tmp``, where another user could have created it first.

Thread-safety: functions only; the instance file is created with an atomic replace, and a
race between two creators is resolved by re-reading (first writer wins on rename order;
both then read the same file).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark_kudu.errors import CorruptionError, InvalidArgumentError
from pyspark_kudu.fileio import FileIO

__all__ = [
    "CONF_DATA_ROOT_ENV",
    "DATA_ROOT_CONF",
    "DATA_ROOT_ENV",
    "INSTANCE_FILE",
    "PinnedResult",
    "TabletServerInfo",
    "check_private_root",
    "ensure_instance",
    "local_data_root",
    "read_instance",
    "run_pinned",
    "verify_instance",
]

DATA_ROOT_ENV = "PYSPARK_KUDU_DATA_ROOT"
#: ``spark.kudu.dataRoot`` of the application, as Python workers see it (module docstring).
CONF_DATA_ROOT_ENV = "PYSPARK_KUDU_CONF_DATA_ROOT"
DATA_ROOT_CONF = "spark.kudu.dataRoot"
INSTANCE_FILE = "instance"
_FORMAT_VERSION = 1
_DEFAULT_ROOT = "/tmp/pyspark-kudu"


@dataclass(frozen=True)
class TabletServerInfo:
    uuid: str
    host: str
    data_root: str


@dataclass(frozen=True)
class PinnedResult:
    """What a pinned task returns: its value, or why it refused to run."""

    ok: bool
    host: str
    value: Any = None
    misplaced_reason: str = ""


def local_data_root(explicit: str | None = None, conf_root: str | None = None, *,
                    cluster: bool = False) -> str:
    """The data root of the host this code runs on (see module docstring for the order).

    Raises:
        InvalidArgumentError: ``cluster`` (an executor of a non-local application) and no
            root is configured: the local-mode default is refused, naming both settings.
    """
    root = (explicit or os.environ.get(DATA_ROOT_ENV) or conf_root
            or os.environ.get(CONF_DATA_ROOT_ENV))
    if root:
        return root
    if cluster:
        raise InvalidArgumentError(
            f"no tablet server data root on host {current_host()}: set {DATA_ROOT_ENV} in the "
            f"worker's environment (spark-env.sh) or {DATA_ROOT_CONF} for the application; "
            f"the default {_DEFAULT_ROOT} is for local mode only (/tmp may be cleared on "
            f"reboot, losing this tablet server's replicas)")
    return _DEFAULT_ROOT


def read_instance(root: str) -> str | None:
    """The tablet-server UUID recorded under ``root``, or None if there is none yet."""
    io = FileIO(root)
    if not io.exists(INSTANCE_FILE):
        return None
    raw = io.read_bytes(INSTANCE_FILE)
    try:
        doc = json.loads(raw)
        ts_uuid = str(doc["uuid"])
        version = int(doc["format_version"])
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptionError(f"instance file {io.path(INSTANCE_FILE)} is unreadable: {e}") from e
    if version > _FORMAT_VERSION:
        raise CorruptionError(
            f"instance file {io.path(INSTANCE_FILE)} has format version {version}; this "
            f"pyspark-kudu understands up to {_FORMAT_VERSION}: upgrade the package"
        )
    return ts_uuid


def ensure_instance(root: str) -> TabletServerInfo:
    """Create the instance file under ``root`` if missing; return this tablet server's identity.

    Raises:
        InvalidArgumentError: a local ``root`` owned by another user or writable by others.
    """
    io = FileIO(root)
    if io.is_local:
        io.makedirs()
        check_private_root(io.local_path())
    existing = read_instance(root)
    if existing is None:
        io.makedirs()
        doc = {"uuid": uuid.uuid4().hex, "format_version": _FORMAT_VERSION,
               "created_on": socket.gethostname()}
        io.atomic_write(json.dumps(doc).encode(), INSTANCE_FILE)
        existing = read_instance(root)
        assert existing is not None
    return TabletServerInfo(existing, current_host(), root)


def check_private_root(path: str) -> None:
    """Refuse a data root that another user owns or that every user may write to.

    Raises:
        InvalidArgumentError: naming the root, its owner or mode, and the fix.
    """
    st = os.stat(path)
    if st.st_uid != os.geteuid():
        raise InvalidArgumentError(
            f"data root {path} belongs to uid {st.st_uid}, not to this process's user "
            f"(uid {os.geteuid()}): another user could read or forge its replicas; choose "
            f"another root (spark.kudu.dataRoot / {DATA_ROOT_ENV})")
    if st.st_mode & stat.S_IWOTH:
        raise InvalidArgumentError(
            f"data root {path} has mode {stat.S_IMODE(st.st_mode):04o}: every user may "
            f"write to it; run chmod o-w {path} or choose another root")


def current_host() -> str:
    """The host name Spark knows this executor by (``SPARK_LOCAL_IP`` on the test cluster)."""
    return os.environ.get("SPARK_LOCAL_IP") or socket.gethostbyname(socket.gethostname())


def verify_instance(root: str, expected_uuid: str) -> str:
    """Empty string if ``root`` holds tablet server ``expected_uuid``, else the reason why not."""
    try:
        found = read_instance(root)
    except CorruptionError as e:
        return str(e)
    if found is None:
        return f"no tablet server instance under {root} on {current_host()}"
    if found != expected_uuid:
        return (f"task for tablet server {expected_uuid} landed on {current_host()}, "
                f"whose data root {root} belongs to tablet server {found}")
    return ""


def run_pinned(root: str, expected_uuid: str, fn: Callable[[str], Any]) -> PinnedResult:
    """Run ``fn(root)`` only if this host holds ``expected_uuid``; otherwise report misplaced."""
    reason = verify_instance(root, expected_uuid)
    if reason:
        return PinnedResult(ok=False, host=current_host(), misplaced_reason=reason)
    return PinnedResult(ok=True, host=current_host(), value=fn(root))
