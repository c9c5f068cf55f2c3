"""``format("kudu")`` for one session: its session service started and the data source
class bound to it registered (:func:`register`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

from pyspark.sql import SparkSession

from pyspark_kudu.spark.api.datasource import bound_source
from pyspark_kudu.spark.api.session_service import (
    FILTER_PUSHDOWN_CONF,
    SERVICE_HOST_CONF,
    SessionBackend,
    SessionService,
)

__all__ = ["register"]


class Registrant(SessionBackend, Protocol):
    """A session backend that also has a SparkSession to register the source in."""

    @property
    def spark(self) -> SparkSession: ...

    @property
    def credential(self) -> str:
        """The application's ``PYSPARK_KUDU_SECRET`` (the session service's secret)."""
        ...


@contextlib.contextmanager
def _active(spark: Any) -> Iterator[None]:
    """Make ``spark`` the JVM's active session on this thread for the block, then restore.

    Spark checks a data source name against the *active* session's registry, so registering
    ``kudu`` in a ``newSession()`` of an application that registered it already fails unless
    that new session is the active one."""
    jss = spark._jvm.org.apache.spark.sql.SparkSession
    previous = jss.getActiveSession()
    jss.setActiveSession(spark._jsparkSession)
    try:
        yield
    finally:
        if previous.isDefined():
            jss.setActiveSession(previous.get())
        else:
            jss.clearActiveSession()


def register(kudu: Registrant) -> SessionService:
    """Start ``kudu``'s session service and register ``format("kudu")`` bound to it.

    The registered class is a subclass of
    :class:`~pyspark_kudu.spark.api.datasource.KuduDataSource` created at run time whose class
    attributes carry this service's address and secret; cloudpickle pickles such a class by
    value, so Spark's planning workers, commit workers and executors receive them. Only the
    master of ``kudu`` is reachable through it (``kudu.master`` naming another is an error).
    Registering again (another KuduContext) replaces the previous binding. Also turns on
    ``spark.sql.python.filterPushdown.enabled`` (unless the application set it) so that
    predicates prune tablets. Close the returned service when the context closes.
    """
    conf = kudu.spark.sparkContext.getConf()
    service = SessionService(kudu, secret=kudu.credential,
                             host=conf.get(SERVICE_HOST_CONF, "127.0.0.1") or "127.0.0.1")
    try:
        with _active(kudu.spark):
            kudu.spark.dataSource.register(bound_source(service.address))
        if not kudu.spark.sparkContext.getConf().contains(FILTER_PUSHDOWN_CONF):
            kudu.spark.conf.set(FILTER_PUSHDOWN_CONF, "true")
    except BaseException:
        service.close()
        raise
    return service
