"""Round-trip estimates from the driver to each tablet-server host, kept from the rounds.

What can be measured (DESIGN §3.4): the leader's state machine runs in the driver and a
round is one barrier stage with one task per host, so every Raft exchange is driver ->
host task -> driver. The round's ``collect`` returns once for all hosts, so its wall time
says nothing about any one host (it is the slowest host's). Spark times every task,
though, without needing synchronised clocks: the driver stamps a task when it launches it
and when its result arrives (launch-to-result, driver clock), and the executor reports how
long it deserialised, ran and serialised the task (its own clock). The difference is
Spark's **scheduler delay**: shipping the task to the host and its result back, plus
queueing in the scheduler. A round's task's sample is that delay, read from the driver's
live status store (the ``schedulerDelay`` of a task in Spark's REST API; the store exists
with the UI disabled) by the round's job group.

Not the launch-to-result time minus the host's own serving time: on the host, handing the
task to a Python worker costs as much as a slow link (measured on loopback with 2 busy
cores: 20-290 ms per task beside serving, against 3-40 ms of scheduler delay), and that is
load, not distance.

The **estimate** for a host is the lowest of its last :data:`DEFAULT_WINDOW` samples (the
minimum-RTT filter of TCP): a slow link raises every sample, a busy driver or executor
only some, and the first task on an executor also loads classes (hundreds of ms). It is
an upper bound of the network round trip between the driver and the host.

Thread-safety: :class:`RoundTrips` is thread-safe (rounds note from any driver thread; the
liveness reporter reads).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark import SparkContext

from pyspark_kudu.spark.jvm import context_cache, scala_context, scala_object

__all__ = [
    "DEFAULT_WINDOW",
    "MAX_HARVEST",
    "MAX_PENDING",
    "PENDING_S",
    "RoundTrip",
    "RoundTrips",
    "TaskDelays",
    "spark_task_delays",
]

_log = logging.getLogger(__name__)

#: Samples per host the estimate is the minimum of.
DEFAULT_WINDOW = 32
#: Rounds waiting for Spark's task timings at most (the oldest are dropped beyond).
MAX_PENDING = 256
#: Rounds read per :meth:`RoundTrips.estimates` (the newest; older unread ones are dropped).
#: Each read is 8 Py4J calls into the status store (~80 commands before they came as JSON
#: texts); with 16 writers the driver ran a dozen rounds a second, and reading them
#: all competed with the writers for the GIL and the JVM.
#: A few rounds per heartbeat keep the estimates (a minimum over a window) fresh.
MAX_HARVEST = 4
#: Seconds a round waits for its task timings to reach the status store before it is dropped.
PENDING_S = 60.0

#: Reads a finished round's scheduler delays by its job group: ``{partition index:
#: seconds}``, or None while Spark has not recorded the job as finished.
TaskDelays = Callable[[str], Mapping[int, float] | None]


@dataclass(frozen=True)
class RoundTrip:
    """A host's estimate: the lowest recent sample (ms) and how many samples were taken."""

    ms: float
    samples: int

    def to_dict(self) -> dict[str, Any]:
        """The heartbeat's ``round_trip`` field (``MasterClient.heartbeat_to``)."""
        return {"ms": round(self.ms, 3), "samples": self.samples}


@dataclass(frozen=True)
class _Pending:
    group: str
    hosts: tuple[str, ...]  # per partition index: the task's host, "" for no sample
    noted: float


class RoundTrips:
    """Per-host round-trip estimates (see the module rules).

    Rounds noted with :meth:`note_round` become samples when :meth:`estimates` finds their
    tasks' delays (``task_delays``, :func:`spark_task_delays`), so the status store is read
    by whoever asks -- the liveness reporter, once per heartbeat -- and never on a round's
    path. :meth:`observe` adds one sample directly.
    """

    def __init__(self, task_delays: TaskDelays | None = None, *,
                 window: int = DEFAULT_WINDOW,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._task_delays = task_delays
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._samples: dict[str, deque[float]] = {}
        self._counts: dict[str, int] = {}
        self._pending: deque[_Pending] = deque(maxlen=MAX_PENDING)
        self._read_failed = False

    def observe(self, host: str, delay_s: float) -> None:
        """One task's scheduler delay on ``host``, in seconds."""
        with self._lock:
            window = self._samples.setdefault(host, deque(maxlen=self._window))
            window.append(max(0.0, delay_s))
            self._counts[host] = self._counts.get(host, 0) + 1

    def note_round(self, group: str, hosts: Sequence[str]) -> None:
        """A finished round: its job group and, per partition, its host ("" for none)."""
        if self._task_delays is None:
            return
        with self._lock:
            self._pending.append(_Pending(group, tuple(hosts), self._clock()))

    def estimates(self) -> dict[str, RoundTrip]:
        """Each sampled host's estimate, after turning noted rounds into samples."""
        self._harvest()
        with self._lock:
            return {h: RoundTrip(min(w) * 1000.0, self._counts[h])
                    for h, w in self._samples.items() if w}

    def _harvest(self) -> None:
        if self._task_delays is None:
            return
        with self._lock:
            pending, self._pending = list(self._pending), deque(maxlen=MAX_PENDING)
        pending = pending[-MAX_HARVEST:]
        keep = []
        now = self._clock()
        for p in pending:
            try:
                delays = self._task_delays(p.group)
            except Exception as e:  # Spark's internals changed, or the context is stopping
                if not self._read_failed:
                    self._read_failed = True
                    _log.info("no round-trip estimates: cannot read Spark's task timings: %s",
                              e)
                continue
            if delays is None:
                if now - p.noted < PENDING_S:
                    keep.append(p)
                continue
            for index, host in enumerate(p.hosts):
                if host and index in delays:
                    self.observe(host, delays[index])
        with self._lock:
            # Rounds noted meanwhile stay behind the older ones still waiting.
            self._pending.extendleft(reversed(keep))


def spark_task_delays(sc: SparkContext) -> TaskDelays:
    """Reads a finished job's scheduler delays from the driver's live status store: the
    group's last job, its result stage (the round's barrier stage: it is created after its
    parents), each successful task's delay by partition.

    Each step comes back as one JSON text (Spark's own Jackson, with its Scala module, the
    way its REST API writes them): the group's job ids, the job, the stage, its tasks --
    8 Py4J calls a read. Walking them through PySpark's status tracker and Py4J took ~8
    calls per task and ~14 more for the job and stage, plus one for each Java object
    Python dropped (~80 commands to read a round of 6 tasks). Where that mapper cannot be
    made, they are walked as before."""
    mapper: list[Any] = []  # [the ObjectMapper] or [None], made on the first read

    def read(group: str) -> Mapping[int, float] | None:
        if not mapper:
            mapper.append(_task_mapper(sc))
        if mapper[0] is not None:
            return _read_as_json(sc, mapper[0], group)
        tracker = sc.statusTracker()
        jobs = tracker.getJobIdsForGroup(group)
        if not jobs:
            return None
        job = tracker.getJobInfo(max(jobs))
        # The store records a job's end after its tasks' ends (one listener queue, in order).
        if job is None or job.status != "SUCCEEDED" or not job.stageIds:
            return None
        stage_id = max(job.stageIds)
        stage = tracker.getStageInfo(stage_id)
        if stage is None:
            return None
        tasks = sc._jsc.sc().statusStore().taskList(stage_id, stage.currentAttemptId,
                                                    stage.numTasks)
        out: dict[int, float] = {}
        it = tasks.iterator()
        while it.hasNext():
            td = it.next()
            # Without metrics Spark reports a delay of 0: no sample.
            if (td.status() == "SUCCESS" and td.duration().isDefined()
                    and td.taskMetrics().isDefined()):
                out[int(td.index())] = int(td.schedulerDelay()) / 1000.0
        return out

    return read


def _read_as_json(sc: SparkContext, mapper: Any, group: str) -> Mapping[int, float] | None:
    """:func:`spark_task_delays`' read, each object of the status store as JSON."""
    ssc = scala_context(sc)
    tracker = context_cache(sc, "scala-status-tracker", lambda: ssc.statusTracker())
    store = context_cache(sc, "status-store", lambda: ssc.statusStore())

    def as_json(obj: Any) -> Any:
        return json.loads(str(mapper.writeValueAsString(obj)))

    jobs = as_json(tracker.getJobIdsForGroup(group))
    if not jobs:
        return None
    job = as_json(store.job(max(jobs)))
    # The store records a job's end after its tasks' ends (one listener queue, in order).
    if job.get("status") != "SUCCEEDED" or not job.get("stageIds"):
        return None
    stage_id = max(job["stageIds"])
    stage = as_json(store.lastStageAttempt(stage_id))
    tasks = store.taskList(stage_id, stage["attemptId"], stage["numTasks"])
    return _delays_from_json(str(mapper.writeValueAsString(tasks)))


_SCALA_MODULE = "com.fasterxml.jackson.module.scala.DefaultScalaModule$"


def _task_mapper(sc: SparkContext) -> Any | None:
    """A Jackson ``ObjectMapper`` with Spark's Scala module (``Option`` as its value or
    null, ``Seq`` as an array), or None if this driver JVM has none."""
    module = scala_object(sc, _SCALA_MODULE)
    if module is None:
        _log.debug("no Jackson Scala module: task timings read one call at a time")
        return None
    jvm = sc._jvm
    assert jvm is not None
    try:
        mapper = jvm.com.fasterxml.jackson.databind.ObjectMapper()
        mapper.registerModule(module)
    except Exception:  # Py4J's or PySpark's errors: another Spark's classpath
        _log.debug("no Jackson mapper: task timings read one call at a time", exc_info=True)
        return None
    return mapper


def _delays_from_json(text: str) -> dict[int, float]:
    """``{partition index: scheduler delay in seconds}`` of the successful tasks with
    metrics in a JSON array of Spark's ``TaskData`` (without metrics Spark reports a delay
    of 0: no sample)."""
    out: dict[int, float] = {}
    for td in json.loads(text):
        if (td.get("status") == "SUCCESS" and td.get("duration") is not None
                and td.get("taskMetrics") is not None):
            out[int(td["index"])] = int(td["schedulerDelay"]) / 1000.0
    return out
