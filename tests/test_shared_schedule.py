"""The schedule module's orders and plan tables: tables are valid and read back into the same
order, plan tables are checked, and the makespan of an order is the earliest-start time of its
tasks, as the timed simulation gives it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan import ExecutionError
from autoplan.plans._schedule import (
    ideal_makespan,
    order_from_table,
    schedule_events,
    schedule_order,
    schedule_summary,
    schedule_table,
    task_deps,
    validate_table,
)


def _ticks(table, S):
    """The table's per-mesh orders replayed tick by tick, each task at the first tick after its
    dependencies and its mesh's previous task (an independent reference for the tables)."""
    orders = [[row[j] for row in table if row[j] is not None] for j in range(S)]
    done, pos, rows = {}, [0] * S, []
    while any(pos[j] < len(orders[j]) for j in range(S)):
        tick = len(rows)
        ready = [orders[j][pos[j]] for j in range(S) if pos[j] < len(orders[j])
                 and all(done.get(d, tick) < tick for d in task_deps(orders[j][pos[j]], S))]
        assert ready, "the orders deadlock"
        cols = [None] * S
        for t in ready:
            done[t], cols[t[1]] = tick, t
            pos[t[1]] += 1
        rows.append(cols)
    return rows


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["gpipe", "1f1b"]), S=st.integers(1, 5), m=st.integers(1, 7))
def test_tables_are_valid_and_read_back_into_their_order(kind, S, m):
    table = schedule_table(kind, S, m)
    validate_table(table, S, m)
    assert table == _ticks(table, S)
    assert len(table) == 2 * (m + S - 1)
    order = schedule_order(kind, S, m)
    assert len(order) == len(set(order)) == 2 * S * m
    assert order_from_table(table, S, m) == order


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["gpipe", "1f1b"]), S=st.integers(1, 4), m=st.integers(1, 6),
       times=st.lists(st.floats(0.1, 5.0), min_size=8, max_size=8))
def test_makespan_equals_the_timed_simulation(kind, S, m, times):
    fwd, bwd = times[:S], times[4:4 + S]
    events = schedule_events(kind, S, m, fwd, bwd)
    assert ideal_makespan(schedule_order(kind, S, m), fwd, bwd) == pytest.approx(
        max(e.end for e in events))


def test_equal_stages_take_m_plus_s_minus_one_forward_backward_pairs():
    for kind in ("gpipe", "1f1b"):
        assert ideal_makespan(schedule_order(kind, 3, 4), [1.0] * 3, [2.0] * 3) == (4 + 3 - 1) * 3.0
    # one stage: the micro-batches one after the other
    assert ideal_makespan(schedule_order("1f1b", 1, 5), [1.0], [2.0]) == 15.0


def test_dependencies_of_a_chain_of_stages():
    assert task_deps((2, 0, "forward"), 3) == []
    assert task_deps((2, 1, "forward"), 3) == [(2, 0, "forward")]
    assert task_deps((2, 2, "backward"), 3) == [(2, 2, "forward")]
    assert task_deps((2, 0, "backward"), 3) == [(2, 0, "forward"), (2, 1, "backward")]


def test_plan_tables_accept_short_kind_names_and_refuse_broken_ones():
    table = [[list(t) if t else None for t in row] for row in schedule_table("gpipe", 2, 2)]
    short = [[None if t is None else [t[0], t[1], t[2][0].upper()] for t in row] for row in table]
    assert order_from_table(short, 2, 2) == schedule_order("gpipe", 2, 2)
    flat = [t for row in table for t in row if t is not None]
    with pytest.raises(ExecutionError, match="once for 2 micro-batches and 2 stages"):
        order_from_table([flat[:-1]], 2, 2)
    with pytest.raises(ExecutionError, match="once for 2 micro-batches"):
        order_from_table([flat[:-1] + [flat[0]]], 2, 2)
    with pytest.raises(ExecutionError, match="should be \\[micro-batch, stage"):
        order_from_table([[[0, 0, "sideways"]]], 2, 2)
    backwards_first = sorted(flat, key=lambda t: t[2] != "backward")
    with pytest.raises(ExecutionError, match="schedule order runs the backward"):
        order_from_table([backwards_first], 2, 2)


def test_bad_kinds_and_counts_are_refused():
    with pytest.raises(ExecutionError, match="'zb-h1'. Got 'zb-h2'"):
        schedule_table("zb-h2", 2, 2)
    with pytest.raises(ExecutionError, match="virtual_stages should be 1 for a '1f1b'"):
        schedule_table("1f1b", 4, 4, 2)
    with pytest.raises(ExecutionError, match="multiple of the 2 meshes"):
        schedule_table("interleaved", 4, 3, 2)
    with pytest.raises(ExecutionError, match="microbatches should be an integer >= 1. Got 0"):
        schedule_table("gpipe", 2, 0)
    with pytest.raises(ExecutionError, match="cannot be met"):
        ideal_makespan([(0, 1, "forward")], [1.0, 1.0], [1.0, 1.0])  # stage 0's forward never runs


def test_the_executor_names_still_work_with_a_deprecation_warning():
    import autoplan.exec  # noqa: PLC0415

    with pytest.warns(DeprecationWarning, match="autoplan.algorithms.schedule_table"):
        assert autoplan.exec.schedule_table is schedule_table
    with pytest.warns(DeprecationWarning, match="autoplan.algorithms.schedule_order"):
        assert autoplan.exec.schedule_order is schedule_order



def test_sweep_orders_are_kept_up_to_a_task_budget_most_recent_first(monkeypatch):
    """The simulation's sweep orders are kept for the next search (the Explorer's memory-budget
    change times most of the same (stages, micro-batches) pairs again), within a budget of
    tasks; the least recently used go first, and a kept order is the one made afresh."""
    from autoplan.plans import _schedule as sc

    make = sc._make_sweep
    made = []
    monkeypatch.setattr(sc, "_SWEEPS", type(sc._SWEEPS)())
    monkeypatch.setattr(sc, "_SWEEP_TASKS", [0])
    monkeypatch.setattr(sc, "SWEEP_CACHE_TASKS", 3 * 2 * 4 * 8)  # three 1F1B orders of 4 x 8
    monkeypatch.setattr(sc, "_make_sweep", lambda *key: made.append(key) or make(*key))
    for m in (8, 8, 9, 8, 10):
        got, fresh = sc._sweep("1f1b", 4, m), make("1f1b", 4, m, 1)
        assert (got.meshes, got.deps, got.first) == (fresh.meshes, fresh.deps, fresh.first)
    assert made == [("1f1b", 4, 8, 1), ("1f1b", 4, 9, 1), ("1f1b", 4, 10, 1)]
    # 8 + 9 + 10 micro-batches are over the budget: 9, the least recently used, went
    assert list(sc._SWEEPS) == [("1f1b", 4, 8, 1), ("1f1b", 4, 10, 1)]
    assert sc._SWEEP_TASKS[0] == 2 * 4 * (8 + 10) <= sc.SWEEP_CACHE_TASKS
    sc._sweep("1f1b", 4, 9)
    assert made[-1] == ("1f1b", 4, 9, 1) and ("1f1b", 4, 8, 1) not in sc._SWEEPS
    # a summary timed from a kept order is the one timed from a fresh order
    times = ([1.0, 1.5, 2.0, 1.2], [2.0, 2.5, 3.0, 2.2], [0.1, 0.2, 0.3])
    kept = schedule_summary("1f1b", 4, 9, *times)
    sc._SWEEPS.clear()
    assert schedule_summary("1f1b", 4, 9, *times) == kept
