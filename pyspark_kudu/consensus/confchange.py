"""One-server membership changes (Raft thesis §4.1): validation and application.

A change moves exactly one node between "absent", "learner" (Kudu's NON_VOTER) and "voter".
The one exception is ``BOOTSTRAP``, the first entry of every group, which states the whole
founding configuration so that a replica replaying the log never sees a partial one.
``ADD_VOTER`` on a learner promotes it; ``ADD_LEARNER`` on a voter demotes it (the
config-change seed's appendix uses demotion to regain fault tolerance fast).

Thread-safety: pure functions.
"""

from __future__ import annotations

import json

from pyspark_kudu.consensus.messages import ConfChange, ConfChangeType, ConfState
from pyspark_kudu.errors import InvalidArgumentError

__all__ = ["apply_conf_change", "check_conf_change"]


def check_conf_change(cs: ConfState, cc: ConfChange) -> ConfState:
    """The configuration ``cc`` leads to from ``cs``; raises if it is a no-op or empties voters."""
    if cc.type == ConfChangeType.BOOTSTRAP:
        raise InvalidArgumentError(
            "a whole configuration can only be written by bootstrap(); propose one-server "
            "changes (ADD_VOTER, ADD_LEARNER, REMOVE) instead"
        )
    new = apply_conf_change(cs, cc)
    if new == cs:
        raise InvalidArgumentError(
            f"configuration change {cc.type.value} {cc.node_id} changes nothing in "
            f"voters={sorted(cs.voters)} learners={sorted(cs.learners)}"
        )
    if not new.voters:
        raise InvalidArgumentError(
            f"configuration change {cc.type.value} {cc.node_id} would remove the last voter"
        )
    return new

def apply_conf_change(cs: ConfState, cc: ConfChange) -> ConfState:
    """``cs`` with ``cc`` applied (no validation)."""
    if cc.type == ConfChangeType.BOOTSTRAP:
        return ConfState.from_dict(json.loads(cc.context))
    voters, learners = set(cs.voters), set(cs.learners)
    match cc.type:
        case ConfChangeType.ADD_VOTER:
            voters.add(cc.node_id)
            learners.discard(cc.node_id)
        case ConfChangeType.ADD_LEARNER:
            learners.add(cc.node_id)
            voters.discard(cc.node_id)
        case ConfChangeType.REMOVE:
            voters.discard(cc.node_id)
            learners.discard(cc.node_id)
    return ConfState(frozenset(voters), frozenset(learners))
