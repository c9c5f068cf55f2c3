"""The placement policy's rules, shared by the placer, ksck and the rebalancer: how many
replicas of a tablet one location group may hold (:func:`max_replicas_per_group`), when a
location joins Kudu's overflow group (:func:`overflow_threshold`), Kudu's checks on a
replication factor, and the :class:`Violation` record. :mod:`.placement` explains the
policy as a whole.

Thread-safety: pure functions and an immutable record.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark_kudu.errors import InvalidArgumentError

__all__ = [
    "NOT_ENOUGH_TSERVERS",
    "Violation",
    "max_replicas_per_group",
    "overflow_threshold",
    "validate_replication_factor",
]

#: Kudu's text when no placement at all is possible.
NOT_ENOUGH_TSERVERS = "not enough tablet servers to satisfy replica placement policy"


def max_replicas_per_group(rf: int, n_groups: int) -> int:
    """Most replicas of an ``rf`` tablet one location group may hold among ``n_groups``
    without a placement policy violation.

    With more than 2 groups, losing one group must leave a majority (``rf // 2 + 1``), so
    a group holds at most ``(rf - 1) // 2``: for an even ``rf`` half the replicas is
    already a violation (Kudu's ksck and rebalancer). At least 1: for ``rf`` 1 or 2 no
    layout survives the loss of a group, so one replica per group is the best there is.
    """
    if n_groups <= 1:
        return rf
    if n_groups == 2:
        return rf // 2 + 1
    return max(1, (rf - 1) // 2)


def overflow_threshold(rf: int, n_groups: int) -> int:
    """Replicas of an ``rf`` tablet a group may hold before it joins Kudu's overflow group.

    Placement adds a replica to a group already holding this many only when no other
    group fits (Kudu's ``SelectLocation``). With more than 2 groups that is the policy
    limit; with 2 groups it is ``rf // 2``, one less, so that replicas split evenly (2 + 2
    for 4, 2 + 1 for 3 rather than 3 + 1 or 3 + 0).
    """
    if n_groups == 2:
        return max(1, rf // 2)
    return max_replicas_per_group(rf, n_groups)


def validate_replication_factor(
    rf: int,
    num_live_tservers: int,
    *,
    allow_even: bool = False,
    min_replicas: int = 1,
    max_replicas: int = 7,
) -> None:
    """Kudu's checks on a requested replication factor, with Kudu's texts.

    Raises:
        InvalidArgumentError: out of range, even (unless ``allow_even``, Kudu's
            ``--allow_unsafe_replication_factor``), or more than the live servers.
    """
    if rf > max_replicas:
        raise InvalidArgumentError(
            f"illegal replication factor {rf}: maximum allowed replication factor is "
            f"{max_replicas} (controlled by --max_num_replicas)"
        )
    if rf < min_replicas:
        raise InvalidArgumentError(
            f"illegal replication factor {rf}: minimum allowed replication factor is "
            f"{min_replicas} (controlled by --min_num_replicas)"
        )
    if rf % 2 == 0 and not allow_even:
        raise InvalidArgumentError(
            f"illegal replication factor {rf}: replication factor must be odd"
        )
    if rf > num_live_tservers:
        raise InvalidArgumentError(
            "not enough live tablet servers to create a table with the requested "
            f"replication factor {rf}; {num_live_tservers} tablet servers are alive"
        )


@dataclass(frozen=True)
class Violation:
    """One way a tablet breaks the policy.

    ``kind`` is ``"placement"`` (``count`` replicas in location group ``location`` at
    ``level``, more than ``limit``) or ``"constraint"`` (a replica on ``ts_uuid`` outside
    the table's constraint). ``avoidable`` says whether a compliant placement exists with
    the live servers the table may use.
    """

    tablet_id: str
    table_id: str
    kind: str
    location: str
    level: int = 0
    count: int = 0
    limit: int = 0
    ts_uuid: str = ""
    avoidable: bool = True
