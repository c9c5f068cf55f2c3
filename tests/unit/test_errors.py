"""The exception hierarchy separates the caller's mistakes from remote failures (STYLE #9)."""

from __future__ import annotations

import inspect

from pyspark_kudu import errors


def test_every_error_derives_from_kudu_error_and_is_named_error() -> None:
    members = inspect.getmembers(errors, inspect.isclass)
    classes = [c for _, c in members if c.__module__ == errors.__name__]
    assert len(classes) == len(errors.__all__)
    for c in classes:
        assert issubclass(c, errors.KuduError), c
        assert c.__name__.endswith(("Error", "Error_")), c


def test_usage_and_remote_families_are_disjoint() -> None:
    assert issubclass(errors.InvalidArgumentError, errors.UsageError)
    assert issubclass(errors.CorruptionError, errors.RemoteError)
    assert not issubclass(errors.CorruptionError, errors.UsageError)
    assert not issubclass(errors.NotFoundError, errors.RemoteError)


def test_not_leader_error_carries_the_leader_hint() -> None:
    e = errors.NotLeaderError("master m1 is not the leader", leader_hint="127.0.0.1:7052")
    assert e.leader_hint == "127.0.0.1:7052"
    assert "not the leader" in str(e)
