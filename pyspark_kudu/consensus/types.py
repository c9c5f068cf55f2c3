"""Public value types of the Raft core: roles, configuration, ``Ready`` and ``Status``.

Thread-safety: ``Config`` is mutable until handed to a ``RaftNode``; the rest are frozen.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field

from pyspark_kudu.consensus.messages import ConfState, Entry, HardState, Message, Snapshot
from pyspark_kudu.consensus.raft_storage import Storage
from pyspark_kudu.errors import InvalidArgumentError

__all__ = ["Config", "Ready", "Role", "SoftState", "Status"]


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True, slots=True)
class SoftState:
    """Volatile state worth reporting (not persisted): who leads and our role."""

    lead: str
    role: Role


@dataclass
class Config:
    """Parameters of one node. ``rng`` drives election-timeout randomisation (inject a seeded one).

    ``applied`` is the index the application's state machine already reflects after a restart;
    the configuration in ``storage.initial_state()`` must be the one in force at that index.
    """

    id: str
    storage: Storage
    election_tick: int = 10
    heartbeat_tick: int = 1
    applied: int = 0
    max_size_per_msg: int | None = 1 << 20
    max_committed_size_per_ready: int | None = None
    max_inflight_msgs: int = 256
    check_quorum: bool = False
    pre_vote: bool = False
    rng: random.Random = field(default_factory=random.Random)

    def validate(self) -> None:
        if not self.id:
            raise InvalidArgumentError("raft Config.id must be a non-empty node id")
        if self.heartbeat_tick <= 0:
            raise InvalidArgumentError("heartbeat_tick must be greater than 0")
        if self.election_tick <= self.heartbeat_tick:
            raise InvalidArgumentError("election_tick must be greater than heartbeat_tick")
        if self.max_inflight_msgs <= 0:
            raise InvalidArgumentError("max_inflight_msgs must be greater than 0")


@dataclass(frozen=True, slots=True)
class Ready:
    """Work for the caller, to be done in this order, then acknowledged with ``advance``.

    1. ``snapshot`` (if any): persist it (it replaces the log) before entries.
    2. ``entries`` and ``hard_state``: persist durably BEFORE sending any message.
    3. ``messages``: send (any order; the network may reorder them anyway).
    4. ``committed_entries``: apply to the state machine in order (after step 2, since some
       may be among ``entries``).
    5. ``advance(ready)``; if ``conf_state`` of the node changed, persist it with the applied
       index it belongs to.

    ``soft_state`` is informational (leader changes). Between ``ready()`` and ``advance()``
    the node may keep stepping messages and ticking (etcd allows the same); only a second
    ``ready()`` must wait for ``advance()``.
    """

    soft_state: SoftState | None
    hard_state: HardState | None
    entries: tuple[Entry, ...]
    snapshot: Snapshot | None
    messages: tuple[Message, ...]
    committed_entries: tuple[Entry, ...]

    @property
    def must_sync(self) -> bool:
        return bool(self.entries) or self.hard_state is not None


@dataclass(frozen=True, slots=True)
class Status:
    id: str
    term: int
    vote: str
    commit: int
    applied: int
    lead: str
    role: Role
    conf_state: ConfState
    lead_transferee: str
    progress: dict[str, tuple[int, int]]
