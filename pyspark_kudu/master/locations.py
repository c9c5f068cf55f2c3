"""Locations of tablet servers and clients, and the replica a location-aware client reads.

Seed: kudu-location-awareness, "Node labeling" and "Location-aware clients".

* The master runs ``location_mapping_cmd`` once per registering host: the command line is
  split into an argv list with :func:`shlex.split` and executed directly, never through a
  shell (``;``, ``|``, ``$(...)`` and ``$VAR`` reach the command as literal text); the host
  is appended as the last argument, and stripped stdout is the location. Kudu splits on
  spaces only; for a command without quotes both give the same argv, and quoting lets a path
  with spaces through. Errors carry Kudu's texts. Unlike Kudu, the command has a timeout
  (default 10 s, ``location_mapping_timeout_s`` of the master); on expiry its whole process
  group is killed and the failure is reported.
* A location must be ``/``-separated components of ``[A-Za-z0-9_.-]`` (seed) and, unlike
  Kudu, at most :data:`MAX_LOCATION_LENGTH` characters: it is stored in the catalog and sent
  with every tablet-server listing, so a runaway script cannot bloat them.
* Locations are cached per host until the server re-registers (:meth:`LocationCache.get`
  with ``refresh=True``); failures are never cached. ``queries`` and ``hits`` count like
  Kudu's ``location_mapping_cache_queries`` / ``location_mapping_cache_hits`` metrics.
* Clients get a location too (:meth:`LocationCache.client_location`); a client whose
  location cannot be resolved simply has none, it is not refused.
* :func:`rank_replicas` orders a tablet's replicas for a read in ``CLOSEST_REPLICA``,
  ``LEADER_ONLY`` or ``FIRST_REPLICA`` mode.
"""

from __future__ import annotations

import enum
import hashlib
import os
import random
import shlex
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence

from pyspark_kudu.errors import (
    InvalidArgumentError,
    LocationMappingError,
    LocationMappingTimedOutError,
)
from pyspark_kudu.master.topology import (
    Replica,
    TabletServer,
    is_valid_location,
    location_components,
)

__all__ = [
    "DEFAULT_MAPPING_TIMEOUT_S",
    "MAX_LOCATION_LENGTH",
    "LocationCache",
    "ReadMode",
    "closeness",
    "is_valid_location",
    "rank_replicas",
    "run_location_mapping_cmd",
    "select_replica",
]

DEFAULT_MAPPING_TIMEOUT_S = 10.0
MAX_LOCATION_LENGTH = 1024
"""Longest location accepted from the mapping command (pyspark-kudu's limit; Kudu has none)."""


def run_location_mapping_cmd(
    cmd: str, host: str, timeout: float = DEFAULT_MAPPING_TIMEOUT_S
) -> str:
    """Run ``cmd`` (shlex-split, no shell) with ``host`` appended; return the location.

    Raises:
        LocationMappingError: with Kudu's texts for an empty command, a failed run (with
            its stderr), an empty or an invalid location (with the output); also for a
            command line with unbalanced quotes and a location longer than
            :data:`MAX_LOCATION_LENGTH`.
        LocationMappingTimedOutError: the command ran longer than ``timeout`` seconds.
        InvalidArgumentError: ``timeout`` is not positive.
    """
    _check_timeout(timeout)
    try:
        argv = shlex.split(cmd)
    except ValueError as e:
        raise LocationMappingError(
            f"invalid location mapping command {cmd!r}: {e}; quote arguments with spaces "
            f"and close every quote") from None
    if not argv:
        raise LocationMappingError("invalid empty location mapping command")
    argv.append(host)
    try:
        # A new session makes the command a process-group leader, so a timeout can kill
        # the helpers it spawned too (otherwise they would keep our pipes open).
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as e:
        raise LocationMappingError(
            f"failed to run location mapping command: Runtime error: "
            f"Unable to run '{argv[0]}': {e.strerror or e}"
        ) from e
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.communicate()
        raise LocationMappingTimedOutError(
            f"failed to run location mapping command: Timed out: '{' '.join(argv)}' "
            f"did not finish within {timeout:g} s and was killed"
        ) from None
    stderr = err.decode(errors="replace").strip()
    if proc.returncode != 0:
        how = (
            f"terminated with non-zero exit status {proc.returncode}"
            if proc.returncode > 0
            else f"killed by signal {-proc.returncode}"
        )
        raise LocationMappingError(
            f"failed to run location mapping command: Runtime error: "
            f"Subprocess '{argv[0]}' {how}: {stderr}"
        )
    location = out.decode(errors="replace").strip()
    if not location:
        raise LocationMappingError("location mapping command returned invalid empty location")
    if len(location) > MAX_LOCATION_LENGTH:
        raise LocationMappingError(
            f"location mapping command returned invalid location: {location[:60]}... is "
            f"{len(location)} characters long, more than the maximum {MAX_LOCATION_LENGTH}"
        )
    if not is_valid_location(location):
        raise LocationMappingError(
            f"location mapping command returned invalid location: {location}"
        )
    return location


def _check_timeout(timeout: float) -> None:
    if not timeout > 0:
        raise InvalidArgumentError(
            f"location mapping timeout must be a positive number of seconds, got {timeout!r}")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class LocationCache:
    """Per-host cache in front of the location mapping command.

    ``cmd=None`` (or ``""``) disables locations, as an unset ``--location_mapping_cmd``
    does in Kudu: every host then has location ``None``.

    Thread-safety: thread-safe. The command runs outside the lock, so two threads asking
    for the same uncached host may both run it (Kudu has the same simplification); the
    first result wins.
    """

    def __init__(self, cmd: str | None, timeout: float = DEFAULT_MAPPING_TIMEOUT_S) -> None:
        _check_timeout(timeout)
        self._cmd = cmd
        self._timeout = timeout
        self._lock = threading.Lock()
        self._cache: dict[str, str] = {}
        self.queries = 0
        self.hits = 0

    @property
    def enabled(self) -> bool:
        return bool(self._cmd)

    def get(self, host: str, *, refresh: bool = False) -> str | None:
        """Location of ``host``; ``refresh=True`` re-runs the command (server re-registers).

        Raises:
            LocationMappingError: see :func:`run_location_mapping_cmd`. Not cached.
        """
        if not self._cmd:
            return None
        with self._lock:
            self.queries += 1
            if refresh:
                self._cache.pop(host, None)
            cached = self._cache.get(host)
            if cached is not None:
                self.hits += 1
                return cached
        location = run_location_mapping_cmd(self._cmd, host, self._timeout)
        with self._lock:
            return self._cache.setdefault(host, location)

    def client_location(self, host: str) -> str | None:
        """Location assigned to a client connecting from ``host``; ``None`` if unknown."""
        try:
            return self.get(host)
        except LocationMappingError:
            return None


class ReadMode(str, enum.Enum):
    """Replica selection for scans, as kudu-spark's ``kudu.scanLocality``."""

    CLOSEST_REPLICA = "closest_replica"
    LEADER_ONLY = "leader_only"
    FIRST_REPLICA = "first_replica"


#: Per-process tie-break seed: ties among equally close replicas are broken by a random
#: choice that stays the same for the life of the process (so one client keeps reading the
#: same replica, which keeps its block cache warm), but differs between clients.
_PROCESS_SEED = random.SystemRandom().getrandbits(64)


def _tie_break(seed: int, ts_uuid: str) -> bytes:
    return hashlib.blake2b(ts_uuid.encode(), digest_size=8, key=seed.to_bytes(8, "big")).digest()


def _common_prefix_len(a: str | None, b: str | None) -> int:
    n = 0
    for x, y in zip(location_components(a), location_components(b), strict=False):
        if x != y:
            break
        n += 1
    return n


def rank_replicas(
    replicas: Sequence[Replica],
    tservers: Mapping[str, TabletServer],
    mode: ReadMode = ReadMode.CLOSEST_REPLICA,
    *,
    client_host: str | None = None,
    client_location: str | None = None,
    seed: int | None = None,
) -> list[Replica]:
    """Replicas of one tablet in the order a client should try them for a read.

    Replicas on unknown or dead servers are left out.

    * ``CLOSEST_REPLICA``: a replica on the client's own host (:func:`closeness`: when
      their locations agree), then the same location, then the longest common location
      prefix, then any; ties by a per-process random choice
      that is stable across calls (``seed`` overrides it, for tests).
    * ``LEADER_ONLY``: only the leader (empty if no live leader is known).
    * ``FIRST_REPLICA``: the replicas in config order.
    """
    live = [r for r in replicas if (ts := tservers.get(r.ts_uuid)) is not None and ts.live]
    if mode is ReadMode.LEADER_ONLY:
        return [r for r in live if r.is_leader][:1]
    if mode is ReadMode.FIRST_REPLICA:
        return live
    key_seed = _PROCESS_SEED if seed is None else seed

    def key(r: Replica) -> tuple[int, bytes]:
        ts = tservers[r.ts_uuid]
        return (closeness(ts.host, ts.location, client_host, client_location),
                _tie_break(key_seed, r.ts_uuid))

    return sorted(live, key=key)


def closeness(host: str, location: str | None, client_host: str | None,
              client_location: str | None) -> int:
    """How close a tablet server on ``host`` at ``location`` is to a client: 0 is closest.

    0: the client's own host -- Kudu's client rule: only when their locations match or one
    of them has none (a host name shared across locations, e.g. a container's, is not
    proof of locality); 1: the same location; then the longer the common location prefix,
    the closer; no common prefix ranks last.
    """
    if (client_host is not None and host == client_host
            and (location is None or client_location is None or location == client_location)):
        return 0
    if client_location is not None and location == client_location:
        return 1
    depth = len(location_components(client_location))
    return 2 + depth - _common_prefix_len(location, client_location)


def select_replica(
    replicas: Sequence[Replica],
    tservers: Mapping[str, TabletServer],
    mode: ReadMode = ReadMode.CLOSEST_REPLICA,
    *,
    client_host: str | None = None,
    client_location: str | None = None,
    seed: int | None = None,
) -> Replica | None:
    """The first choice of :func:`rank_replicas`, or ``None`` if there is none."""
    ranked = rank_replicas(
        replicas,
        tservers,
        mode,
        client_host=client_host,
        client_location=client_location,
        seed=seed,
    )
    return ranked[0] if ranked else None
