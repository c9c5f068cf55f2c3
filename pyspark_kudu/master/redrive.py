"""Work the leader master asks of a tablet server in a heartbeat response (re-driving).

Seed: kudu-multi-master, KUDU-1374 and "Send full heartbeats to newly elected leader
masters". Table-wide operations complete tablet by tablet, so a catalog may say "deleted" or
"schema version 3" while some replicas are not there yet. Whatever is pending is derived
from the catalog and the tablet server's report -- never from a leader's memory -- so a new
leader that receives a full report re-drives everything its predecessor left unfinished:

- a reported replica of a tablet whose record is a tombstone (deleted table), or which its
  tablet's config no longer lists (evicted), is deleted (``delete_tablet``). Fencing: only
  tablets with a persistent record are ever deleted; a tablet the catalog has never heard
  of (a true orphan) is left alone;
- a replica running an older schema version than its table is altered (``alter_tablet``);
- a tablet this server leads that is under-replicated (fewer voters than the replication
  factor, a replica on a server that stopped heartbeating, or a REPLACE mark) gets a new
  replica placed with :func:`~pyspark_kudu.master.placement.place_extra_replica`
  (``add_replica``, as NON_VOTER: Raft config change seed, 3-4-3; ``replacing`` names the
  doomed voter the leader evicts right after promoting the new one); one that is
  over-replicated sheds its REPLACE-marked or dead replica (``remove_replica``), and, in the
  healer's plan, a NON_VOTER it no longer needs (an add or a move cut short);
- on a *full* report, tablets the catalog assigns to the server that it did not report are
  created again (``create_tablet``, the seed's "nudge").

Thread-safety: pure functions apart from consuming ``rng``.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from typing import Any

from pyspark_kudu.master.catalog import Catalog
from pyspark_kudu.master.ddl import cluster_snapshot
from pyspark_kudu.master.entities import (
    MemberType,
    ReplicaMeta,
    TableState,
    TabletMeta,
    TabletState,
)
from pyspark_kudu.master.placement import place_extra_replica
from pyspark_kudu.master.rebalancer import plan_rebalance
from pyspark_kudu.master.records import TabletReport
from pyspark_kudu.master.topology import PlacementConfig, Table, Tablet

__all__ = ["pending_actions", "rebalance_actions", "replication_plan"]

Action = dict[str, Any]


def pending_actions(
    catalog: Catalog,
    ts_uuid: str,
    reports: Sequence[TabletReport],
    *,
    full: bool,
    live: Collection[str],
    rng: random.Random,
    placement_config: PlacementConfig | None = None,
) -> list[Action]:
    """The actions for ``ts_uuid`` given the tablets it reported (see the module rules)."""
    out: list[Action] = []
    reported = set()
    for rep in reports:
        reported.add(rep.tablet_id)
        tb = catalog.tablets.get(rep.tablet_id)
        if tb is None:
            continue  # true orphan: never deleted (fencing)
        if tb.state is TabletState.DELETED:
            table = catalog.tables.get(tb.table_id)
            why = f"table {table.name!r} was deleted" if table is not None else "tablet deleted"
            out.append({"action": "delete_tablet", "tablet_id": tb.tablet_id, "reason": why,
                        "tombstoned": True})
            continue
        if tb.replica(ts_uuid) is None and tb.config_index > 0:
            out.append({"action": "delete_tablet", "tablet_id": tb.tablet_id,
                        "reason": f"replica on {ts_uuid} was evicted from the config",
                        "cas_config_index": tb.config_index, "tombstoned": False})
            continue
        table = catalog.tables[tb.table_id]
        if rep.schema_version is not None and rep.schema_version < table.schema_version:
            out.append({"action": "alter_tablet", "tablet_id": tb.tablet_id,
                        "schema_version": table.schema_version,
                        "schema": table.schema.to_dict()})
        if tb.leader == ts_uuid:
            out.extend(_replication_actions(catalog, tb, live, rng, placement_config))
    if full:
        for tb in catalog.tablets.values():
            if (tb.tablet_id not in reported and tb.state is not TabletState.DELETED
                    and tb.replica(ts_uuid) is not None):
                table = catalog.tables[tb.table_id]
                out.append({"action": "create_tablet", "tablet_id": tb.tablet_id,
                            "table_id": tb.table_id, "table_name": table.name,
                            "partition": tb.partition.to_dict(),
                            "replicas": [r.to_dict() for r in tb.replicas],
                            "schema": table.schema.to_dict(),
                            "schema_version": table.schema_version})
    return sorted(out, key=lambda a: (a["tablet_id"], a["action"]))


def replication_plan(
    catalog: Catalog,
    *,
    live: Collection[str],
    failed: Collection[str],
    rng: random.Random,
    placement_config: PlacementConfig | None = None,
) -> list[Action]:
    """Re-replication work for every tablet of a live table (Kudu's 3-4-3), whoever leads it.

    ``failed`` are the tablet servers unseen for longer than
    ``follower_unavailable_considered_failed_sec``: their replicas are replaced, like
    REPLACE-marked ones. New replicas go only to ``live`` (recently seen) servers. Per tablet
    at most one action, in the order a replacement takes: ``add_replica`` (as NON_VOTER),
    ``promote_replica`` (a NON_VOTER that is needed), ``remove_replica`` (once enough healthy
    voters exist). The client that leads the tablet executes it (there are no daemons) and
    reports the new configuration; the next plan then shows the next step.
    """
    out: list[Action] = []
    for tb in sorted(catalog.tablets.values(), key=lambda t: t.tablet_id):
        if tb.state is TabletState.DELETED:
            continue
        acts = _replication_actions(catalog, tb, live, rng, placement_config, failed=failed)
        for a in acts:
            a["table_id"] = tb.table_id
            a["table_name"] = catalog.tables[tb.table_id].name
        out.extend(acts)
    return out


def rebalance_actions(
    catalog: Catalog,
    *,
    live: Collection[str],
    rng: random.Random,
    max_moves: int | None = None,
) -> list[Action]:
    """The rebalancer's plan (:func:`~pyspark_kudu.master.rebalancer.plan_rebalance`: fix
    placement-policy violations first, then balance) as ``move_replica`` actions for the
    client to execute: add ``to_uuid`` (NON_VOTER, tablet copy, promote), then remove
    ``ts_uuid`` (seed: location awareness, "rebalancing"). Only over live servers; nothing
    while any tablet still needs re-replication (healing comes first)."""
    tables = catalog.live_tables()
    snap = cluster_snapshot(catalog, live, tuple(
        Table(t.table_id, t.name, t.replication_factor,
              None if t.constraint is None else t.constraint.to_topology())
        for t in tables))
    snap = snap.with_tablets(Tablet(tb.tablet_id, tb.table_id, tb.to_topology())
                             for t in tables for tb in catalog.tablets_of(t))
    plan = plan_rebalance(snap, rng, max_moves=max_moves)
    out: list[Action] = []
    for m in plan.moves:
        tb = catalog.tablets[m.tablet_id]
        out.append({"action": "move_replica", "tablet_id": m.tablet_id,
                    "table_id": m.table_id, "table_name": catalog.tables[m.table_id].name,
                    "ts_uuid": m.from_uuid, "to_uuid": m.to_uuid, "reason": m.reason,
                    "stage": m.stage, "cas_config_index": tb.config_index})
    return out


def _replication_actions(
    catalog: Catalog, tb: TabletMeta, live: Collection[str], rng: random.Random,
    placement_config: PlacementConfig | None, failed: Collection[str] | None = None,
) -> list[Action]:
    table = catalog.tables[tb.table_id]
    if table.state is TableState.DELETED:
        return []
    rf = table.replication_factor
    voters = [r for r in tb.replicas if r.member_type is MemberType.VOTER]
    doomed = [r.ts_uuid for r in tb.replicas if r.replace or (
        r.ts_uuid in failed if failed is not None else r.ts_uuid not in live)]
    healthy_voters = [r for r in voters if r.ts_uuid not in doomed]
    if len(voters) > rf and doomed:
        # Evict a dead/marked voter first; a marked NON_VOTER goes too.
        return [{"action": "remove_replica", "tablet_id": tb.tablet_id, "ts_uuid": doomed[0],
                 "cas_config_index": tb.config_index}]
    non_voters = [r for r in tb.replicas if r.member_type is MemberType.NON_VOTER
                  and r.ts_uuid not in doomed]
    if failed is not None:
        if non_voters and len(voters) < rf + (1 if doomed else 0):
            return [_replacing({"action": "promote_replica", "tablet_id": tb.tablet_id,
                                "ts_uuid": non_voters[0].ts_uuid,
                                "cas_config_index": tb.config_index}, voters, doomed)]
        dead_non_voters = [r.ts_uuid for r in tb.replicas if r.member_type is
                           MemberType.NON_VOTER and r.ts_uuid in doomed]
        if dead_non_voters:
            return [{"action": "remove_replica", "tablet_id": tb.tablet_id,
                     "ts_uuid": dead_non_voters[0], "cas_config_index": tb.config_index}]
        if not doomed and non_voters and len(healthy_voters) >= rf:
            # A NON_VOTER nobody needs: an add cut short after the new replica joined, whose
            # failed voter came back meanwhile, or an interrupted rebalancing move. Kept, it
            # would show the tablet RECOVERING in ksck for ever; evicted, as Kudu does.
            return [{"action": "remove_replica", "tablet_id": tb.tablet_id,
                     "ts_uuid": non_voters[0].ts_uuid, "cas_config_index": tb.config_index}]
    if len(healthy_voters) + len(non_voters) >= rf:
        return []  # enough replicas (some may be catching up as NON_VOTER)
    topo_table = Table(table.table_id, table.name, rf,
                       None if table.constraint is None else table.constraint.to_topology())
    # A server being replaced still holds its replica: it is no candidate for the new one.
    snap = cluster_snapshot(catalog, set(live) - set(doomed), (topo_table,), placement_config)
    dest = place_extra_replica(snap, Tablet(tb.tablet_id, tb.table_id, tb.to_topology()), rng,
                               replacing=doomed)
    if dest is None:
        return []
    return [_replacing({"action": "add_replica", "tablet_id": tb.tablet_id, "ts_uuid": dest,
                        "member_type": MemberType.NON_VOTER.value,
                        "cas_config_index": tb.config_index}, voters, doomed)]


def _replacing(action: Action, voters: Sequence[ReplicaMeta], doomed: Sequence[str]) -> Action:
    """Name in ``action`` the doomed voter the new replica replaces (``replacing``): as in
    Kudu, the leader that promoted the new replica evicts that one right away, in the same
    action (no second plan for the ``remove_replica`` step)."""
    doomed_voters = [r.ts_uuid for r in voters if r.ts_uuid in doomed]
    if doomed_voters:
        action["replacing"] = doomed_voters[0]
    return action
