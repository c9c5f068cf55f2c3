"""The checks have teeth: plant a known Raft bug in the core and the simulator catches it.

Each mutant replaces one core function for the duration of a test (``monkeypatch``), then a
few seeded histories must fail with the property the bug breaks.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pyspark_kudu.consensus import Message, Role, Snapshot
from pyspark_kudu.consensus.messages import NONE, Entry
from pyspark_kudu.consensus.raft import RaftNode
from pyspark_kudu.consensus.raft_log import RaftLog
from pyspark_kudu.consensus.sim_run import SimulationFailure, simulate

from . import test_paper_replication
from .helpers import MT


def _always_up_to_date(self: RaftLog, last_index: int, term: int) -> bool:
    return True  # no election restriction (§5.4.1)


_handle_vote_request = RaftNode._handle_vote_request


def _forgetful_voter(self: RaftNode, m: Message) -> None:
    if m.type == MT.VOTE:
        self.vote = NONE  # forgets its vote: two votes per term (§5.2)
    _handle_vote_request(self, m)


def _restore_blindly(self: RaftNode, snap: Snapshot) -> bool:
    md = snap.metadata
    if md.index <= self.log.committed:
        return False
    self.log.restore(snap)  # even when the log already holds the entry: drops entries after it
    self._tracker.apply_conf(md.conf_state, self.log.last_index())
    return True


def _append_without_truncating(
    self: RaftLog, index: int, log_term: int, committed: int, ents: tuple[Entry, ...]
) -> int | None:
    if not self.match_term(index, log_term):
        return None
    new = [e for e in ents if e.index > self.last_index()]  # keeps conflicting entries (§5.3)
    if new:
        self.append(new)
    self.commit_to(min(committed, index + len(ents)))
    return index + len(ents)


# mutant -> (class, attribute, replacement, what the failure must mention: one of these)
MUTANTS: dict[str, tuple[type, str, Callable[..., object], tuple[str, ...]]] = {
    "no-election-restriction": (
        RaftLog, "is_up_to_date", _always_up_to_date, ("leader completeness",)
    ),
    "two-votes-per-term": (RaftNode, "_handle_vote_request", _forgetful_voter, ("voted for",)),
    "snapshot-drops-held-entries": (
        RaftNode, "_restore", _restore_blindly, ("lost committed entry",)
    ),
    "no-conflict-truncation": (
        RaftLog, "maybe_append", _append_without_truncating,
        ("durable only", "log matching", "state-machine safety"),
    ),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_the_sweep_catches_a_planted_bug(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cls, name, fn, want = MUTANTS[mutant]
    monkeypatch.setattr(cls, name, fn)
    for nodes in (3, 5):
        for seed in range(60):
            try:
                simulate(seed, nodes, 1500)
            except SimulationFailure as e:
                assert any(w in str(e) for w in want), str(e).splitlines()[0]
                return
    raise AssertionError(f"120 histories did not notice the {mutant} bug")


def test_figure_8_catches_committing_an_old_term_entry_by_counting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def commit_any_term(self: RaftLog, max_index: int, term: int) -> bool:
        if max_index > self.committed:
            self.commit_to(max_index)  # ignores the §5.4.2 term check
            return True
        return False

    monkeypatch.setattr(RaftLog, "maybe_commit", commit_any_term)
    with pytest.raises(AssertionError):
        test_paper_replication.test_s5_4_2_figure_8_an_old_term_entry_on_a_majority_is_not_committed()


def test_mutants_are_undone_after_each_test() -> None:
    assert RaftLog.is_up_to_date is not _always_up_to_date
    assert Role.LEADER.value == "leader"
