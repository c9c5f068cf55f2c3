"""How master replicas exchange Raft messages: the ``Transport`` protocol and two transports.

DESIGN §3: the master's catalog is the same ``RaftNode`` as a tablet's, driven by a
different transport -- :class:`LocalNetwork` (in-process queues) when the master is
embedded in the driver, :class:`~pyspark_kudu.master.flight.FlightTransport` (Arrow Flight)
between standalone master processes.

A message travels in an :class:`Envelope` that adds the sender's commit index. Followers use
it to know how fresh their catalog is (KUDU-500 stale reads; the heartbeat's own ``commit``
is capped at the follower's match index, so it cannot tell a lagging follower it is behind).

Sending never blocks the replica's loop and may silently drop messages: Raft retransmits.

Thread-safety: :class:`LocalNetwork` is thread-safe. The codec functions are pure.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pyspark_kudu.consensus.messages import (
    ConfState,
    Entry,
    EntryType,
    Message,
    MessageType,
    Snapshot,
    SnapshotMetadata,
)
from pyspark_kudu.errors import InvalidArgumentError

__all__ = [
    "Envelope",
    "LocalNetwork",
    "Receiver",
    "Transport",
    "decode_envelopes",
    "encode_envelopes",
]


@dataclass(frozen=True, slots=True)
class Envelope:
    """A Raft message plus the sender's commit index at the time it was sent."""

    msg: Message
    commit: int = 0


class Receiver(Protocol):
    """Something that accepts inbound envelopes without blocking (a ``MasterReplica``)."""

    def deliver(self, envelopes: Sequence[Envelope]) -> None: ...


class Transport(Protocol):
    """Outbound side. ``send`` must not block; delivery is best effort, in order per peer."""

    def send(self, envelopes: Sequence[Envelope]) -> None: ...

    def close(self) -> None: ...


class LocalNetwork:
    """In-process transport for embedded replicas, with partitions for tests.

    Every replica registers a :class:`Receiver`; :meth:`transport` gives each its sender.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._receivers: dict[str, Receiver] = {}
        self._isolated: set[str] = set()

    def register(self, node_id: str, receiver: Receiver) -> None:
        with self._lock:
            self._receivers[node_id] = receiver

    def unregister(self, node_id: str) -> None:
        with self._lock:
            self._receivers.pop(node_id, None)

    def isolate(self, node_id: str) -> None:
        """Drop every message to or from ``node_id`` until :meth:`heal`."""
        with self._lock:
            self._isolated.add(node_id)

    def heal(self, node_id: str | None = None) -> None:
        with self._lock:
            if node_id is None:
                self._isolated.clear()
            else:
                self._isolated.discard(node_id)

    def transport(self, node_id: str) -> Transport:
        return _LocalTransport(self, node_id)

    def _send(self, frm: str, envelopes: Sequence[Envelope]) -> None:
        by_target: dict[str, list[Envelope]] = {}
        with self._lock:
            if frm in self._isolated:
                return
            for env in envelopes:
                if env.msg.to not in self._isolated:
                    by_target.setdefault(env.msg.to, []).append(env)
            targets = {t: self._receivers.get(t) for t in by_target}
        for t, envs in by_target.items():
            r = targets[t]
            if r is not None:
                r.deliver(envs)


class _LocalTransport:
    def __init__(self, net: LocalNetwork, node_id: str) -> None:
        self._net = net
        self._id = node_id

    def send(self, envelopes: Sequence[Envelope]) -> None:
        if envelopes:
            self._net._send(self._id, envelopes)

    def close(self) -> None:
        pass


# == wire codec (used by the Flight transport) ====================================================


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def _unb64(s: str) -> bytes:
    return base64.b64decode(s) if s else b""


def _entry_to(e: Entry) -> list[Any]:
    return [e.term, e.index, e.type.value, _b64(e.data)]


def _entry_from(x: list[Any]) -> Entry:
    return Entry(int(x[0]), int(x[1]), EntryType(x[2]), _unb64(x[3]))


def _msg_to(m: Message) -> dict[str, Any]:
    d: dict[str, Any] = {"t": m.type.value, "to": m.to, "f": m.frm, "tm": m.term}
    if m.log_term:
        d["lt"] = m.log_term
    if m.index:
        d["i"] = m.index
    if m.entries:
        d["e"] = [_entry_to(e) for e in m.entries]
    if m.commit:
        d["c"] = m.commit
    if m.reject:
        d["r"] = True
    if m.reject_hint:
        d["rh"] = m.reject_hint
    if m.context:
        d["x"] = _b64(m.context)
    if m.snapshot is not None:
        md = m.snapshot.metadata
        d["s"] = {"i": md.index, "t": md.term, "cs": md.conf_state.to_dict(),
                  "d": _b64(m.snapshot.data)}
    return d


def _msg_from(d: dict[str, Any]) -> Message:
    snap = None
    if "s" in d:
        s = d["s"]
        snap = Snapshot(SnapshotMetadata(int(s["i"]), int(s["t"]), ConfState.from_dict(s["cs"])),
                        _unb64(s["d"]))
    return Message(
        MessageType(d["t"]), str(d["to"]), str(d["f"]), int(d["tm"]), int(d.get("lt", 0)),
        int(d.get("i", 0)), tuple(_entry_from(x) for x in d.get("e", ())), int(d.get("c", 0)),
        bool(d.get("r", False)), int(d.get("rh", 0)), snap, _unb64(d.get("x", "")),
    )


def encode_envelopes(envelopes: Sequence[Envelope]) -> bytes:
    return json.dumps([[_msg_to(e.msg), e.commit] for e in envelopes],
                      separators=(",", ":")).encode()


def decode_envelopes(data: bytes) -> list[Envelope]:
    """Raises InvalidArgumentError on bytes that are not an envelope batch."""
    try:
        return [Envelope(_msg_from(m), int(c)) for m, c in json.loads(data)]
    except (ValueError, KeyError, TypeError) as e:
        raise InvalidArgumentError(f"malformed Raft message batch: {e!r}") from e
