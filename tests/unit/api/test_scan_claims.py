"""The session service's registry of ``format("kudu")`` scans: every tablet read exactly
once, each task preferring a tablet with a replica on its own host, and a retried task
reading the tablet it was given the first time."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_kudu.errors import InvalidArgumentError, NotFoundError
from pyspark_kudu.spark.api.scan_claims import ScanClaims

pytestmark = pytest.mark.unit

HOSTS = [f"h{k}" for k in range(6)]


@st.composite
def scans(draw: st.DrawFn) -> tuple[list[list[str]], list[tuple[int, str]]]:
    n = draw(st.integers(1, 12))
    replicas = [draw(st.lists(st.sampled_from(HOSTS), min_size=1, max_size=3, unique=True))
                for _ in range(n)]
    # Tasks ask in any order, from any host, some of them more than once (retries).
    asks = draw(st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from(HOSTS)),
                         min_size=n, max_size=3 * n))
    asks += [(p, draw(st.sampled_from(HOSTS))) for p in range(n)]  # every partition asks
    return replicas, asks


@given(scans())
@settings(max_examples=200, deadline=None)
def test_every_tablet_is_read_exactly_once_and_a_retry_reads_the_same_one(
        scan: tuple[list[list[str]], list[tuple[int, str]]]) -> None:
    replicas, asks = scan
    claims = ScanClaims()
    claims.register("s", replicas, [f"tok{j}" for j in range(len(replicas))])
    given_to: dict[int, int] = {}
    for part, host in asks:
        j, token = claims.claim("s", part, host)
        assert token == f"tok{j}"
        if part in given_to:
            assert j == given_to[part], "a retried partition was given another tablet"
            continue
        free = set(range(len(replicas))) - set(given_to.values())
        local = {k for k in free if host in replicas[k]}
        assert j in free, "a tablet was given twice"
        if local:
            assert j in local, f"{host} was given a remote tablet while {local} were free"
        given_to[part] = j
    assert sorted(given_to.values()) == list(range(len(replicas)))


def test_a_task_on_a_replica_host_gets_a_local_tablet_while_its_own_is_remote() -> None:
    claims = ScanClaims()
    claims.register("s", [["h0"], ["h1"], ["h2"]], ["a", "b", "c"])
    assert claims.claim("s", 0, "h2") == (2, "c")
    assert claims.claim("s", 2, "h2") == (0, "a")  # no local tablet left: its own is taken
    assert claims.claim("s", 1, "h1") == (1, "b")


def test_unknown_scans_and_partitions_are_refused_with_their_names() -> None:
    claims = ScanClaims(keep_tokens=3)
    with pytest.raises(NotFoundError, match="scan nope is not registered"):
        claims.claim("nope", 0, "h0")
    claims.register("s1", [["h0"]], ["t"])
    claims.register("s2", [["h0"], ["h1"]], ["t", "u"])
    claims.register("s3", [["h0"]], ["t"])  # 4 tokens: s1 goes
    assert claims.scan_ids() == ["s2", "s3"]
    with pytest.raises(NotFoundError, match="scan s1 is not registered"):
        claims.claim("s1", 0, "h0")
    with pytest.raises(InvalidArgumentError, match=r"partitions 0\.\.0, not 1"):
        claims.claim("s3", 1, "h0")
    with pytest.raises(InvalidArgumentError, match="registered already"):
        claims.register("s3", [["h0"]], ["t"])
    with pytest.raises(InvalidArgumentError, match="2 host lists for 1 tokens"):
        claims.register("s4", [["h0"], ["h1"]], ["t"])


def test_registrations_older_than_the_limit_are_dropped() -> None:
    now = [100.0]
    claims = ScanClaims(keep_s=60.0, clock=lambda: now[0])
    claims.register("old", [["h0"]], ["t"])
    now[0] += 30.0
    claims.register("mid", [["h0"]], ["t"])
    assert claims.claim("old", 0, "h0") == (0, "t")
    now[0] += 31.0
    claims.register("new", [["h0"]], ["t"])
    assert claims.claim("mid", 0, "h0") == (0, "t")
    with pytest.raises(NotFoundError, match="scan old is not registered"):
        claims.claim("old", 0, "h0")
