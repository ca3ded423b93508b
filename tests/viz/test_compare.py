"""The comparison figure: points are the predictions, the Pareto line the non-dominated plans."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.viz import compare_figure, pareto_front

from .conftest import COMPARE, PARETO_LABELS


def trace(fig, kind):
    return next(t for t in fig.data if t.meta and t.meta.get("kind") == kind)


def test_points_equal_predictions(compare_plans):
    fig = compare_figure(compare_plans)
    pts = trace(fig, "plans")
    assert list(pts.x) == [p.predicted.step_time for p in compare_plans]
    assert list(pts.y) == [p.predicted.memory_per_device for p in compare_plans]
    assert list(pts.text) == [label for label, _, _ in COMPARE]


def test_pareto_line_is_exactly_the_non_dominated(compare_plans):
    fig = compare_figure(compare_plans)
    line = trace(fig, "pareto")
    by_label = {p.label: p for p in compare_plans}
    assert list(line.x) == [by_label[lab].predicted.step_time for lab in PARETO_LABELS]
    assert list(line.y) == [by_label[lab].predicted.memory_per_device for lab in PARETO_LABELS]
    assert "3 of 5 plans on the Pareto front" in fig.layout.title.text


def test_breakdown_stacks_compute_collectives_and_bubble(compare_plans):
    fig = compare_figure(compare_plans)
    parts = {t.meta["component"]: t for t in fig.data if t.meta and t.meta.get("kind") == "breakdown"}
    assert list(parts) == ["compute", "all-reduce", "all-gather", "bubble"]
    for i, p in enumerate(compare_plans):
        assert parts["compute"].y[i] == p.predicted.compute_time
        assert parts["all-reduce"].y[i] == p.predicted.comm_time_by_kind["all-reduce"]
        assert parts["bubble"].y[i] == pytest.approx(p.predicted.bubble_fraction * p.predicted.step_time)
    assert fig.layout.barmode == "stack"


def test_accepts_plans_attribute_highlight_and_duplicate_labels(compare_plans):
    class Result:
        plans = compare_plans

    fig = compare_figure(Result(), highlight="megatron")
    pts = trace(fig, "plans")
    assert list(pts.marker.symbol).count("star") == 1 and pts.marker.symbol[2] == "star"
    dup = compare_figure([compare_plans[0], compare_plans[0]])
    assert list(trace(dup, "plans").text) == ["autoplan", "autoplan #2"]
    assert len(trace(dup, "pareto").x) == 2  # equal points do not dominate each other
    with pytest.raises(TypeError, match="plans should"):
        compare_figure([1, 2])
    with pytest.raises(TypeError, match="plans should"):
        compare_figure([])


def test_pipeline_plan_breakdown_has_send_recv(pipeline_plan, intra_plan):
    fig = compare_figure([pipeline_plan, intra_plan])
    comps = [t.meta["component"] for t in fig.data if t.meta and t.meta.get("kind") == "breakdown"]
    assert comps == ["compute", "all-reduce", "all-gather", "send-recv", "bubble"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)), min_size=1, max_size=9))
def test_pareto_front_matches_brute_force(points):
    front = set(pareto_front(points))
    for i, (t, m) in enumerate(points):
        dominated = any(t2 <= t and m2 <= m and (t2 < t or m2 < m) for t2, m2 in points)
        assert (i in front) == (not dominated)
