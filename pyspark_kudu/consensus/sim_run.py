"""Seeded simulation runs of the sans-IO Raft core: the adversary and the entry points.

A run builds a :class:`~pyspark_kudu.consensus.sim.Cluster` (whose
:class:`~pyspark_kudu.consensus.sim_checks.SafetyChecker` checks Raft's safety properties after
every step), drives it with an adversary and ends by healing everything and checking
liveness. One ``random.Random`` drives everything, so a seed is a complete, replayable
history. Replay a failing seed with::

    python -m pyspark_kudu.consensus.sim_run --seed 1234 --nodes 5 --steps 3000

- :class:`RandomSchedule`: the adversary, one random action per step (deliver a due message
  in any order, tick, propose, crash or restart a replica, symmetric or one-way partitions,
  heal, membership changes, compaction), drawn from the seed's ``random.Random``; the
  cluster's network drops, duplicates and delays messages at rates the seed's :class:`Knobs`
  set.
- :func:`check_liveness`: after healing, a leader emerges and a fresh proposal is applied by
  every member of the committed configuration.
- :func:`simulate`: one seeded history: per-seed knobs (:class:`Knobs`), then
  :class:`RandomSchedule` for ``steps`` steps, then :func:`check_liveness`. Founders
  bootstrap their configuration into the log; joiners start from empty storage; a re-added
  replica keeps its storage or is tombstoned.
- :func:`main`: the command line above; :func:`repro_command` builds it for a seed.

Dependencies point one way: this module imports ``sim`` (the cluster model) and
``sim_checks`` (the invariants); neither imports it.
Thread-safety: not thread-safe; a run owns its cluster.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from pyspark_kudu.consensus.messages import ConfChange, ConfChangeType
from pyspark_kudu.consensus.sim import Cluster, Host, NodeOptions, SimulationFailure
from pyspark_kudu.consensus.sim_checks import InvariantViolation

__all__ = [
    "Knobs", "RandomSchedule", "SimResult", "SimulationFailure", "check_liveness", "main",
    "repro_command", "simulate",
]


# == the random schedule and the liveness check ==============================================


class RandomSchedule:
    """The adversary: one random action per step (deliver a due message, tick, propose,
    crash or restart a replica, partition or heal, change membership, compact...), drawn from
    ``rng``, with the cluster's checks after every step."""

    def __init__(
        self, c: Cluster, rng: random.Random, nodes: int, membership: bool, compaction: bool
    ) -> None:
        self.c, self.rng, self.nodes = c, rng, nodes
        self.proposals = 0
        self.actions: list[tuple[Callable[[], object], float]] = [
            (c.tick, 4.0), (lambda: self._on(c.live(), lambda h: c.tick([h.id])), 0.5),
            (self.propose, 3.0), (self.transfer, 0.3),
            (lambda: self._on(c.live(), lambda h: c.campaign(h.id)), 0.15),
            (lambda: self._on(c.live(), lambda h: c.crash(h.id)), 0.3), (self.restart, 1.0),
            (self.partition, 0.3), (c.recover, 0.4),
        ]
        if membership:
            self.actions += [(self.membership, 1.0), (self.retire, 0.3)]
        if compaction:
            self.actions.append((lambda: self._on(
                [h for h in c.hosts.values() if h.sm],
                lambda h: c.compact(h.id, keep=rng.choice([0, 0, 2, 5]))), 0.5))

    def _on(self, hosts: Sequence[Host], act: Callable[[Host], object]) -> None:
        if hosts:
            act(self.rng.choice(hosts))

    # -- actions -----------------------------------------------------------------------------
    def step(self) -> None:
        c = self.c
        acts = list(self.actions)
        if any(f.due <= c.now for f in c.net.flights):
            acts.append((self.deliver, 30.0))
        if c.auto_ready < 1.0 or c.split_ready:
            acts.append((lambda: self._on(
                [h for h in c.live() if h.pending or h.node.has_ready()],
                lambda h: c.handle_ready(h.id)), 6.0))
        self.rng.choices([a for a, _ in acts], [w for _, w in acts])[0]()
        c.check()

    def deliver(self) -> None:
        f = self.c._pop_due(fifo=False)
        if f is not None:
            self.c.deliver(f)

    def propose(self) -> None:
        c = self.c
        lead = c.leader()
        target = lead if lead is not None and self.rng.random() < 0.9 else None
        if target is None and c.live():
            target = self.rng.choice(c.live()).id  # most likely refused: not the leader
        if target is None:
            return
        n = self.rng.choice([1, 1, 1, 3])  # sometimes a batch (one AppendEntries for all)
        datas = [f"p{self.proposals + i}".encode() for i in range(1, n + 1)]
        self.proposals += n
        if c.propose_batch(target, datas):
            c.stats["proposals"] += n

    def transfer(self) -> None:
        """To a voter, a learner, itself or a stranger: all must be handled."""
        lead = self.c.leader()
        if lead is not None:
            self.c.transfer_leader(lead, self.rng.choice(sorted(self.c.hosts)))
            self.c.stats["transfers"] += 1

    def restart(self) -> None:
        """A crashed replica comes back, unless it was retired and is not a member again."""
        members = self.c.checker.conf.members()
        down = [h.id for h in self.c.hosts.values()
                if not h.alive and h.starts > 0 and (h.id in members or not h.retired)]
        if down:
            self.c.start(self.rng.choice(down), volatile=self.rng.random() < 0.3)
            self.c.stats["restarts"] += 1

    def partition(self) -> None:
        c, rng = self.c, self.rng
        ids = sorted(c.hosts)
        kind = rng.choice(["isolate", "split", "one-way"])
        if kind == "isolate":
            c.isolate(rng.choice(ids))
        elif kind == "split":
            rng.shuffle(ids)
            k = rng.randint(1, len(ids) // 2)
            c.partition(ids[:k], ids[k:])
        else:
            for _ in range(rng.randint(1, len(ids))):
                a, b = rng.sample(ids, 2)
                c.cut(a, b, one_way=True)
        c.stats[f"partition_{kind}"] += 1
        c._note(f"partition {kind}: {sorted(c.net.cut_links)}")

    def retire(self) -> None:
        """Shut down a replica neither the committed nor the leader's configuration has."""
        c = self.c
        lead = c.leader()
        keep = c.checker.conf.members() | (c.node(lead).conf_state.members() if lead else set())
        out = sorted(h.id for h in c.live() if h.id not in keep)
        if out:
            nid = self.rng.choice(out)
            c.crash(nid)
            c.hosts[nid].retired = True
            c.stats["retired"] += 1

    def membership(self) -> None:
        """One-by-one change at the leader: add learner, promote, demote, remove, re-add."""
        c, rng = self.c, self.rng
        lead = c.leader()
        if lead is None:
            return
        node = c.node(lead)
        cs, committed = node.conf_state, c.checker.conf
        progress = node.status().progress
        options: list[ConfChange] = []
        for nid in sorted(c.hosts):
            if nid not in cs.members() and nid not in committed.members():
                options.append(ConfChange(ConfChangeType.ADD_LEARNER, nid))
        for nid in sorted(cs.learners):
            caught_up = progress.get(nid, (0, 0))[0] + 3 >= node.commit_index
            if len(cs.voters) <= self.nodes and caught_up:
                options.append(ConfChange(ConfChangeType.ADD_VOTER, nid))
        # Rarely the leader itself: it must step down once the change is applied.
        others = cs.members() - ({lead} if rng.random() < 0.9 else set())
        for nid in sorted(others):
            if nid in cs.learners or len(cs.voters) > max(2, self.nodes - 1):
                options.append(ConfChange(ConfChangeType.REMOVE, nid))
                if nid in cs.voters and rng.random() < 0.3:
                    options.append(ConfChange(ConfChangeType.ADD_LEARNER, nid))
        if not options:
            return
        cc = rng.choice(options)
        h = c.hosts[cc.node_id]
        if cc.type == ConfChangeType.ADD_LEARNER and cc.node_id not in cs.members() and not h.alive:
            if h.starts > 0 and rng.random() < 0.5 and c.forgotten(cc.node_id):
                c.tombstone(cc.node_id)
                c.stats["tombstones"] += 1
            c.stats["rejoins" if h.starts else "joins"] += 1
            c.start(cc.node_id)
        if c.propose_conf_change(lead, cc):
            c.stats[f"conf_{cc.type.value}"] += 1

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()


def check_liveness(c: Cluster, token: bytes, election_timeouts: int = 60) -> None:
    """Heal the network, run the committed configuration's replicas (only them) and tick:
    a leader must emerge and ``token``, proposed to it, must be applied by every member,
    whose configuration must then be the one its applied log produces."""
    c.recover()
    c.net.drop_rate = c.net.dup_rate = 0.0
    c.net.max_delay = 0
    for f in c.net.flights:
        f.due = min(f.due, c.now)
    c.auto_ready, c.split_ready, c.lazy_commit = 1.0, 0.0, 0.0
    for h in c.live():
        c.flush_carried(h.id)
    c._note("settle")
    election = c.options.election_tick
    proposed_at = -10**9
    for _ in range(election_timeouts * election):
        members = c.checker.conf.members()
        for h in list(c.hosts.values()):
            if h.alive and h.id not in members:
                c.crash(h.id)
                h.retired = True
            elif not h.alive and h.id in members:
                c.start(h.id)
        c.run(1)
        lead = c.leader()
        due = c.now - proposed_at > 3 * election
        if lead is not None and due and token not in c.hosts[lead].applied_data():
            if c.propose(lead, token):
                proposed_at = c.now
                c.drain()
        members = c.checker.conf.members()
        if all(token in c.hosts[m].applied_data() for m in members):
            for m in members:  # all past any snapshot's (newer) configuration by now
                h = c.hosts[m]
                c.checker.configuration(m, len(h.sm), h.node.conf_state)
            return
    lagging = {m: (len(c.hosts[m].sm), c.hosts[m].alive) for m in sorted(members)}
    raise InvariantViolation(
        f"liveness: after healing and {election_timeouts * election} quiet ticks, {token!r} "
        f"is not applied by every member of {c.checker.conf} (leader {c.leader()}, "
        f"applied {lagging})"
    )


# == seeded runs ==============================================================================


@dataclass(frozen=True)
class Knobs:
    """Per-seed fault and workload settings, all drawn from the seed."""

    options: NodeOptions
    drop: float
    dup: float
    delay: int
    auto_ready: float
    split_ready: float
    membership: bool
    compaction: bool
    # Drawn apart (see simulate) so that seeds without it replay the histories they had.
    lazy_commit: float = 0.0

    @classmethod
    def draw(cls, rng: random.Random) -> Knobs:
        opts = NodeOptions(
            election_tick=rng.choice([5, 10]), heartbeat_tick=rng.choice([1, 2]),
            pre_vote=rng.random() < 0.5, check_quorum=rng.random() < 0.5,
            max_size_per_msg=rng.choice([None, 1 << 20, 40]),
            max_inflight_msgs=rng.choice([2, 256]),
            max_committed_size_per_ready=rng.choice([None, None, 60]),
        )
        return cls(opts, drop=rng.choice([0.0, 0.02, 0.1]), dup=rng.choice([0.0, 0.05]),
                   delay=rng.choice([0, 1, 3]), auto_ready=rng.choice([1.0, 0.7]),
                   split_ready=rng.choice([0.0, 0.3]),
                   membership=rng.random() < 0.75, compaction=rng.random() < 0.6)


@dataclass
class SimResult:
    seed: int
    nodes: int
    steps: int
    knobs: Knobs
    stats: Counter[str]
    commit_index: int
    terms_with_leader: int

    def summary(self) -> str:
        stats = " ".join(f"{k}={v}" for k, v in sorted(self.stats.items()))
        return (f"seed={self.seed} nodes={self.nodes} steps={self.steps} ok: commit="
                f"{self.commit_index} leaders={self.terms_with_leader} {stats}")


def repro_command(seed: int, nodes: int, steps: int) -> str:
    """The command line that replays one seeded history."""
    return (f"python -m pyspark_kudu.consensus.sim_run --seed {seed} --nodes {nodes} "
            f"--steps {steps}")


def simulate(seed: int, nodes: int = 3, steps: int = 3000, trace: int = 60) -> SimResult:
    """Run one seeded history; raise SimulationFailure (with a repro command) on violation.

    ``trace`` is how many of the last events the failure message lists.
    """
    rng = random.Random(f"raft-sim/{seed}/{nodes}")
    knobs = Knobs.draw(rng)
    knobs = replace(knobs, lazy_commit=random.Random(f"raft-sim-lazy/{seed}/{nodes}").choice(
        [0.0, 0.0, 0.5, 1.0]))
    c: Cluster | None = None
    try:
        c = Cluster([f"n{i}" for i in range(1, nodes + 1)], rng=rng, options=knobs.options,
                    spares=[f"n{i}" for i in range(nodes + 1, nodes + 3)])
        c.net.drop_rate, c.net.dup_rate, c.net.max_delay = knobs.drop, knobs.dup, knobs.delay
        c.auto_ready, c.split_ready = knobs.auto_ready, knobs.split_ready
        c.lazy_commit = knobs.lazy_commit
        c.report_unreachable = True
        c.trace = deque(maxlen=trace)
        RandomSchedule(c, rng, nodes, knobs.membership, knobs.compaction).run(steps)
        check_liveness(c, f"live-{seed}".encode())
    except Exception as e:  # a core exception is a finding too: report it with the seed
        where = c.describe() if c is not None else "  (while founding the cluster)"
        raise SimulationFailure(
            f"{type(e).__name__}: {e}\n  knobs: {knobs}\n{where}\n"
            f"  reproduce: {repro_command(seed, nodes, steps)}"
        ) from e
    return SimResult(seed, nodes, steps, knobs, c.stats, c.checker.commit_index,
                     len(c.checker.leader_of_term))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pyspark_kudu.consensus.sim_run",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--seeds", type=int, default=1, help="run seeds seed .. seed+N-1")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--trace", type=int, default=60, help="events listed on failure")
    args = p.parse_args(argv)
    failed = 0
    for seed in range(args.seed, args.seed + args.seeds):
        try:
            print(simulate(seed, args.nodes, args.steps, args.trace).summary())
        except SimulationFailure as e:
            failed += 1
            print(f"seed={seed} FAILED\n{e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
