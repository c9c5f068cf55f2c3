"""Settings of a ``KuduContext`` and of a host's data root: honoured or refused, never ignored.

Pure functions of ``pyspark_kudu.spark.api.settings``, ``...api.tablet_servers`` and
``...host.identity``; the same rules through a real local-mode ``KuduContext`` are in
``tests/spark/test_settings.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pyspark import SparkConf

from pyspark_kudu.errors import InvalidArgumentError
from pyspark_kudu.master.locations import DEFAULT_MAPPING_TIMEOUT_S
from pyspark_kudu.spark.api import settings as kudu_settings
from pyspark_kudu.spark.api import tablet_servers
from pyspark_kudu.spark.api.settings import (
    FAILED_AFTER_CONF,
    HEAL_MAX_MOVES_CONF,
    LOCATION_MAPPING_CMD_CONF,
    LOCATION_MAPPING_TIMEOUT_CONF,
    ROUND_TIMEOUT_CONF,
)
from pyspark_kudu.spark.host import identity
from pyspark_kudu.spark.host.identity import DATA_ROOT_CONF, DATA_ROOT_ENV, local_data_root


def conf(**settings: str) -> SparkConf:
    c = SparkConf(loadDefaults=False)
    for k, v in settings.items():
        c.set(k, v)
    return c


# -- timeouts and intervals ----------------------------------------------------------------


@pytest.mark.parametrize(("settings", "arg", "want"), [
    ({}, None, 300.0),                               # neither: the default
    ({ROUND_TIMEOUT_CONF: "42"}, None, 42.0),        # the Spark setting
    ({ROUND_TIMEOUT_CONF: "42"}, 7.5, 7.5),          # the argument wins over it
    ({ROUND_TIMEOUT_CONF: " 0.25 "}, None, 0.25),
])
def test_a_timeout_is_the_argument_else_the_setting_else_the_default(
        settings: dict[str, str], arg: float | None, want: float) -> None:
    got = kudu_settings.seconds(conf(**settings), ROUND_TIMEOUT_CONF, 300.0, "round_timeout_s", arg)
    assert got == want


@pytest.mark.parametrize(("settings", "arg", "message"), [
    ({}, 0.0, "round_timeout_s=0 is not usable: it must be more than 0 seconds"),
    ({ROUND_TIMEOUT_CONF: "100"}, 0.0, "round_timeout_s=0 is not usable"),
    ({}, -3.0, "round_timeout_s=-3 is not usable"),
    ({ROUND_TIMEOUT_CONF: "0"}, None, f"{ROUND_TIMEOUT_CONF}=0 is not usable"),
    ({ROUND_TIMEOUT_CONF: "nan"}, None, f"{ROUND_TIMEOUT_CONF}=nan is not usable"),
    ({ROUND_TIMEOUT_CONF: "5s"}, None, f"{ROUND_TIMEOUT_CONF}='5s' is not a number of seconds"),
    ({ROUND_TIMEOUT_CONF: ""}, None, f"{ROUND_TIMEOUT_CONF}='' is not a number of seconds"),
])
def test_a_zero_negative_or_malformed_timeout_is_refused_not_defaulted(
        settings: dict[str, str], arg: float | None, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        kudu_settings.seconds(conf(**settings), ROUND_TIMEOUT_CONF, 300.0, "round_timeout_s", arg)


def test_zero_is_kept_where_it_has_a_meaning() -> None:
    # lease_s=0 / spark.kudu.leaderLeaseSec=0: no leases (before, the setting's 0 became 10 s).
    assert kudu_settings.seconds(conf(), "spark.kudu.leaderLeaseSec", 10.0, "lease_s", 0.0,
                            zero_ok=True) == 0.0
    assert kudu_settings.seconds(conf(**{"spark.kudu.leaderLeaseSec": "0"}),
                            "spark.kudu.leaderLeaseSec", 10.0, zero_ok=True) == 0.0
    with pytest.raises(InvalidArgumentError, match=re.escape("lease_s=-1 is not usable: it "
                                                             "must be 0 or more seconds")):
        kudu_settings.seconds(conf(), "spark.kudu.leaderLeaseSec", 10.0, "lease_s", -1.0,
                         zero_ok=True)


def test_heal_max_moves_must_allow_a_move() -> None:
    assert kudu_settings.heal_max_moves(conf()) == 4
    assert kudu_settings.heal_max_moves(conf(**{HEAL_MAX_MOVES_CONF: "9"})) == 9
    with pytest.raises(InvalidArgumentError,
                       match=re.escape(f"{HEAL_MAX_MOVES_CONF}=0 is not usable")) as info:
        kudu_settings.heal_max_moves(conf(**{HEAL_MAX_MOVES_CONF: "0"}))
    assert "spark.kudu.heal.enabled=false" in str(info.value)  # the way to say "no healing"
    with pytest.raises(InvalidArgumentError, match=re.escape("'four' is not an integer")):
        kudu_settings.heal_max_moves(conf(**{HEAL_MAX_MOVES_CONF: "four"}))


# -- embedded-master settings --------------------------------------------------------------


def test_embedded_master_settings_come_from_arguments_else_spark_settings() -> None:
    assert kudu_settings.embedded_master_settings(conf(), None, None, None, None) == {
        "location_mapping_cmd": None, "location_mapping_timeout_s": DEFAULT_MAPPING_TIMEOUT_S,
        "follower_unavailable_considered_failed_s": 300.0}
    c = conf(**{LOCATION_MAPPING_CMD_CONF: "map.sh topo", LOCATION_MAPPING_TIMEOUT_CONF: "3",
                FAILED_AFTER_CONF: "60"})
    assert kudu_settings.embedded_master_settings(c, None, None, None, None) == {
        "location_mapping_cmd": "map.sh topo", "location_mapping_timeout_s": 3.0,
        "follower_unavailable_considered_failed_s": 60.0}
    assert kudu_settings.embedded_master_settings(c, None, "other.sh", 4.0, 5.0) == {
        "location_mapping_cmd": "other.sh", "location_mapping_timeout_s": 4.0,
        "follower_unavailable_considered_failed_s": 5.0}
    with pytest.raises(InvalidArgumentError,
                       match=re.escape(f"{LOCATION_MAPPING_TIMEOUT_CONF}=0 is not usable")):
        kudu_settings.embedded_master_settings(conf(**{LOCATION_MAPPING_TIMEOUT_CONF: "0"}), None,
                                          None, None, None)


@pytest.mark.parametrize(("args", "settings", "name", "flag"), [
    (("map.sh", None, None), {}, "location_mapping_cmd", "--location-mapping-cmd"),
    ((None, 10.0, None), {}, "location_mapping_timeout_s", "--location-mapping-timeout-s"),
    ((None, None, 60.0), {}, "failed_after_s", "--follower-unavailable-considered-failed-sec"),
    ((None, None, None), {LOCATION_MAPPING_CMD_CONF: "map.sh"}, LOCATION_MAPPING_CMD_CONF,
     "--location-mapping-cmd"),
    ((None, None, None), {LOCATION_MAPPING_TIMEOUT_CONF: "3"}, LOCATION_MAPPING_TIMEOUT_CONF,
     "--location-mapping-timeout-s"),
    ((None, None, None), {FAILED_AFTER_CONF: "60"}, FAILED_AFTER_CONF,
     "--follower-unavailable-considered-failed-sec"),
])
def test_embedded_master_settings_with_standalone_masters_are_a_usage_error(
        args: tuple[str | None, float | None, float | None], settings: dict[str, str],
        name: str, flag: str) -> None:
    with pytest.raises(InvalidArgumentError, match=re.escape(
            f"{name}: setting(s) of the embedded master, but this KuduContext uses the "
            f"standalone masters h1:7051")) as info:
        kudu_settings.embedded_master_settings(conf(**settings), "h1:7051", *args)
    assert f"pyspark-kudu master run {flag} ..." in str(info.value)


def test_without_embedded_master_settings_standalone_masters_get_none() -> None:
    assert kudu_settings.embedded_master_settings(conf(), "h1:7051", None, None, None) == {}


# -- data root -----------------------------------------------------------------------------


def test_a_cluster_host_without_a_data_root_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    default = tmp_path / "default-root"
    monkeypatch.setattr(identity, "_DEFAULT_ROOT", str(default))
    assert local_data_root() == str(default)  # local mode keeps the default
    with pytest.raises(InvalidArgumentError) as info:
        local_data_root(cluster=True)
    assert DATA_ROOT_ENV in str(info.value) and DATA_ROOT_CONF in str(info.value)
    # The discovery task refuses before it creates anything.
    with pytest.raises(InvalidArgumentError, match=re.escape(DATA_ROOT_CONF)):
        tablet_servers._identify(identity.current_host(), conf_root=None)
    assert not default.exists()


def test_a_cluster_host_uses_its_env_root_else_the_application_setting(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    conf_root = tmp_path / "conf-root"
    found = tablet_servers._identify(identity.current_host(), conf_root=str(conf_root))
    assert found is not None
    info, _ = found
    assert info.data_root == str(conf_root) and (conf_root / "instance").is_file()
    env_root = tmp_path / "env-root"
    monkeypatch.setenv(DATA_ROOT_ENV, str(env_root))
    assert local_data_root(None, str(conf_root), cluster=True) == str(env_root)


def test_a_discovery_task_that_runs_on_another_host_reports_nothing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A pinned discovery task Spark ran elsewhere must not answer for the host it was
    meant for (that host's server would get this host's identity and address); nothing is
    created under the data root."""
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    conf_root = tmp_path / "conf-root"
    assert tablet_servers._identify("192.0.2.1", conf_root=str(conf_root)) is None
    assert not conf_root.exists()
    assert tablet_servers._identify(identity.current_host(), conf_root=str(conf_root)) is not None
