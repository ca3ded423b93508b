"""The collector pause of searches and traces: the main thread's and the Explorer's background
searches, nested and overlapping safely, restored as it was."""

import gc
import json
import subprocess
import sys
import threading

import pytest

from autoplan._gc import gc_paused


@gc_paused
def _state(inner=None):
    return gc.isenabled(), (inner() if inner else None)


def test_the_main_thread_pauses_and_restores_the_collector():
    assert gc.isenabled()
    assert _state(lambda: _state()[0]) == (False, False)  # nested: still paused inside
    assert gc.isenabled()


def test_a_collector_the_user_disabled_stays_disabled():
    gc.disable()
    try:
        assert _state() == (False, None)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_search_in_another_thread_leaves_the_collector_alone():
    seen = []
    thread = threading.Thread(target=lambda: seen.append(_state()[0]))
    thread.start()
    thread.join()
    assert seen == [True] and gc.isenabled()


def test_overlapping_pauses_of_two_threads_restore_the_collector_once_the_last_ends():
    from autoplan._gc import paused

    inside, leave = threading.Event(), threading.Event()

    def background():
        with paused():  # (what the Explorer's search and what-if threads run in)
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=background)
    thread.start()
    assert inside.wait(10)
    try:
        assert not gc.isenabled()  # another thread's pause holds in this one too
        assert _state() == (False, None)
        assert not gc.isenabled()  # this thread's pause ended first: the other's still holds
    finally:
        leave.set()
        thread.join()
    assert gc.isenabled()


def test_the_explorers_search_job_pauses_the_collector_and_a_view_update_does_not():
    from autoplan.viz import Explorer

    ex = Explorer(autostart=False)
    seen = {}
    ex._search_job = lambda: seen.setdefault("search", gc.isenabled())  # (what Search runs)
    assert ex.search()
    ex.wait_idle(30)
    assert ex._start("view", lambda: seen.setdefault("view", gc.isenabled()))
    ex.wait_idle(30)
    assert seen == {"search": False, "view": True}
    assert gc.isenabled()


def test_an_error_resumes_the_collector():
    @gc_paused
    def fail():
        raise KeyError("x")

    try:
        fail()
    except KeyError:
        pass
    assert gc.isenabled()


def test_trace_pauses_the_collector_and_restores_it():
    import jax.numpy as jnp

    import autoplan

    seen = []

    def step(params, batch):
        seen.append(gc.isenabled())  # runs while JAX traces it
        return params["w"] * batch["x"]

    graph = autoplan.trace(step, {"w": jnp.ones(4)}, {"x": jnp.ones(4)})
    assert len(graph.ops) >= 1 and seen == [False] and gc.isenabled()

    def broken(params, batch):
        raise ValueError("not traceable")

    with pytest.raises((ValueError, autoplan.AutoplanError), match="not traceable"):
        autoplan.trace(broken, {"w": jnp.ones(4)}, {"x": jnp.ones(4)})
    assert gc.isenabled()


def test_what_the_pause_kept_goes_to_the_oldest_generation_unwalked():
    kept = []

    @gc_paused
    def allocate():
        kept.extend([i] for i in range(20_000))  # tracked containers, kept alive

    gc.collect()
    frozen = gc.get_freeze_count()  # (none unless something froze objects before)
    allocate()
    # (left in the young generation, the caller's next allocation would walk the 20,000 lists)
    assert gc.get_count()[0] < gc.get_threshold()[0] and len(kept) == 20_000
    assert len(gc.get_objects(0)) < 100  # (the young generation: what came after)
    oldest = {id(o) for o in gc.get_objects(2)}
    assert all(id(x) in oldest for x in kept[::997]) and gc.get_freeze_count() == frozen


def test_objects_the_user_froze_stay_frozen():
    gc.collect()
    mine = [[i] for i in range(100)]
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        kept = []

        @gc_paused
        def allocate():
            kept.extend([i] for i in range(1_000))

        allocate()
        # (not the freeze count: another thread may free frozen objects meanwhile)
        tracked = {id(o) for g in range(3) for o in gc.get_objects(g)}  # frozen ones are in none
        assert frozen and not any(id(x) in tracked for x in mine) and len(mine) == 100
        assert all(id(x) in tracked for x in kept[::97])  # what the call made is not frozen
        assert gc.get_count()[0] < gc.get_threshold()[0]  # (collected instead)
    finally:
        gc.unfreeze()


_GARBAGE = """
import gc, json
import jax
jax.config.update("jax_num_cpu_devices", 8)
import autoplan
from autoplan import models

def garbage(layers):
    gc.collect()  # (what the last round dropped: a searched graph and its analyses)
    graph = autoplan.trace(models.get("gpt", size="125M", layers=layers, hidden=64, heads=4,
                                      seq_len=16, batch=4))
    traced = gc.collect()
    res = autoplan.search(graph, "p3.16xlarge", pipeline=False, mesh_shape=(2, 4),
                          level="folded", cache=False)
    assert res.best is not None
    return traced, gc.collect()

garbage(2)  # (first imports and caches)
gc.disable()
print(json.dumps([garbage(2), garbage(8)]))
"""


def test_a_folded_search_and_its_trace_leave_no_cyclic_garbage_of_their_size(tmp_path):
    """What lets the pause promote what it kept without a walk: reference counting frees what a
    trace and a search drop. (The first round's imports and caches leave a few cycles; later
    rounds none, at either size.) Measured in a fresh interpreter: each full collection walks
    the whole heap, which in a test worker holds what the tests before it cached."""
    out = subprocess.run([sys.executable, "-c", _GARBAGE], capture_output=True, text=True,
                         timeout=600, cwd=tmp_path, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    small, large = json.loads(out.stdout.strip().splitlines()[-1])
    assert small == large and max(large) < 300, (small, large)
