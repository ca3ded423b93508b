"""The comparison figure: points are the predictions, the Pareto line the non-dominated plans,
equivalent plans merged, non-fitting plans set apart, the difference from a reference broken down."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.plans._plan import Stage
from autoplan.viz import compare_figure, pareto_front
from autoplan.viz._compare import _label_positions, cost_parts, equivalent_groups

from .conftest import COMPARE, PARETO_LABELS, make_intra_plan


def trace(fig, kind):
    return next(t for t in fig.data if t.meta and t.meta.get("kind") == kind)


def test_points_equal_predictions(compare_plans):
    fig = compare_figure(compare_plans)
    pts = trace(fig, "plans")
    assert fig.layout.meta["unit"] == "ms"
    assert list(pts.x) == pytest.approx([p.predicted.step_time * 1e3 for p in compare_plans])
    assert list(pts.y) == [p.predicted.memory_per_device for p in compare_plans]
    assert list(pts.text) == [f"#{k}" for k in range(len(COMPARE))]  # numbers, not labels
    for k, (label, _, _) in enumerate(COMPARE):
        assert f"#{k} {label}" in pts.hovertext[k]


def test_pareto_line_is_exactly_the_non_dominated(compare_plans):
    fig = compare_figure(compare_plans)
    line = trace(fig, "pareto")
    by_label = {p.label: p for p in compare_plans}
    assert list(line.x) == pytest.approx([by_label[lab].predicted.step_time * 1e3 for lab in PARETO_LABELS])
    assert list(line.y) == [by_label[lab].predicted.memory_per_device for lab in PARETO_LABELS]
    assert "3 of 5 fitting plans on the Pareto front" in fig.layout.title.text


def test_breakdown_stacks_compute_collectives_and_bubble(compare_plans):
    fig = compare_figure(compare_plans)
    parts = {t.meta["component"]: t for t in fig.data if t.meta and t.meta.get("kind") == "breakdown"}
    assert list(parts)[:3] == ["compute", "all-reduce", "all-gather"] and list(parts)[-1] == "bubble"
    for i, p in enumerate(compare_plans):
        q = p.predicted
        assert parts["compute"].y[i] == pytest.approx(q.compute_time * 1e3)
        assert parts["all-reduce"].y[i] == pytest.approx(q.comm_time_by_kind["all-reduce"] * 1e3)
        # a plan without schedule events waits its bubble fraction of the step
        assert parts["bubble"].y[i] == pytest.approx(q.bubble_fraction * q.step_time * 1e3)
        # the parts add up to the step time, and the bars reach it
        assert sum(t.meta["seconds"][i] for t in parts.values()) == pytest.approx(q.step_time)
        assert max(t.base[i] + t.y[i] for t in parts.values()) == pytest.approx(q.step_time * 1e3)
        assert parts["compute"].base[i] == 0
    # short tick labels: the number and a few letters; the full label is in the hover text
    assert list(parts["compute"].x) == ["#0 auto", "#1 data-parall\u2026", "#2 megatron", "#3 zero-3",
                                        "#4 pipeline"]


def test_highlight_and_bad_input(compare_plans):
    class Result:
        plans = compare_plans

    fig = compare_figure(Result(), highlight="megatron")
    pts = trace(fig, "plans")
    assert list(pts.marker.symbol).count("star") == 1 and pts.marker.symbol[2] == "star"
    assert "\u2605 = #2 megatron" in fig.layout.title.text
    assert "\u2605 #2 megatron" in fig.layout.xaxis2.ticktext[2]
    with pytest.raises(TypeError, match="plans should"):
        compare_figure([1, 2])
    with pytest.raises(TypeError, match="plans should"):
        compare_figure([])


def transposed(plan):
    """The same plan on the transposed mesh: 2x4 over (x, y) becomes 4x2 with the axes renamed."""
    swap = {"x": "y", "y": "x"}

    def sp(spec):
        return tuple(None if not e else tuple(swap[a] for a in e) for e in spec)

    st = plan.stages[0]
    ops = tuple(dataclasses.replace(o, tensors=tuple(dataclasses.replace(t, spec=sp(t.spec))
                                                     for t in o.tensors)) for o in st.ops)
    stage = dataclasses.replace(st, mesh_shape=st.mesh_shape[::-1], ops=ops)
    return plan.with_(stages=(stage,), inputs=tuple(dataclasses.replace(i, spec=sp(i.spec))
                                                    for i in plan.inputs))


def test_equivalent_plans_are_shown_once():
    a = make_intra_plan("autoplan")
    b = transposed(a)
    assert b.mesh_shape == (4, 2) and b != a
    c = make_intra_plan("baseline", step_time=0.02)
    d = make_intra_plan("other", step_time=0.010)  # equal prediction, another spec somewhere
    d = d.with_(inputs=(dataclasses.replace(d.inputs[0], spec=(None, None)),) + d.inputs[1:])
    assert equivalent_groups([a, b, c, d, a]) == [[0, 1, 4], [2], [3]]
    fig = compare_figure([a, b, c, d, a])
    pts = trace(fig, "plans")
    assert fig.layout.meta["groups"] == [[0, 1, 4], [2], [3]]
    # a and d have equal predictions but different shardings: one marker naming both groups
    assert "#0=#1=#4, #3" in list(pts.text)
    assert "2 equivalent plans merged" in fig.layout.title.text
    bars = trace(fig, "breakdown")
    assert list(bars.x) == ["#0=#1=#4 auto", "#2 baseline", "#3 other"]


def test_plans_that_do_not_fit_are_set_apart(compare_plans):
    cap = compare_plans[0].cluster.device_memory
    huge = make_intra_plan("huge", step_time=0.009, memory=1000 * 2**30)
    over = make_intra_plan("over", step_time=0.011, memory=40 * 2**30)
    fig = compare_figure(compare_plans + [huge, over])
    pts = trace(fig, "plans")
    ys = dict(zip(pts.text, pts.y))
    assert all(ys[f"#{k}"] <= cap for k in range(5))
    # in the band above the device's memory, in memory order; the axis stays near it
    assert cap < ys["#6"] < ys["#5"] < 1.5 * cap
    assert fig.layout.yaxis.range[1] < 1.5 * cap
    assert "does not fit" in pts.hovertext[list(pts.text).index("#5")]
    assert "2 do not fit in device memory" in fig.layout.title.text
    # the Pareto front is of the fitting plans only
    assert len(trace(fig, "pareto").x) == 3


def test_reference_and_the_difference_broken_down(compare_plans):
    before = compare_plans[1]
    after = compare_plans[0]
    fig = compare_figure(compare_plans, highlight=0, reference=before)
    diff = trace(fig, "difference")
    a, b = cost_parts(after), cost_parts(before)
    comps = diff.meta["components"]
    assert comps[-1] == "step time"
    for name, v in zip(comps[:-1], diff.meta["seconds"]):
        assert v == pytest.approx(a.get(name, 0.0) - b.get(name, 0.0))
    assert diff.meta["seconds"][-1] == pytest.approx(after.predicted.step_time - before.predicted.step_time)
    assert diff.meta["memory"] == pytest.approx(after.predicted.memory_per_device
                                                - before.predicted.memory_per_device)
    ref = trace(fig, "reference")
    assert ref.meta["plan"] == 1 and ref.marker.symbol == "diamond-open"
    assert "(c) #0 minus #1" in [a.text for a in fig.layout.annotations]
    # a reference not among the plans is added
    outside = make_intra_plan("previous answer", step_time=0.03)
    fig = compare_figure(compare_plans, highlight=0, reference=outside)
    assert trace(fig, "reference").meta["plan"] == 5


def test_close_points_take_different_label_sides():
    pos = _label_positions([(1.0, 1.0), (1.001, 1.0), (1.002, 1.0), (5.0, 5.0)])
    assert len(set(pos[:3])) == 3 and pos[3] == "top center"


def test_pipeline_plan_breakdown_has_send_recv(pipeline_plan, intra_plan):
    fig = compare_figure([pipeline_plan, intra_plan])
    comps = [t.meta["component"] for t in fig.data if t.meta and t.meta.get("kind") == "breakdown"]
    assert comps[:4] == ["compute", "all-reduce", "all-gather", "send-recv"] and comps[-1] == "bubble"
    assert set(comps[4:-1]) <= {"overlap", "other"}
    # the pipeline's bubble is the time its busiest mesh waits: the step less its events' time
    busy = {}
    for start, end, mesh, *_ in pipeline_plan.schedule.events:
        busy[mesh] = busy.get(mesh, 0.0) + end - start
    assert cost_parts(pipeline_plan)["bubble"] == pytest.approx(
        pipeline_plan.predicted.step_time - max(busy.values()))


def test_plans_on_other_devices_are_not_equivalent(intra_plan):
    st = intra_plan.stages[0]
    moved = intra_plan.with_(stages=(Stage(**{**st.__dict__, "device_ids": tuple(range(8, 16))}),))
    assert equivalent_groups([intra_plan, moved]) == [[0], [1]]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)), min_size=1, max_size=9))
def test_pareto_front_matches_brute_force(points):
    front = set(pareto_front(points))
    for i, (t, m) in enumerate(points):
        dominated = any(t2 <= t and m2 <= m and (t2 < t or m2 < m) for t2, m2 in points)
        assert (i in front) == (not dominated)
