"""``MasterClient``: talks to a master group given as ``kudu.master=h1:7051,h2:7052,h3:7053``.

Rules:

1. The client knows every master address a priori (seed: kudu-multi-master, "Clients behave
   much like tservers"). With no known leader it asks all masters for their status in
   parallel; a master's view of the group size must match the configured list, else the
   client refuses with Kudu's text ("Client configured with 1 master(s) ... but cluster
   indicates it expects 3 master(s) ...").
2. A request goes to the known leader. ``NotLeaderError`` hints are followed at once;
   unreachable masters, ``ServiceUnavailable`` and per-attempt timeouts are retried with
   jittered exponential backoff until the call's deadline, which ends in
   :class:`TimedOutError` naming the masters and the last error -- never a hang.
3. Errors that retrying cannot fix (``AlreadyPresent``, ``NotFound``, ``InvalidArgument``)
   are raised at once, so a DDL retried after a leader crash ends ``AlreadyPresent`` /
   ``NotFound`` when its first attempt had in fact been applied.
4. Reads that accept ``max_staleness_s`` may be answered by any master (KUDU-500).

Thread-safety: thread-safe; channels are shared, the cached leader is a single reference.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from pyspark_kudu.errors import (
    InvalidArgumentError,
    KuduError,
    NetworkError,
    NotLeaderError,
    ServiceUnavailableError,
    TimedOutError,
    UsageError,
)
from pyspark_kudu.master.entities import ConstraintMeta, TableMeta, TabletMeta, TServerMeta
from pyspark_kudu.partitioning import PartitionSchema
from pyspark_kudu.schema import ColumnSchema, Schema

__all__ = [
    "DEFAULT_MASTER_PORT",
    "Channel",
    "MasterClient",
    "TableLocations",
    "parse_master_addresses",
]

DEFAULT_MASTER_PORT = 7051
Body = dict[str, Any]
_RETRYABLE = (NetworkError, ServiceUnavailableError, TimedOutError)


class Channel(Protocol):
    """One master's endpoint: a request/response call with a timeout."""

    address: str

    def call(self, method: str, body: Body, timeout: float) -> Body: ...

    def close(self) -> None: ...


def parse_master_addresses(spec: str | Sequence[str]) -> list[str]:
    """``"h1:7051,h2,h3:7053"`` -> ``["h1:7051", "h2:7051", "h3:7053"]`` (order kept).

    Raises:
        InvalidArgumentError: empty list, bad port or duplicate address.
    """
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[str] = []
    for raw in items:
        a = raw.strip()
        if not a:
            continue
        host, _, port = a.rpartition(":") if ":" in a else (a, "", str(DEFAULT_MASTER_PORT))
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgumentError(
                f"invalid master address {a!r} in kudu.master: use host[:port] "
                f"(default port {DEFAULT_MASTER_PORT})")
        addr = f"{host}:{int(port)}"
        if addr in out:
            raise InvalidArgumentError(f"master address {addr} is listed twice in kudu.master")
        out.append(addr)
    if not out:
        raise InvalidArgumentError(
            "no master addresses given: set kudu.master=host1:7051,host2:7051,host3:7051")
    return out


@dataclass(frozen=True)
class TableLocations:
    """A table with its tablets and the tablet servers holding their replicas."""

    table: TableMeta
    tablets: tuple[TabletMeta, ...]
    tservers: Mapping[str, TServerMeta]
    catalog_index: int


class MasterClient:
    """Client of a master group; see the module rules. Close it (or use ``with``)."""

    def __init__(
        self,
        masters: str | Sequence[str],
        *,
        token: str | None = None,
        timeout_s: float = 30.0,
        rpc_timeout_s: float = 10.0,
        channel_factory: Callable[[str], Channel] | None = None,
        check_master_count: bool = True,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``clock`` and ``sleep`` (seconds) pace the retries; tests inject fakes."""
        self.addresses = parse_master_addresses(masters)
        self._clock = clock
        self._sleep_fn = sleep
        self.timeout_s = timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        self._check_count = check_master_count
        if channel_factory is None:
            from pyspark_kudu.master.flight import FlightChannel

            def channel_factory(addr: str) -> Channel:
                return FlightChannel(addr, token=token)

        self._factory = channel_factory
        self._lock = threading.Lock()
        self._channels: dict[str, Channel] = {}
        self._leader: str | None = None
        self._rng = random.Random()

    def __enter__(self) -> MasterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            chans, self._channels = list(self._channels.values()), {}
        for c in chans:
            c.close()

    def _channel(self, address: str) -> Channel:
        with self._lock:
            ch = self._channels.get(address)
            if ch is None:
                ch = self._channels[address] = self._factory(address)
            return ch

    # == generic call with leader discovery and retries =====================================
    def call(self, method: str, body: Body | None = None, *, timeout_s: float | None = None,
             any_master: bool = False) -> Body:
        """Run ``method`` on the leader (or any master if ``any_master``), retrying per rule 2."""
        body = body or {}
        timeout = self.timeout_s if timeout_s is None else timeout_s
        deadline = self._clock() + timeout
        attempt = 0
        last: KuduError | None = None
        target: str | None = self._leader
        if any_master and target is None:
            target = self.addresses[0]
        while True:
            left = deadline - self._clock()
            if left <= 0:
                raise TimedOutError(
                    f"{method} timed out after {timeout:.1f} s: no leader master answered among "
                    f"{self.addresses}" + (f"; last error: {last}" if last else ""))
            if target is None:
                target, err = self._discover(min(left, self.rpc_timeout_s))
                last = err or last
                if target is None:
                    attempt += 1
                    self._sleep(attempt, deadline)
                    continue
            try:
                out = self._channel(target).call(method, body, min(left, self.rpc_timeout_s))
            except NotLeaderError as e:
                last, attempt = e, attempt + 1
                self._leader = None
                hint = e.leader_hint if e.leader_hint and e.leader_hint != target else None
                target = hint
                if hint is None:
                    self._sleep(attempt, deadline)
                continue
            except _RETRYABLE as e:
                last, attempt = e, attempt + 1
                self._leader, target = None, None
                self._sleep(attempt, deadline)
                continue
            if not any_master:
                self._leader = target
            return out

    def _sleep(self, attempt: int, deadline: float) -> None:
        delay = min(0.05 * 2 ** min(attempt, 5), 1.0) * self._rng.uniform(0.5, 1.0)
        self._sleep_fn(max(0.0, min(delay, deadline - self._clock())))

    def _discover(self, timeout: float) -> tuple[str | None, KuduError | None]:
        """Ask every master for its status: the ready leader with the highest term (or a
        leader hint) and the last error met. A usage error (bad token) is raised at once."""
        statuses = self.statuses(timeout)
        best: tuple[int, str] | None = None
        hinted: str | None = None
        err: KuduError | None = None
        for addr, st in statuses.items():
            if isinstance(st, UsageError):
                raise st
            if isinstance(st, KuduError):
                err = st
                continue
            if self._check_count:
                self._check_group_size(st)
            if st["role"] == "leader" and st.get("leader_ready") and (
                    best is None or st["term"] > best[0]):
                best = (int(st["term"]), addr)
            elif st.get("leader_address"):
                hinted = hinted or str(st["leader_address"])
        if best is None and hinted is None and err is None:
            err = ServiceUnavailableError(f"no master among {self.addresses} knows a leader yet")
        return (best[1] if best else hinted), err

    def _check_group_size(self, st: Body) -> None:
        cluster = [str(a) for m, a in sorted(st.get("masters", {}).items())
                   if m in st.get("voters", ())]
        if cluster and len(cluster) != len(self.addresses):
            raise InvalidArgumentError(
                f"Client configured with {len(self.addresses)} master(s) "
                f"({','.join(self.addresses)}) but cluster indicates it expects {len(cluster)} "
                f"master(s) ({','.join(cluster)}); set kudu.master to all {len(cluster)} "
                f"master addresses")

    def statuses(self, timeout: float = 2.0) -> dict[str, Body | KuduError]:
        """Every configured master's status (or the error reaching it), in parallel."""
        def one(addr: str) -> Body | KuduError:
            try:
                return self._channel(addr).call("status", {}, timeout)
            except KuduError as e:
                return e

        with ThreadPoolExecutor(max_workers=len(self.addresses)) as pool:
            return dict(zip(self.addresses, pool.map(one, self.addresses), strict=True))

    def leader_address(self, timeout_s: float | None = None) -> str:
        """The leader's address (discovering it, with retries, if unknown)."""
        self.call("status", timeout_s=timeout_s)
        lead = self._leader
        if lead is None:
            raise TimedOutError(f"no leader master found among {self.addresses}")
        return lead

    # == typed API ============================================================================
    def create_table(
        self, name: str, schema: Schema, partition_schema: PartitionSchema | None = None, *,
        replication_factor: int = 3, constraint: ConstraintMeta | None = None,
        timeout_s: float | None = None,
    ) -> str:
        """Create a table with all its tablets in one catalog entry; returns its id."""
        body: Body = {
            "name": name, "schema": schema.to_dict(),
            "partition_schema": None if partition_schema is None
            else partition_schema.to_dict(schema),
            "replication_factor": replication_factor,
            "constraint": None if constraint is None else constraint.to_dict(),
        }
        return str(self.call("create_table", body, timeout_s=timeout_s)["table_id"])

    def delete_table(self, name: str, *, timeout_s: float | None = None) -> None:
        self.call("delete_table", {"name": name}, timeout_s=timeout_s)

    def alter_table(
        self, name: str, *, rename_to: str | None = None,
        add_columns: Sequence[ColumnSchema] = (), drop_columns: Sequence[str] = (),
        rename_columns: Mapping[str, str] | None = None, timeout_s: float | None = None,
    ) -> None:
        """All steps in one catalog entry: every step applies or none does."""
        self.call("alter_table", {
            "name": name, "rename_to": rename_to,
            "add_columns": [c.to_dict() for c in add_columns],
            "drop_columns": list(drop_columns), "rename_columns": dict(rename_columns or {}),
        }, timeout_s=timeout_s)

    def get_table(self, name: str, *, max_staleness_s: float | None = None,
                  timeout_s: float | None = None) -> TableLocations:
        out = self._read("get_table", {"name": name}, max_staleness_s, timeout_s)
        return TableLocations(
            TableMeta.from_dict(out["table"]),
            tuple(TabletMeta.from_dict(t) for t in out["tablets"]),
            {u: TServerMeta.from_dict(t) for u, t in out["tservers"].items()},
            int(out["catalog_index"]),
        )

    def list_tables(self, *, max_staleness_s: float | None = None,
                    timeout_s: float | None = None) -> list[str]:
        out = self._read("list_tables", {}, max_staleness_s, timeout_s)
        return [str(t["name"]) for t in out["tables"]]

    def list_tservers(self, *, max_staleness_s: float | None = None,
                      timeout_s: float | None = None) -> list[Body]:
        return list(self._read("list_tservers", {}, max_staleness_s, timeout_s)["tservers"])

    def _read(self, method: str, body: Body, max_staleness_s: float | None,
              timeout_s: float | None) -> Body:
        if max_staleness_s is None:
            return self.call(method, body, timeout_s=timeout_s)
        return self.call(method, dict(body, max_staleness_s=max_staleness_s),
                         timeout_s=timeout_s, any_master=True)

    def heartbeat_to(self, address: str, tserver: TServerMeta, reports: Sequence[Body] = (),
                     *, full: bool = False, timeout_s: float = 5.0,
                     round_trip: Body | None = None) -> Body:
        """One heartbeat to one master (no retry: heartbeats go to every master anyway).
        ``round_trip``: the client's estimate of its round trip to the server's host,
        ``{"ms": float, "samples": int}`` (``cluster ksck`` reports it)."""
        body: Body = {"tserver": tserver.to_dict(), "reports": list(reports), "full": full}
        if round_trip is not None:
            body["round_trip"] = dict(round_trip)
        return self._channel(address).call("heartbeat", body, timeout_s)

    def set_replace(self, tablet_id: str, ts_uuid: str, replace: bool = True) -> None:
        self.call("set_replace", {"tablet_id": tablet_id, "ts_uuid": ts_uuid, "replace": replace})

    def tablet_lease(self, client: str, tablet_ids: Sequence[str], *, ttl_s: float = 0.0,
                     endpoint: Body | None = None, release: bool = False,
                     timeout_s: float | None = None) -> dict[str, Body]:
        """Acquire or renew ``client``'s leadership lease on each tablet (or drop them with
        ``release``); returns each tablet's holder: ``{client, endpoint, expires_in_s,
        continued}`` (see :mod:`pyspark_kudu.master.leases`)."""
        out = self.call("tablet_lease", {"client": client, "tablet_ids": list(tablet_ids),
                                         "ttl_s": ttl_s, "endpoint": dict(endpoint or {}),
                                         "release": release}, timeout_s=timeout_s)
        return {str(t): dict(v) for t, v in out["leases"].items()}

    def add_master(self, node_id: str, address: str, *, timeout_s: float | None = None) -> None:
        """Add a master (learner, then voter once caught up). Start its process first."""
        self.call("add_master", {"id": node_id, "address": address}, timeout_s=timeout_s)

    def remove_master(self, node_id: str, *, timeout_s: float | None = None) -> None:
        self.call("remove_master", {"id": node_id}, timeout_s=timeout_s)

    def transfer_leader(self, to: str, *, timeout_s: float | None = None) -> None:
        self.call("transfer_leader", {"to": to}, timeout_s=timeout_s)
