"""Interleaved 1F1B and ZB-H1: their tables are valid and hold every task once, their bubbles
are the closed forms of Megatron-LM ((P - 1) / (v m)) and of the zero-bubble paper
((S - 1)(t_F + t_B - t_W), a third of 1F1B's at equal times), and they keep 1F1B's memory."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan import ExecutionError
from autoplan.plans._schedule import (
    StagePass,
    interleaved_table,
    order_from_table,
    schedule_events,
    schedule_order,
    schedule_stats,
    schedule_summary,
    schedule_table,
    validate_table,
    zb_h1_table,
)


def _bubble_ratio(stats, P):
    """Idle over busy time of ``P`` meshes: Megatron-LM's bubble time fraction."""
    busy = sum(stats.busy)
    return (P * stats.step_time - busy) / busy


@settings(max_examples=40, deadline=None)
@given(P=st.integers(1, 4), v=st.integers(1, 4), groups=st.integers(1, 4))
def test_interleaved_tables_are_valid_and_hold_each_task_once(P, v, groups):
    m, S = P * groups, P * v
    table = schedule_table("interleaved", S, m, v)
    validate_table(table, S, m, v)
    assert all(len(row) == P for row in table)
    tasks = [t for row in table for t in row if t is not None]
    assert len(tasks) == len(set(tasks)) == 2 * S * m
    assert all(t.stage % P == j for row in table for j, t in enumerate(row) if t is not None)
    assert order_from_table(table, S, m) == schedule_order("interleaved", S, m, v)


@settings(max_examples=40, deadline=None)
@given(P=st.integers(2, 5), v=st.integers(1, 4), groups=st.integers(1, 4),
       tf=st.floats(0.1, 3.0), tb=st.floats(0.1, 3.0))
def test_interleaved_bubble_is_p_minus_one_over_v_m(P, v, groups, tf, tb):
    """Chunks of 1 / v of a stage: the bubble over the busy time is (P - 1) / (v m)
    (Narayanan et al., SC 2021, Section 2.2), 1F1B's (P - 1) / m divided by v."""
    m, S = P * groups, P * v
    stats = schedule_summary("interleaved", S, m, [tf / v] * S, [tb / v] * S, virtual_stages=v)
    assert _bubble_ratio(stats, P) == pytest.approx((P - 1) / (v * m), rel=1e-9)
    one = schedule_summary("1f1b", P, m, [tf] * P, [tb] * P)
    assert _bubble_ratio(one, P) == pytest.approx((P - 1) / m, rel=1e-9)


def test_interleaved_warm_up_and_memory():
    """Mesh j warms up with 2 (P - j - 1) + (v - 1) P chunk forwards, so it holds one more chunk
    micro-batch than that; stage s runs on mesh s mod P."""
    P, v, m = 4, 2, 8
    table = interleaved_table(P, v, m)
    assert table == schedule_table("interleaved", P * v, m, v)
    stats = schedule_stats(schedule_events("interleaved", P * v, m, [1.0] * 8, [2.0] * 8,
                                           virtual_stages=v), P)
    assert stats.peak_inflight == [2 * (P - j - 1) + (v - 1) * P + 1 for j in range(P)]
    col = [t for row in table for t in [row[0]] if t is not None]
    # groups of P micro-batches pass chunk 0 (stage 0), then chunk 1 (stage P)
    assert col[:8] == [StagePass(b, 0, "forward") for b in range(4)] + [
        StagePass(b, 4, "forward") for b in range(4)]
    # one chunk per mesh is 1F1B
    assert schedule_table("interleaved", 4, 8, 1) == schedule_table("1f1b", 4, 8)


@settings(max_examples=40, deadline=None)
@given(S=st.integers(1, 6), m=st.integers(1, 10))
def test_zb_h1_tables_are_valid_and_split_every_backward(S, m):
    table = zb_h1_table(S, m)
    validate_table(table, S, m)
    tasks = [t for row in table for t in row if t is not None]
    assert len(tasks) == len(set(tasks)) == 3 * S * m
    assert {t.kind for t in tasks} == {"forward", "backward", "weight"}
    assert order_from_table(table, S, m) == schedule_order("zb-h1", S, m)
    unit = schedule_summary("zb-h1", S, m, [1.0] * S, [1.0] * S, weight_times=[1.0] * S)
    assert unit.step_time == len(table)
    if m >= S:  # one clock per F, B and W: 3 m + S - 1 clocks, 1F1B's 3 (m + S - 1)
        assert len(table) == 3 * m + S - 1
    else:  # one micro-batch's chain bounds it
        assert len(table) >= 2 * S + 1


@settings(max_examples=40, deadline=None)
@given(S=st.integers(2, 6), extra=st.integers(0, 8), tf=st.floats(0.2, 3.0),
       tb=st.floats(0.2, 3.0), share=st.floats(0.05, 1.0))
def test_zb_h1_bubble_is_the_papers(S, extra, tf, tb, share):
    """Qi et al. (ICLR 2024), Section 3.1: ZB-H1's bubble is (S - 1)(t_F + t_B - t_W) where
    1F1B's is (S - 1)(t_F + t_B + t_W), for t_W up to min(t_F, t_B)."""
    m = S + extra
    tw = share * min(tf, tb)
    zb = schedule_summary("zb-h1", S, m, [tf] * S, [tb] * S, weight_times=[tw] * S)
    one = schedule_summary("1f1b", S, m, [tf] * S, [tb + tw] * S)
    work = m * (tf + tb + tw)
    assert zb.step_time - work == pytest.approx((S - 1) * (tf + tb - tw), rel=1e-9)
    assert one.step_time - work == pytest.approx((S - 1) * (tf + tb + tw), rel=1e-9)


def test_zb_h1_cuts_the_bubble_to_a_third_at_equal_times():
    for S, m in ((4, 8), (8, 32), (8, 128)):
        zb = schedule_summary("zb-h1", S, m, [1.0] * S, [1.0] * S, weight_times=[1.0] * S)
        one = schedule_summary("1f1b", S, m, [1.0] * S, [2.0] * S)
        assert (zb.step_time - 3 * m) / (one.step_time - 3 * m) == pytest.approx(1 / 3)
        assert _bubble_ratio(zb, S) == pytest.approx((S - 1) / (3 * m))


@settings(max_examples=60, deadline=None)
@given(S=st.integers(1, 5), m=st.integers(1, 9),
       times=st.lists(st.floats(0.05, 3.0), min_size=15, max_size=15))
def test_zb_h1_keeps_1f1b_memory_and_is_never_slower_on_equal_stages(S, m, times):
    """Equal stages: never slower than 1F1B. Unequal ones may be (the order is fixed by unit
    times), which is why the search simulates both."""
    fwd, bwd, wgt = times[:S], times[5:5 + S], times[10:10 + S]
    zb = schedule_summary("zb-h1", S, m, fwd, bwd, weight_times=wgt)
    one = schedule_summary("1f1b", S, m, fwd, [b + w for b, w in zip(bwd, wgt, strict=True)])
    f, b, w = times[0], times[5], times[10]
    assert schedule_summary("zb-h1", S, m, [f] * S, [b] * S, weight_times=[w] * S).step_time <= (
        schedule_summary("1f1b", S, m, [f] * S, [b + w] * S).step_time * (1 + 1e-9))
    # activations held from F to W: at most 1F1B's first mesh's min(S, m)
    assert max(zb.peak_inflight) <= max(one.peak_inflight) == min(S, m)
    assert all(d <= min(S, m) for d in zb.peak_deferred)
    events = schedule_events("zb-h1", S, m, fwd, bwd, weight_times=wgt)
    assert schedule_stats(events, S) == zb


@settings(max_examples=30, deadline=None)
@given(P=st.integers(1, 4), v=st.integers(1, 3), groups=st.integers(1, 3),
       times=st.lists(st.floats(0.05, 3.0), min_size=36, max_size=36))
def test_interleaved_summary_equals_its_events(P, v, groups, times):
    m, S = P * groups, P * v
    fwd, bwd, comm = times[:S], times[12:12 + S], times[24:24 + S - 1]
    kw = dict(virtual_stages=v, step_times=bwd)
    events = schedule_events("interleaved", S, m, fwd, bwd, comm, **kw)
    assert schedule_stats(events, P) == schedule_summary("interleaved", S, m, fwd, bwd, comm, **kw)
    assert sum(e.kind == "update" for e in events) == S
    assert all(e.mesh == e.stage % P for e in events)


def test_tables_refuse_a_weight_pass_before_its_input_gradient():
    table = [list(row) for row in zb_h1_table(2, 2)]
    flat = [t for row in table for t in row if t is not None]
    w = next(t for t in flat if t.kind == "weight")
    b = StagePass(w.microbatch, w.stage, "backward")
    swapped = [[{w: b, b: w}.get(t, t) for t in row] for row in table]
    with pytest.raises(ExecutionError, match="weight of micro-batch"):
        validate_table(swapped, 2, 2)
    missing = [[None if t == w else t for t in row] for row in table]
    with pytest.raises(ExecutionError, match="12 .* tasks once .* is missing"):
        order_from_table(missing, 2, 2)
