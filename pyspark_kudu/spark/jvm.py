"""JVM handles the driver looks up once instead of on every write.

Every Py4J command costs the driver ~0.1 ms of JVM CPU and as much Python CPU, and under 16
concurrent writers each one also waits for the GIL: a lone 1-row write on the 6-worker test
cluster sent ~230 of them. Names resolved through ``sc._jvm`` cost one reflection call per
package segment, and every Java object Python drops costs one more command when Py4J's
finalizer tells the JVM. So objects that do not change are kept:

- per Py4J gateway (a driver JVM): classes, reflected fields, Scala objects (a class's
  ``MODULE$``, :func:`scala_object`), see :func:`gateway_cache`;
- per ``SparkContext``: objects that belong to one context (its block manager master, the
  Python functions of its recurring stages), see :func:`context_cache`.

Thread-safety: both caches are filled under one lock; what they hold is immutable or
thread-safe on the JVM side.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from pyspark import SparkContext

__all__ = [
    "context_cache", "gateway_cache", "gateway_cached", "scala_context", "scala_object",
]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

_lock = threading.Lock()
# Per gateway, kept referenced so that its id cannot be reused by another one.
_by_gateway: dict[int, tuple[Any, dict[str, Any]]] = {}
# Per SparkContext, dropped with it.
_by_context: weakref.WeakKeyDictionary[SparkContext, dict[str, Any]] = (
    weakref.WeakKeyDictionary())
_MISSING = object()


def _gateway_entries(sc: SparkContext) -> dict[str, Any]:
    """This gateway's entries (call with ``_lock`` held)."""
    gateway = sc._gateway
    entry = _by_gateway.get(id(gateway))
    if entry is None or entry[0] is not gateway:  # a new gateway that reused an id
        entry = _by_gateway[id(gateway)] = (gateway, {})
    return entry[1]


def gateway_cache(sc: SparkContext, key: str, make: Callable[[], _T]) -> _T:
    """``key``'s object for this Py4J gateway, made by ``make`` the first time (under the
    lock: ``make`` must not call back into this module)."""
    with _lock:
        entries = _gateway_entries(sc)
        found = entries.get(key, _MISSING)
        if found is _MISSING:
            found = entries[key] = make()
        return found  # type: ignore[no-any-return]


def gateway_cached(sc: SparkContext, key: str) -> Any | None:
    """``key``'s object for this gateway if it was made, else None."""
    with _lock:
        return _gateway_entries(sc).get(key)


def scala_object(sc: SparkContext, class_name: str) -> Any | None:
    """The instance of Scala object ``class_name`` (its ``MODULE$``, e.g.
    ``"org.apache.spark.sql.execution.arrow.ArrowConverters$"``) in the driver JVM, looked up
    once per gateway; ``None`` if this JVM has no such class (another Spark's classpath)."""

    def find() -> Any | None:
        jvm = sc._jvm
        assert jvm is not None
        try:
            return jvm.java.lang.Class.forName(class_name).getField("MODULE$").get(None)
        except Exception:  # Py4J's or PySpark's error for a missing class or field
            _log.debug("no Scala object %s in this driver JVM", class_name, exc_info=True)
            return None

    return gateway_cache(sc, "scala-object:" + class_name, find)


def context_cache(sc: SparkContext, key: str, make: Callable[[], _T]) -> _T:
    """``key``'s object for this ``SparkContext``, made by ``make`` the first time (under
    the lock: ``make`` must not call back into this module)."""
    with _lock:
        entries = _by_context.get(sc)
        if entries is None:
            entries = _by_context[sc] = {}
        found = entries.get(key, _MISSING)
        if found is _MISSING:
            found = entries[key] = make()
        return found  # type: ignore[no-any-return]


def scala_context(sc: SparkContext) -> Any:
    """The driver JVM's Scala ``SparkContext`` behind ``sc`` (``sc._jsc.sc()``, one Py4J
    call the first time per context)."""
    return context_cache(sc, "scala-spark-context", lambda: sc._jsc.sc())
