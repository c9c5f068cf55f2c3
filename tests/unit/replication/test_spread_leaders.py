"""Leaderships are spread over the servers: the first candidate of each tablet."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pyspark_kudu.spark.replication.multitablet import spread_leaders

SERVERS = [f"ts-{k}" for k in range(6)]


@st.composite
def _placements(draw: st.DrawFn) -> tuple[dict[str, list[str]], list[str]]:
    tablets = draw(st.integers(0, 12))
    cands = {f"tab-{k}": draw(st.permutations(SERVERS).map(lambda p: list(p[:3])))
             for k in range(tablets)}
    leading = draw(st.lists(st.sampled_from(SERVERS), max_size=6))
    return cands, leading


@given(_placements())
def test_first_candidates_are_as_even_as_greedy_allows(
        case: tuple[dict[str, list[str]], list[str]]) -> None:
    cands, leading = case
    out = spread_leaders(cands, leading)
    assert out.keys() == cands.keys()
    load = {s: leading.count(s) for s in SERVERS}
    for tid, order in out.items():
        # Only reordered: the same candidates, the later ones in their given order.
        assert sorted(order) == sorted(cands[tid])
        rest = [c for c in cands[tid] if c != order[0]]
        assert order[1:] == rest
        # The first is a least-loaded candidate at its turn.
        assert load[order[0]] == min(load[c] for c in cands[tid]), (tid, order, load)
        load[order[0]] += 1


def test_six_tablets_whose_first_voter_is_the_same_server_get_six_leaders() -> None:
    # Placement listed ts-0 first for every tablet; each tablet has one other server.
    cands = {"tab-0": ["ts-0", "ts-1", "ts-2"], **{
        f"tab-{k}": ["ts-0", SERVERS[k], SERVERS[k % 5 + 1]] for k in range(1, 6)}}
    out = spread_leaders(cands)
    firsts = [order[0] for order in out.values()]
    assert max(firsts.count(s) for s in set(firsts)) == 1, firsts


def test_servers_already_leading_are_chosen_last() -> None:
    out = spread_leaders({"t": ["ts-0", "ts-1", "ts-2"]}, ["ts-0", "ts-1"])
    assert out["t"] == ["ts-2", "ts-0", "ts-1"]
    assert spread_leaders({"t": []}) == {"t": []}
