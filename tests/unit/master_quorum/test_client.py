"""MasterClient rules: address parsing, discovery, NotLeader hints, backoff to a deadline."""

from __future__ import annotations

from typing import Any

import pytest

from pyspark_kudu.errors import (
    AlreadyPresentError,
    InvalidArgumentError,
    NetworkError,
    NotLeaderError,
    TimedOutError,
)
from pyspark_kudu.master.client import MasterClient, parse_master_addresses


def test_master_lists_parse_like_kudu_master_option() -> None:
    assert parse_master_addresses("h1:7051, h2 ,h3:7053") == ["h1:7051", "h2:7051", "h3:7053"]
    for bad, text in [("", "no master addresses"), ("h:x", "invalid master address"),
                      ("h:1,h:1", "listed twice"), ("h:70000", "invalid master address")]:
        with pytest.raises(InvalidArgumentError, match=text):
            parse_master_addresses(bad)


class _Fake:
    """Scripted masters: ``status`` plus one method whose answers are queued per address."""

    def __init__(self, statuses: dict[str, Any], answers: dict[str, list[Any]]) -> None:
        self.statuses = statuses
        self.answers = answers
        self.calls: list[tuple[str, str]] = []

    def factory(self, addr: str) -> Any:
        fake = self

        class Ch:
            address = addr

            def call(self, method: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
                fake.calls.append((addr, method))
                src = fake.statuses if method == "status" else None
                if src is not None:
                    v = src[addr]
                else:
                    q = fake.answers[addr]
                    v = q.pop(0) if len(q) > 1 else q[0]
                if isinstance(v, Exception):
                    raise v
                return v  # type: ignore[no-any-return]

            def close(self) -> None:
                pass

        return Ch()


def _status(role: str, term: int = 1, leader: str = "", voters: int = 3) -> dict[str, Any]:
    masters = {f"m{i}": f"h{i}:7051" for i in range(1, voters + 1)}
    return {"id": "x", "role": role, "term": term, "leader_ready": role == "leader",
            "leader_address": leader, "voters": sorted(masters), "masters": masters}


ADDRS = "h1:7051,h2:7051,h3:7051"


def test_discovery_picks_the_ready_leader_and_caches_it() -> None:
    f = _Fake({"h1:7051": _status("follower", leader="h2:7051"), "h2:7051": _status("leader"),
               "h3:7051": NetworkError("down")},
              {"h2:7051": [{"tables": []}]})
    with MasterClient(ADDRS, channel_factory=f.factory) as c:
        assert c.call("list_tables") == {"tables": []}
        assert c.call("list_tables") == {"tables": []}
    assert [a for a, m in f.calls if m == "list_tables"] == ["h2:7051", "h2:7051"]
    assert sum(1 for _, m in f.calls if m == "status") == 3  # one discovery round only


def test_not_leader_hints_are_followed_and_usage_errors_are_not_retried() -> None:
    f = _Fake({a: _status("follower") for a in ADDRS.split(",")},
              {"h1:7051": [NotLeaderError("no", "h3:7051")],
               "h3:7051": [AlreadyPresentError("table 't' already exists")]})
    f.statuses["h1:7051"] = _status("follower", leader="h1:7051")
    with MasterClient(ADDRS, channel_factory=f.factory) as c:
        with pytest.raises(AlreadyPresentError):
            c.call("create_table")
    assert [a for a, m in f.calls if m == "create_table"] == ["h1:7051", "h3:7051"]


def test_retries_back_off_until_the_deadline_with_the_last_error() -> None:
    f = _Fake({a: NetworkError(f"{a} refused") for a in ADDRS.split(",")}, {})
    now = [0.0]  # an injected clock: the client's sleeps advance it, nothing else does
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    with MasterClient(ADDRS, channel_factory=f.factory, timeout_s=0.6,
                      clock=lambda: now[0], sleep=sleep) as c:
        with pytest.raises(TimedOutError, match=r"timed out after 0.6 s.*last error: .*refused"):
            c.call("list_tables")
    assert now[0] == pytest.approx(0.6)  # gave up exactly at the deadline, not before
    assert len(slept) >= 3 and slept[2] > slept[0]  # exponential backoff (with jitter)
    rounds = sum(1 for _, m in f.calls if m == "status") / 3
    assert 2 <= rounds < 20  # backed off, did not spin
    assert all(0 < s <= 1.0 for s in slept)


def test_stale_reads_may_be_answered_by_any_master() -> None:
    f = _Fake({a: _status("follower") for a in ADDRS.split(",")},
              {"h1:7051": [{"tables": [{"name": "t"}]}]})
    with MasterClient(ADDRS, channel_factory=f.factory) as c:
        assert c.list_tables(max_staleness_s=5) == ["t"]
    assert f.calls == [("h1:7051", "list_tables")]


def test_a_group_size_mismatch_is_a_configuration_error() -> None:
    f = _Fake({"h1:7051": _status("leader", voters=3)}, {})
    with MasterClient("h1:7051", channel_factory=f.factory) as c:
        with pytest.raises(InvalidArgumentError, match=r"expects 3 master\(s\) \(h1:7051,h2"):
            c.call("list_tables")
