"""One exception hierarchy for pyspark-kudu, named after Kudu's ``Status`` codes.

Every error the project raises derives from :class:`KuduError`. Two families are kept
apart on purpose (the h11 habit): :class:`UsageError` subclasses mean *the caller* did
something wrong locally (bad argument, bad schema, illegal replication factor) and retrying
the same call cannot help; :class:`RemoteError` subclasses mean a peer, a disk or the cluster
failed and a retry, a different replica or an operator may help.

Messages name the object concerned and, where there is one, the fix. Where Kudu has a text
for the condition, the message uses Kudu's text (DESIGN §6).

Thread-safety: exception classes carry no shared state.
"""

from __future__ import annotations

__all__ = [
    "AbortedError",
    "AlreadyPresentError",
    "CompactedError",
    "ConsensusError",
    "CorruptionError",
    "CredentialError",
    "DiskFullError",
    "EntryUnavailableError",
    "FencedError",
    "IOError_",
    "IllegalStateError",
    "InvalidArgumentError",
    "KuduError",
    "LocationMappingError",
    "LocationMappingTimedOutError",
    "NetworkError",
    "NotFoundError",
    "NotLeaderError",
    "NotSupportedError",
    "ProposalDroppedError",
    "RemoteError",
    "RoundFailedError",
    "RowWriteError",
    "ServiceUnavailableError",
    "SessionUnreachableError",
    "TimedOutError",
    "TlsHandshakeError",
    "UsageError",
]


class KuduError(Exception):
    """Base of every pyspark-kudu error. ``status`` is Kudu's status name for the condition."""

    status: str = "RuntimeError"

    def __str__(self) -> str:
        return super().__str__()


# --- the caller's mistakes -------------------------------------------------------------


class UsageError(KuduError):
    """The caller's own mistake: fix the call, retrying it unchanged cannot succeed."""

    status = "InvalidArgument"


class InvalidArgumentError(UsageError):
    """An argument is malformed or out of range (Kudu ``InvalidArgument``)."""

    status = "InvalidArgument"


class CredentialError(InvalidArgumentError):
    """A service and its caller do not share the credential (``PYSPARK_KUDU_SECRET``, or
    the masters' token): either side refused the other. Retrying cannot help."""


class TlsHandshakeError(CredentialError):
    """A client's TLS handshake failed: the server does not serve TLS, or its certificate
    is not signed by the client's CA or does not name the address dialled
    (:mod:`pyspark_kudu.rpc.tls`). Retrying cannot help."""


class IllegalStateError(UsageError):
    """The object is not in a state that allows the operation (Kudu ``IllegalState``)."""

    status = "IllegalState"


class NotFoundError(UsageError):
    """A named table, tablet, column, server or key does not exist (Kudu ``NotFound``)."""

    status = "NotFound"


class AlreadyPresentError(UsageError):
    """The object to create already exists (Kudu ``AlreadyPresent``)."""

    status = "AlreadyPresent"


class NotSupportedError(UsageError):
    """The operation or option is not supported (Kudu ``NotSupported``)."""

    status = "NotSupported"


# --- failures of peers, disks and the cluster ------------------------------------------


class RemoteError(KuduError):
    """A peer, disk or cluster failure; a retry elsewhere or later may succeed."""

    status = "RemoteError"


class NetworkError(RemoteError):
    """A peer could not be reached (Kudu ``NetworkError``)."""

    status = "NetworkError"


class TimedOutError(RemoteError):
    """An operation did not finish before its deadline (Kudu ``TimedOut``)."""

    status = "TimedOut"


class ServiceUnavailableError(RemoteError):
    """The service is overloaded or not ready yet (Kudu ``ServiceUnavailable``)."""

    status = "ServiceUnavailable"


class NotLeaderError(ServiceUnavailableError):
    """The contacted replica is not the leader; ``leader_hint`` names the one it believes is."""

    status = "IllegalState"

    def __init__(self, message: str, leader_hint: str | None = None) -> None:
        super().__init__(message)
        self.leader_hint = leader_hint


class AbortedError(RemoteError):
    """The operation was aborted, e.g. by a concurrent change (Kudu ``Aborted``)."""

    status = "Aborted"


class FencedError(AbortedError):
    """A newer leader (another client) took over this tablet; this client's leadership ended.
    The outcome of the write that saw it is unknown: it may have committed."""


class RoundFailedError(ServiceUnavailableError):
    """A replication round could not reach the replicas it needed (e.g. no majority of
    tablet servers); nothing the round carried is visible unless a later round commits it."""


class SessionUnreachableError(ServiceUnavailableError):
    """No connection to a driver's session service could be made: nothing was sent."""


class LocationMappingError(RemoteError):
    """The location mapping command could not assign a location (Kudu ``RuntimeError``)."""

    status = "RuntimeError"


class LocationMappingTimedOutError(LocationMappingError, TimedOutError):
    """The location mapping command did not finish in time and was killed."""

    status = "TimedOut"


class IOError_(RemoteError):
    """A file-system operation failed (Kudu ``IOError``). Trailing ``_`` avoids the builtin."""

    status = "IOError"


class CorruptionError(IOError_):
    """Stored data failed a checksum or structural check (Kudu ``Corruption``).

    A replica that raises this is marked failed and never serves data (DESIGN §5).
    """

    status = "Corruption"


class DiskFullError(IOError_):
    """The data root has no space left; the replica is marked failed."""

    status = "IOError"


class RowWriteError(KuduError):
    """Some rows of a write failed (Kudu's per-row errors: duplicate key on INSERT, missing
    key on UPDATE/DELETE, ...); the other rows were written. ``errors`` lists
    ``(tablet_id, row_values, status, message)``; ``rows_written`` counts the successes."""

    status = "RuntimeError"

    def __init__(self, message: str, errors: list[tuple[str, dict[str, object], str, str]],
                 rows_written: int) -> None:
        super().__init__(message)
        self.errors = errors
        self.rows_written = rows_written


# --- consensus -------------------------------------------------------------------------


class ConsensusError(KuduError):
    """Base for errors raised by the sans-IO Raft core."""

    status = "IllegalState"


class CompactedError(ConsensusError):
    """Requested log entries were compacted away; the peer must be sent a snapshot/copy."""

    status = "NotFound"


class EntryUnavailableError(ConsensusError):
    """Requested log entries are not yet available in storage (etcd's ``ErrUnavailable``;
    not to be confused with :class:`ServiceUnavailableError`, a peer that cannot serve)."""

    status = "Incomplete"


class ProposalDroppedError(ConsensusError):
    """A proposal was refused: not leader, transfer in progress, or a config change pending."""

    status = "IllegalState"
