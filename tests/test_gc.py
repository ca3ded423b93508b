"""The collector pause of searches and traces: main thread only, nested safely, restored as it was."""

import gc
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


def test_the_pause_collects_its_own_young_generation():
    kept = []

    @gc_paused
    def allocate():
        kept.extend([i] for i in range(20_000))  # tracked containers, kept alive

    allocate()
    # (without the collection at the end, the young generation would count the 20,000 lists)
    assert gc.get_count()[0] < gc.get_threshold()[0] and len(kept) == 20_000
