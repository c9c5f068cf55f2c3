"""Value types exchanged with the Raft core: entries, messages, hard state, configurations.

All are frozen dataclasses (the h11 habit): a message cannot change after it was handed to
the transport, and construction validates what can be validated locally. Node ids are
strings (tablet-server UUIDs in production, ``"n1"``... in tests); ``NONE`` (``""``) means
"no node", e.g. no vote cast or no known leader.

Serialisation: :func:`encode_conf_change` / :func:`decode_conf_change` give the stable byte
form stored in ``CONF_CHANGE`` entries; :mod:`pyspark_kudu.wal` frames whole entries itself.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field

from pyspark_kudu.errors import InvalidArgumentError

__all__ = [
    "NONE",
    "ConfChange",
    "ConfChangeType",
    "ConfState",
    "Entry",
    "EntryType",
    "HardState",
    "Message",
    "MessageType",
    "Snapshot",
    "SnapshotMetadata",
    "decode_conf_change",
    "encode_conf_change",
    "is_local_message",
    "is_response_message",
]

NONE = ""
"""The absent node id: no vote, no leader."""


class MessageType(enum.Enum):
    """Raft message kinds. ``HUP``, ``BEAT``, ``PROP``, ``TRANSFER_LEADER`` are local inputs."""

    HUP = "hup"  # local: start an election (election timeout or campaign())
    BEAT = "beat"  # local: leader should broadcast heartbeats
    PROP = "prop"  # local (or forwarded): propose entries
    APP = "app"  # AppendEntries
    APP_RESP = "app_resp"
    VOTE = "vote"  # RequestVote
    VOTE_RESP = "vote_resp"
    PRE_VOTE = "pre_vote"  # Raft thesis §9.6
    PRE_VOTE_RESP = "pre_vote_resp"
    SNAP = "snap"  # InstallSnapshot: "your entries are gone, copy the tablet"
    HEARTBEAT = "heartbeat"
    HEARTBEAT_RESP = "heartbeat_resp"
    TRANSFER_LEADER = "transfer_leader"  # local at the leader (or forwarded by a follower)
    TIMEOUT_NOW = "timeout_now"  # leader -> transferee: campaign immediately
    CHECK_QUORUM = "check_quorum"  # local: leader checks it heard from a quorum
    UNREACHABLE = "unreachable"  # local: transport reports a peer unreachable
    SNAP_STATUS = "snap_status"  # local: application reports a snapshot finished / failed


_LOCAL = frozenset(
    {
        MessageType.HUP,
        MessageType.BEAT,
        MessageType.CHECK_QUORUM,
        MessageType.UNREACHABLE,
        MessageType.SNAP_STATUS,
    }
)
_RESPONSES = frozenset(
    {
        MessageType.APP_RESP,
        MessageType.VOTE_RESP,
        MessageType.PRE_VOTE_RESP,
        MessageType.HEARTBEAT_RESP,
        MessageType.UNREACHABLE,
        MessageType.SNAP_STATUS,
    }
)


def is_local_message(t: MessageType) -> bool:
    """Messages the node makes for itself; they never travel on the wire."""
    return t in _LOCAL


def is_response_message(t: MessageType) -> bool:
    return t in _RESPONSES


class EntryType(enum.Enum):
    NORMAL = "normal"
    CONF_CHANGE = "conf_change"


@dataclass(frozen=True, slots=True)
class Entry:
    """One log entry. An empty ``NORMAL`` entry is the no-op a new leader appends (§5.4.2)."""

    term: int
    index: int
    type: EntryType = EntryType.NORMAL
    data: bytes = b""

    def __post_init__(self) -> None:
        if self.term < 0 or self.index < 0:
            raise InvalidArgumentError(
                f"entry term and index must be >= 0, got term={self.term} index={self.index}"
            )

    def size(self) -> int:
        """Approximate size used for message batching limits."""
        return len(self.data) + 16


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be durable before any message leaves the node (Raft Fig. 2 persistent state)."""

    term: int = 0
    vote: str = NONE
    commit: int = 0

    def is_empty(self) -> bool:
        return self == HardState()


@dataclass(frozen=True, slots=True)
class ConfState:
    """A Raft configuration: voters count toward elections and commit, learners only receive."""

    voters: frozenset[str] = frozenset()
    learners: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        both = self.voters & self.learners
        if both:
            raise InvalidArgumentError(f"nodes {sorted(both)} cannot be both voter and learner")

    @classmethod
    def of(cls, voters: list[str] | tuple[str, ...] | set[str],
           learners: list[str] | tuple[str, ...] | set[str] = ()) -> ConfState:
        return cls(frozenset(voters), frozenset(learners))

    def members(self) -> frozenset[str]:
        return self.voters | self.learners

    def to_dict(self) -> dict[str, list[str]]:
        return {"voters": sorted(self.voters), "learners": sorted(self.learners)}

    @classmethod
    def from_dict(cls, d: dict[str, list[str]]) -> ConfState:
        return cls(frozenset(d.get("voters", [])), frozenset(d.get("learners", [])))


class ConfChangeType(enum.Enum):
    """One-server changes (Raft thesis §4.1). Kudu names in comments."""

    ADD_VOTER = "add_voter"  # ADD_PEER as VOTER; on an existing learner: promote (MODIFY_PEER)
    ADD_LEARNER = "add_learner"  # ADD_PEER as NON_VOTER; on an existing voter: demote
    REMOVE = "remove"  # REMOVE_PEER
    # The whole configuration at once, in ``context`` (``ConfState.to_dict`` as JSON). Only
    # the bootstrap entry of a new group uses it (Kudu's first CHANGE_CONFIG_OP also carries
    # the full config); ``node_id`` names the founder that wrote it.
    BOOTSTRAP = "bootstrap"


@dataclass(frozen=True, slots=True)
class ConfChange:
    type: ConfChangeType
    node_id: str
    context: bytes = b""

    def __post_init__(self) -> None:
        if not self.node_id:
            raise InvalidArgumentError("a configuration change must name a node")


def encode_conf_change(cc: ConfChange) -> bytes:
    return json.dumps(
        {"type": cc.type.value, "node": cc.node_id, "ctx": cc.context.hex()},
        separators=(",", ":"), sort_keys=True,
    ).encode()


def decode_conf_change(data: bytes) -> ConfChange:
    try:
        d = json.loads(data)
        return ConfChange(ConfChangeType(d["type"]), d["node"], bytes.fromhex(d.get("ctx", "")))
    except (ValueError, KeyError, TypeError) as e:
        raise InvalidArgumentError(f"malformed configuration change entry: {e}") from e


@dataclass(frozen=True, slots=True)
class SnapshotMetadata:
    index: int = 0
    term: int = 0
    conf_state: ConfState = field(default_factory=ConfState)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """State up to ``metadata.index``. For tablets ``data`` describes a tablet copy source."""

    metadata: SnapshotMetadata = field(default_factory=SnapshotMetadata)
    data: bytes = b""

    def is_empty(self) -> bool:
        return self.metadata.index == 0


@dataclass(frozen=True, slots=True)
class Message:
    """A Raft message. Field meaning depends on ``type`` (etcd raftpb conventions):

    - APP: ``index``/``log_term`` identify the entry preceding ``entries``; ``commit`` is the
      leader's commit index.
    - APP_RESP: ``index`` is the last index the follower now matches (or, on reject, the
      rejected probe index) and ``reject_hint``/``log_term`` drive fast backtracking.
    - VOTE/PRE_VOTE: ``index``/``log_term`` describe the candidate's last entry.
    - HEARTBEAT: ``commit`` is min(leader commit, follower match).
    """

    type: MessageType
    to: str = NONE
    frm: str = NONE
    term: int = 0
    log_term: int = 0
    index: int = 0
    entries: tuple[Entry, ...] = ()
    commit: int = 0
    reject: bool = False
    reject_hint: int = 0
    snapshot: Snapshot | None = None
    context: bytes = b""
