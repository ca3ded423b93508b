"""Stage, timeline and memory figures follow the plan's stages, schedule and inputs."""

from __future__ import annotations

import math

import pytest

from autoplan.costs._cluster import Cluster
from autoplan.plans._plan import Plan, Predicted, Schedule, Stage
from autoplan.viz import (
    memory_breakdown,
    memory_figure,
    stage_color,
    stage_figure,
    timeline_events,
    timeline_figure,
)
from autoplan.viz._timeline import GROUP_EVENTS

from .conftest import make_pipeline_plan


def rgb(color):
    c = color.lstrip("#")
    return [int(c[k:k + 2], 16) for k in (0, 2, 4)]


@pytest.mark.parametrize("which", ["pipeline_plan", "intra_plan"])
def test_stage_figure_cells_follow_device_ids(which, request):
    plan = request.getfixturevalue(which)
    fig = stage_figure(plan)
    img = next(t for t in fig.data if t.meta and t.meta.get("kind") == "devices")
    cl = plan.cluster
    per = cl.devices_per_node
    assert img.meta["per_host"] == per and len(img.z) == cl.nodes and len(img.z[0]) == per
    owner = {d: s.index for s in plan.stages for d in s.device_ids}
    assert fig.layout.meta["owner"] == [owner.get(d) for d in range(cl.num_devices)]
    for d in range(cl.num_devices):
        h, j = divmod(d, per)  # row = host, column = slot
        want = stage_color(owner[d]) if d in owner else "#ffffff"
        assert list(img.z[h][j]) == rgb(want)
        assert f"device {d} (host {h}, slot {j})" in img.hovertext[h][j]


def test_stage_figure_labels_and_unused(pipeline_plan):
    fig = stage_figure(pipeline_plan)
    img = next(t for t in fig.data if t.meta and t.meta.get("kind") == "devices")
    assert "unused" in img.hovertext[1][3]  # device 7
    labels = [a.text for a in fig.layout.annotations]
    assert len(labels) == 3 and all(f"stage {k}" in labels[k] or f"<b>{k}</b>" == labels[k]
                                    for k in range(3))
    legend = [t.name for t in fig.data if t.meta and t.meta.get("kind") == "legend"]
    assert "layers 0-3" in legend[0] and "mesh 1x4" in legend[0] and "devices 0-3" in legend[0]
    assert "layers 8-11" in legend[2] and "mesh 1x1" in legend[2]
    assert "unused" in legend[-1]
    assert "3 stages on 7 of 8 devices" in fig.layout.title.text


def test_stage_labels_of_many_stages_on_one_host_do_not_collide():
    # one-device stages on one host: short labels, the stage number alone where cells are narrow
    def plan(per):
        stages = tuple(Stage(k, (f"l{k}",), (k, k + 1), (1, 1), (k,), (1, 1), ("x", "y"))
                       for k in range(per))
        return Plan("m", "0" * 16, Cluster.preset("p3.16xlarge", 1, devices_per_node=per), stages,
                    (), Schedule("1f1b", 8, per), Predicted(1.0, 1.0, 1.0))

    assert [a.text for a in stage_figure(plan(8)).layout.annotations] == [
        f"<b>stage {k}</b>" for k in range(8)]
    assert [a.text for a in stage_figure(plan(32)).layout.annotations] == [
        f"<b>{k}</b>" for k in range(32)]


def test_stage_figure_of_a_thousand_devices_is_one_image():
    stages = (Stage(0, ("a",), (0, 1), (64, 8), tuple(range(512)), (64, 8), ("x", "y")),
              Stage(1, ("b",), (1, 2), (64, 8), tuple(range(512, 1024)), (64, 8), ("x", "y")))
    plan = Plan("m", "0" * 16, Cluster.preset("p3.16xlarge", 128), stages, (),
                Schedule("1f1b", 8, 2), Predicted(1.0, 1.0, 1.0))
    fig = stage_figure(plan)
    assert len(fig.data) <= 4  # the image and the legend entries
    img = fig.data[0]
    assert len(img.z) == 128 and list(img.z[100][3]) == rgb(stage_color(1))


def test_a_host_of_many_devices_wraps_into_rows():
    stages = (Stage(0, ("a",), (0, 1), (1, 32), tuple(range(32)), (32, 1), ("x", "y")),
              Stage(1, ("b",), (1, 2), (1, 32), tuple(range(32, 64)), (32, 1), ("x", "y")))
    plan = Plan("m", "0" * 16, Cluster.preset("cpu", 1, devices_per_node=64), stages, (),
                Schedule("1f1b", 8, 2), Predicted(1.0, 1.0, 1.0))
    fig = stage_figure(plan)
    img = fig.data[0]
    assert (len(img.z), len(img.z[0])) == (4, 16)  # 64 devices of one host in rows of 16
    assert list(img.z[2][0]) == rgb(stage_color(1)) and "device 32 " in img.hovertext[2][0]
    assert fig.layout.meta["width"] == 16 and fig.layout.meta["rows_per_host"] == 4
    assert "each host in rows of 16" in fig.layout.title.text


def bars(fig):
    """Every event bar, in seconds: (start, end, mesh, microbatch, stage, kind, label, colour)."""
    out = []
    for t in fig.data:
        if t.meta and t.meta.get("kind") == "events":
            for cd, text in zip(t.customdata, t.text):
                out.append((cd[0], cd[1], int(cd[2]), int(cd[3]), t.meta["stage"],
                            t.meta["event_kind"], text, t.marker.color))
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
    # the axis and the bars are in one unit (ms here), the hover text too
    assert fig.layout.meta["unit"] == "ms" and fig.layout.xaxis.title.text == "time (ms)"
    tr = next(t for t in fig.data if t.meta and t.meta.get("kind") == "events")
    assert tr.base[0] == pytest.approx(tr.customdata[0][0] * 1e3)
    assert tr.customdata[0][6].endswith(" ms")
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
        gaps = sum(d for d, y in zip(idle.x, idle.y) if y == mesh) * 1e-3
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
    assert sorted(tuple(b[:2]) for b in bars(timeline_figure(plan))) == [(0.0, 0.004), (0.004, 0.01)]


def test_timeline_from_table_when_no_events(pipeline_plan):
    sch = pipeline_plan.schedule
    plan = pipeline_plan.with_(schedule=Schedule(sch.kind, sch.microbatches, sch.num_stages, table=sch.table))
    events, unit = timeline_events(plan)
    assert unit == "tick"
    assert len(events) == 2 * 3 * sch.microbatches
    fig = timeline_figure(plan)
    assert len(bars(fig)) == len(events)
    assert "clock tick" in fig.layout.xaxis.title.text


def test_128_micro_batches_group_the_steady_state():
    plan = make_pipeline_plan("1f1b", m=128)
    events = plan.schedule.events
    assert len(events) > GROUP_EVENTS
    fig = timeline_figure(plan)
    steady = next(t for t in fig.data if t.meta and t.meta.get("kind") == "steady")
    drawn = bars(fig)
    keep = 2 * 3 + 2
    assert len(drawn) == 3 * 2 * keep  # ramp-up and ramp-down of each mesh
    assert len(steady.y) == 3
    for mesh, cd, text in zip(steady.y, steady.customdata, steady.text):
        evs = sorted(e for e in events if e[2] == mesh)[keep:-keep]
        assert cd[0] == pytest.approx(evs[0][0]) and cd[1] == pytest.approx(max(e[1] for e in evs))
        nf = sum(1 for e in evs if e[5] == "forward")
        assert (cd[8], cd[9]) == (nf, len(evs) - nf) and f"{nf} F + {len(evs) - nf} B" in text
    # every event is drawn once: kept bars plus the steady state's counts
    assert len(drawn) + sum(c[8] + c[9] for c in steady.customdata) == len(events)
    buttons = [b.label for b in fig.layout.updatemenus[0].buttons]
    assert buttons == ["whole step", "ramp-up", "ramp-down"]
    up = fig.layout.updatemenus[0].buttons[1].args[0]["xaxis.range"]
    assert 0 == up[0] < up[1] < fig.layout.xaxis.range[1]
    assert fig.layout.meta["grouped"] is True
    # and ungrouped on request: one bar per event
    assert len(bars(timeline_figure(plan, group=False))) == len(events)


def test_memory_breakdown_adds_up(intra_plan, pipeline_plan):
    rows = memory_breakdown(intra_plan)
    assert len(rows) == 1
    r = rows[0]
    stage = intra_plan.stages[0]
    size = dict(zip(stage.axis_names, stage.mesh_shape))

    def per_device(kind):
        return sum(math.prod(i.shape) * 4 / math.prod(size[a] for e in i.spec if e for a in e)
                   for i in intra_plan.inputs if i.kind == kind)

    assert r["parameters"] == pytest.approx(per_device("parameter"))
    assert r["optimizer_state"] == pytest.approx(per_device("optimizer_state"))
    assert r["batch"] == pytest.approx(per_device("batch"))
    assert r["parameters"] + r["optimizer_state"] + r["batch"] + r["activations"] == pytest.approx(
        intra_plan.predicted.memory_per_device)
    assert r["capacity"] == intra_plan.cluster.device_memory
    rows = memory_breakdown(pipeline_plan)
    assert [r["stage"] for r in rows] == [0, 1, 2]
    for r, s in zip(rows, pipeline_plan.stages):
        assert r["total"] == pytest.approx(max(s.memory, r["parameters"] + r["batch"]))
        assert r["devices"] == list(s.device_ids)


def test_memory_figure_stacks_parts_against_capacity(pipeline_plan):
    fig = memory_figure(pipeline_plan)
    parts = [t for t in fig.data if t.meta and t.meta.get("kind") == "memory"]
    assert [t.meta["part"] for t in parts] == ["parameters", "optimizer_state", "batch", "activations"]
    assert fig.layout.meta["unit"] == "GiB" and fig.layout.barmode == "stack"
    totals = [sum(t.y[k] for t in parts) for k in range(3)]
    assert totals == pytest.approx([s.memory / 2**30 for s in pipeline_plan.stages])
    # far below the device's memory: the axis follows the bars, no capacity line
    assert not fig.layout.shapes and "uses" in fig.layout.title.text
    # a stage over the device's memory is marked, against the capacity line
    big = pipeline_plan.with_(stages=(pipeline_plan.stages[0].__class__(
        **{**pipeline_plan.stages[0].__dict__, "memory": 40 * 2**30}),) + pipeline_plan.stages[1:])
    fig = memory_figure(big)
    cap = pipeline_plan.cluster.device_memory / 2**30
    assert any(abs(s.y0 - cap) < 1e-9 for s in fig.layout.shapes)
    assert [a.text for a in fig.layout.annotations if "fit" in a.text] == ["<b>does not fit</b>"]
