"""The timeline draws interleaved 1F1B (one row per mesh, each chunk in its own colour) and
ZB-H1 (B and hatched W bars) readably at 128 micro-batches."""

from __future__ import annotations

from dataclasses import astuple, replace

import pytest

from autoplan.plans._plan import Schedule
from autoplan.plans._schedule import schedule_events, schedule_table
from autoplan.viz import timeline_figure
from autoplan.viz._timeline import GROUP_EVENTS, kind_color

from .conftest import make_pipeline_plan


def _with_schedule(plan, kind, m, fwd, bwd, v=1, wgt=None):
    stages = plan.stages
    if v > 1:  # chunk s on mesh s mod P: the mesh's stage record, re-indexed
        P = len(stages)
        stages = tuple(replace(stages[s % P], index=s) for s in range(P * v))
    S = len(stages)
    kw = {"virtual_stages": v} if v > 1 else {}
    if wgt is not None:
        kw["weight_times"] = wgt
    events = sorted(astuple(e) for e in schedule_events(kind, S, m, fwd, bwd, **kw))
    table = tuple(tuple(None if t is None else tuple(t) for t in row)
                  for row in schedule_table(kind, S, m, v))
    return replace(plan, stages=stages, schedule=Schedule(kind, m, S, table=table,
                                                          events=tuple(events), virtual_stages=v))


def _bars(fig):
    return [t for t in fig.data if t.meta and t.meta.get("kind") == "events"]


def test_interleaved_timeline_has_one_row_per_mesh_and_a_colour_per_chunk():
    base = make_pipeline_plan("1f1b", m=4)
    base = replace(base, stages=base.stages[:2])
    plan = _with_schedule(base, "interleaved", 8, [1e-3] * 4, [2e-3] * 4, v=2)
    fig = timeline_figure(plan)
    assert list(fig.layout.yaxis.tickvals) == [0, 1]
    assert "stages 0, 2" in fig.layout.yaxis.ticktext[0]
    assert "v=2 stages per mesh on 2 meshes" in fig.layout.title.text
    colours = {t.meta["stage"]: t.marker.color for t in _bars(fig) if t.meta["event_kind"] == "forward"}
    assert len(colours) == 4 and len(set(colours.values())) == 4
    for t in _bars(fig):
        st = t.meta["stage"]
        assert set(t.y) == {st % 2}
        assert f"(chunk {st // 2} of mesh {st % 2})" in t.hovertemplate
    assert len([e for t in _bars(fig) for e in t.x]) == 2 * 4 * 8


def test_zb_h1_timeline_draws_b_dark_and_w_hatched():
    plan = _with_schedule(make_pipeline_plan("1f1b", m=4), "zb-h1", 6, [1e-3] * 3, [1e-3] * 3,
                          wgt=[1e-3] * 3)
    fig = timeline_figure(plan)
    weights = [t for t in _bars(fig) if t.meta["event_kind"] == "weight"]
    assert len(weights) == 3 and all(t.marker.pattern.shape == "/" for t in weights)
    assert all("W (weight gradient)" in t.name for t in weights)
    backs = [t for t in _bars(fig) if t.meta["event_kind"] == "backward"]
    assert all("B (input gradient)" in t.name and t.marker.pattern.shape in (None, "")
               for t in backs)
    assert kind_color(0, "weight") not in (kind_color(0, "forward"), kind_color(0, "backward"))
    assert "W (hatched, deferred into the bubble)" in fig.layout.title.text
    # ZB-H1 at equal times: 3 m + S - 1 ticks of 1 ms
    assert plan.schedule.events[-1][1] == pytest.approx((3 * 6 + 3 - 1) * 1e-3)


@pytest.mark.parametrize("kind", ["zb-h1", "interleaved"])
def test_128_micro_batches_stay_readable(kind):
    """128 micro-batches: each mesh's steady state is one bar counting its F, B and W (or its
    chunks), the ramps stay bars, and every event is accounted for once."""
    base = make_pipeline_plan("1f1b", m=4)
    if kind == "zb-h1":
        plan = _with_schedule(base, kind, 128, [1e-3] * 3, [1e-3] * 3, wgt=[1e-3] * 3)
    else:
        plan = _with_schedule(replace(base, stages=base.stages[:2]), kind, 128, [5e-4] * 4,
                              [1e-3] * 4, v=2)
    events = plan.schedule.events
    assert len(events) > GROUP_EVENTS
    fig = timeline_figure(plan)
    steady = next(t for t in fig.data if t.meta and t.meta.get("kind") == "steady")
    meshes = plan.schedule.num_meshes
    assert sorted(steady.y) == list(range(meshes))
    drawn = sum(len(t.x) for t in _bars(fig))
    assert drawn < 40 * meshes  # the ramps only
    assert drawn + sum(c[8] + c[9] for c in steady.customdata) == len(events)
    for text in steady.text:
        if kind == "zb-h1":
            assert " W" in text
        else:
            assert "over 2 chunks" in text
    assert fig.layout.height <= 900
