"""Adding and removing master replicas one at a time (Raft thesis §4.1, config-change seed)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pyspark_kudu.consensus.raft_storage import MemoryStorage
from pyspark_kudu.errors import AlreadyPresentError, NotFoundError, NotLeaderError
from pyspark_kudu.master.catalog_replica import MasterReplica, bootstrap_group
from pyspark_kudu.master.client import MasterClient
from pyspark_kudu.master.master_service import MasterService
from pyspark_kudu.master.raft_transport import LocalNetwork

from .conftest import FAST, SCHEMA, wait_until


class _Group:
    """Replicas on a LocalNetwork with in-memory storage; masters can join later."""

    def __init__(self, founders: list[str]) -> None:
        self.net = LocalNetwork()
        self.addresses = {m: f"mem:{i + 1}" for i, m in enumerate(founders)}
        self.replicas: dict[str, MasterReplica] = {}
        self.services: dict[str, MasterService] = {}
        for m in founders:
            st = MemoryStorage()
            bootstrap_group(st, {k: self.addresses[k] for k in founders})
            self._start(m, st)

    def _start(self, m: str, st: MemoryStorage) -> None:
        rep = MasterReplica(m, st, self.net.transport(m), FAST)
        self.replicas[m], self.services[m] = rep, MasterService(rep)
        self.net.register(m, rep)
        rep.start()

    def join(self, m: str) -> str:
        self.addresses[m] = f"mem:{len(self.addresses) + 1}"
        self._start(m, MemoryStorage())
        return self.addresses[m]

    def leader(self) -> MasterReplica:
        return wait_until(lambda: next((r for r in self.replicas.values()
                                        if r.status().leader_ready), None), 10, "a ready leader")

    def client(self, check: bool = False) -> MasterClient:
        by_addr = {a: m for m, a in self.addresses.items()}
        group = self

        class Ch:
            def __init__(self, addr: str) -> None:
                self.address = addr

            def call(self, method: str, body: dict, timeout: float) -> dict:  # type: ignore[type-arg]
                return group.services[by_addr[self.address]].handle(method, body)

            def close(self) -> None:
                pass

        return MasterClient(list(self.addresses.values()), channel_factory=Ch,
                            check_master_count=check)

    def close(self) -> None:
        for r in self.replicas.values():
            r.stop()


@pytest.fixture
def group() -> Iterator[_Group]:
    g = _Group(["m1", "m2", "m3"])
    try:
        g.leader()
        yield g
    finally:
        g.close()


def test_a_new_master_joins_as_learner_then_voter_and_learns_the_catalog(group: _Group) -> None:
    c = group.client()
    from pyspark_kudu.master.entities import TServerMeta

    lead = group.leader()
    c.heartbeat_to(group.addresses[lead.id], TServerMeta("ts0", "h", 7050, "/d"))
    c.create_table("before", SCHEMA, replication_factor=1)
    addr = group.join("m4")
    c.add_master("m4", addr)
    st = group.leader().status()
    assert st.voters == {"m1", "m2", "m3", "m4"} and not st.learners
    m4 = group.replicas["m4"]
    wait_until(lambda: "before" in m4.catalog.names, 5, "m4 applying the catalog")
    assert dict(m4.catalog.masters) == group.addresses
    with pytest.raises(AlreadyPresentError, match="already a voter"):
        c.add_master("m4", addr)


def test_removing_the_leader_hands_over_leadership_first(group: _Group) -> None:
    c = group.client()
    lead = group.leader().id
    with pytest.raises(NotLeaderError, match="handing leadership"):
        group.services[lead].handle("remove_master", {"id": lead})
    c.remove_master(lead)  # the client retries on the new leader
    new = group.leader()
    assert new.id != lead and new.status().voters == set(group.addresses) - {lead}
    assert lead not in new.catalog.masters
    with pytest.raises(NotFoundError, match="not a member"):
        c.remove_master(lead)


def test_the_group_keeps_committing_after_one_at_a_time_changes(group: _Group) -> None:
    c = group.client()
    addr = group.join("m4")
    c.add_master("m4", addr)
    victim = next(m for m in ("m1", "m2", "m3") if m != group.leader().id)
    c.remove_master(victim)
    group.replicas[victim].stop()
    from pyspark_kudu.master.entities import TServerMeta

    c.heartbeat_to(group.addresses[group.leader().id], TServerMeta("ts0", "h", 7050, "/d"))
    c.create_table("after", SCHEMA, replication_factor=1)
    assert group.leader().status().voters == {"m1", "m2", "m3", "m4"} - {victim}
