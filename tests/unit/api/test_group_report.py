"""Group commit of the writers' commit reports (``GroupReport``): real threads, a send that
the test holds open to make callers arrive during it."""

from __future__ import annotations

import threading

import pytest

from pyspark_kudu.spark.api.group_report import GroupReport
from tests.waiting import wait_until


class _Sends:
    """Records each send's items; the first send blocks until ``release`` is set."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.started = threading.Event()
        self.release = threading.Event()
        self.fail_next = False

    def __call__(self, items: list[int]) -> None:
        self.batches.append(list(items))
        fail, self.fail_next = self.fail_next, False  # decided when the send begins
        if len(self.batches) == 1:
            self.started.set()
            assert self.release.wait(30), "the test never released the first send"
        if fail:
            raise ConnectionError("the master did not answer")


def test_a_lone_report_is_sent_at_once_with_its_items() -> None:
    sends = _Sends()
    sends.release.set()
    group = GroupReport(sends)
    group.report([1, 2])
    group.report([3])
    assert sends.batches == [[1, 2], [3]]
    assert (group.sends, group.reports) == (2, 2)


def test_callers_arriving_during_a_send_share_the_next_one_and_return_after_it() -> None:
    sends = _Sends()
    group = GroupReport(sends)
    returned: dict[int, int] = {}  # caller -> how many sends had begun when it returned

    def call(item: int) -> None:
        group.report([item])
        returned[item] = len(sends.batches)

    first = threading.Thread(target=call, args=(0,))
    first.start()
    assert sends.started.wait(30), "the first report was not sent"
    others = [threading.Thread(target=call, args=(i,)) for i in range(1, 9)]
    for t in others:
        t.start()
    wait_until(lambda: group.reports == 9, 30, "eight more callers reporting")
    assert not returned, "a caller returned while the send carrying nothing of it ran"
    sends.release.set()
    for t in [first, *others]:
        t.join(30)
        assert not t.is_alive(), "a caller never returned"
    # One send for the first caller, one for the eight that came during it.
    assert sends.batches[0] == [0] and sorted(sends.batches[1]) == list(range(1, 9))
    assert len(sends.batches) == 2 and group.sends == 2
    assert returned[0] >= 1 and all(returned[i] == 2 for i in range(1, 9)), returned
    assert group._errors == {} and group._awaiting == {}  # nothing kept once returned


def test_a_failed_send_raises_in_every_caller_it_carried_and_the_next_send_goes() -> None:
    sends = _Sends()
    group = GroupReport(sends)
    errors: dict[int, BaseException | None] = {}

    def call(item: int) -> None:
        try:
            group.report([item])
        except ConnectionError as e:
            errors[item] = e
        else:
            errors[item] = None

    first = threading.Thread(target=call, args=(0,))
    first.start()
    assert sends.started.wait(30)
    waiting = [threading.Thread(target=call, args=(i,)) for i in (1, 2)]
    for t in waiting:
        t.start()
    wait_until(lambda: group.reports == 3, 30, "two more callers reporting")
    sends.fail_next = True  # the running send ends well; the one carrying 1 and 2 fails
    sends.release.set()
    for t in [first, *waiting]:
        t.join(30)
    assert errors[0] is None
    assert isinstance(errors[1], ConnectionError) and errors[1] is errors[2]
    group.report([3])  # the reporter still works
    assert sends.batches[-1] == [3]
    with pytest.raises(ConnectionError):
        sends.fail_next = True
        group.report([4])
