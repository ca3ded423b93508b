"""Independent solves on all cores: a pool of worker processes for the search.

A search's intra-operator searches (one per logical mesh, one per baseline) are independent of
one another, and so are the pipeline search's layer ILPs. :func:`run_tasks` runs a batch of such
tasks on ``workers`` processes: the caller's own process and ``workers - 1`` workers of a
:class:`concurrent.futures.ProcessPoolExecutor`. The caller takes tasks from the front of the
batch and the workers from the back, so the first task (the mesh whose folding analysis the result
shows) runs where the graph's memoised analysis already is. Every task's result is the one it gives
run alone, and the batch returns them in task order: a parallel search returns what the serial
one returns (``workers=1``; tested on GPT and Wide-ResNet).

Start method. JAX is not fork-safe once its backend has started (tracing a step starts it), and
HiGHS keeps threads of its own: a forked worker could inherit a lock held by a thread that does
not exist in it. Workers are therefore started fresh (``spawn``). The search needs no JAX backend:
workers import ``jax`` (for ``PartitionSpec``) but never start one (tested).

What travels. A task names a module-level function, the graph it runs on and its other
arguments. A graph is pickled once per batch by the caller (its fields only, not what was
memoised on it) and travels with the tasks until every worker has confirmed it holds it; each
worker keeps the graphs it received (:data:`WORKER_GRAPHS`, least recently used dropped), so later
tasks, and later searches of the same graph object (a notebook re-searching on every control
change), send only its token. Warnings a task raises are recorded where it runs and returned
with its result, for the caller to raise again (and to store with a cached result).

The pool is kept between searches and closed after :data:`IDLE_SECONDS` without work, or when the
interpreter exits. A search of a large workload starts it before tracing the step
(:func:`prestart`), so that the workers import what they run while the caller traces. A worker that dies, or a pool that cannot start (a script calling the search at
its top level, without an ``if __name__ == "__main__":`` guard, re-runs in every spawned worker),
loses nothing: the tasks run in the caller's process, with a :class:`ParallelWarning` that says
why and how to fix it. The same holds, before any worker starts, where workers cannot work: a
main script read from standard input (a worker re-reads the main script), or a file on
``sys.path`` that shadows a standard-library module (``queue.py`` in the current folder).

Lifetime. Every worker watches its parent and ends within :data:`WATCH_SECONDS` of the parent's
death, however it died (``kill -9`` included); with the workers gone, multiprocessing's resource
tracker, which they share, ends too.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import importlib
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import uuid
import warnings
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from autoplan._errors import SearchError
from autoplan._gc import paused
from autoplan._memo import per_owner
from autoplan.search._warn import user_stacklevel
from autoplan.tracing._graph import OpGraph
from autoplan.tracing._loader import shadowed_stdlib

__all__ = ["Task", "Outcome", "ParallelWarning", "run_tasks", "resolve_workers", "check_workers",
           "cpu_count", "shutdown", "cannot_spawn"]

#: ``workers=None`` uses every core for graphs of at least this many operators and one process
#: below: a smaller graph's whole search takes about as long as starting a worker.
AUTO_PARALLEL_OPS = 4000
#: seconds without work after which the pool's worker processes are ended
IDLE_SECONDS = 300.0
#: graphs a worker keeps (least recently used dropped first)
WORKER_GRAPHS = 8


class ParallelWarning(UserWarning):
    """Worker processes could not be used (they could not start, or one died); the search ran the
    tasks in the caller's process instead, with the same results."""


@dataclass(frozen=True)
class Task:
    """One independent solve: ``fn(graph, *args, **kwargs)``, ``fn`` a module-level function
    (``fn(*args, **kwargs)`` when ``graph`` is None: a task whose arguments are all it needs).

    Attributes:
        label: what it is, for progress messages (``"intra-op search on mesh 2x4"``).
        local: run it in the caller's process only (its arguments cannot travel: a user's
            workload, whose step function may be defined in a notebook).
    """

    fn: Callable[..., Any]
    graph: OpGraph | None
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    label: str = ""
    local: bool = False


@dataclass
class Outcome:
    """What a task gave: its value or the exception it raised, and the warnings it raised
    (``(category, message)``, in order)."""

    value: Any = None
    error: BaseException | None = None
    warnings: list[tuple[type[Warning], str]] = field(default_factory=list)

    def result(self) -> Any:
        """The value, or the task's exception raised again."""
        if self.error is not None:
            raise self.error
        return self.value


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one, as
    ``os.process_cpu_count`` does), else ``os.cpu_count()``."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def resolve_workers(workers: int | None, num_ops: int) -> int:
    """The number of processes a search of a graph of ``num_ops`` operators uses.

    ``None``: every CPU (:func:`cpu_count`) for graphs of at least :data:`AUTO_PARALLEL_OPS`
    operators, else 1. An integer is capped at :func:`cpu_count` (more processes than CPUs only
    take turns on them, each holding its own copy of the graph; the results are the same).
    Inside a worker, always 1.

    Raises:
        SearchError: ``workers`` is not a positive integer or None.
    """
    check_workers(workers)
    if _IN_WORKER:
        return 1
    if workers is None:
        return cpu_count() if num_ops >= AUTO_PARALLEL_OPS else 1
    return min(workers, cpu_count())


def check_workers(workers: Any) -> None:
    """Raise unless ``workers`` is a positive integer or None.

    Raises:
        SearchError: another value.
    """
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise SearchError(f"search: workers should be a positive integer or None. Got {workers!r}. "
                          "Fix: workers=1 for a search in this process alone, or leave it out to "
                          "use every core.")


def check_not_bootstrapping() -> None:
    """Raise when called while a spawned process imports the main script: a script that searches
    at its top level without an ``if __name__ == "__main__":`` guard would search again in every
    worker process.

    Raises:
        SearchError: called during a spawned process's start.
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise SearchError(
            "search: called while a worker process was starting: the script that calls it re-runs "
            "in every worker process, since it calls the search at its top level. Fix: put the "
            "script's work under if __name__ == '__main__':, or pass workers=1.")


# ---- the worker side ------------------------------------------------------------------------

_IN_WORKER = False
_NEED_GRAPH = "need graph"
_STORE: OrderedDict[str, OpGraph] = OrderedDict()


def _worker_init(parent: int | None = None) -> None:
    """Each worker: Ctrl-C is the caller's to handle (it ends the workers it started), and the
    worker ends when its parent does, however the parent ended (SIGKILL included)."""
    global _IN_WORKER
    _IN_WORKER = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent is not None:
        threading.Thread(target=_watch_parent, args=(parent,), name="autoplan-watch-parent",
                         daemon=True).start()


#: seconds between a worker's looks at its parent
WATCH_SECONDS = 0.25


def _watch_parent(parent: int) -> None:
    """End this worker as soon as ``parent`` is no longer its parent (it died, and the worker was
    handed to init or a subreaper). A pipe or ``PR_SET_PDEATHSIG`` would not do: the pool's
    workers are started by whichever of the parent's threads submits first, and Linux sends the
    death signal when that thread ends, not the process."""
    while True:
        if os.getppid() != parent:
            os._exit(1)
        time.sleep(WATCH_SECONDS)


def cannot_spawn() -> str | None:
    """Why worker processes cannot start from this process (a spawned worker re-imports the main
    script and runs with this ``sys.path``), or None when they can."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if getattr(main, "__spec__", None) is None and path and not os.path.isfile(path):
        return (f"the main script {path!r} is not a file (a script read from standard input, "
                "'python - <<EOF', cannot be read again by a worker process). Fix: save the "
                "script to a file and run that, or pass workers=1")
    shadows = shadowed_stdlib()
    if shadows:
        listed = ", ".join(f"{path} (the standard library's module {name!r})"
                           for name, path in shadows[:3])
        return (f"a file on sys.path shadows a module of Python's standard library, which worker "
                f"processes would import in its place: {listed}. Fix: rename "
                f"{'it' if len(shadows) == 1 else 'them'} (and remove any __pycache__ copy), or "
                "pass workers=1")
    return None


def _recorded(caught: list[warnings.WarningMessage]) -> list[tuple[type[Warning], str]]:
    return [(w.category, str(w.message)) for w in caught]


def _call(task_fn: Callable[..., Any], graph: OpGraph | None, args: tuple, kwargs: dict
          ) -> Outcome:
    """Run one task, recording its warnings (in the caller as in a worker), with the cyclic
    garbage collector paused as the search pauses it (:func:`autoplan._gc.paused`): in a worker,
    what a task made and kept (the graphs' memoised strategies and plans) then goes to the oldest
    generation without a walk, where re-enabling the collector left it young, for a walk of the
    whole heap a few allocations later (0.55 s of a worker's time at once on GPT 39B)."""
    with warnings.catch_warnings(record=True) as caught, paused():
        warnings.simplefilter("always")
        try:
            value = (task_fn(*args, **kwargs) if graph is None
                     else task_fn(graph, *args, **kwargs))
            return Outcome(value, None, _recorded(caught))
        except Exception as err:  # the task's own error, raised again in the caller
            return Outcome(None, err, _recorded(caught))


def _worker_run(task_fn: Callable[..., Any], token: str | None, payload: bytes | None,
                args: tuple, kwargs: dict) -> tuple[int, Outcome | str]:
    """A task in a worker: the graph from the worker's store, or unpickled from ``payload``
    (none for a task without a graph, ``token`` None)."""
    if token is None:
        return os.getpid(), _call(task_fn, None, args, kwargs)
    graph = _STORE.get(token)
    if graph is None:
        if payload is None:
            return os.getpid(), _NEED_GRAPH
        with paused():  # (the graph kept, to the oldest generation without a walk)
            graph = pickle.loads(payload)
        _STORE[token] = graph
        while len(_STORE) > WORKER_GRAPHS:
            _STORE.popitem(last=False)
    _STORE.move_to_end(token)
    return os.getpid(), _call(task_fn, graph, args, kwargs)


# ---- the caller side ------------------------------------------------------------------------

class _Pool:
    """The kept pool: its executor, size, and which workers hold which graph token."""

    def __init__(self, size: int):
        self.size = size
        self.executor = cf.ProcessPoolExecutor(
            max_workers=size, mp_context=multiprocessing.get_context("spawn"),
            initializer=_worker_init, initargs=(os.getpid(),))
        self.holders: dict[str, set[int]] = {}
        self.last_used = time.monotonic()
        self.busy = 0
        self.starters: list[threading.Thread] = []  # the threads of :func:`prestart`

    def close(self, *, kill: bool = False) -> None:
        """Shut the executor down (again is a no-op: batches that share a pool may each find it
        broken); ``kill`` ends its worker processes too. Workers being started ahead are started
        first, so that each is ended with the rest."""
        try:
            for s in self.starters:
                if s is not threading.current_thread():
                    s.join()
        finally:  # (a second Ctrl-C during the wait still ends the workers)
            # (an executor already shut down has no process table)
            procs = list((getattr(self.executor, "_processes", None) or {}).values()) if kill else []
            self.executor.shutdown(wait=False, cancel_futures=True)
            for p in procs:  # running tasks of an abandoned search: end them (our own workers)
                if p.is_alive():
                    p.terminate()


_LOCK = threading.Lock()
_POOL: _Pool | None = None
_SAID: set[str] = set()  # why workers could not start, once said


def _acquire(size: int) -> _Pool:
    """The kept pool, made or remade to ``size`` workers (a larger idle one is kept: its extra
    workers sit idle)."""
    global _POOL
    with _LOCK:
        if _POOL is not None and _POOL.size < size and _POOL.busy == 0:
            _POOL.close()
            _POOL = None
        if _POOL is None:
            _POOL = _Pool(size)
        _POOL.busy += 1
        return _POOL


def _release(pool: _Pool, *, broken: bool = False) -> None:
    global _POOL
    with _LOCK:
        pool.busy -= 1
        pool.last_used = time.monotonic()
        if broken and _POOL is pool:
            _POOL = None
    if broken:  # (outside the lock: closing waits for a prestart, which releases the pool)
        pool.close(kill=True)
        return
    timer = threading.Timer(IDLE_SECONDS + 1.0, _close_if_idle)
    timer.daemon = True
    timer.start()


def _close_if_idle() -> None:
    global _POOL
    with _LOCK:
        pool = _POOL
        if pool is None or pool.busy or time.monotonic() - pool.last_used < IDLE_SECONDS:
            return
        _POOL = None
    pool.close()


def _warm(modules: tuple[str, ...]) -> int:
    """A worker's first task when started ahead (:func:`prestart`): import ``modules``."""
    for name in modules:
        importlib.import_module(name)
    return os.getpid()


def prestart(workers: int, modules: Sequence[str] = ()) -> None:
    """Start the pool's ``workers - 1`` worker processes, each importing ``modules`` (what the
    tasks to come run), and return at once: a search calls it before tracing a large step, so
    that the workers start while the caller traces (a later :func:`run_tasks` of at most that
    many workers uses them).

    The processes are started by a thread of their own, never the caller's: a signal's exception
    (Ctrl-C) in the caller cannot land between starting a worker and sending it what it starts
    from, which left the worker to fail on a cut-off start with a traceback on the user's
    terminal. Closing the pool waits for that thread (a few milliseconds per worker), so every
    worker it started is ended with the rest; a worker it is too late to start at the
    interpreter's exit is not started."""
    if _IN_WORKER or workers <= 1 or cannot_spawn() is not None:
        return  # (the batch that would use them says why not)
    pool = _acquire(workers - 1)

    def start() -> None:
        try:
            for _ in range(pool.size):
                pool.executor.submit(_warm, tuple(modules))
        except Exception:  # (a pool that cannot start says so, with its fallback, when first used)
            pass
        finally:
            _release(pool)

    starter = threading.Thread(target=start, name="autoplan-prestart", daemon=False)
    pool.starters.append(starter)
    try:
        starter.start()
    except BaseException as err:  # no thread (the first batch starts the workers), or Ctrl-C
        if starter.ident is None:  # never ran: it will not release the pool
            pool.starters.remove(starter)
            _release(pool)
        if not isinstance(err, Exception):
            raise


def shutdown(*, kill: bool = False) -> None:
    """End the kept worker processes now (a later parallel search starts new ones).

    Idle workers are asked to exit (and exit after freeing what they hold); with ``kill``, or
    while a search still uses them, they are terminated at once (the caller is about to exit)."""
    global _POOL
    with _LOCK:
        pool, _POOL = _POOL, None
    if pool is not None:
        pool.close(kill=kill or pool.busy > 0)


def _at_exit() -> None:
    """Close the kept pool while the interpreter is whole (its executor's callbacks otherwise run
    during teardown, when the modules they use are gone)."""
    global _POOL
    with _LOCK:
        pool, _POOL = _POOL, None
    if pool is not None and pool.busy:
        pool.close(kill=True)  # a search still running in another thread: its workers end now
    elif pool is not None:
        for s in pool.starters:
            s.join()
        pool.executor.shutdown(wait=True, cancel_futures=True)  # idle workers exit at once


atexit.register(_at_exit)


@per_owner
def _token(graph: OpGraph) -> str:
    """A name for this graph object, unique in this process's life (the workers' store key)."""
    return uuid.uuid4().hex


def _payload(graph: OpGraph) -> bytes:
    """The graph's fields pickled (what was memoised on it stays here: a worker recomputes what
    it needs, which is cheaper than moving it)."""
    bare = OpGraph.__new__(OpGraph)
    bare.__dict__.update({f.name: getattr(graph, f.name) for f in fields(OpGraph)})
    return pickle.dumps(bare, protocol=pickle.HIGHEST_PROTOCOL)


#: the batches running now
_ACTIVE: set[_Batch] = set()
#: per thread, the batches whose caller it is, innermost last: a batch started by a task that
#: the caller of another runs (the pipeline search's layer ILPs) is that batch's child
_CALLERS = threading.local()
#: seconds a dispatcher that gave way to a newer batch waits before it looks again
_YIELD_POLL = 0.01


class _FirstGroup:
    """The tasks of :func:`run_tasks`' ``first`` and its ``on_first``: called once, in a thread
    of its own, when the last of them is done while other tasks of the batch are not (the
    batch's caller is then still busy with one of those, and a result to show need not wait for
    it). :meth:`wait` joins that thread and raises what the call raised."""

    def __init__(self, order: Sequence[int], callback: Callable[[list[Outcome]], None]):
        self.order, self.members, self.callback = list(order), frozenset(order), callback
        self.lock = threading.Lock()
        self.settled = False  # the group is done: called, or too late to be early
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def done(self, outcomes: Sequence[Outcome | None], *, inline: bool = False) -> None:
        """An outcome of the batch is in: start the call when it completes the group (with
        ``inline``, make it in this thread: a batch in one process)."""
        with self.lock:
            if self.settled or any(outcomes[k] is None for k in self.members):
                return
            self.settled = True
            if all(o is not None for o in outcomes):
                return  # (nothing else runs any more: there is nothing to be early for)
            got = [outcomes[k] for k in self.order]
            if not inline:
                self.thread = threading.Thread(target=self._run, args=(got,),
                                               name="autoplan-first", daemon=True)
                self.thread.start()
                return
        self.callback(got)

    def _run(self, got: list[Outcome]) -> None:
        try:
            self.callback(got)
        except BaseException as err:  # raised again by the batch's caller (:meth:`wait`)
            self.error = err

    def wait(self, *, raise_error: bool = True) -> None:
        if self.thread is not None:
            self.thread.join()
        if raise_error and self.error is not None:
            raise self.error


class _Batch:
    """One call of :func:`run_tasks` with a pool: the caller takes tasks from the front, a
    dispatcher thread hands tasks from the back to the workers (one in flight per worker,
    counted over the batch and the batches nested in it or it in, so the caller can still take
    any task no worker has started).

    Batches share the pool's workers. A search's batch holds the pipeline search, which runs
    in the caller and starts batches of its own (layer ILPs, stage-DP runs), beside one
    intra-operator search per mesh, whose lengths are not known ahead (0.5 s, or 14 s for a
    mixed-integer program with a real gap). Its tasks go to the workers first but for its last
    one: a long one then starts early rather than run alone after the rest (Wide-ResNet 4B on
    16 GPUs: a 14-s search on the 8x2 mesh began at 7.6 s, when the layer ILPs were done, and
    the call took 21 s), and the last waits for the pipeline search's serial tail (the stage
    DP, the next micro-batch size's trace), through which the worker would otherwise be idle.
    So while a batch started by one of this batch's tasks (run by its caller), or by one of
    that batch's, has a task for a worker and room for it, a batch with one task left to travel
    hands it out only when a worker is free all the same (those in flight run on). Batches of
    other threads (another search) do not wait for each other. A batch's first group
    (:func:`run_tasks`' ``first``: results to show early) goes ahead of the batches nested in
    it. Which process runs a task never changes what it gives."""

    def __init__(self, tasks: Sequence[Task], pool: _Pool, size: int,
                 parent: _Batch | None = None, first: _FirstGroup | None = None):
        self.tasks, self.pool, self.size = tasks, pool, min(size, pool.size)
        self.parent = parent
        self.first = first
        self.in_flight = 0  # tasks handed to the workers and not back yet
        self.pending = deque(range(len(tasks)))
        self.outcomes: list[Outcome | None] = [None] * len(tasks)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.failure: BaseException | None = None
        self.payloads: dict[str, bytes] = {}
        for t in tasks:  # pickled here, before the caller's own work touches the graph's memo
            if t.local or t.graph is None:
                continue
            tok = _token(t.graph)
            if tok not in self.payloads and len(pool.holders.get(tok, ())) < pool.size:
                self.payloads[tok] = _payload(t.graph)
        self.thread = threading.Thread(target=self._dispatch, name="autoplan-dispatch", daemon=True)

    def take(self, front: bool) -> int | None:
        """The next task for the caller (the first pending) or a worker (the last pending one
        that may travel)."""
        with self.lock:
            if front:
                return self.pending.popleft() if self.pending else None
            if self.stop.is_set():
                return None
            for j in range(len(self.pending) - 1, -1, -1):
                if not self.tasks[self.pending[j]].local:
                    k = self.pending[j]
                    del self.pending[j]
                    return k
            return None

    def can_travel(self) -> bool:
        """Whether a pending task may go to a worker."""
        with self.lock:
            return not self.stop.is_set() and any(not self.tasks[k].local for k in self.pending)

    def _goes_first(self) -> bool:
        """Whether this batch's pending tasks go to the workers ahead of the batches nested in
        it: a task of its first group (:func:`run_tasks`' ``first``) may still travel, or more
        than one task may (all but its last go first)."""
        with self.lock:
            if self.stop.is_set():
                return False
            travelling = [k for k in self.pending if not self.tasks[k].local]
        return len(travelling) > 1 or (self.first is not None and any(
            k in self.first.members for k in travelling))

    def _older_goes_first(self) -> bool:
        """Whether a batch this one is nested in has tasks that go ahead of it."""
        return any(b._goes_first() for b in self._ancestors())

    def finish(self, k: int, outcome: Outcome) -> None:
        """Task ``k``'s outcome is in (from the caller's thread or the dispatcher's)."""
        self.outcomes[k] = outcome
        if self.first is not None:
            self.first.done(self.outcomes)

    def _ancestors(self):
        """The batches this one is nested in, innermost first."""
        b = self.parent
        while b is not None:
            yield b
            b = b.parent

    def _descends_from(self, other: _Batch) -> bool:
        return any(b is other for b in self._ancestors())

    def _newer_waits(self) -> bool:
        """Whether a batch nested in this one has a task for a worker and room to hand it out,
        or has a task and no worker is free."""
        with _LOCK:
            active = list(_ACTIVE)
        full = False
        for b in active:
            if b._descends_from(self) and b.can_travel():
                if b.in_flight < b.size:
                    return True
                full = True
        return full and sum(b.in_flight for b in active) >= self.pool.size

    def _workers_taken(self) -> bool:
        """Whether every worker already runs (or has queued) a task of this batch's family (the
        batches it is nested in and those nested in them): a task handed out now would wait
        behind another batch's long task (an intra-operator search) while this batch's caller,
        done with the rest, waited for it; left pending, the caller takes it."""
        root = self
        for b in self._ancestors():
            root = b
        with _LOCK:
            active = list(_ACTIVE)
        return sum(b.in_flight for b in active
                   if b is root or b._descends_from(root)) >= self.pool.size

    def _submit(self, k: int, with_payload: bool) -> cf.Future:
        t = self.tasks[k]
        tok = None if t.graph is None else _token(t.graph)
        payload = self.payloads.get(tok) if with_payload else None
        return self.pool.executor.submit(_worker_run, t.fn, tok, payload, t.args, t.kwargs)

    def _dispatch(self) -> None:
        inflight: dict[cf.Future, int] = {}
        try:
            while True:
                gave_way = False
                while len(inflight) < self.size and not self.stop.is_set():
                    if self._older_goes_first() or (
                            not self._goes_first() and self._newer_waits()) or \
                            self._workers_taken():
                        gave_way = True
                        break
                    k = self.take(front=False)
                    if k is None:
                        break
                    inflight[self._submit(k, True)] = k
                    self.in_flight = len(inflight)
                if not inflight:
                    if gave_way and self.can_travel():
                        self.stop.wait(_YIELD_POLL)
                        continue
                    return
                done, _ = cf.wait(inflight, timeout=_YIELD_POLL if gave_way else None,
                                  return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    k = inflight.pop(fut)
                    pid, out = fut.result()  # an infrastructure failure raises here
                    if isinstance(out, str):  # _NEED_GRAPH: the worker dropped it; send it again
                        tok = _token(self.tasks[k].graph)
                        if tok not in self.payloads:
                            self.payloads[tok] = _payload(self.tasks[k].graph)
                        inflight[self._submit(k, True)] = k
                        continue
                    if self.tasks[k].graph is not None:
                        self.pool.holders.setdefault(_token(self.tasks[k].graph), set()).add(pid)
                    self.finish(k, out)
                self.in_flight = len(inflight)
        except BaseException as err:  # the pool broke: its tasks go back to the caller
            self.failure = err
            self.stop.set()
            with self.lock:
                self.pending.extend(inflight.values())
            self.in_flight = 0  # (none runs on a worker now: its family need not wait for it)


def run_tasks(tasks: Sequence[Task], *, workers: int,
              report: Callable[[str, float], None] | None = None,
              first: Sequence[int] = (),
              on_first: Callable[[list[Outcome]], None] | None = None) -> list[Outcome]:
    """Run independent tasks on ``workers`` processes (the caller's included); their outcomes
    in task order, each what the task gives run alone.

    Args:
        tasks: the tasks, most wanted in the caller's process first.
        workers: processes to use (1: all in the caller's process, in order).
        report: called in the caller's thread as ``report(message, fraction done)`` before each
            task it runs and while it waits for workers (a progress bar; it may raise to
            interrupt the batch, which ends the workers running its tasks).
        first: indices of tasks to finish early: the workers take them ahead of any task of a
            batch nested in this one (in one process they run before the others).
        on_first: called once with the outcomes of ``first`` (in that order) as soon as they
            are all in while another task is still running or to run, in a thread of its own
            (the caller may be running a long task; in one process, in the caller's, before
            the other tasks); not called when they are the last to finish. The batch returns
            after it, raising what it raised.

    Warns:
        ParallelWarning: the workers could not be used; the tasks ran in the caller's process.
    """
    tick = report or (lambda message, fraction: None)
    n = len(tasks)
    group = None if on_first is None or not first else _FirstGroup(first, on_first)
    if workers <= 1 or n <= 1 or all(t.local for t in tasks):
        out: list[Outcome | None] = [None] * n
        order = list(dict.fromkeys([*first, *range(n)]))
        for j, k in enumerate(order):
            t = tasks[k]
            tick(t.label, j / n)
            out[k] = _call(t.fn, t.graph, t.args, t.kwargs)
            if group is not None:
                group.done(out, inline=True)  # (in one process: before the next task)
        return out  # type: ignore[return-value]
    why = cannot_spawn()
    if why is not None:
        if why not in _SAID:  # (once per process: a search runs several batches)
            _SAID.add(why)
            warnings.warn(ParallelWarning(f"search: no worker processes were started: {why}. The "
                                          "tasks ran in this process, with the same results."),
                          stacklevel=user_stacklevel())
        return run_tasks(tasks, workers=1, report=report, first=first, on_first=on_first)
    size = min(workers - 1, sum(not t.local for t in tasks))
    pool = _acquire(size)
    broken = False
    batch: _Batch | None = None
    try:
        callers = _CALLERS.__dict__.setdefault("batches", [])
        batch = _Batch(tasks, pool, size, parent=callers[-1] if callers else None, first=group)
        with _LOCK:
            _ACTIVE.add(batch)
        callers.append(batch)
        batch.thread.start()

        def done() -> float:
            return sum(o is not None for o in batch.outcomes) / n

        while True:
            k = batch.take(front=True)
            if k is not None:
                t = tasks[k]
                tick(t.label, done())
                batch.finish(k, _call(t.fn, t.graph, t.args, t.kwargs))
                continue
            if not batch.thread.is_alive():
                break
            batch.thread.join(timeout=0.2)
            tick(f"waiting for {sum(o is None for o in batch.outcomes)} task(s) in worker "
                 "processes", done())
        for k in range(n):  # (tasks handed back by a broken pool after the loop saw it empty)
            if batch.outcomes[k] is None:
                t = tasks[k]
                tick(t.label, done())
                batch.finish(k, _call(t.fn, t.graph, t.args, t.kwargs))
        if batch.failure is not None:
            broken = True
            warnings.warn(ParallelWarning(
                f"search: the worker processes failed ({type(batch.failure).__name__}: "
                f"{str(batch.failure)[:200]}); their tasks ran in this process, with the same "
                "results. Fix: if a script calls the search at its top level, put that under "
                "if __name__ == '__main__': (each worker re-runs the script's top level); or pass "
                "workers=1."), stacklevel=user_stacklevel())
        outcomes = list(batch.outcomes)
    except BaseException:  # an interrupted batch: its workers' tasks are abandoned
        broken = True
        if batch is not None:
            batch.stop.set()
        if group is not None:
            group.wait(raise_error=False)
        raise
    finally:
        if batch is not None:
            with _LOCK:
                _ACTIVE.discard(batch)
            callers = _CALLERS.__dict__.get("batches", [])
            if callers and callers[-1] is batch:
                callers.pop()
        _release(pool, broken=broken)
    if group is not None:
        group.wait()
    return outcomes  # type: ignore[return-value]
