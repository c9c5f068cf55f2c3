"""``MasterService``: the master's RPC surface over one replica (embedded or standalone alike).

Every request is a method name plus a JSON-able dict, answered with a JSON-able dict or a
:class:`~pyspark_kudu.errors.KuduError` -- the same code serves the in-process channel and
Arrow Flight. Behaviours (seed: kudu-multi-master):

- DDL (create/delete/alter table, replace marks, master membership) only on the leader, and
  only once it has applied its own term's first entry; a follower answers
  :class:`NotLeaderError` whose ``leader_hint`` is the leader's *address*.
- Every master accepts heartbeats and records the tablet server's liveness (so a new leader
  has a warm view, KUDU-1358); only the leader registers servers (location resolved through
  :class:`~pyspark_kudu.master.locations.LocationCache` on first registration), records their
  tablet reports (one ``UpdateTablets`` entry per heartbeat) and answers with work to do
  (:mod:`~pyspark_kudu.master.redrive`). A leader asks every server once per term for a full
  report (``needs_full_report``), which is how pending work is re-driven after failover.
- A heartbeat may carry the sending client's round-trip estimate to the server's host
  (``round_trip``, from its replication rounds); every master keeps the latest per server
  in memory, like liveness, and ``list_tservers`` returns it for ``cluster ksck``.
- Reads go to the leader, or to a follower when the caller accepts ``max_staleness_s`` and
  the follower's catalog is at most that stale (KUDU-500).
- Masters are added (as a learner first, promoted once caught up) and removed one at a time;
  removing the leader hands leadership to another voter first and answers NotLeader.

Thread-safety: thread-safe; requests run concurrently on the RPC threads.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from pyspark_kudu.consensus.messages import ConfChange, ConfChangeType
from pyspark_kudu.consensus.raft import Role
from pyspark_kudu.errors import (
    AlreadyPresentError,
    ConsensusError,
    InvalidArgumentError,
    NotFoundError,
    NotLeaderError,
    ServiceUnavailableError,
    TimedOutError,
)
from pyspark_kudu.master.catalog import Catalog, apply
from pyspark_kudu.master.catalog_replica import MasterReplica
from pyspark_kudu.master.ddl import build_alter_table, build_create_table, build_delete_table
from pyspark_kudu.master.entities import ConstraintMeta, TServerMeta
from pyspark_kudu.master.leases import LeaseTable
from pyspark_kudu.master.locations import LocationCache
from pyspark_kudu.master.records import (
    Record,
    RegisterTServer,
    SetReplaceMark,
    TabletReport,
    UpdateTablets,
)
from pyspark_kudu.master.redrive import pending_actions, rebalance_actions, replication_plan
from pyspark_kudu.partitioning import PartitionSchema
from pyspark_kudu.schema import ColumnSchema, Schema

__all__ = ["MasterService"]

_log = logging.getLogger(__name__)
Body = dict[str, Any]


def _round_trip(value: Any) -> tuple[float, int] | None:
    """A heartbeat's ``round_trip`` as ``(ms, samples)``; None when absent or malformed (a
    diagnostic must never cost a tablet server its liveness)."""
    if not isinstance(value, dict):
        return None
    ms, samples = value.get("ms"), value.get("samples")
    if (not isinstance(ms, (int, float)) or isinstance(ms, bool) or not math.isfinite(ms)
            or ms < 0 or not isinstance(samples, int) or isinstance(samples, bool)
            or samples < 1):
        return None
    return float(ms), samples


class MasterService:
    """Request handlers of one master replica; :meth:`handle` dispatches by method name."""

    def __init__(
        self,
        replica: MasterReplica,
        *,
        locations: LocationCache | None = None,
        op_timeout_s: float = 10.0,
        tserver_unresponsive_s: float = 30.0,
        follower_unavailable_considered_failed_s: float = 300.0,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.replica = replica
        self._locations = locations or LocationCache(None)
        self._op_timeout = op_timeout_s
        self._unresponsive = tserver_unresponsive_s
        self._failed_after = follower_unavailable_considered_failed_s
        self._started = clock()
        self._rng = rng or random.Random()
        self._clock = clock
        self._lock = threading.Lock()
        self._last_seen: dict[str, float] = {}
        self._round_trips: dict[str, tuple[float, int, float]] = {}  # ms, samples, when
        self._full_seen: set[str] = set()
        self._full_term = -1
        self._leases = LeaseTable()
        self._lease_term = -1
        self._handlers: dict[str, Callable[[Body], Body]] = {
            "status": self.status,
            "create_table": self.create_table,
            "delete_table": self.delete_table,
            "alter_table": self.alter_table,
            "get_table": self.get_table,
            "list_tables": self.list_tables,
            "list_tservers": self.list_tservers,
            "heartbeat": self.heartbeat,
            "set_replace": self.set_replace,
            "tablet_lease": self.tablet_lease,
            "replication_plan": self.replication_plan,
            "rebalance_plan": self.rebalance_plan,
            "add_master": self.add_master,
            "remove_master": self.remove_master,
            "transfer_leader": self.transfer_leader,
        }

    def handle(self, method: str, body: Body) -> Body:
        """Run one request. Raises KuduError (NotLeader hints carry leader addresses)."""
        h = self._handlers.get(method)
        if h is None:
            raise InvalidArgumentError(
                f"unknown master method {method!r}; known: {sorted(self._handlers)}")
        try:
            return h(body)
        except NotLeaderError as e:
            raise NotLeaderError(str(e), self._address(e.leader_hint)) from None
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidArgumentError(f"malformed {method} request: {e!r}") from e

    # -- helpers ---------------------------------------------------------------------------
    def _address(self, node_id: str | None) -> str | None:
        if not node_id:
            return None
        return self.replica.catalog.masters.get(node_id, node_id)

    def _leader_catalog(self) -> Catalog:
        st = self.replica.status()
        if st.role is not Role.LEADER:
            raise NotLeaderError(
                f"master {st.id} is a {st.role.value}, not the leader (leader: "
                f"{self._address(st.leader) or 'unknown'}); send DDL to the leader",
                st.leader or None)
        if not st.leader_ready:
            raise ServiceUnavailableError(
                f"master {st.id} was just elected leader and is still applying the log; retry")
        return self.replica.catalog

    def _readable_catalog(self, body: Body) -> Catalog:
        bound = body.get("max_staleness_s")
        st = self.replica.status()
        if st.role is Role.LEADER and st.leader_ready and st.read_lease:
            return self.replica.catalog
        if bound is None and st.role is Role.LEADER:
            # A leader cut off from its quorum may already be deposed: reading its catalog
            # could miss a newer leader's writes. Serve only under a lease (Raft §6.4.1).
            raise ServiceUnavailableError(
                f"master {st.id} leads term {st.term} but has no read lease (a quorum has not "
                f"answered its heartbeats recently); retry")
        if bound is not None:
            stale = self.replica.staleness()
            if stale <= float(bound):
                return self.replica.catalog
            why = (f"its catalog is {stale:.2f} s stale, more than the {float(bound):.2f} s "
                   f"allowed")
        else:
            why = "the request accepts no staleness (max_staleness_s unset)"
        raise NotLeaderError(f"master {st.id} cannot serve this read: {why}; read from the "
                             f"leader", st.leader or None)

    def _wait(self, fut: Future[Any], what: str) -> None:
        try:
            fut.result(timeout=self._op_timeout)
        except FutureTimeout:
            raise TimedOutError(
                f"{what} on master {self.replica.id}: not committed within "
                f"{self._op_timeout:.0f} s; the outcome is unknown, retry (a retry reports "
                f"AlreadyPresent or NotFound if it was applied)") from None
        except ConsensusError as e:  # e.g. a configuration change still pending
            raise ServiceUnavailableError(f"{what}: {e}; retry") from e

    def _commit(self, record: Record, catalog: Catalog, what: str) -> None:
        apply(catalog, record, catalog.index + 1)  # fail fast on what the leader can see
        self._wait(self.replica.propose(record), what)

    def _live(self) -> set[str]:
        now = self._clock()
        with self._lock:
            return {u for u, t in self._last_seen.items() if now - t <= self._unresponsive}

    # == handlers ===========================================================================
    def status(self, body: Body) -> Body:
        st = self.replica.status()
        masters = dict(self.replica.catalog.masters)
        return {
            "id": st.id, "role": st.role.value, "term": st.term, "leader": st.leader,
            "leader_address": masters.get(st.leader, "") if st.leader else "",
            "leader_ready": st.leader_ready, "commit": st.commit, "applied": st.applied,
            "voters": sorted(st.voters), "learners": sorted(st.learners),
            "masters": {m: masters.get(m, m) for m in sorted(st.voters | st.learners)},
            "staleness_s": self.replica.staleness(), "failed": st.failed,
        }

    def create_table(self, body: Body) -> Body:
        cat = self._leader_catalog()
        schema = Schema.from_dict(body["schema"])
        ps = body.get("partition_schema")
        c = body.get("constraint")
        rec = build_create_table(
            cat, name=body["name"], schema=schema,
            partition_schema=None if ps is None else PartitionSchema.from_dict(ps, schema),
            replication_factor=int(body.get("replication_factor", 3)),
            constraint=None if c is None else ConstraintMeta.from_dict(c),
            live=self._live(), rng=self._rng,
        )
        self._commit(rec, cat, f"CreateTable {rec.table.name!r}")
        return {"table_id": rec.table.table_id}

    def delete_table(self, body: Body) -> Body:
        cat = self._leader_catalog()
        rec = build_delete_table(cat, body["name"])
        self._commit(rec, cat, f"DeleteTable {body['name']!r}")
        return {"table_id": rec.table_id}

    def alter_table(self, body: Body) -> Body:
        cat = self._leader_catalog()
        rec = build_alter_table(
            cat, body["name"], rename_to=body.get("rename_to"),
            add_columns=[ColumnSchema.from_dict(x) for x in body.get("add_columns", ())],
            drop_columns=list(body.get("drop_columns", ())),
            rename_columns=dict(body.get("rename_columns") or {}),
        )
        self._commit(rec, cat, f"AlterTable {body['name']!r}")
        return {"table_id": rec.table_id}

    def get_table(self, body: Body) -> Body:
        cat = self._readable_catalog(body)
        t = cat.table_by_name(body["name"]) if "name" in body else cat.live_table(body["id"])
        tablets = cat.tablets_of(t)
        uuids = {r.ts_uuid for tb in tablets for r in tb.replicas}
        return {
            "table": t.to_dict(), "tablets": [tb.to_dict() for tb in tablets],
            "tservers": {u: cat.tservers[u].to_dict() for u in sorted(uuids) if u in cat.tservers},
            "catalog_index": cat.index,
        }

    def list_tables(self, body: Body) -> Body:
        cat = self._readable_catalog(body)
        return {"tables": [{"name": t.name, "id": t.table_id, "state": t.state.value}
                           for t in cat.live_tables()], "catalog_index": cat.index}

    def list_tservers(self, body: Body) -> Body:
        cat = self._readable_catalog(body)
        live = self._live()
        unseen = self.tserver_liveness()
        return {"tservers": [dict(ts.to_dict(), live=ts.uuid in live,
                                  unseen_s=round(unseen.get(ts.uuid, -1.0), 3),
                                  replicas=cat.replica_counts.get(ts.uuid, 0),
                                  **self._round_trip_fields(ts.uuid))
                             for ts in sorted(cat.tservers.values(), key=lambda t: t.uuid)]}

    def _round_trip_fields(self, ts_uuid: str) -> Body:
        """``round_trip_ms``, ``round_trip_samples`` and ``round_trip_age_s`` (seconds since
        it was reported) of the latest estimate a client reported for ``ts_uuid``; none if
        no client did since this master started."""
        with self._lock:
            got = self._round_trips.get(ts_uuid)
        if got is None:
            return {}
        ms, samples, when = got
        return {"round_trip_ms": ms, "round_trip_samples": samples,
                "round_trip_age_s": round(self._clock() - when, 3)}

    def heartbeat(self, body: Body) -> Body:
        ts = TServerMeta.from_dict(body["tserver"])
        round_trip = _round_trip(body.get("round_trip"))
        with self._lock:
            self._last_seen[ts.uuid] = self._clock()
            if round_trip is not None:
                self._round_trips[ts.uuid] = (*round_trip, self._clock())
        st = self.replica.status()
        base: Body = {"leader": False, "term": st.term,
                      "leader_hint": self._address(st.leader) or "",
                      "needs_full_report": False, "actions": []}
        if st.role is not Role.LEADER or not st.leader_ready:
            return base  # seed: followers only refresh liveness
        cat = self.replica.catalog
        known = cat.tservers.get(ts.uuid)
        if known is None or (known.host, known.port, known.data_root) != (
                ts.host, ts.port, ts.data_root):
            loc = self._locations.get(ts.host, refresh=known is not None)
            reg = RegisterTServer(TServerMeta(ts.uuid, ts.host, ts.port, ts.data_root, loc))
            self._wait(self.replica.propose(reg), f"registering tablet server {ts.uuid}")
            cat = self.replica.catalog
        reports = [TabletReport.from_dict(r) for r in body.get("reports", ())]
        if reports:
            rec = UpdateTablets(ts.uuid, tuple(reports))
            if apply(cat, rec, cat.index).tablets is not cat.tablets:
                self._wait(self.replica.propose(rec), f"tablet report of {ts.uuid}")
                cat = self.replica.catalog
        full = bool(body.get("full"))
        with self._lock:
            if self._full_term != st.term:
                self._full_term, self._full_seen = st.term, set()
            if full:
                self._full_seen.add(ts.uuid)
            needs_full = ts.uuid not in self._full_seen
        actions = pending_actions(cat, ts.uuid, reports, full=full, live=self._live(),
                                  rng=self._rng)
        return dict(base, leader=True, needs_full_report=needs_full, actions=actions)

    def replication_plan(self, body: Body) -> Body:
        """Re-replication work for all tablets (see :func:`.redrive.replication_plan`).

        A tablet server counts as failed when this master has not heard from it for
        ``follower_unavailable_considered_failed_s``, counted from this master's start for a
        server it never heard from (tablet servers heartbeat every master, so a follower
        that becomes leader knows who is alive; a restarted master waits the full time).
        ``next_failure_in_s``: the seconds until the next server would count as failed if it
        stays silent (None: every one already does), so a healer can ask again right then
        instead of up to its whole interval later.
        """
        cat = self._leader_catalog()
        now = self._clock()
        with self._lock:
            seen = dict(self._last_seen)
        silent = {u: now - seen.get(u, self._started) for u in cat.tservers}
        failed = {u for u, s in silent.items() if s > self._failed_after}
        acts = replication_plan(cat, live=self._live(), failed=failed, rng=self._rng)
        limit = int(body.get("max_actions", 0) or 0)
        due = [self._failed_after - s for u, s in silent.items() if u not in failed]
        return {"actions": acts[:limit] if limit > 0 else acts,
                "failed": sorted(failed),
                "failed_after_s": self._failed_after,
                "next_failure_in_s": max(0.0, min(due)) if due else None}

    def rebalance_plan(self, body: Body) -> Body:
        """Rebalancing moves (see :func:`.redrive.rebalance_actions`); empty while any
        tablet still needs re-replication, so healing always goes first."""
        cat = self._leader_catalog()
        if self.replication_plan({"max_actions": 1})["actions"]:
            return {"actions": [], "healing": True}
        limit = int(body.get("max_moves", 0) or 0)
        acts = rebalance_actions(cat, live=self._live(), rng=self._rng,
                                 max_moves=limit if limit > 0 else None)
        return {"actions": acts, "healing": False}

    def set_replace(self, body: Body) -> Body:
        cat = self._leader_catalog()
        rec = SetReplaceMark(body["tablet_id"], body["ts_uuid"], bool(body.get("replace", True)))
        self._commit(rec, cat, f"marking tablet {rec.tablet_id} replica on {rec.ts_uuid}")
        return {}

    def tablet_lease(self, body: Body) -> Body:
        """Grant, renew (``ttl_s`` > 0) or release (``release``) a client's leadership leases
        on tablets (:mod:`.leases`); answers every asked tablet's holder. Leader only: all
        clients must see one table. A new leader term starts with no leases."""
        self._leader_catalog()
        term = self.replica.status().term
        client = str(body["client"])
        tids = [str(t) for t in body["tablet_ids"]]
        now = self._clock()
        with self._lock:
            if term != self._lease_term:
                self._leases, self._lease_term = LeaseTable(), term
            self._leases.expire(now)
            if body.get("release"):
                self._leases.release(client, tids)
                return {"leases": {}}
            got = self._leases.acquire(client, dict(body.get("endpoint") or {}), tids,
                                       float(body["ttl_s"]), now)
        return {"leases": {t: {"client": lease.client, "endpoint": dict(lease.endpoint),
                               "expires_in_s": round(lease.expires - now, 3),
                               "continued": lease.continued}
                           for t, lease in got.items()}}

    # -- master membership ------------------------------------------------------------------
    def add_master(self, body: Body) -> Body:
        node_id, address = str(body["id"]), str(body["address"])
        self._leader_catalog()
        st = self.replica.status()
        if node_id in st.voters:
            raise AlreadyPresentError(f"master {node_id} is already a voter of the master group")
        if node_id not in st.learners:
            self._conf(ConfChange(ConfChangeType.ADD_LEARNER, node_id, address.encode()),
                       f"adding master {node_id} ({address}) as a learner")
        timeout = float(body.get("catch_up_timeout_s", 30.0))
        self.replica.wait_for(
            lambda r: r.status().progress.get(node_id, (0, 0))[0] >= r.status().commit,
            timeout, f"new master {node_id} at {address} catching up with the leader")
        self._conf(ConfChange(ConfChangeType.ADD_VOTER, node_id),
                   f"promoting master {node_id} to voter")
        return {"voters": sorted(self.replica.status().voters)}

    def remove_master(self, body: Body) -> Body:
        node_id = str(body["id"])
        self._leader_catalog()
        st = self.replica.status()
        if node_id not in st.voters | st.learners:
            raise NotFoundError(f"master {node_id} is not a member of the master group "
                                f"(members: {sorted(st.voters | st.learners)})")
        if node_id == st.id:
            others = [(m, p[0]) for m, p in st.progress.items() if m in st.voters and m != st.id]
            if not others:
                raise InvalidArgumentError(f"cannot remove {node_id}: it is the only voter")
            target = max(others, key=lambda x: x[1])[0]
            self.replica.transfer_leader(target).result(timeout=self._op_timeout)
            raise NotLeaderError(
                f"master {node_id} is the leader; it is handing leadership to {target} before "
                f"its removal, retry on the new leader", target)
        self._conf(ConfChange(ConfChangeType.REMOVE, node_id), f"removing master {node_id}")
        return {"voters": sorted(self.replica.status().voters)}

    def transfer_leader(self, body: Body) -> Body:
        self._leader_catalog()
        self.replica.transfer_leader(str(body["to"])).result(timeout=self._op_timeout)
        return {}

    def _conf(self, cc: ConfChange, what: str) -> None:
        self._wait(self.replica.propose_conf_change(cc), what)

    def tserver_liveness(self) -> Mapping[str, float]:
        """Seconds since each tablet server's last heartbeat to this master."""
        now = self._clock()
        with self._lock:
            return {u: now - t for u, t in self._last_seen.items()}
