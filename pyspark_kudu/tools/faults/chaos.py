"""Chaos mode of the fault harness: ``df.write.format("kudu")`` upserts while one executor is
SIGKILLed every few seconds (``python -m pyspark_kudu.tools.faults --mode chaos``).

What a user sees when executors die under a DataFrame job, measured: how many writes are
acknowledged (goal: :data:`ACK_GOAL`), how long each takes, and why each failed one raised,
while the checker proves nothing acknowledged was lost and nothing stale or invented was read.

* :class:`ChaosInjector` -- the only fault is ``kill_executor``: one every ``period_s``
  (measured from the previous kill), on the hosts in a seeded rotation (each cycle a new
  permutation of the hosts, never the same host twice in a row). A kill waits only for its
  host to have an executor (the driver lists one and its JVM runs) -- *not* for full
  replication, as the destructive faults do -- under ``precondition_deadline_s``; a kill not
  applied by then fails the run (the same rule and the same records as
  :class:`.injector.FaultInjector`, whose machinery it reuses). **One host down at a time**:
  a kill also waits until the host killed before it has its new executor (or that host's
  ``recover_deadline_s`` passed), so with RF=3 every tablet keeps a live majority, the
  scenario whose writes must all succeed -- on a slow machine, where Spark takes longer than
  ``period_s`` to replace an executor, kills would otherwise pile up until no host had one.
  The new executor's arrival ends the kill's span (``end``). Once the writes are over no kill
  starts; one still waiting then is dropped and named in the report's notes.
* :class:`ChaosWorkload` -- one client (``c0``), as a user's loop would be: each write is one
  ``df.write.format("kudu")`` upsert (``kudu.operation=upsert``) of ``rows`` keys drawn at
  random from ``keys``, each given a value never written before (``c0-<write>-<key>``), then
  a full read through ``spark.read.format("kudu")`` (``kudu.readMode`` ``read_mode``; the
  final read is ``linearizable``). Each write is **one** history op naming all its keys
  (:mod:`.history` writes name one or more keys; the checker checks every key of every
  write as its own register): an acknowledged write's rows must all be visible unless a
  later write replaced them; an unknown one's may or may not be.
* :func:`classify` -- Spark wraps the project's errors: an error of ``commit()`` or of the
  planning calls arrives as an ``AnalysisException`` (``PYTHON_DATA_SOURCE_ERROR``) whose
  message is the Python worker's traceback; a task's error inside a ``Py4JJavaError`` /
  ``SparkException`` ("Job aborted due to stage failure ... PythonException: Traceback
  ..."). The outermost exception of the first Python traceback in the text (following its
  chain of causes) is the error: only :data:`.workload.OUTCOME_UNKNOWN` ones make a write
  ``info``, ``InvalidArgumentError`` a ``fail``; anything else -- including an error with
  no Python traceback (an executor lost four times, ...) -- is unexpected and fails the run
  with its traceback, as in the other modes. (A message that itself embeds a chained Python
  traceback could be misread; the project's messages carry one-line root causes.) Reads
  follow the same rule, except that a chaos read raising ``ServiceUnavailableError`` (no
  replica served its scan), or whose job was aborted after its task's executor was lost,
  the last time with exit code 137 (killed by this harness: Spark counts such a loss
  against ``spark.task.maxFailures``), is a failed read, counted and reported with the
  driver's view of the tablet servers (:func:`tserver_view`): a read changes nothing, so
  this is availability, timing-dependent like the writes' acknowledged share. The final
  reads, after the kills, stay strict, and so do writes.

Thread-safety: the injector runs on one thread of its own (see :class:`.injector.FaultInjector`);
the workload's client thread shares the :class:`HistoryWriter` (thread-safe); the summaries
the harness reads are taken under the workload's lock.
"""

from __future__ import annotations

import random
import re
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pyspark_kudu import errors as project_errors
from pyspark_kudu.errors import InvalidArgumentError, KuduError
from pyspark_kudu.testing.standalone_cluster import StandaloneCluster
from pyspark_kudu.tools.faults.history import HistoryWriter, Key, Value
from pyspark_kudu.tools.faults.inject import FaultEvent, executor_pids
from pyspark_kudu.tools.faults.injector import FaultInjector, _Halt
from pyspark_kudu.tools.faults.workload import OUTCOME_UNKNOWN, Workload, record_read

__all__ = [
    "ACK_GOAL",
    "ChaosInjector",
    "ChaosWorkload",
    "ErrorInfo",
    "classify",
    "kill_rotation",
    "outermost_python_error",
    "run_chaos",
    "tserver_view",
]

ACK_GOAL = 0.95
"""The share of chaos writes that should be acknowledged (a measurement: not an exit code)."""

_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = ("The above exception was the direct cause of the following exception:",
            "During handling of the above exception, another exception occurred:")
_PREFIX = "pyspark_kudu.errors."
_MAX_LINE = 1000
# A chaos read failing with these is a failed read, counted and reported, not a run failure:
# the documented "no replica served a scan from this task" (each replica's reason named)...
_READ_UNAVAILABLE = frozenset({"ServiceUnavailableError"})
# ... or its job aborted because its task's executor was lost the last time with exit code
# 137: SIGKILLed by this harness (Spark counts that loss against spark.task.maxFailures).
_KILLED_BY_CHAOS = re.compile(r"Job aborted due to stage failure: .* failed \d+ times, most "
                              r"recent failure: .*ExecutorLostFailure .* exited with code 137")


# == errors ======================================================================================


@dataclass(frozen=True)
class ErrorInfo:
    """Why a call raised: ``raised`` is the exception's type (``AnalysisException``, ...),
    ``condition`` Spark's error condition and action if any (``PYTHON_DATA_SOURCE_ERROR
    (commit or abort)``), ``error`` the Python error found inside (a project error by its
    class name, ``RoundFailedError``; another by its qualified name; None: no Python
    traceback in it), ``message`` the first line of its message (else of the raised
    exception's), and ``outcome`` ``info`` / ``fail``, or None when it is unexpected."""

    raised: str
    condition: str | None
    error: str | None
    message: str
    outcome: str | None

    def text(self) -> str:
        """One line for the history: ``RoundFailedError: ... [AnalysisException ...]``."""
        via = self.raised + (f" {self.condition}" if self.condition else "")
        return f"{self.error or 'no project error'}: {self.message} [raised as {via}]"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def outermost_python_error(text: str) -> tuple[str, str] | None:
    """(qualified exception name, first message line) of the outermost exception of the
    first Python traceback in ``text`` (a chain of causes is followed to its last link);
    None when ``text`` holds no traceback."""
    lines = text.splitlines()
    i = next((n for n, line in enumerate(lines) if line.rstrip().endswith(_TRACEBACK)), None)
    if i is None:
        return None
    header: str | None = None
    while True:
        i += 1
        while i < len(lines) and (lines[i].startswith((" ", "\t")) or not lines[i].strip()):
            i += 1  # the frames: "  File ...", their source and caret lines
        if i >= len(lines):
            break
        header = lines[i]
        j = next((n for n in range(i + 1, len(lines)) if lines[n].strip() in _CHAINED), None)
        k = j + 1 if j is not None else len(lines)
        while k < len(lines) and not lines[k].strip():
            k += 1
        if k >= len(lines) or not lines[k].rstrip().endswith(_TRACEBACK):
            break
        i = k
    if header is None:
        return None
    name, _, message = header.partition(":")
    return name.strip(), message.strip()[:_MAX_LINE]


def _first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip().lstrip(":").strip()
        if line and not line.startswith("An error occurred while calling"):
            return line[:_MAX_LINE]
    return ""


def _condition(e: BaseException) -> tuple[str | None, str | None]:
    """Spark's error condition of ``e`` (with its action) and the Python worker's traceback
    it carries, if any."""
    get = getattr(e, "getCondition", None) or getattr(e, "getErrorClass", None)
    params = getattr(e, "getMessageParameters", None)
    try:
        cond = get() if callable(get) else None
        p = params() if callable(params) else None
    except Exception:  # a Py4J call on a closed gateway: the text is all there is
        return None, None
    if not cond:
        return None, None
    p = p if isinstance(p, Mapping) else {}
    action = p.get("action")
    return (f"{cond} ({action})" if action else str(cond)), (str(p["msg"]) if "msg" in p
                                                              else None)


def classify(e: BaseException, *, write: bool = True) -> ErrorInfo:
    """What ``e`` (raised by a ``format("kudu")`` write, or read when ``write`` is False)
    means for the op: see the module docstring."""
    condition, worker = _condition(e)
    cls: type[BaseException] | None = None
    name: str | None = None
    message = _first_line(str(e))
    if isinstance(e, KuduError):
        cls, name = type(e), type(e).__name__
    else:
        found = None
        for text in (worker, str(e)):
            if text and (found := outermost_python_error(text)) is not None:
                break
        if found is not None:
            name, message = found
            if name.startswith(_PREFIX):
                name = name[len(_PREFIX):]
                got = getattr(project_errors, name, None)
                cls = got if isinstance(got, type) and issubclass(got, KuduError) else None
    outcome: str | None = None
    if cls is not None and issubclass(cls, OUTCOME_UNKNOWN):
        outcome = "info"
    elif write and cls is not None and issubclass(cls, InvalidArgumentError):
        outcome = "fail"  # validated before anything was proposed (as in the ops workload)
    return ErrorInfo(type(e).__name__, condition, name, message, outcome)


# == kills =======================================================================================


def _rotation(rng: random.Random, hosts: Sequence[str]) -> Iterator[str]:
    last: str | None = None
    while True:
        cycle = rng.sample(list(hosts), len(hosts))
        if len(cycle) > 1 and cycle[0] == last:
            cycle.append(cycle.pop(0))
        yield from cycle
        last = cycle[-1]


def kill_rotation(rng: random.Random, hosts: Sequence[str], n: int) -> list[str]:
    """The first ``n`` hosts of the seeded rotation: each cycle a permutation of ``hosts``,
    never the same host twice in a row."""
    it = _rotation(rng, hosts)
    return [next(it) for _ in range(n)]


class _Cancelled(Exception):
    """The writes ended while a kill waited for its precondition: it is not needed."""


class ChaosInjector(FaultInjector):
    """``kill_executor`` every ``period_s`` until :meth:`finish` (see the module docstring).
    ``planned`` replays a saved schedule (its hosts and times) instead of the rotation.
    :attr:`events` is what was struck, as a schedule; :meth:`snapshot` the records, in the
    format of :class:`.injector.FaultInjector`. A kill still waiting for its host's executor
    when :meth:`finish` is called is dropped (the writes it was to disturb are over) and
    named in :attr:`cancelled`."""

    def __init__(self, cluster: StandaloneCluster, clock: Callable[[], float],
                 has_executor: Callable[[str], bool], *, rng: random.Random,
                 period_s: float, planned: Sequence[FaultEvent] | None = None,
                 precondition_deadline_s: float = 150.0, recover_deadline_s: float = 60.0,
                 poll_s: float = 0.25) -> None:
        super().__init__(cluster, list(planned or ()), clock, has_executor,
                         precondition_deadline_s=precondition_deadline_s,
                         recover_deadline_s=recover_deadline_s, poll_s=poll_s)
        if not period_s > 0:
            raise ValueError(f"chaos period must be > 0 s, got {period_s!r}")
        self.period_s = period_s
        self.rng = rng
        self.planned = list(planned) if planned else None
        self.events: list[FaultEvent] = []
        self.cancelled: list[str] = []
        self._finish = threading.Event()
        # (host, pids killed, record, monotonic deadline): kills whose host has no new
        # executor yet. Only the injector thread touches it.
        self._pending: list[tuple[str, set[int], dict[str, Any], float]] = []

    def finish(self) -> None:
        """No kill after the one under way (if any: it is still applied or fails the run)."""
        self._finish.set()

    def _run(self) -> None:
        assert self.started_at is not None
        hosts = _rotation(self.rng, list(self.cluster.hosts))
        at = self.period_s
        try:
            while not (self._finish.is_set() or self._stop.is_set()):
                if self.planned is not None:
                    if len(self.events) >= len(self.planned):
                        break
                    ev = self.planned[len(self.events)]
                    due = ev.at_s
                else:
                    # The schedule shows the time rounded; the pacing uses it unrounded, or
                    # a kill could strike up to 5 ms less than a period after the last one.
                    ev = FaultEvent(round(at, 2), "kill_executor", next(hosts))
                    due = at
                if not self._wait_until(self.started_at + due):
                    break
                self.events.append(ev)
                rec = self._record(ev, note="waiting for its precondition")
                try:
                    pids = self._strike(ev, rec)
                except _Cancelled as c:
                    with self._lock:
                        self._records.remove(rec)
                    self.events.pop()
                    self.cancelled.append(f"kill_executor on {ev.host} (planned at "
                                          f"{ev.at_s:.1f} s) dropped: the writes ended while "
                                          f"it waited ({c})")
                    break
                except _Halt as h:
                    self._update(rec, note=f"NOT APPLIED: {h}")
                    self._error(str(h))
                    break
                self._pending.append((ev.host, set(pids), rec,
                                      time.monotonic() + self.recover_deadline_s))
                at = float(rec["start"]) - self.started_at + self.period_s
            while self._pending and not self._stop.is_set():  # the last spans' ends
                self._poll_recoveries()
                self._stop.wait(self.poll_s)  # polling under each kill's recover deadline
        except Exception:  # a bug here must fail the run, with its traceback
            self._error(f"the chaos injector crashed:\n{traceback.format_exc()}")
        finally:
            self.finished_at = self.clock()

    def _wait_until(self, t: float) -> bool:
        """Pace to clock time ``t``, meanwhile noting new executors; False when finished
        or stopped first."""
        while True:
            self._poll_recoveries()
            left = t - self.clock()
            if left <= 0:
                return True
            if self._finish.is_set() or self._stop.wait(min(left, self.poll_s)):
                return False

    def _not_ready(self, ev: FaultEvent) -> str | None:
        self._poll_recoveries()  # called on every poll of a precondition
        why = super()._not_ready(ev)
        if why is None and self._pending:
            down = sorted({host for host, _, _, _ in self._pending})
            why = (f"one host down at a time: {', '.join(down)} has no new executor yet "
                   f"(module docstring)")
        if why is not None and self._finish.is_set():
            raise _Cancelled(why)
        return why

    def _poll_recoveries(self) -> None:
        keep = []
        now = time.monotonic()
        for host, old, rec, deadline in self._pending:
            if set(executor_pids(self.cluster, host)) - old and self.has_executor(host):
                self._update(rec, end=self.clock())
            elif now >= deadline:
                self._update(rec, note=f"{rec['note']}; no new executor on the host within "
                                       f"{self.recover_deadline_s:.0f} s (span drawn to the end)")
            else:
                keep.append((host, old, rec, deadline))
        self._pending = keep


# == the workload =================================================================================


def tserver_view(kudu: Any) -> list[dict[str, Any]]:
    """What the driver's ``KuduContext`` believes of each tablet server -- the address
    ``format("kudu")`` reads are planned with -- and whether it answers a TCP connect now,
    with the host's executors now and when the address was learnt: recorded with each
    failed read (a read task reaches another host's replica through that address)."""
    from pyspark_kudu.spark.pinned import executor_hosts

    now = executor_hosts(kudu.spark.sparkContext)
    learnt = dict(getattr(kudu, "_executors", {}))
    out = []
    for s in list(kudu.servers):
        host, _, port = str(s.address).rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=2.0).close()
            answers = True
        except (OSError, ValueError):
            answers = False
        out.append({"uuid": s.uuid, "host": s.host, "address": s.address, "answers": answers,
                    "executors_now": now.get(s.host, []),
                    "executors_when_learnt": learnt.get(s.host)})
    return out


class ChaosWorkload(Workload):
    """One client writing ``rows``-row upserts through ``df.write.format("kudu")`` and
    reading the table back through ``spark.read.format("kudu")`` (see the module docstring).
    Before :meth:`begin` its writes are the warm-up; after it, at most ``writes`` writes
    during ``window_s`` seconds are the chaos writes, then the client stops
    (:attr:`chaos_done`). Client ``reader-ctx`` reads through ``kudu.read_table``
    (linearizable) instead: the harness's last resort for the final contents when
    ``format("kudu")`` cannot read. ``diagnose()`` (e.g. :func:`tserver_view`) is recorded
    with each failed read."""

    def __init__(self, spark: Any, history: HistoryWriter, *, table: str, master: str,
                 seed: int, keys: int, rows: int, writes: int, window_s: float,
                 read_mode: str, op_pause_s: float, kudu: Any = None,
                 diagnose: Callable[[], Any] | None = None) -> None:
        if not 0 < rows <= keys:
            raise ValueError(f"rows per write must be in 1..{keys} (the keys), got {rows}")
        super().__init__([(kudu, spark)], history, table=table, seed=seed, clients=1,
                         keys=keys, mix=[("upsert", 1.0)], op_pause_s=op_pause_s)
        self.diagnose = diagnose
        self.spark = spark
        self.master = master
        self.rows = rows
        self.writes = writes
        self.window_s = window_s
        self.read_mode = read_mode
        self.chaos_start: float | None = None
        self.chaos_end: float | None = None
        self.chaos_done = threading.Event()
        self._begun = threading.Event()
        self._chaos_ops: list[int] = []
        self._errors: dict[int, dict[str, Any]] = {}
        self._read_errors: list[dict[str, Any]] = []

    def begin(self) -> float:
        """Start counting chaos writes (the next write the client invokes is the first);
        returns the chaos start (history seconds)."""
        self.chaos_start = self.history.now()
        self._begun.set()
        return self.chaos_start

    def chaos_ops(self) -> list[int]:
        with self._lock:
            return list(self._chaos_ops)

    def write_errors(self) -> dict[int, dict[str, Any]]:
        """op id -> :class:`ErrorInfo` (as a dict) of every write that raised."""
        with self._lock:
            return dict(self._errors)

    def read_errors(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._read_errors)

    def _client(self, client: str) -> None:
        rng = random.Random(f"{self.seed}/{client}")
        n = 0
        try:
            while not self.stop.is_set():
                counted = self._begun.is_set()
                if counted and self._chaos_over():
                    break
                n += 1
                op = self.write_rows(client, n, sorted(rng.sample(range(self.keys), self.rows)))
                if counted:
                    with self._lock:
                        self._chaos_ops.append(op)
                if self.stop.is_set():
                    break
                self.read(client)  # each write is read back, also the last one
                self.stop.wait(self.op_pause_s)  # pacing only
        finally:
            if self._begun.is_set():
                self.chaos_end = self.history.now()
            self.chaos_done.set()

    def _chaos_over(self) -> bool:
        """``writes`` chaos writes done, or the window closed."""
        assert self.chaos_start is not None
        with self._lock:
            done = len(self._chaos_ops)
        return done >= self.writes or self.history.now() >= self.chaos_start + self.window_s

    def write_rows(self, client: str, n: int, keys: Sequence[int]) -> int:
        """One ``format("kudu")`` upsert of ``keys`` with fresh values; returns its op id."""
        values = [f"{client}-{n}-{k}" for k in keys]
        df = self.spark.createDataFrame(list(zip(keys, values, strict=True)), self.row)
        op = self.history.invoke(client, "upsert", list(keys), values)
        try:
            (df.write.format("kudu").option("kudu.table", self.table)
             .option("kudu.master", self.master).option("kudu.operation", "upsert")
             .mode("append").save())
        except Exception as e:
            info = classify(e)
            with self._lock:
                self._errors[op] = info.to_dict()
            if info.outcome == "info":
                self.history.info(op, info.text())
            elif info.outcome == "fail":
                self.history.fail(op, info.text())
            else:
                self._unexpected_error(op, client, "upsert", e)
        else:
            self.history.ok(op)
            with self._lock:
                self._acked.add(client)
        return op

    def read(self, client: str) -> dict[Key, Value] | None:
        """The whole table through ``spark.read.format("kudu")`` (the final reader's read is
        ``linearizable``); None when it failed (recorded)."""
        if client == "reader-ctx":
            return super().read(client)
        keys = list(range(self.keys))
        mode = "linearizable" if client == "reader" else self.read_mode
        op = self.history.invoke(client, "read", keys)
        try:
            rows = (self.spark.read.format("kudu").option("kudu.table", self.table)
                    .option("kudu.master", self.master).option("kudu.readMode", mode)
                    .load().collect())
        except Exception as e:
            info = classify(e, write=False)
            rec: dict[str, Any] = {"op": op, "client": client,
                                   "time": round(self.history.now(), 2), **info.to_dict()}
            if self.diagnose is not None:
                try:
                    rec["tservers"] = self.diagnose()
                except Exception as d:  # a diagnosis must not change the run
                    rec["tservers"] = f"{type(d).__name__}: {d}"
            with self._lock:
                self._read_errors.append(rec)
            # A chaos read that no replica served is measured (a read changes nothing); the
            # final reads, after the kills, must succeed.
            unavailable = not client.startswith("reader") and (
                info.error in _READ_UNAVAILABLE
                or (info.error is None and _KILLED_BY_CHAOS.search(info.message) is not None))
            if info.outcome == "info" or unavailable:
                self.history.info(op, info.text())
            else:
                self._unexpected_error(op, client, "read", e)
            return None
        return record_read(self.history, op, keys, rows)


def run_chaos(workload: ChaosWorkload, injector: ChaosInjector, *, window_s: float,
              grace_s: float, join_s: float, stopped: threading.Event,
              log: Callable[[str], None]) -> list[str]:
    """The chaos phase: the chaos writes and the kills start together; once the client has
    done its writes (or its ``window_s`` closed) no new kill starts, and the one under way
    is still applied or fails the run. Waits at most ``window_s + grace_s`` for the writes
    (a write under way when the window closes finishes first) and ``join_s`` more for the
    injector; ``stopped`` (the run's watchdog) ends the waits. Returns the errors."""
    errors: list[str] = []
    start = workload.begin()
    injector.start()
    log(f"chaos from {start:.1f} s: an executor killed every {injector.period_s:g} s; at most "
        f"{workload.writes} writes of {workload.rows} rows within {window_s:.0f} s")
    end = time.monotonic() + window_s + grace_s
    while not workload.chaos_done.is_set():
        if time.monotonic() >= end or stopped.is_set():
            errors.append(f"the chaos writes did not end within {grace_s:.0f} s after their "
                          f"window of {window_s:.0f} s (a write hung)")
            break
        workload.chaos_done.wait(0.5)  # polling under the deadline above
    injector.finish()
    if not injector.join(join_s):
        errors.append(f"the chaos injector did not end within {join_s:.0f} s after the writes")
    return errors
