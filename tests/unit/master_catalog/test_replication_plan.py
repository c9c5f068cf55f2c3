"""The master's re-replication plan and rebalancing moves (issue 8): what the client's
healer is told to do, decided from the catalog and liveness alone."""

from __future__ import annotations

import random
from collections.abc import Sequence

from pyspark_kudu.master.catalog import Catalog, apply
from pyspark_kudu.master.ddl import build_create_table
from pyspark_kudu.master.entities import MemberType, ReplicaMeta
from pyspark_kudu.master.records import TabletReport, UpdateTablets
from pyspark_kudu.master.redrive import rebalance_actions, replication_plan

from .helpers import SCHEMA, id_factory, with_tservers


def _table(c: Catalog, live: set[str]) -> tuple[Catalog, str]:
    rec = build_create_table(c, name="t1", schema=SCHEMA, partition_schema=None,
                             replication_factor=3, constraint=None, live=live,
                             rng=random.Random(0), id_factory=id_factory("id"))
    c = apply(c, rec, c.index + 1)
    tid = c.names["t1"]
    return c, c.tables[tid].tablet_ids[0]


def _config(c: Catalog, tb: str, voters: Sequence[str], learners: Sequence[str] = (),
            index: int = 1) -> Catalog:
    reps = (*(ReplicaMeta(v) for v in voters),
            *(ReplicaMeta(v, MemberType.NON_VOTER) for v in learners))
    rep = TabletReport(tb, 2, voters[0], 5, index, reps)
    return apply(c, UpdateTablets(voters[0], (rep,)), c.index + 1)


def test_a_failed_server_is_replaced_step_by_step_3_4_3() -> None:
    c = with_tservers(4)
    c, tb = _table(c, set(c.tservers))
    voters = list(c.tablets[tb].voters)
    (spare,) = set(c.tservers) - set(voters)
    dead = voters[1]
    live = set(c.tservers) - {dead}
    # Not failed yet (only unresponsive): nothing to do.
    assert replication_plan(c, live=live, failed=set(), rng=random.Random(0)) == []
    acts = replication_plan(c, live=live, failed={dead}, rng=random.Random(0))
    assert [(a["action"], a["ts_uuid"], a["table_name"], a["replacing"]) for a in acts] == [
        ("add_replica", spare, "t1", dead)]
    # An interrupted add (the new replica is still a NON_VOTER) is finished first.
    c = _config(c, tb, voters, [spare], index=2)
    acts = replication_plan(c, live=live, failed={dead}, rng=random.Random(0))
    assert [(a["action"], a["ts_uuid"], a["replacing"]) for a in acts] == [
        ("promote_replica", spare, dead)]
    c = _config(c, tb, [*voters, spare], index=3)
    acts = replication_plan(c, live=live, failed={dead}, rng=random.Random(0))
    assert [(a["action"], a["ts_uuid"], a["cas_config_index"]) for a in acts] == [
        ("remove_replica", dead, 3)]
    c = _config(c, tb, [v for v in [*voters, spare] if v != dead], index=4)
    assert replication_plan(c, live=live, failed={dead}, rng=random.Random(0)) == []


def test_a_replica_with_nowhere_to_go_waits() -> None:
    c = with_tservers(3)
    c, tb = _table(c, set(c.tservers))
    dead = c.tablets[tb].voters[0]
    assert replication_plan(c, live=set(c.tservers) - {dead}, failed={dead},
                            rng=random.Random(0)) == []


def test_rebalancing_moves_fix_a_location_majority_once_the_rack_is_back() -> None:
    # ts0 and ts3 are in /rack0, ts1 in /rack1, ts2 in /rack2 (helpers.with_tservers).
    c = with_tservers(4)
    c, tb = _table(c, set(c.tservers))
    # As if /rack2 had been lost and re-replication put its replica in /rack0.
    c = _config(c, tb, ["ts0", "ts1", "ts3"], index=2)
    live = set(c.tservers)
    assert replication_plan(c, live=live, failed=set(), rng=random.Random(0)) == []
    acts = rebalance_actions(c, live=live, rng=random.Random(0))
    assert len(acts) == 1, acts
    (a,) = acts
    assert a["action"] == "move_replica" and a["to_uuid"] == "ts2"
    assert a["ts_uuid"] in ("ts0", "ts3") and a["cas_config_index"] == 2
    # While /rack2 is still gone, there is no legal move.
    assert rebalance_actions(c, live=live - {"ts2"}, rng=random.Random(0)) == []


def test_a_non_voter_left_by_an_interrupted_add_is_evicted_once_it_is_not_needed() -> None:
    """The add that replaced a failed voter was cut short after the new replica joined as
    a NON_VOTER, and the failed server came back: three healthy voters need no fourth, so
    the NON_VOTER goes (ksck would show the tablet RECOVERING for ever otherwise)."""
    c = with_tservers(4)
    c, tb = _table(c, set(c.tservers))
    voters = list(c.tablets[tb].voters)
    (spare,) = set(c.tservers) - set(voters)
    c = _config(c, tb, voters, [spare], index=2)
    live = set(c.tservers)
    acts = replication_plan(c, live=live, failed=set(), rng=random.Random(0))
    assert [(a["action"], a["ts_uuid"], a["cas_config_index"]) for a in acts] == [
        ("remove_replica", spare, 2)]
    # While a voter is still failed the same NON_VOTER is the replacement: promoted.
    acts = replication_plan(c, live=live - {voters[1]}, failed={voters[1]},
                            rng=random.Random(0))
    assert [(a["action"], a["ts_uuid"]) for a in acts] == [("promote_replica", spare)]
    c = _config(c, tb, voters, index=3)
    assert replication_plan(c, live=live, failed=set(), rng=random.Random(0)) == []
