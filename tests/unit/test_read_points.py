"""Which replicas may serve a linearizable read point, in the order scans try them."""

from __future__ import annotations

from pyspark_kudu.spark.replication.session_client import read_point_replicas


def test_the_leader_comes_first_and_with_a_term_every_other_voter_follows() -> None:
    assert read_point_replicas("b", ["a", "b", "c"], term=4) == [
        ("b", True), ("a", False), ("c", False)]


def test_without_the_points_term_only_the_leader_may_serve_it() -> None:
    assert read_point_replicas("b", ["a", "b", "c"], term=None) == [("b", True)]


def test_a_leader_missing_from_the_voters_is_still_tried_first() -> None:
    # E.g. the leader's server is unreachable from the planner's view: it stays first (a
    # scan task may still reach it), the reachable voters back it up.
    assert read_point_replicas("x", ["a", "c"], term=2) == [
        ("x", True), ("a", False), ("c", False)]
