"""The plan explorer widget without a browser: a real search on tiny GPT / cpu:8, the candidate
list, in-place FigureWidget updates, linked layer selection, errors into the Output, and a launch."""

from __future__ import annotations

import math
import pathlib
import sys

import plotly.graph_objects as go
import pytest
from ipywidgets.widgets import widget as ipywidget

import autoplan
from autoplan.viz import _explorer, compare_figure, sharding_figure, stage_figure, timeline_figure
from autoplan.viz._explorer import DIM, FIGURES, NO_SIZE, Explorer, sync_figure

SEARCH_TIMEOUT = 900
USER_MODELS = pathlib.Path(__file__).resolve().parents[1] / "user_models"


def figure_widgets(root):
    out, todo = [], [root]
    while todo:
        w = todo.pop()
        if isinstance(w, go.FigureWidget):
            out.append(w)
        todo.extend(getattr(w, "children", ()) or ())
    return out


def live_figure_widgets():
    return [w for w in list(ipywidget._instances.values()) if isinstance(w, go.FigureWidget)]


def traces(fw):
    return [t.to_plotly_json() for t in fw.data]


def without_uid(ts):
    return [{k: v for k, v in t.items() if k != "uid"} for t in ts]


def click(fw, trace_index, point=0):
    """What the page sends when a point of a trace is clicked (plotly's pointsCallback message)."""
    fw._js2py_pointsCallback = {"event_type": "plotly_click",
                                "points": {"trace_indexes": [trace_index], "point_indexes": [point],
                                           "xs": [0], "ys": [0]},
                                "device_state": None, "selector": None}


@pytest.fixture(scope="module")
def explorer():
    ex = Explorer(model="gpt", size="tiny", cluster="cpu:8")  # autostart: searches in the background
    ex.wait_idle(SEARCH_TIMEOUT)
    assert ex.result is not None, ex._errors.outputs
    return ex


@pytest.fixture
def in_user_folder(monkeypatch):
    """The notebook runs in the folder of the user's modules (found through the current
    directory; sys.path and the imported module restored afterwards)."""
    monkeypatch.chdir(USER_MODELS)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(USER_MODELS))])
    yield
    sys.modules.pop("optax_mlp", None)


# ---- no search needed -----------------------------------------------------------------------
def test_the_model_box_takes_a_users_module_function(in_user_folder):
    ex = Explorer("optax_mlp:workload", cluster="cpu:8", autostart=False)
    assert ex._model.value == "optax_mlp:workload"
    assert (ex._size.value, ex._size.disabled) == (NO_SIZE, True)
    assert ex.launch_spec() == {"model": "optax_mlp:workload"}
    ex = Explorer({"model": "optax_mlp:workload", "layers": 2}, autostart=False)
    assert ex.launch_spec() == {"model": "optax_mlp:workload", "layers": 2}
    # typed into the model box: a zoo name brings its sizes back, a module:function drops them
    ex._model.value = "mlp"
    assert (ex._size.value, ex._size.disabled) == ("tiny", False)
    assert ex.launch_spec() == {"model": "mlp", "size": "tiny"}
    ex._model.value = "optax_mlp:workload"
    assert ex._size.disabled and ex.launch_spec() == {"model": "optax_mlp:workload"}
    assert ex._get_workload().name == "optax_mlp:workload"
    ex._model.value = "not a model"
    with pytest.raises(ValueError, match="the model box should hold one of"):
        ex._get_workload()
    with pytest.raises(autoplan.ModelError, match="no attribute 'nope'"):
        Explorer("optax_mlp:nope", autostart=False)


def test_sync_figure_swaps_and_restyles_in_place(intra_plan, pipeline_plan, gpipe_plan):
    fw = go.FigureWidget(sharding_figure(intra_plan))
    for plan in (pipeline_plan, intra_plan, gpipe_plan, pipeline_plan):
        want = sharding_figure(plan)
        sync_figure(fw, want)
        assert without_uid(traces(fw)) == without_uid([t.to_plotly_json() for t in want.data])
        assert fw.layout.title.text == want.layout.title.text
    # same structure (pipeline 1F1B -> GPipe timelines have the same trace types): restyled,
    # and properties the new figure does not set are removed
    fw = go.FigureWidget(timeline_figure(pipeline_plan))
    objs = list(fw.data)
    fw.data[1].opacity = 0.3
    sync_figure(fw, timeline_figure(pipeline_plan))
    assert all(a is b for a, b in zip(fw.data, objs))
    assert fw.data[1].opacity is None
    # layout keys the new figure lacks go away (the stage figure has annotations, the timeline none)
    fw = go.FigureWidget(stage_figure(pipeline_plan))
    assert fw.layout.annotations
    sync_figure(fw, timeline_figure(pipeline_plan))
    assert not fw.layout.annotations


def test_search_errors_go_to_the_output(monkeypatch):
    def broken(*args, **kwargs):
        kwargs["progress"]("tracing", 0.0)
        raise RuntimeError("the solver exploded")

    monkeypatch.setattr(_explorer, "_search_function", lambda: broken)
    ex = Explorer(model="gpt", size="tiny", cluster="cpu:8", autostart=False)
    assert ex._status.value == "no search yet"
    assert ex.search()
    ex.wait_idle(60)
    text = "".join(o.get("text", "") for o in ex._errors.outputs)
    assert "RuntimeError: the solver exploded" in text and "Traceback" in text
    assert ex._status.value.startswith("search failed: RuntimeError")
    assert ex._progress.bar_style == "danger"
    assert ex.result is None and ex.plan is None
    assert not ex._search_button.disabled
    with pytest.raises(RuntimeError, match="no search result"):
        ex.select(0)
    with pytest.raises(RuntimeError, match="no plan selected"):
        ex.launch()


def test_bad_arguments():
    with pytest.raises(ValueError, match="model should be one of"):
        Explorer(model="bert", autostart=False)
    with pytest.raises(ValueError, match="size should be one of"):
        Explorer(model="gpt", size="huge", autostart=False)
    with pytest.raises(ValueError, match="level should be one of"):
        Explorer(level="fast", autostart=False)
    with pytest.raises(ValueError, match="microbatches"):
        Explorer(microbatches=0, autostart=False)


def test_controls_build_the_search_arguments(monkeypatch):
    seen = {}

    def fake(workload, cluster, **kwargs):
        seen.update(workload=workload, cluster=cluster, **kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(_explorer, "_search_function", lambda: fake)
    ex = Explorer(cluster="p3.16xlarge:2", level="exhaustive", schedule="gpipe", microbatches=8,
                  autostart=False)
    assert (ex._preset.value, ex._nodes.value, ex._nodes.description) == ("p3.16xlarge", 2, "nodes")
    ex._model.value = "mlp"
    assert ex._size.value == "tiny"
    ex.search()
    ex.wait_idle(120)
    assert (seen["workload"].name, seen["workload"].size) == ("mlp", "tiny")
    assert seen["cluster"].spec == "p3.16xlarge:2"
    assert (seen["level"], seen["schedule"], seen["microbatches"]) == ("exhaustive", "gpipe", 8)
    ex._preset.value = "cpu"
    ex._nodes.value = 4
    ex._microbatches.value = 0  # "auto"
    ex.search()
    ex.wait_idle(120)
    assert seen["cluster"].spec == "cpu:4" and seen["cluster"].num_devices == 4
    assert seen["microbatches"] is None
    assert ex._nodes.description == "devices"
    assert ex.launch_spec() == {"model": "mlp", "size": "tiny"}
    assert len(repr(ex)) < 200 and "plans=0" in repr(ex)


def test_a_given_workload_keeps_its_overrides_until_the_model_changes():
    from autoplan.models import get

    ex = Explorer(get("gpt", "tiny", layers=1, hidden=64), cluster="cpu:4", autostart=False)
    assert (ex._model.value, ex._size.value) == ("gpt", "tiny")
    assert ex.launch_spec() == {"model": "gpt", "size": "tiny", "layers": 1, "hidden": 64}
    ex._model.value = "mlp"
    ex._model.value = "gpt"
    assert ex.launch_spec() == {"model": "gpt", "size": "tiny"}


# ---- with a real search -----------------------------------------------------------------------
def test_candidates_are_the_results_plans(explorer):
    res = explorer.result
    assert len(res.plans) >= 2
    assert explorer.candidates == res.plans
    assert all(a is b for a, b in zip(explorer.candidates, res.plans))
    labels = [label for label, _ in explorer._candidate.options]
    assert [v for _, v in explorer._candidate.options] == list(range(len(res.plans)))
    for label, p in zip(labels, res.plans):
        assert p.label in label and p.describe() in label
        assert f"{p.predicted.step_time * 1e3:.3f} ms" in label
    assert any(p.label.startswith("baseline") for p in res.plans)
    assert explorer.plan is res.plans[0] and explorer._candidate.value == 0
    assert explorer._progress.value == 1.0 and "plans for gpt (tiny) on cpu:8" in explorer._status.value
    assert res.plans[0].label in explorer._summary.value
    assert not explorer._launch_button.disabled
    assert explorer._errors.outputs == ()


def test_changing_the_candidate_updates_the_figures_in_place(explorer):
    res = explorer.result
    explorer.select(0)
    figs = dict(explorer.figures)
    in_tree = figure_widgets(explorer.widget)
    live = len(live_figure_widgets())
    assert sorted(map(id, in_tree)) == sorted(map(id, figs.values())) and len(in_tree) == len(FIGURES)
    before = {k: traces(f) for k, f in figs.items()}
    # a candidate whose sharding differs from the best plan's
    j = next(k for k, p in enumerate(res.plans[1:], 1)
             if p.describe() != res.plans[0].describe() or p.label != res.plans[0].label)
    plan = explorer.select(j)
    assert plan is res.plans[j] is explorer.plan and explorer._candidate.value == j
    for name, fn in (("sharding", sharding_figure), ("stage", stage_figure), ("timeline", timeline_figure)):
        fw = explorer.figures[name]
        assert fw is figs[name]
        want = fn(plan)
        assert without_uid(traces(fw)) == without_uid([t.to_plotly_json() for t in want.data]), name
        assert fw.layout.title.text == want.layout.title.text
    assert traces(explorer.figures["sharding"]) != before["sharding"]
    # the comparison keeps its traces and moves the star to the selected plan
    cmp = explorer.figures["compare"]
    pts = next(t for t in cmp.data if t.meta["kind"] == "plans")
    k = list(pts.meta["plans"]).index(j)
    assert pts.marker.symbol[k] == "star" and list(pts.marker.symbol).count("star") == 1
    want = compare_figure(res.plans, highlight=j)
    assert len(cmp.data) == len(want.data)
    assert plan.label in explorer._summary.value
    # back and forth: still the same widgets, and no FigureWidget was created anywhere
    for idx in (0, j, 0):
        explorer.select(idx)
    assert [id(f) for f in figure_widgets(explorer.widget)] == [id(f) for f in in_tree]
    assert all(explorer.figures[n] is figs[n] for n in FIGURES)
    assert len(live_figure_widgets()) == live
    assert without_uid(traces(explorer.figures["sharding"])) == without_uid(
        [t.to_plotly_json() for t in sharding_figure(res.plans[0]).data])
    with pytest.raises(IndexError):
        explorer.select(len(res.plans))


def test_a_candidate_change_from_the_page_runs_off_the_main_thread(explorer):
    explorer.select(0)
    explorer._candidate.value = 1  # what the page's Dropdown does
    explorer.wait_idle(120)
    assert explorer.plan is explorer.result.plans[1]
    assert explorer.figures["sharding"].layout.title.text == \
        sharding_figure(explorer.result.plans[1]).layout.title.text
    explorer.select(0)


def tile_traces(explorer):
    return [t for t in explorer.figures["sharding"].data if (t.meta or {}).get("kind") == "tile"]


def test_layer_selection_highlights_it_in_every_view(explorer):
    plan = explorer.select(0)
    layer_of = {o.op: o.layer for s in plan.stages for o in s.ops}
    tiles = tile_traces(explorer)
    drawn = [layer_of[t.meta["op"]] for t in tiles]
    layer = next(name for name in plan.stages[0].layers if name in drawn and drawn.count(name) < len(drawn))
    explorer.select_layer(layer)
    assert explorer.focus == f"layer:{layer}" and explorer._focus.value == f"layer:{layer}"
    hit = [t for t in tiles if layer_of[t.meta["op"]] == layer]
    miss = [t for t in tiles if layer_of[t.meta["op"]] != layer]
    assert hit and miss
    assert all(t.opacity == 1.0 for t in hit) and all(t.opacity == DIM for t in miss)
    cols = sorted({t.meta["column"] for t in hit})
    boxes = [s for s in explorer.figures["sharding"].layout.shapes if s.name == "highlight"]
    assert boxes
    for c in cols:  # every column of the layer is inside a highlight box, no other column is
        assert any(b.x0 <= c + 0.1 and b.x1 >= c + 0.9 for b in boxes)
    other = {t.meta["column"] for t in miss}
    assert not any(b.x0 <= c + 0.1 and b.x1 >= c + 0.9 for b in boxes for c in other)
    # the stage that owns the layer is outlined in the stage view
    owner = next(s.index for s in plan.stages if layer in s.layers)
    devs = [t for t in explorer.figures["stage"].data if (t.meta or {}).get("kind") == "device"]
    for t in devs:
        owned = t.meta["stage"] == owner
        assert (t.line.width == 3) == owned, t.meta
    assert layer in explorer._focus_info.value
    # clearing restores every view to the figure as drawn
    explorer.clear_selection()
    assert explorer.focus == ""
    for name, fn in (("sharding", sharding_figure), ("stage", stage_figure), ("timeline", timeline_figure)):
        fw, want = explorer.figures[name], fn(plan)
        assert without_uid(traces(fw)) == without_uid([t.to_plotly_json() for t in want.data]), name
        assert fw.layout.shapes == want.layout.shapes
    with pytest.raises(ValueError, match="not a layer or stage"):
        explorer.select_layer("no_such_layer")


def test_clicks_select_layers_and_stages(explorer):
    plan = explorer.select(0)
    layer_of = {o.op: o.layer for s in plan.stages for o in s.ops}
    fw = explorer.figures["sharding"]
    k = next(i for i, t in enumerate(fw.data) if (t.meta or {}).get("kind") == "tile")
    click(fw, k)
    assert explorer.focus == f"layer:{layer_of[fw.data[k].meta['op']]}"
    explorer.clear_selection()
    st = explorer.figures["stage"]
    k = next(i for i, t in enumerate(st.data) if (t.meta or {}).get("kind") == "device"
             and t.meta["stage"] is not None)
    click(st, k)
    assert explorer.focus == f"stage:{st.data[k].meta['stage']}"
    tl = explorer.figures["timeline"]
    k = next(i for i, t in enumerate(tl.data) if (t.meta or {}).get("kind") == "events")
    explorer.clear_selection()
    click(tl, k)
    assert explorer.focus == f"stage:{tl.data[k].meta['stage']}"
    bars = [t for t in tl.data if (t.meta or {}).get("kind") == "events"]
    stage = tl.data[k].meta["stage"]
    assert all((t.opacity == 1.0) == (t.meta["stage"] == stage) for t in bars)
    explorer.clear_selection()
    assert explorer._errors.outputs == ()


def test_the_number_of_figure_widgets_stays_fixed(explorer):
    ids = sorted(map(id, figure_widgets(explorer.widget)))
    live = len(live_figure_widgets())
    for k in range(min(4, len(explorer.result.plans))):
        explorer.select(k)
        explorer.select_stage(explorer.plan.stages[-1].index)
    explorer.clear_selection()
    explorer.select(0)
    assert sorted(map(id, figure_widgets(explorer.widget))) == ids and len(ids) == len(FIGURES)
    assert len(live_figure_widgets()) == live


@pytest.mark.slow
def test_launch_streams_losses_and_reports_the_result(explorer):
    plan = explorer.select(0)
    assert plan.num_devices == 8
    assert explorer.launch(steps=3)
    explorer.wait_idle(900)
    rec = explorer.last_launch
    assert rec is not None and rec.done and rec.error is None, (rec, explorer._errors.outputs)
    assert (rec.num_processes, rec.devices_per_process) == (2, 4)
    assert rec.spec == {"model": "gpt", "size": "tiny"}
    assert rec.result is not None
    losses = rec.losses
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert {e["process"] for e in rec.step_events} == {0, 1}
    assert rec.matched is True
    assert rec.measured_step_time and rec.measured_step_time > 0
    # shown: the table has every loss, the live figure the curve, the result line the comparison
    for x in losses:
        assert f"{x:.6f}" in explorer._launch_table.value
    fw = explorer.figures["launch"]
    assert list(fw.data[0].y) == pytest.approx(losses)
    assert len(fw.data[1].y) == 3
    assert list(fw.data[2].y) == pytest.approx([plan.predicted.step_time] * 2)
    html = explorer._launch_result.value
    assert "launch finished" in html and "matched single-device results" in html
    assert f"{losses[-1]:.6f}" in html and f"{plan.predicted.step_time * 1e3:.3f} ms" in html
    assert explorer._launch_status.value.startswith("finished: 3 steps")
    assert not explorer._launch_button.disabled


@pytest.mark.slow
def test_a_users_workload_is_searched_and_launched_from_the_explorer(in_user_folder):
    ex = Explorer("optax_mlp:workload", cluster="cpu:8", level="exhaustive")
    ex.wait_idle(SEARCH_TIMEOUT)
    assert ex.result is not None, ex._errors.outputs
    assert ex._status.value.startswith(f"{len(ex.result.plans)} plans for optax_mlp:workload on cpu:8")
    intra = next(k for k, p in enumerate(ex.result.plans) if not p.is_pipeline)
    plan = ex.select(intra)
    assert plan.model == "optax_mlp:workload"
    assert ex.launch(steps=2)
    ex.wait_idle(900)
    rec = ex.last_launch
    assert rec is not None and rec.done and rec.error is None, (rec, ex._errors.outputs)
    assert rec.spec == {"model": "optax_mlp:workload"}
    assert (rec.num_processes, rec.devices_per_process) == (2, 4)  # detected: no accelerator here
    assert rec.layout == "2 processes x 4 emulated CPU devices (no accelerator attached)"
    assert rec.matched is True and len(rec.losses) == 2
    assert rec.layout in ex._launch_result.value and "matched single-device results" in ex._launch_result.value
