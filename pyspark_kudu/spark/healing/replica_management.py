"""The client's side of self-healing: what :class:`~pyspark_kudu.spark.healing.healer.Healer`
asks of a :class:`~pyspark_kudu.spark.api.context.KuduContext` (``HealerTarget``), and operator
tools.

There are no storage daemons (DESIGN §1): the master plans, and a client carries the plan
out with Spark jobs on the tablets' leaders. :class:`ReplicaManagement` is the part of
``KuduContext`` that does so:

- ``replication_plan`` / ``rebalance_plan``: the leader master's actions, after reporting the
  failed replicas this client saw;
- ``execute_replication_actions``: actions of different tablets concurrently, their rounds
  shared (:class:`~pyspark_kudu.spark.replication.sharedrounds.SharedRounds`), each reported to the
  master as a new configuration; an action on a tablet another client leads (holds the lease of,
  :mod:`~pyspark_kudu.spark.replication.lease_keeper`) is sent to that client, so a tablet copy
  is never fenced by
  that client's next write;
- ``sweep_replicas``: deletes replicas the catalog says are evicted or orphaned;
- ``recover_tablet``: the unsafe recovery of a tablet that lost a majority.

Thread-safety: as ``KuduContext`` (these methods take its lock where they touch its leaders).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from pyspark.sql import SparkSession

from pyspark_kudu.errors import (
    IllegalStateError,
    InvalidArgumentError,
    KuduError,
    NotFoundError,
    ServiceUnavailableError,
)
from pyspark_kudu.master.client import MasterClient, TableLocations
from pyspark_kudu.master.entities import MemberType, ReplicaMeta
from pyspark_kudu.master.records import TabletReport
from pyspark_kudu.spark.host.handlers import PeerRequest, RequestKind, tablet_dir
from pyspark_kudu.spark.host.identity import local_data_root, run_pinned
from pyspark_kudu.spark.host.replica_cache import delete_replica
from pyspark_kudu.spark.host.round_tasks import HostTask, serve_task_remote
from pyspark_kudu.spark.pinned import pinned_rdd
from pyspark_kudu.spark.replication.lease_keeper import LeaseKeeper
from pyspark_kudu.spark.replication.session_client import SessionAddress, SessionClient
from pyspark_kudu.spark.replication.sharedrounds import SharedRounds
from pyspark_kudu.spark.replication.spark_rounds import (
    SparkTransport,
    TabletServerLocation,
    root_cause,
)
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
from pyspark_kudu.spark.replication.write_service import ReplicationService

__all__ = ["ReplicaManagement", "delete_replicas_task", "delete_via_server"]

_log = logging.getLogger(__name__)


class ReplicaManagement:
    """Healing and replica management of a ``KuduContext`` (see module docstring); a mixin
    over the context's master client, tablet servers, transport and leaders."""

    spark: SparkSession
    master: MasterClient
    servers: list[TabletServerLocation]
    transport: SparkTransport
    _service: ReplicationService
    _lock: threading.Lock
    _leaders: dict[str, TabletLeader]
    _leader_tables: dict[str, str]
    leases: LeaseKeeper
    _next_failure_at: float | None = None  # time.monotonic() (``next_failure_in``)

    if TYPE_CHECKING:  # provided by KuduContext
        def _report_failed(self, leaders: Iterable[TabletLeader]) -> None: ...

        def _current_addresses(self) -> dict[str, str]: ...

        def _route(self, locs: TableLocations, tablet_ids: Sequence[str], *,
                   forwarded: bool = False, exclude: frozenset[str] = frozenset()
                   ) -> tuple[dict[str, TabletLeader], dict[str, SessionAddress]]: ...

        @property
        def credential(self) -> str: ...

    def _delete_replicas(self, doomed: dict[str, tuple[str, ...]]) -> set[str]:
        """Delete the given replicas (tablet ids by tablet server); returns the tablet
        servers where some could not be deleted now.

        Each goes to its host's resident tablet server, straight from the driver: no Spark
        task that Spark might run on another host (it would find no such tablet server and
        delete nothing), and the server, which keeps the replicas open, closes them as it
        deletes them (a pinned task deleting files under it would leave it holding their
        MemRowSets and indexes). Servers without a current address get the pinned job."""
        servers = {s.uuid: s for s in self.servers}
        addresses = self._current_addresses()
        left = {ts for ts in doomed if ts not in servers}
        direct = {ts: addresses[servers[ts].host] for ts in doomed
                  if ts in servers and servers[ts].host in addresses}
        if direct:
            secret = self.credential.encode()
            with ThreadPoolExecutor(max_workers=min(8, len(direct))) as pool:
                done = dict(zip(direct, pool.map(
                    lambda ts: delete_via_server(direct[ts], secret, ts, servers[ts].root,
                                                 doomed[ts]), direct), strict=True))
        else:
            done = {}
        tasks = [((ts, servers[ts].root, tids), [servers[ts].host])
                 for ts, tids in sorted(doomed.items())
                 if ts in servers and not done.get(ts)]
        if tasks:
            try:
                out = pinned_rdd(self.spark.sparkContext, tasks).map(
                    delete_replicas_task).collect()
                left |= {ts for ts, ok in out if not ok}
            except Exception as e:  # a host lost meanwhile: the files stay for now
                _log.warning("deleting replicas failed: %s", root_cause(str(e)))
                left |= {ts for (ts, _, _), _ in tasks}
        return left

    def replication_plan(self, max_actions: int = 0) -> list[dict[str, Any]]:
        """The leader master's re-replication actions (see ``redrive.replication_plan``),
        after reporting the failed replicas this client has seen."""
        with self._lock:
            leaders = list(self._leaders.values())
        self._report_failed(leaders)
        out = self.master.call("replication_plan", {"max_actions": max_actions})
        due = out.get("next_failure_in_s")
        self._next_failure_at = None if due is None else time.monotonic() + float(due)
        return list(out["actions"])

    def next_failure_in(self) -> float | None:
        """Seconds until the master would count the next silent tablet server as failed,
        as of the last plan (None: no server it does not count failed yet); the healer
        asks for a plan again then (:class:`~pyspark_kudu.spark.healing.healer.Healer`)."""
        at = self._next_failure_at
        return None if at is None else max(0.0, at - time.monotonic())

    def execute_replication_action(self, action: dict[str, Any]) -> None:
        """Carry out one planned action on the tablet's leader (electing this client for
        it if needed) and report the new configuration to the master."""
        (err,) = (e for e, _ in self.execute_replication_actions([action]))
        if err is not None:
            raise err

    def execute_replication_actions(self, actions: Sequence[dict[str, Any]], *,
                                    forwarded: bool = False
                                    ) -> list[tuple[KuduError | None, float]]:
        """Carry out planned actions of *different* tablets concurrently (the bounded number
        of concurrent moves is the caller's batch size): one thread per tablet drives its
        leader, all inside one call on the replication service's round thread, so no write
        round interleaves. Returns, per action, its error (None: done) and its duration in
        seconds, ``-1.0`` for an action skipped because the plan was stale or its tablet
        already has an action in this batch (the next plan decides again). Actions on
        tablets another client leads are sent to it (``forwarded``: this call is such a
        send; a tablet this client does not lead then fails with ``NotLeaderError``)."""
        out: list[tuple[KuduError | None, float]] = [(None, -1.0)] * len(actions)
        ready: list[tuple[int, str, str, str, TabletLeader, str]] = []
        elsewhere: dict[SessionAddress, list[int]] = {}
        servers = {s.uuid for s in self.servers}
        for i, action in enumerate(actions):
            kind = str(action["action"])
            tid, ts = str(action["tablet_id"]), str(action["ts_uuid"])
            to = str(action.get("to_uuid", ""))
            # An add/promote that replaces a doomed voter evicts it once the new one is a
            # voter, as Kudu's leader does (3-4-3 in one action).
            replacing = str(action.get("replacing", "")) if kind in (
                "add_replica", "promote_replica") else ""
            try:
                # Only a server this application runs tasks on can receive a copy; evicting
                # one needs nothing from it (it may be long dead).
                target = ts if kind in ("add_replica", "promote_replica") else to
                if kind != "remove_replica" and target not in servers:
                    raise ServiceUnavailableError(
                        f"tablet server {target} is not one of this application's ({kind} "
                        f"of {tid})")
                if kind not in ("add_replica", "promote_replica", "remove_replica",
                                "move_replica"):
                    raise InvalidArgumentError(f"unknown replication action {kind!r}")
                if any(r[2] == tid for r in ready) or any(
                        str(actions[j]["tablet_id"]) == tid for js in elsewhere.values()
                        for j in js):
                    continue  # one change at a time per tablet: the next pass
                locs = self.master.get_table(str(action["table_name"]))
                tablet = next((t for t in locs.tablets if t.tablet_id == tid), None)
                if tablet is None or tablet.config_index != int(
                        action.get("cas_config_index", 0)):
                    continue  # the plan is stale: the tablet changed since; next pass
                exclude = frozenset({ts}) if kind in ("remove_replica", "move_replica") \
                    else frozenset({replacing} - {""})
                own, remote = self._route(locs, [tid], forwarded=forwarded, exclude=exclude)
                if tid in remote:
                    elsewhere.setdefault(remote[tid], []).append(i)
                    continue
                lead = own[tid]
            except KuduError as e:
                out[i] = (e, 0.0)
                continue
            ready.append((i, kind, tid, ts if kind != "move_replica" else f"{ts}>{to}", lead,
                          replacing))

        def one(kind: str, member: str, lead: TabletLeader, replacing: str
                ) -> tuple[KuduError | None, float]:
            t0 = time.monotonic()
            try:
                if kind in ("add_replica", "promote_replica"):
                    lead.add_replica(member)
                    if replacing:
                        try:
                            lead.remove_replica(replacing)
                        except KuduError:
                            # The new voter is committed: the catalog must know it, or
                            # elections and plans go on from the configuration before it.
                            with contextlib.suppress(KuduError):
                                self._report_config(lead)
                            raise
                elif kind == "remove_replica":
                    lead.remove_replica(member)
                else:  # the rebalancer's move: add, then remove
                    src, dst = member.split(">")
                    lead.add_replica(dst)
                    lead.remove_replica(src)
            except KuduError as e:
                lead.abandon(f"{kind} of {member} failed")
                return e, time.monotonic() - t0
            return None, time.monotonic() - t0

        def run_all() -> list[tuple[KuduError | None, float]]:
            if len(ready) == 1:
                _, kind, _, member, lead, replacing = ready[0]
                return [one(kind, member, lead, replacing)]
            # One thread per tablet, their rounds merged: one stage per step for all.
            shared = SharedRounds(self.transport, len(ready))

            def party_member(kind: str, member: str, lead: TabletLeader, replacing: str
                             ) -> tuple[KuduError | None, float]:
                try:
                    with lead.rounds_via(shared):
                        return one(kind, member, lead, replacing)
                finally:
                    shared.leave()

            with ThreadPoolExecutor(len(ready), thread_name_prefix="kudu-heal") as pool:
                futs = [pool.submit(party_member, kind, member, lead, replacing)
                        for _, kind, _, member, lead, replacing in ready]
                return [f.result() for f in futs]

        def forward(addr: SessionAddress, idx: list[int]) -> None:
            try:
                got = SessionClient(addr).lead_heal([actions[i] for i in idx])
            except KuduError as e:
                got = [(e, 0.0)] * len(idx)
            for i, res in zip(idx, got, strict=True):
                out[i] = res

        with ThreadPoolExecutor(max(1, len(elsewhere)),
                                thread_name_prefix="kudu-heal-forward") as pool:
            sent = [pool.submit(forward, addr, idx) for addr, idx in elsewhere.items()]
            if ready:
                with self.leases.using([r[2] for r in ready]):
                    results = self._service.call(run_all).result()
                for (i, _, _, _, lead, _), res in zip(ready, results, strict=True):
                    out[i] = res
                    if res[0] is None:
                        self._report_config(lead)
            for f in sent:
                f.result()
        return out

    def recover_tablet(self, table: str, tablet_id: str, survivor: str | None = None
                       ) -> dict[str, Any]:
        """Manual recovery of a tablet that lost a majority of its voters (UNSAFE).

        The config-change seed's "unsafe config change": reads the state of every reachable
        replica, picks the most up-to-date one (highest last log term, then index; or
        ``survivor``), forces a configuration of that replica alone on it -- its whole log
        counts as committed, including entries the lost majority may never have agreed on
        -- elects it and reports the new configuration. The healer then adds replicas back
        (tablet copies). Whatever existed only on the lost replicas is gone. Refused while
        a majority is reachable (use the healer or REPLACE marks then).
        """
        locs = self.master.get_table(table)
        tablet = next((t for t in locs.tablets if t.tablet_id == tablet_id), None)
        if tablet is None:
            raise NotFoundError(f"table {table} has no tablet {tablet_id}")
        unreachable = self.transport.unreachable()
        reqs = {v: [PeerRequest(RequestKind.READ_STATE, tablet_id, v)]
                for v in tablet.voters if v not in unreachable}
        out = self.transport.run(reqs) if reqs else {}
        states = {ts: r[0].state for ts, r in out.items()
                  if r and r[0].ok and r[0].state is not None}
        if len(states) > len(tablet.voters) // 2:
            raise IllegalStateError(
                f"tablet {tablet_id} of {table} has {len(states)} of {len(tablet.voters)} "
                f"voters reachable, a majority: it does not need an unsafe recovery")
        if survivor is not None and survivor not in states:
            raise ServiceUnavailableError(
                f"replica {survivor} of tablet {tablet_id} is not readable "
                f"(readable: {sorted(states)})")
        if not states:
            raise ServiceUnavailableError(
                f"tablet {tablet_id} of {table}: no replica is readable; nothing to recover "
                f"from")
        best = survivor or max(states, key=lambda ts: (states[ts].last_term,
                                                       states[ts].last_index, ts))
        st = states[best]
        _log.warning(
            "UNSAFE recovery of tablet %s of %s: forcing a configuration of replica %s alone "
            "(last entry %d.%d, commit %d). Entries after %d are now committed without "
            "majority agreement; anything only the lost replicas %s had is lost.",
            tablet_id, table, best, st.last_term, st.last_index, st.hard_state.commit,
            st.hard_state.commit, sorted(set(tablet.voters) - set(states)))
        with self._lock:
            old = self._leaders.pop(tablet_id, None)
            if old is not None:
                old.abandon("unsafe recovery of the tablet")
        res = self.transport.run({best: [PeerRequest(RequestKind.UNSAFE_CONFIG, tablet_id,
                                                     best, voters=(best,))]}).get(best)
        if not res or not res[0].ok:
            raise ServiceUnavailableError(
                f"tablet {tablet_id}: forcing the configuration on {best} failed "
                f"({res[0].error if res else 'its task failed'})")
        lead = TabletLeader(TabletReplicas(tablet_id, (best,)), best, self.transport)
        lead.elect()
        assert lead.node is not None
        lead.config_index = lead.node.log.last_index()
        with self._lock:
            self._leaders[tablet_id] = lead
            self._leader_tables[tablet_id] = table
        self._report_config(lead)
        return {"tablet_id": tablet_id, "table": table, "survivor": best,
                "last_index": st.last_index, "last_term": st.last_term,
                "previously_committed": st.hard_state.commit,
                "lost": sorted(set(tablet.voters) - set(states)),
                "discarded": sorted(set(states) - {best}), "term": lead.node.term}

    def rebalance_plan(self, max_moves: int = 0) -> list[dict[str, Any]]:
        """The leader master's rebalancing moves (``move_replica`` actions; none while
        anything needs re-replication), for :meth:`execute_replication_action`."""
        return list(self.master.call("rebalance_plan", {"max_moves": max_moves})["actions"])

    def _report_config(self, lead: TabletLeader) -> None:
        node = lead.node
        if node is None:
            return
        cs = node.conf_state
        members = tuple(ReplicaMeta(v, MemberType.VOTER) for v in sorted(cs.voters)) + tuple(
            ReplicaMeta(v, MemberType.NON_VOTER) for v in sorted(cs.learners))
        # The configuration in force at the driver's applied index (a configuration change
        # takes effect when applied). ``lead.config_index`` alone is the last change this
        # leader made itself: 0 for one elected after the change, whose report the master
        # would then ignore as older than the catalog's (a fault run looped on that).
        rep = TabletReport(lead.tablet.tablet_id, node.term, leader=lead.leader_id,
                           committed_index=node.commit_index,
                           config_index=max(lead.config_index, node.log.applied),
                           replicas=members)
        loc = {s.uuid: s for s in self.servers}[lead.leader_id]
        self.master.heartbeat_to(self.master.leader_address(),
                                 loc.meta(),
                                 [rep.to_dict()])

    def sweep_replicas(self) -> int:
        """Delete replicas the catalog says are evicted or of deleted tables, on every tablet
        server with an executor (the master decides, from a report of what each holds).
        Returns how many were deleted."""
        gone = self.transport.unreachable()
        servers = [s for s in self.servers if s.uuid not in gone]
        if not servers:
            return 0
        try:
            held = pinned_rdd(self.spark.sparkContext, [
                ((s.uuid, s.root), [s.host]) for s in servers]).map(_list_replicas).collect()
        except Exception as e:  # a host lost meanwhile: the next sweep
            _log.warning("listing replicas failed: %s", root_cause(str(e)))
            return 0
        address = self.master.leader_address()
        by_uuid = {s.uuid: s for s in servers}
        doomed: list[tuple[tuple[str, str | None, tuple[str, ...]], list[str]]] = []
        for ts, tids in held:
            if not tids:
                continue
            s = by_uuid[ts]
            out = self.master.heartbeat_to(
                address, s.meta(),
                [TabletReport(t, 0).to_dict() for t in tids])
            dead = tuple(a["tablet_id"] for a in out.get("actions", ())
                         if a.get("action") == "delete_tablet")
            if dead:
                doomed.append(((ts, s.root, dead), [s.host]))
        if not doomed:
            return 0
        by_ts = {ts: tids for (ts, _, tids), _ in doomed}
        left = self._delete_replicas(by_ts)
        n = sum(len(tids) for ts, tids in by_ts.items() if ts not in left)
        _log.info("deleted %d evicted or orphaned replicas", n)
        return n


def delete_via_server(address: str, secret: bytes, ts_uuid: str, root: str | None,
                      tablet_ids: Sequence[str]) -> bool:
    """Delete ``tablet_ids``' replicas of tablet server ``ts_uuid`` through the resident
    server at ``address`` (``WIPE`` requests, served as a round task's are); False if it
    could not (unreachable, not that tablet server, a replica not deleted)."""
    task = HostTask("", ((ts_uuid, root, tuple(
        PeerRequest(RequestKind.WIPE, t, ts_uuid) for t in tablet_ids)),), None)
    try:
        out = serve_task_remote(address, secret, task)
    except KuduError as e:
        _log.info("deleting replicas through %s failed: %s", address, e)
        return False
    return all(resps is not None and all(r.ok for r in resps) for _, resps, _ in out)


def delete_replicas_task(task: tuple[str, str | None, tuple[str, ...]]) -> tuple[str, bool]:
    """Pinned task: delete the given replicas of this tablet server (instance-checked)."""
    ts_uuid, root_hint, tablet_ids = task
    root = local_data_root(root_hint)
    res = run_pinned(root, ts_uuid, lambda r: [
        delete_replica(r, tablet_dir(r, t), t) for t in tablet_ids])
    return ts_uuid, res.ok


def _list_replicas(task: tuple[str, str | None]) -> tuple[str, list[str]]:
    """The tablets with a replica on this tablet server (pinned; instance-checked)."""
    ts, root_hint = task
    root = local_data_root(root_hint)

    def listing(r: str) -> list[str]:
        base = os.path.join(r, "tablets")
        if not os.path.isdir(base):
            return []
        return sorted(t for t in os.listdir(base)
                      if not t.startswith(".") and tablet_dir(r, t).exists("meta"))

    res = run_pinned(root, ts, listing)
    return ts, list(res.value) if res.ok and res.value is not None else []
