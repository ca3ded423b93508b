"""Independent solves on all cores (autoplan.search._parallel): a parallel search returns what the
serial one returns; workers start no JAX backend; a failed worker, a task's error and a task's
warnings reach the caller as in a serial search."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import warnings

import pytest

import autoplan
from autoplan import models
from autoplan.search import _parallel
from autoplan.search._parallel import ParallelWarning, Task, resolve_workers, run_tasks
from autoplan.tracing._trace import forget_shared_traces


def _comparable(plan):
    """A plan's record without what depends on timing (seconds, and notes that quote them)."""
    d = plan.to_dict()
    d.pop("search_seconds")
    d.pop("notes")
    return d


def _same_result(serial, parallel):
    assert [_comparable(p) for p in parallel.plans] == [_comparable(p) for p in serial.plans]
    assert parallel.best.label == serial.best.label
    timing = {k for k in serial.stats if "seconds" in k} | {"workers", "cache"}
    assert {k: v for k, v in parallel.stats.items() if k not in timing} == \
        {k: v for k, v in serial.stats.items() if k not in timing}
    # the folding analysis is the graph's, whichever process ran the folded levels
    assert parallel.analysis == serial.analysis and parallel.analysis.segments


@pytest.mark.parametrize("name, over, level", [
    ("gpt", dict(layers=4), "folded"),
    ("wide_resnet", {}, "auto"),
])
def test_parallel_search_equals_serial(name, over, level):
    """Every logical mesh and baseline is a task: four meshes and two baselines on 8 devices
    (GPT folded: its tasks carry a folding analysis back). Each search gets a graph of its own:
    a second search of one graph reuses the stitched plans the first solved in this process."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        serial = autoplan.search(autoplan.trace(models.get(name, size="tiny", **over)),
                                 "p3.16xlarge:1", pipeline=False, level=level, workers=1,
                                 cache=False)
        parallel = autoplan.search(autoplan.trace(models.get(name, size="tiny", **over)),
                                   "p3.16xlarge:1", pipeline=False, level=level, workers=2,
                                   cache=False)
    assert serial.stats["workers"] == 1 and parallel.stats["workers"] == 2
    assert len(serial.plans) >= 5  # four meshes and the baselines
    _same_result(serial, parallel)


def test_parallel_search_with_pipeline_equals_serial():
    """The pipeline search and the Megatron TP x PP baseline need the workload and run in the
    caller's process while the workers solve the meshes and the other baselines. (Each search
    gets a fresh trace of its own: a second search of one workload object, or of another object
    of the same zoo spec, reuses the layer plans the first solved, and would run none on the
    workers.)"""
    cluster = autoplan.Cluster.preset("p3.16xlarge", 2, devices_per_node=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        forget_shared_traces()
        serial = autoplan.search(models.get("gpt", size="tiny", layers=2), cluster, workers=1,
                                 cache=False)
        forget_shared_traces()  # (another object of one zoo spec would share its trace)
        parallel = autoplan.search(models.get("gpt", size="tiny", layers=2), cluster, workers=3,
                                   cache=False)
    labels = {p.label for p in serial.plans}
    assert {"autoplan", "autoplan-pipeline", "baseline: data parallel", "baseline: Megatron TP",
            "baseline: Megatron TP x PP"} <= labels
    _same_result(serial, parallel)


def _backend_started(graph) -> tuple[int, bool]:
    """(pid, whether this process started a JAX backend) after an intra-operator search."""
    import jax._src.xla_bridge as xb

    from autoplan.algorithms import level_search

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        level_search(graph, autoplan.Cluster.parse("p3.16xlarge:1"), (2, 4), level="folded")
    return os.getpid(), bool(xb._backends)


def test_workers_start_no_jax_backend():
    graph = autoplan.trace(models.get("gpt", size="tiny", layers=2))
    outs = run_tasks([Task(_backend_started, graph) for _ in range(4)], workers=2)
    facts = [o.result() for o in outs]
    in_workers = [started for pid, started in facts if pid != os.getpid()]
    assert in_workers and not any(in_workers)


def _die_in_worker(graph, k: int) -> int:
    if _parallel._IN_WORKER:
        os._exit(3)
    return k


def test_a_dead_worker_loses_nothing():
    graph = autoplan.trace(models.get("mlp", size="tiny"))
    with pytest.warns(ParallelWarning, match="ran in this process"):
        outs = run_tasks([Task(_die_in_worker, graph, (k,)) for k in range(4)], workers=2)
    assert [o.result() for o in outs] == [0, 1, 2, 3]
    # the broken pool was dropped: the next batch starts a new one and uses it
    outs = run_tasks([Task(_backend_started, graph) for _ in range(3)], workers=2)
    assert any(o.result()[0] != os.getpid() for o in outs)


def test_a_pool_shared_by_two_batches_closes_twice():
    """A search's batch and the pipeline search's batches inside it share one pool; each may find
    it broken and close it: closing again is harmless."""
    graph = autoplan.trace(models.get("mlp", size="tiny"))
    run_tasks([Task(_backend_started, graph) for _ in range(2)], workers=2)
    pool = _parallel._POOL
    procs = list(pool.executor._processes.values())
    assert procs and all(p.is_alive() for p in procs)
    pool.close(kill=True)
    pool.close(kill=True)  # no error the second time
    deadline = time.monotonic() + 30
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(p.is_alive() for p in procs)  # the first close ended the workers
    _parallel.shutdown()
    # the closed pool is not reused: the next batch starts a new one and runs in its workers
    outs = run_tasks([Task(_backend_started, graph) for _ in range(3)], workers=2)
    assert _parallel._POOL is not pool
    assert any(o.result()[0] != os.getpid() for o in outs)
    _parallel.shutdown()


def _pid(graph, k: int) -> tuple[int, int]:
    return os.getpid(), k


def test_workers_started_ahead_are_used_and_a_batch_keeps_to_its_count():
    """prestart() starts the workers before any task (their processes exist at once); the next
    batch runs on them, and a batch asking for fewer workers than the kept pool holds uses no
    more than it asked for."""
    _parallel.shutdown()
    graph = autoplan.trace(models.get("mlp", size="tiny"))
    _parallel.prestart(3, ("autoplan.search._api",))
    pool = _parallel._POOL
    assert pool is not None and pool.size == 2
    assert [s.name for s in pool.starters] == ["autoplan-prestart"]
    assert not pool.starters[0].daemon and pool.starters[0] is not threading.current_thread()
    pool.starters[0].join()
    started = {p.pid for p in pool.executor._processes.values()}
    assert len(started) == 2
    outs = run_tasks([Task(_pid, graph, (k,)) for k in range(6)], workers=3)
    assert [o.result()[1] for o in outs] == list(range(6))
    assert _parallel._POOL is pool  # the same pool, not a new one
    assert {o.result()[0] for o in outs} - {os.getpid()} <= started
    # a batch of two processes (one worker) keeps one task at a time in the pool of two
    batch = _parallel._Batch([Task(_pid, graph, (k,)) for k in range(4)], pool, 1)
    assert batch.size == 1
    _parallel.shutdown()


def _timed(graph, kind: str, k: int, seconds: float) -> tuple[str, int, int, float]:
    """A task that takes ``seconds``: ``(kind, k, its process, when it started)``."""
    start = time.time()
    time.sleep(seconds)
    return kind, k, os.getpid(), start


def _nested(graph, n: int = 8) -> list:
    """A task in the caller's process that starts a batch of its own (as the pipeline search,
    a task of the search's batch, starts one of its layer ILPs) once a worker is busy."""
    time.sleep(0.3)
    return [o.result() for o in run_tasks([Task(_timed, graph, ("inner", k, 0.2))
                                           for k in range(n)], workers=2)]


def test_a_batchs_tasks_go_to_the_workers_first_but_its_last_waits_for_a_nested_batch():
    """The search's batch holds the pipeline search (in the caller) beside intra-operator
    searches of unknown length: the workers take those first, so that a long one starts early,
    all but the last, which waits while a batch started inside the caller's task (the
    pipeline's layer ILPs) has a task for a worker; every task runs once, outcomes in the
    order given."""
    _parallel.shutdown()
    graph = autoplan.trace(models.get("mlp", size="tiny"))
    run_tasks([Task(_pid, graph, (k,)) for k in range(2)], workers=2)  # the worker started
    outer = [Task(_nested, graph, (12,), local=True)] + [Task(_timed, graph, ("outer", k, 0.3))
                                                         for k in range(4)]
    outs = [o.result() for o in run_tasks(outer, workers=2)]
    inner, rest = outs[0], outs[1:]
    assert [r[:2] for r in inner] == [("inner", k) for k in range(12)]
    assert [r[:2] for r in rest] == [("outer", k) for k in range(4)]
    on_workers = [r for r in inner if r[2] != os.getpid()]
    assert on_workers, inner  # the worker helped with the inner batch
    first_inner_on_worker = min(r[3] for r in on_workers)
    # the outer tasks taken first (from the back) ran on the worker before it took an inner one
    assert all(r[2] != os.getpid() and r[3] < first_inner_on_worker for r in rest[1:]), (
        inner, rest)
    # the last waited for the inner batch: it started after the worker's first inner task
    assert rest[0][3] > first_inner_on_worker, (inner, rest)
    _parallel.shutdown()


def test_a_first_group_goes_ahead_of_nested_batches_and_is_shown_while_the_caller_works():
    """``first`` tasks go to the workers ahead of a nested batch's (the search's intra-operator
    candidates, shown while the pipeline search runs in the caller), and ``on_first`` gets their
    outcomes, in the order given, in a thread of its own as soon as they are in, while the
    caller's task still runs; the batch returns after it, and raises what it raised."""
    _parallel.shutdown()
    graph = autoplan.trace(models.get("mlp", size="tiny"))
    # two workers kept, the batch below asking for one: a worker stays idle while the first
    # group waits for its one, and the nested batch must not take it (both workers started
    # now: tasks that overlap in time, where quick ones would leave the second unstarted)
    for _ in range(10):  # (a worker still starting lets the other take both tasks: again)
        warm = run_tasks([Task(_timed, graph, ("warm", k, 0.5)) for k in range(3)], workers=3)
        if len({o.result()[2] for o in warm}) == 3:
            break
    assert len({o.result()[2] for o in warm}) == 3
    assert _parallel._POOL is not None and _parallel._POOL.size == 2
    tasks = [Task(_nested, graph, local=True)] + [Task(_timed, graph, ("first", k, 0.3))
                                                  for k in range(3)]
    seen = []

    def on_first(got):
        seen.append(([o.result()[:2] for o in got], threading.current_thread(), time.time()))

    outs = run_tasks(tasks, workers=2, first=[3, 1, 2], on_first=on_first)
    inner = outs[0].result()
    assert len(seen) == 1
    shown, thread, when = seen[0]
    assert shown == [("first", 2), ("first", 0), ("first", 1)]  # the order of ``first``
    assert thread is not threading.current_thread()
    assert when < max(r[3] for r in inner) + 0.2  # shown before the caller's task ended
    # no inner task started on a worker while a first task waited for one
    firsts = [o.result() for o in outs[1:]]
    on_worker = [r for r in firsts if r[2] != os.getpid()]
    assert on_worker
    assert not [r for r in inner if r[2] != os.getpid() and r[3] < max(x[3] for x in on_worker)]

    def fails(got):
        raise ValueError("shown wrong")

    with pytest.raises(ValueError, match="shown wrong"):
        run_tasks(tasks, workers=2, first=[1, 2, 3], on_first=fails)
    # in one process: the first group first, shown before the rest runs, in the caller's thread
    order = []
    serial = run_tasks([Task(_timed, graph, ("x", 0, 0.0)), Task(_timed, graph, ("y", 1, 0.0))],
                       workers=1, first=[1],
                       on_first=lambda got: order.append((got[0].result()[0],
                                                          threading.current_thread())))
    assert order == [("y", threading.current_thread())]
    assert serial[1].result()[3] < serial[0].result()[3]
    # nothing shown when the first group finishes last (there is nothing to be early for)
    late = []
    run_tasks([Task(_pid, graph, (0,))], workers=2, first=[0], on_first=late.append)
    assert late == []
    _parallel.shutdown()


@contextlib.contextmanager
def _active_batches(graph, size: int):
    """On a pool of two workers, active: an outer batch of one task, a batch of three nested in
    it (one worker), and another search's batch of three; the outer and the other batch may use
    ``size`` workers. Yields ``(pool, outer, nested, other)``; after, they are removed, the pool
    released and the workers ended."""
    pool = _parallel._acquire(2)
    batches: tuple = ()
    try:
        outer = _parallel._Batch([Task(_pid, graph, (0,))], pool, size)
        nested = _parallel._Batch([Task(_pid, graph, (k,)) for k in range(3)], pool, 1,
                                  parent=outer)
        other = _parallel._Batch([Task(_pid, graph, (k,)) for k in range(3)], pool, size)
        batches = (outer, nested, other)
        with _parallel._LOCK:
            _parallel._ACTIVE.update(batches)
        yield (pool, *batches)
    finally:
        with _parallel._LOCK:
            _parallel._ACTIVE.difference_update(batches)
        _parallel._release(pool)
        _parallel.shutdown()


def test_only_a_nested_batch_with_room_or_no_free_worker_holds_a_batch_back():
    """A batch gives way to the batches started inside its own tasks (in its caller's thread),
    not to another thread's search; and not to a nested batch that already has all the workers
    it may use while a worker is free."""
    graph = autoplan.trace(models.get("mlp", size="tiny"))
    with _active_batches(graph, 2) as (_, outer, nested, other):
        assert outer._newer_waits()  # the nested batch has tasks and room
        assert not nested._newer_waits()  # nothing nested in it; `other` is not its child
        nested.in_flight = 1  # full (its one worker busy), and the pool's second worker free
        assert not outer._newer_waits()
        outer.in_flight = 1  # now no worker is free: the nested batch's next task goes first
        assert outer._newer_waits()
        nested.pending.clear()  # nothing left to hand out
        assert not outer._newer_waits()


def _nested_behind_a_long_task(graph) -> list:
    """A task in the caller's process that starts a batch of short tasks once the worker runs
    the outer batch's long one (as the pipeline search's stage-DP runs while a worker runs a
    long intra-operator search)."""
    time.sleep(0.5)
    return [o.result() for o in run_tasks([Task(_timed, graph, ("inner", k, 0.05))
                                           for k in range(6)], workers=2)]


def test_a_nested_batch_hands_no_task_to_a_worker_its_family_keeps_busy():
    """While the only worker runs a long task of the outer batch, the nested batch hands it
    nothing (a task handed out would wait behind the long one while the caller, done with the
    rest, waited for it): the caller runs every nested task, before the long task ends; a
    batch of another thread's search is not counted."""
    _parallel.shutdown()
    graph = autoplan.trace(models.get("mlp", size="tiny"))
    run_tasks([Task(_pid, graph, (k,)) for k in range(2)], workers=2)  # the worker started
    outs = run_tasks([Task(_nested_behind_a_long_task, graph, local=True),
                      Task(_timed, graph, ("long", 0, 1.5))], workers=2)
    inner, long = outs[0].result(), outs[1].result()
    assert long[2] != os.getpid()
    assert [r[:2] for r in inner] == [("inner", k) for k in range(6)]
    assert all(r[2] == os.getpid() for r in inner), (inner, long)
    with _active_batches(graph, 1) as (pool, outer, nested, other):
        other.in_flight = pool.size  # another search's tasks: not this family's
        assert not nested._workers_taken() and not outer._workers_taken()
        outer.in_flight = pool.size
        assert nested._workers_taken() and outer._workers_taken()


def test_a_signal_while_workers_start_ahead_leaves_no_traceback(tmp_path):
    """Ctrl-C while a worker process is being sent what it starts from (a large start, so the
    write to its pipe blocks until it reads): the caller's KeyboardInterrupt is raised, and no
    worker fails on a cut-off start with a traceback (the spawning is not in the caller's
    thread, where the signal's exception would cut the write short)."""
    script = tmp_path / "interrupt.py"
    script.write_text(
        "import os, signal, sys, threading, time\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)  # (as at a terminal)\n"
        "import multiprocessing.util as util\n"
        "from autoplan.search import _parallel\n"
        "sys.argv.append('x' * 4_000_000)  # sent to every worker: more than a pipe holds\n"
        "real, sent = util.spawnv_passfds, []\n"
        "def spawn(*args):  # (the resource tracker and the worker: one signal in all)\n"
        "    if not sent:\n"
        "        sent.append(threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGINT)))\n"
        "        sent[0].start()\n"
        "    return real(*args)\n"
        "util.spawnv_passfds = spawn\n"
        "if __name__ == '__main__':\n"
        "    try:\n"
        "        _parallel.prestart(2, ())\n"
        "        time.sleep(30)\n"
        "    except KeyboardInterrupt:\n"
        "        print('interrupted', flush=True)\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.stdout.strip() == "interrupted", proc.stderr
    assert "Traceback" not in proc.stderr and "Error" not in proc.stderr, proc.stderr


def test_a_large_workload_starts_its_workers_before_it_is_traced(monkeypatch):
    """The search of a workload whose arguments hold many elements starts its worker pool before
    tracing; a small one, or an OpGraph, does not."""
    calls = []
    from autoplan.search import _api

    monkeypatch.setattr(_api, "prestart", lambda n, modules: calls.append(n))
    _large_workload = _api._large_workload

    small = models.get("mlp", size="tiny")
    assert not _large_workload(small) and not _large_workload(autoplan.trace(small))
    monkeypatch.setattr(_api, "PRESTART_ELEMENTS", 1)
    assert _large_workload(small)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        autoplan.search(small, "cpu:8", pipeline=False, workers=2, cache=False)
    assert calls == [2]


def _fail_or_warn(graph, k: int) -> int:
    warnings.warn(f"task {k} says so", RuntimeWarning, stacklevel=1)
    if k == 2:
        raise autoplan.SearchError("task 2 cannot")
    return k


def test_errors_and_warnings_reach_the_caller():
    graph = autoplan.trace(models.get("mlp", size="tiny"))
    outs = run_tasks([Task(_fail_or_warn, graph, (k,)) for k in range(4)], workers=2)
    assert [o.result() for k, o in enumerate(outs) if k != 2] == [0, 1, 3]
    with pytest.raises(autoplan.SearchError, match="task 2 cannot"):
        outs[2].result()
    assert [o.warnings for o in outs] == [[(RuntimeWarning, f"task {k} says so")] for k in range(4)]


def test_workers_option(monkeypatch):
    graph = autoplan.trace(models.get("mlp", size="tiny"))
    with monkeypatch.context() as m:
        m.setattr(_parallel, "cpu_count", lambda: 4)
        assert resolve_workers(3, 10) == 3
        assert resolve_workers(64, 10) == 4  # capped at the CPUs
    assert resolve_workers(None, 10) == 1  # a small graph: one process
    assert resolve_workers(None, _parallel.AUTO_PARALLEL_OPS) == _parallel.cpu_count()
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(autoplan.SearchError, match="workers should be a positive integer"):
            autoplan.search(graph, "cpu:8", pipeline=False, workers=bad)


def test_search_refused_while_a_worker_process_starts(monkeypatch):
    """A script that searches at its top level re-runs in every spawned worker: there the search
    refuses with the fix, instead of searching again inside each worker."""
    graph = autoplan.trace(models.get("mlp", size="tiny"))
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(autoplan.SearchError, match="__name__ == '__main__'"):
        autoplan.search(graph, "cpu:8", pipeline=False)


def test_pipeline_layer_ilps_on_workers_equal_serial(monkeypatch):
    """The pipeline search's layer ILPs are tasks of the worker pool: two processes give the
    plans and statistics of one, the layer ILPs going to the pool as batches of several tasks
    (the Megatron TP x PP baseline's too, solved for its one layout)."""
    from autoplan.search.pipeline import _cost_table, _layouts

    ran: list[tuple[int, int]] = []
    real = _cost_table.run_tasks

    def counting(tasks, *, workers, report=None):
        outs = real(tasks, workers=workers, report=report)
        ran.append((workers, len(tasks)))
        return outs

    # (the layer ILPs' batches and the stage-DP runs')
    monkeypatch.setattr(_cost_table, "run_tasks", counting)
    monkeypatch.setattr(_layouts, "run_tasks", counting)
    cluster = autoplan.Cluster.preset("p3.16xlarge", 2, devices_per_node=4)
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for workers in (1, 2):
            forget_shared_traces()  # (a fresh trace per run: no reused layer plans)
            wl = models.get("gpt", size="tiny", layers=2)
            res = [autoplan.algorithms.pipeline_search(wl, cluster, microbatches=4, workers=workers,
                                                   megatron=megatron, max_candidates=3)
                   for megatron in (False, True)]
            out[workers] = [[p.to_dict() for p in r.plans] for r in res], [
                {k: v for k, v in r.stats.items() if "seconds" not in k} for r in res]
    assert out[1] == out[2]
    assert any(w == 2 and n > 1 for w, n in ran)  # a batch of several layer ILPs on two processes
    assert out[1][1][0]["layer_solves"] > 1


_KEPT: list = []


def _keep_many() -> int:
    """A task that keeps what it made (as a worker keeps a graph's memoised strategies)."""
    _KEPT.extend([i] for i in range(20_000))
    return len(_KEPT)


def test_a_task_leaves_what_it_kept_in_the_oldest_generation():
    """After a task (in a worker, with the collector on between tasks), what it made and kept
    is in the oldest generation, not the young ones the next allocations would walk again (a
    whole-heap walk a few tasks later), and the collector is on again as it was."""
    import gc

    was = gc.isenabled()
    gc.enable()
    try:
        _KEPT.clear()
        out = _parallel._call(_keep_many, None, (), {})
        assert out.result() == 20_000 and gc.isenabled()
        kept = {id(x) for x in _KEPT}
        young = {id(o) for g in (0, 1) for o in gc.get_objects(generation=g)}
        assert not kept & young
        assert len(kept & {id(o) for o in gc.get_objects(generation=2)}) == len(kept)
    finally:
        _KEPT.clear()
        if not was:
            gc.disable()
