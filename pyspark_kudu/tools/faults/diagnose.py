"""What a fault run records when replication does not come back: enough to tell, from the
report alone, which of the usual causes held (no plan, a plan whose actions fail or are
skipped, a host left out of rounds, a healer blocked) -- a CI failure leaves nothing else.

Thread-safety: :func:`replication_state` only reads; call it from any thread.
"""

from __future__ import annotations

from typing import Any

__all__ = ["replication_state"]


def replication_state(kudu: Any) -> dict[str, Any]:
    """The healing context's view of replication now: the master's plan, every tablet of
    the catalog with the Raft configuration of the leader this client holds for it, the
    healer's last actions and error, the hosts left out of rounds, and each tablet server
    as the driver knows it (:func:`~.chaos.tserver_view`: address, whether it answers, the
    host's executors). Each part is best effort: a part that fails says why instead."""
    from pyspark_kudu.tools.faults.chaos import tserver_view

    out: dict[str, Any] = {}

    def part(name: str, fn: Any) -> None:
        try:
            out[name] = fn()
        except Exception as e:  # a diagnosis must not fail the run's own report
            out[name] = f"{type(e).__name__}: {e}"

    part("plan", lambda: kudu.replication_plan())
    part("suspect_hosts", lambda: sorted(kudu.transport.suspect_hosts()))
    part("servers", lambda: tserver_view(kudu))
    healer = getattr(kudu, "healer", None)
    if healer is not None:
        out["healer"] = {
            "passes": healer.passes, "last_error": healer.last_error,
            "running": healer.running,
            "last_actions": [{"action": a.action, "tablet": a.tablet_id, "ts": a.ts_uuid,
                              "outcome": a.outcome, "seconds": round(a.seconds, 2),
                              "at": a.at} for a in healer.history[-8:]]}
    part("tablets", lambda: _tablets(kudu))
    return out


def _tablets(kudu: Any) -> list[dict[str, Any]]:
    out = []
    for name in kudu.master.list_tables():
        for t in kudu.master.get_table(name).tablets:
            lead = kudu._leaders.get(t.tablet_id)
            node = getattr(lead, "node", None)
            out.append({
                "table": name, "tablet": t.tablet_id, "config_index": t.config_index,
                "replicas": [{"ts": r.ts_uuid, "type": r.member_type.value,
                              "replace": r.replace} for r in t.replicas],
                "leader_here": getattr(lead, "leader_id", None),
                "raft_voters": sorted(node.conf_state.voters) if node is not None else None,
                "raft_learners": sorted(node.conf_state.learners) if node is not None
                else None,
                "commit_index": node.commit_index if node is not None else None})
    return out
