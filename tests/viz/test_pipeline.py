"""Stage and timeline figures follow the plan's stages and schedule."""

from __future__ import annotations

import pytest

from autoplan._plan import Schedule
from autoplan.viz import stage_color, stage_figure, timeline_events, timeline_figure


def cells(fig):
    return {t.meta["device"]: t for t in fig.data if t.meta and t.meta.get("kind") == "device"}


@pytest.mark.parametrize("which", ["pipeline_plan", "intra_plan"])
def test_stage_figure_cells_follow_device_ids(which, request):
    plan = request.getfixturevalue(which)
    fig = stage_figure(plan)
    c = cells(fig)
    cl = plan.cluster
    assert sorted(c) == list(range(cl.num_devices))
    owner = {d: s.index for s in plan.stages for d in s.device_ids}
    for d, t in c.items():
        assert t.meta["stage"] == owner.get(d)
        assert (t.meta["host"], t.meta["slot"]) == divmod(d, cl.devices_per_node)
        # the cell is drawn at row = host, column = slot
        assert min(t.x) == t.meta["slot"] and min(t.y) == t.meta["host"]
        if d in owner:
            assert t.fillcolor == stage_color(owner[d])
        else:
            assert t.fillcolor == "#ffffff"


def test_stage_figure_annotations_and_unused(pipeline_plan):
    fig = stage_figure(pipeline_plan)
    assert cells(fig)[7].meta["stage"] is None  # device 7 is unused
    texts = [a.text for a in fig.layout.annotations]
    assert len(texts) == 3
    assert "layers 0-3" in texts[0] and "mesh 1x4" in texts[0]
    assert "layers 8-11" in texts[2] and "mesh 1x1" in texts[2]
    assert "3 stages on 7 of 8 devices" in fig.layout.title.text
    assert "unused" in cells(fig)[7].text


def bars(fig):
    out = []
    for t in fig.data:
        if t.meta and t.meta.get("kind") == "events":
            for base, dur, y, cd, text in zip(t.base, t.x, t.y, t.customdata, t.text):
                out.append((base, base + dur, y, int(cd[3]), t.meta["stage"], t.meta["event_kind"],
                            text, t.marker.color))
    return out


@pytest.mark.parametrize("which", ["pipeline_plan", "gpipe_plan"])
def test_timeline_one_bar_per_event(which, request):
    plan = request.getfixturevalue(which)
    fig = timeline_figure(plan)
    got = bars(fig)
    assert len(got) == len(plan.schedule.events)
    want = sorted(plan.schedule.events)
    for (s, e, mesh, mb, st, kind), bar in zip(want, sorted(got)):
        assert bar[0] == pytest.approx(s, abs=1e-15) and bar[1] == pytest.approx(e, abs=1e-15)
        assert bar[2:6] == (mesh, mb, st, kind)
        assert bar[6] == str(mb)  # labelled with the micro-batch number
    # forward and backward of a stage: different shades
    for st in range(3):
        fwd = {b[7] for b in got if b[4] == st and b[5] == "forward"}
        bwd = {b[7] for b in got if b[4] == st and b[5] == "backward"}
        assert len(fwd) == len(bwd) == 1 and fwd != bwd
    assert list(fig.layout.yaxis.tickvals) == [0, 1, 2]
    assert plan.schedule.kind in fig.layout.title.text


def test_timeline_idle_gaps_fill_the_rest(pipeline_plan):
    fig = timeline_figure(pipeline_plan)
    idle = next(t for t in fig.data if t.meta and t.meta.get("kind") == "idle")
    end = max(e[1] for e in pipeline_plan.schedule.events)
    for mesh in range(3):
        busy = sum(e[1] - e[0] for e in pipeline_plan.schedule.events if e[2] == mesh)
        gaps = sum(d for d, y in zip(idle.x, idle.y) if y == mesh)
        assert busy + gaps == pytest.approx(end)
    # mesh 0 waits for the last stage's first backward: a gap after its warm-up forwards
    assert any(y == 0 and b > 0 for b, y in zip(idle.base, idle.y))


def test_single_stage_plan_has_one_row_forward_then_backward(intra_plan):
    fig = timeline_figure(intra_plan)
    got = sorted(bars(fig))
    st = intra_plan.stages[0]
    assert [(b[2], b[5]) for b in got] == [(0, "forward"), (0, "backward")]
    assert got[0][:2] == pytest.approx((0.0, st.forward_time))
    assert got[1][:2] == pytest.approx((st.forward_time, st.forward_time + st.backward_time))
    assert list(fig.layout.yaxis.tickvals) == [0]
    # with recorded events the figure uses them
    ev = ((0.0, 0.004, 0, 0, 0, "forward"), (0.004, 0.01, 0, 0, 0, "backward"))
    plan = intra_plan.with_(schedule=Schedule("none", 1, 1, events=ev))
    assert sorted(b[:2] for b in bars(timeline_figure(plan))) == [(0.0, 0.004), (0.004, 0.01)]


def test_timeline_from_table_when_no_events(pipeline_plan):
    sch = pipeline_plan.schedule
    plan = pipeline_plan.with_(schedule=Schedule(sch.kind, sch.microbatches, sch.num_stages, table=sch.table))
    events, unit = timeline_events(plan)
    assert unit == "tick"
    assert len(events) == 2 * 3 * sch.microbatches
    fig = timeline_figure(plan)
    assert len(bars(fig)) == len(events)
    assert "clock tick" in fig.layout.xaxis.title.text
