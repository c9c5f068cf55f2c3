"""A narrated run of a 3-replica group: election, commits, leader loss, re-election, rejoin.

Thread-safety: runs in the calling thread only.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark_kudu.consensus.local import LocalGroup

__all__ = ["run_demo"]


def run_demo(seed: int, say: Callable[[str], None]) -> dict[str, list[bytes]]:
    """Run the story, narrating through ``say``; returns each replica's applied writes."""
    ids = ["ts-a", "ts-b", "ts-c"]
    group = LocalGroup(ids, seed=seed, pre_vote=True, check_quorum=True)
    lead = group.elect()
    say(f"elected {lead.id} as leader of term {lead.term}")
    for i in range(5):
        lead.propose(f"row-{i}".encode())
    group.pump()
    say(f"committed 5 writes at index {lead.commit_index}: "
        + ", ".join(f"{n}={len(group.applied[n])}" for n in ids))

    old = lead.id
    group.crash(old)
    say(f"crashed {old}; waiting for the survivors to elect a new leader")
    lead = group.elect()
    say(f"elected {lead.id} as leader of term {lead.term}")
    for i in range(5, 8):
        lead.propose(f"row-{i}".encode())
    group.pump()
    say(f"committed 3 more writes with one replica down (majority 2 of 3), index "
        f"{lead.commit_index}")

    group.restart(old)
    group.tick(5)
    say(f"restarted {old}; it replayed its log and caught up: "
        + ", ".join(f"{n}={len(group.applied[n])}" for n in ids))
    same = all(group.applied[n] == group.applied[ids[0]] for n in ids)
    say("all replicas applied the same writes in the same order: " + ("yes" if same else "NO"))
    return group.applied
