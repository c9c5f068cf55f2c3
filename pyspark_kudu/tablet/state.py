"""The tablet replica lifecycle as one transition table (STYLE habit 4).

States follow Kudu's ``TabletStatePB``::

    INITIALIZED --bootstrap--> BOOTSTRAPPING --bootstrapped--> RUNNING
         |                          |                             |
         |                          +----------fail-------------> FAILED
         +-------------------------shutdown-----------------------+---> SHUTDOWN

A replica serves scans and accepts committed entries only while ``RUNNING``; during
``BOOTSTRAPPING`` only log replay applies entries. ``FAILED`` is terminal for the object: the
replica's data is suspect (I/O error, corruption) and must be re-replicated (DESIGN §5).

Thread-safety: the table is immutable; :func:`next_state` is pure.
"""

from __future__ import annotations

import enum

from pyspark_kudu.errors import IllegalStateError

__all__ = ["TabletEvent", "TabletState", "next_state"]


class TabletState(enum.Enum):
    INITIALIZED = "initialized"
    BOOTSTRAPPING = "bootstrapping"
    RUNNING = "running"
    FAILED = "failed"
    SHUTDOWN = "shutdown"


class TabletEvent(enum.Enum):
    BOOTSTRAP = "bootstrap"
    BOOTSTRAPPED = "bootstrapped"
    FAIL = "fail"
    SHUTDOWN = "shutdown"


S, E = TabletState, TabletEvent
TRANSITIONS: dict[tuple[TabletState, TabletEvent], TabletState] = {
    (S.INITIALIZED, E.BOOTSTRAP): S.BOOTSTRAPPING,
    (S.INITIALIZED, E.FAIL): S.FAILED,
    (S.INITIALIZED, E.SHUTDOWN): S.SHUTDOWN,
    (S.BOOTSTRAPPING, E.BOOTSTRAPPED): S.RUNNING,
    (S.BOOTSTRAPPING, E.FAIL): S.FAILED,
    (S.BOOTSTRAPPING, E.SHUTDOWN): S.SHUTDOWN,
    (S.RUNNING, E.FAIL): S.FAILED,
    (S.RUNNING, E.SHUTDOWN): S.SHUTDOWN,
    (S.FAILED, E.FAIL): S.FAILED,
    (S.FAILED, E.SHUTDOWN): S.SHUTDOWN,
    (S.SHUTDOWN, E.SHUTDOWN): S.SHUTDOWN,
}
del S, E


def next_state(state: TabletState, event: TabletEvent, tablet_id: str = "?") -> TabletState:
    """The state after ``event``.

    Raises:
        IllegalStateError: the lifecycle does not allow ``event`` in ``state``.
    """
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalStateError(
            f"tablet {tablet_id} is {state.value}; it cannot {event.value}"
        ) from None
