"""The shared schedule module: tables and orders agree with the pipeline search's own schedule
simulator, plan tables are read back and checked, and the makespan of an order is the
earliest-start time of its tasks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan import ExecutionError
from autoplan._schedule import (
    ideal_makespan,
    order_from_table,
    schedule_order,
    schedule_table,
    task_deps,
)
from autoplan.search.pipeline import _schedule as search_schedule


def _as_tuples(table):
    return [[None if t is None else (t.microbatch, t.stage, t.kind) for t in row] for row in table]


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["gpipe", "1f1b"]), S=st.integers(1, 5), m=st.integers(1, 7))
def test_tables_equal_the_search_schedule_tables(kind, S, m):
    table = schedule_table(kind, S, m)
    assert table == _as_tuples(search_schedule.schedule_table(kind, S, m))
    assert len(table) == 2 * (m + S - 1)
    order = schedule_order(kind, S, m)
    assert len(order) == len(set(order)) == 2 * S * m
    assert order_from_table(table, S, m) == order


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["gpipe", "1f1b"]), S=st.integers(1, 4), m=st.integers(1, 6),
       times=st.lists(st.floats(0.1, 5.0), min_size=8, max_size=8))
def test_makespan_equals_the_search_simulation(kind, S, m, times):
    fwd, bwd = times[:S], times[4:4 + S]
    events = search_schedule.schedule_events(kind, S, m, fwd, bwd)
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
    with pytest.raises(ExecutionError, match="'gpipe' or '1f1b'. Got 'interleaved'"):
        schedule_table("interleaved", 2, 2)
    with pytest.raises(ExecutionError, match="microbatches should be an integer >= 1. Got 0"):
        schedule_table("gpipe", 2, 0)
    with pytest.raises(ExecutionError, match="cannot be met"):
        ideal_makespan([(0, 1, "forward")], [1.0, 1.0], [1.0, 1.0])  # stage 0's forward never runs
