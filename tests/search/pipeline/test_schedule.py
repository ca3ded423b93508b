"""Tests of the GPipe and 1F1B schedule tables and their timed simulation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan._errors import SearchError
from autoplan.plans._schedule import (
    StagePass,
    gpipe_table,
    one_f_one_b_table,
    schedule_events,
    schedule_stats,
    schedule_summary,
    schedule_table,
    validate_table,
)

KINDS = ["gpipe", "1f1b"]
GRID = [(S, m) for S in range(1, 6) for m in range(1, 9)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("S, m", GRID)
def test_tables_are_valid_and_take_2_m_plus_s_minus_1_clocks(kind, S, m):
    table = schedule_table(kind, S, m)
    validate_table(table, S, m)
    assert len(table) == 2 * (m + S - 1)
    assert all(len(row) == S for row in table)
    busy = sum(task is not None for row in table for task in row)
    assert busy == 2 * S * m


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("S, m", GRID)
def test_unit_time_events_reproduce_the_table(kind, S, m):
    table = schedule_table(kind, S, m)
    events = schedule_events(kind, S, m, [1.0] * S, [1.0] * S)
    assert len(events) == 2 * S * m
    for e in events:
        assert e.end == e.start + 1.0 and e.mesh == e.stage
        assert table[int(e.start)][e.mesh] == StagePass(e.microbatch, e.stage, e.kind)
    stats = schedule_stats(events, S)
    assert stats.step_time == 2 * (m + S - 1)
    assert stats.bubble_fraction == pytest.approx((S - 1) / (m + S - 1))
    assert stats.busy == [2.0 * m] * S
    if kind == "1f1b":
        assert stats.peak_inflight == [min(S - i, m) for i in range(S)]
    else:
        assert stats.peak_inflight == [m] * S


def test_gpipe_table_layout():
    F = lambda b, s: StagePass(b, s, "forward")  # noqa: E731
    B = lambda b, s: StagePass(b, s, "backward")  # noqa: E731
    assert gpipe_table(2, 2) == [
        [F(0, 0), None],
        [F(1, 0), F(0, 1)],
        [None, F(1, 1)],
        [None, B(0, 1)],
        [B(0, 0), B(1, 1)],
        [B(1, 0), None],
    ]


def test_one_f_one_b_warmup_and_steady_state():
    S, m = 4, 6
    table = one_f_one_b_table(S, m)
    for i in range(S):
        col = [row[i] for row in table if row[i] is not None]
        w = min(S - i - 1, m)
        assert all(t.kind == "forward" for t in col[:w])  # warm-up forwards
        assert col[w].kind == "forward" and col[w + 1].kind == "backward"  # then 1F1B
        kinds = "".join(t.kind[0] for t in col)
        assert kinds == "f" * w + "fb" * (m - w) + "b" * w
    # the last mesh alternates from the start
    assert [row[S - 1].kind[0] for row in table if row[S - 1] is not None][:4] == list("fbfb")


def test_one_f_one_b_fewer_microbatches_than_stages():
    table = one_f_one_b_table(5, 2)
    validate_table(table, 5, 2)
    col0 = [row[0] for row in table if row[0] is not None]
    assert [t.kind[0] for t in col0] == list("ffbb")  # warm-up capped at m


def test_validate_table_catches_errors():
    table = [list(r) for r in gpipe_table(3, 2)]
    validate_table(table, 3, 2)
    swapped = [list(r) for r in table]
    swapped[0][0], swapped[1][0] = swapped[1][0], swapped[0][0]
    with pytest.raises(SearchError, match="does not follow"):  # F0 of stage 0 now at clock 1
        validate_table(swapped, 3, 2)
    bad = [list(r) for r in table]
    t_f = next(t for t, row in enumerate(bad) if row[1] == StagePass(0, 1, "forward"))
    bad[t_f][1], bad[0][1] = None, StagePass(0, 1, "forward")  # stage 1 before stage 0
    with pytest.raises(SearchError, match="does not follow"):
        validate_table(bad, 3, 2)
    missing = [list(r) for r in table]
    missing[0][0] = None
    with pytest.raises(SearchError, match="missing"):
        validate_table(missing, 3, 2)
    dup = [list(r) for r in table] + [[StagePass(0, 0, "forward"), None, None]]
    with pytest.raises(SearchError, match="twice"):
        validate_table(dup, 3, 2)
    wrong_col = [list(r) for r in table]
    wrong_col[0][0], wrong_col[0][1] = None, StagePass(0, 0, "forward")
    with pytest.raises(SearchError, match="stage 1"):
        validate_table(wrong_col, 3, 2)
    early_bwd = [list(r) for r in table]
    t_b = next(t for t, row in enumerate(early_bwd) if row[2] == StagePass(0, 2, "backward"))
    early_bwd[t_b][2] = None
    early_bwd[0][2] = StagePass(0, 2, "backward")
    with pytest.raises(SearchError, match="backward"):
        validate_table(early_bwd, 3, 2)


def draw_times(data, S: int, least: float) -> tuple[list[float], list[float], list[float]]:
    """Forward and backward times per stage (at least ``least``) and transfer times per
    boundary."""
    times = st.floats(least, 5.0)
    return (data.draw(st.lists(times, min_size=S, max_size=S)),
            data.draw(st.lists(times, min_size=S, max_size=S)),
            data.draw(st.lists(st.floats(0.0, 2.0), min_size=S - 1, max_size=S - 1)))


#: a schedule kind, stage and micro-batch counts, and the data to draw its times from
SCHEDULES = {"kind": st.sampled_from(KINDS), "S": st.integers(1, 5), "m": st.integers(1, 8),
             "data": st.data()}


@settings(max_examples=60, deadline=None)
@given(**SCHEDULES)
def test_events_respect_dependencies_and_mesh_order(kind, S, m, data):
    fwd, bwd, comm = draw_times(data, S, 0.1)
    events = schedule_events(kind, S, m, fwd, bwd, comm)
    by = {(e.microbatch, e.stage, e.kind): e for e in events}
    assert len(by) == 2 * S * m
    eps = 1e-9
    for (b, s, k), e in by.items():
        dur = fwd[s] if k == "forward" else bwd[s]
        assert e.end - e.start == pytest.approx(dur)
        if k == "forward" and s > 0:
            assert e.start >= by[(b, s - 1, "forward")].end + comm[s - 1] - eps
        if k == "backward":
            if s == S - 1:
                assert e.start >= by[(b, s, "forward")].end - eps
            else:
                assert e.start >= by[(b, s + 1, "backward")].end + comm[s] - eps
    # each mesh runs one task at a time, in the table's order
    table = schedule_table(kind, S, m)
    for j in range(S):
        mine = sorted((e for e in events if e.mesh == j), key=lambda e: e.start)
        for a, c in zip(mine, mine[1:]):
            assert c.start >= a.end - eps
        order = [row[j] for row in table if row[j] is not None]
        assert [StagePass(e.microbatch, e.stage, e.kind) for e in mine] == order
    stats = schedule_stats(events, S)
    assert stats.busy == pytest.approx([m * (fwd[j] + bwd[j]) for j in range(S)])
    assert stats.bubble_fraction == pytest.approx(1 - sum(stats.busy) / (S * stats.step_time))
    assert 0 <= stats.bubble_fraction < 1
    if kind == "1f1b":
        assert all(stats.peak_inflight[i] <= S - i for i in range(S))


@settings(max_examples=60, deadline=None)
@given(**SCHEDULES)
def test_summary_equals_the_stats_of_the_events(kind, S, m, data):
    """The pipeline search's summary (no events made) is exactly the events' statistics, with
    backward transfers and per-step work too (ties included: zero-length tasks)."""
    fwd, bwd, comm = draw_times(data, S, 0.0)
    comm_b = data.draw(st.none() | st.lists(st.floats(0.0, 2.0), min_size=S - 1, max_size=S - 1))
    step = data.draw(st.none() | st.lists(st.floats(0.0, 5.0), min_size=S, max_size=S))
    kw = {"backward_comm_times": comm_b, "step_times": step}
    events = schedule_events(kind, S, m, fwd, bwd, comm or None, **kw)
    assert schedule_summary(kind, S, m, fwd, bwd, comm or None, **kw) == schedule_stats(events, S)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b", "interleaved", "zb-h1"])
def test_each_sweep_keeps_every_mesh_order_and_waits_for_each_dependency(kind):
    """The summary's task order (GPipe's and 1F1B's sorted by a potential, the others swept):
    each mesh's tasks in the order its schedule runs them, and every task after the one it waits
    for (the previous stage's forward, the next stage's backward or on the last stage its own
    forward, a W's B)."""
    from autoplan.plans import _schedule as sc

    for S in range(1, 9):
        for m in range(1, 13):
            v = 2 if kind == "interleaved" and S % 2 == 0 and m % (S // 2) == 0 else 1
            sw = sc._make_sweep(kind, S, m, v)
            P, n = S // v, len(sw.meshes)
            code = {0: "forward", 1: "backward", 2: "weight"}
            tasks = [(int(c) % S, code[int(c) // S]) for c in sw.dur_code]
            mine = [[] for _ in range(P)]
            for i, j in enumerate(sw.meshes):
                mine[j].append(i)
            orders = sc._mesh_orders(kind, S, m, v)
            for j in range(P):
                assert [tasks[i] for i in mine[j]] == [(t.stage, t.kind) for t in orders[j]]
                assert sw.first[j] == mine[j][0]
            # each task's micro-batch, from its place in its mesh's order
            mb = [0] * n
            for j in range(P):
                for i, t in zip(mine[j], orders[j]):
                    mb[i] = t.microbatch
            for i, d in enumerate(sw.deps):
                s, k = tasks[i]
                want = sc.task_deps((mb[i], s, k), S)
                if k == "backward" and s < S - 1:
                    want = want[1:]  # (its own forward ran before it on its mesh)
                if not want:
                    assert d == n
                    continue
                assert d < i, (kind, S, m, i)
                assert (mb[d], *tasks[d]) == tuple(want[0])


def test_unbalanced_stages_and_comm_example():
    # 2 stages, 2 micro-batches, slow second stage, 0.5 transfer each way
    ev = schedule_events("gpipe", 2, 2, [1.0, 2.0], [1.0, 2.0], [0.5])
    got = [(e.kind[0], e.microbatch, e.stage, e.start, e.end) for e in ev]
    assert got == [
        ("f", 0, 0, 0.0, 1.0),
        ("f", 1, 0, 1.0, 2.0),
        ("f", 0, 1, 1.5, 3.5),
        ("f", 1, 1, 3.5, 5.5),
        ("b", 0, 1, 5.5, 7.5),
        ("b", 1, 1, 7.5, 9.5),
        ("b", 0, 0, 8.0, 9.0),
        ("b", 1, 0, 10.0, 11.0),
    ]
    stats = schedule_stats(ev, 2)
    assert stats.step_time == 11.0
    assert stats.busy == [4.0, 8.0]
    assert stats.bubble_fraction == pytest.approx(1 - 12 / 22)


def test_gpipe_and_1f1b_same_step_time_with_uniform_stages():
    for S, m in [(4, 8), (3, 3)]:
        g = schedule_stats(schedule_events("gpipe", S, m, [1.0] * S, [2.0] * S), S)
        o = schedule_stats(schedule_events("1f1b", S, m, [1.0] * S, [2.0] * S), S)
        assert g.step_time == pytest.approx(o.step_time) == pytest.approx(3 * (m + S - 1))
        assert o.peak_inflight == [min(S - i, m) for i in range(S)]
        assert g.peak_inflight == [m] * S


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: schedule_table("chimera", 2, 2), "kind"),
        (lambda: schedule_table("interleaved", 3, 2, 2), "multiple of virtual_stages"),
        (lambda: schedule_events("zb-h1", 2, 2, [1.0] * 2, [1.0] * 2), "weight_times"),
        (lambda: schedule_events("1f1b", 2, 2, [1.0] * 2, [1.0] * 2, weight_times=[1.0] * 2),
         "weight_times should be None"),
        (lambda: schedule_table("gpipe", 0, 2), "num_stages"),
        (lambda: gpipe_table(2, 0), "microbatches"),
        (lambda: schedule_events("1f1b", 2, 2, [1.0], [1.0, 1.0]), "forward_times"),
        (lambda: schedule_events("1f1b", 2, 2, [1.0, 1.0], [1.0, -1.0]), "backward_times"),
        (lambda: schedule_events("1f1b", 2, 2, [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]), "comm_times"),
        (lambda: schedule_stats([], 2), "events"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(SearchError, match=match):
        call()


@pytest.mark.parametrize("kind", KINDS)
def test_backward_transfers_and_per_step_work(kind):
    """Gradients travel back with their own transfer time; each mesh's per-step work starts
    right after its last backward, and the step ends with the last of them."""
    S, m = 3, 4
    f, b = [1.0, 1.0, 1.0], [2.0, 2.0, 2.0]
    plain = schedule_events(kind, S, m, f, b, [0.5, 0.5])
    slow_back = schedule_events(kind, S, m, f, b, [0.5, 0.5], backward_comm_times=[1.5, 1.5])
    assert schedule_stats(slow_back, S).step_time > schedule_stats(plain, S).step_time
    # forward-only dependencies are unchanged by slower gradients: the first forwards agree
    first = lambda evs: sorted((e.start, e.stage) for e in evs if e.kind == "forward")[:S]  # noqa: E731
    assert first(plain) == first(slow_back)
    step = [0.3, 5.0, 0.1]
    ev = schedule_events(kind, S, m, f, b, [0.5, 0.5], step_times=step)
    updates = {e.mesh: e for e in ev if e.kind == "update"}
    assert sorted(updates) == [0, 1, 2]
    for j, u in updates.items():
        last_bwd = max(e.end for e in ev if e.mesh == j and e.kind == "backward")
        assert u.start == last_bwd and u.end == pytest.approx(last_bwd + step[j])
        assert u.microbatch == m - 1
    stats = schedule_stats(ev, S)
    assert stats.step_time == pytest.approx(max(u.end for u in updates.values()))
    assert stats.peak_inflight == schedule_stats(plain, S).peak_inflight
    assert stats.busy == pytest.approx([m * 3.0 + x for x in step])
    with pytest.raises(SearchError, match="step_times"):
        schedule_events(kind, S, m, f, b, step_times=[1.0])
    with pytest.raises(SearchError, match="backward_comm_times.*boundary"):
        schedule_events(kind, S, m, f, b, backward_comm_times=[1.0])
