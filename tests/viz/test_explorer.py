"""The plan explorer widget without a browser: a real search on tiny GPT / cpu:8, the candidate
list (equivalent plans once), figure state held whole in each view, linked selection by dropdown
and by the page's click messages, what-if pins and undo, the code pane, the memory budget, the
session's memo of results, users' workloads and graphs, errors into the Output, and launches."""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import sys
import threading

import pytest

import autoplan
from autoplan import models
from autoplan.viz import (
    _explorer,
    compare_figure,
    graph_figure,
    memory_figure,
    sharding_figure,
    stage_figure,
    timeline_figure,
)
from autoplan.viz._compare import cost_parts, equivalent_groups
from autoplan.viz._explorer import FIGURES, NO_SIZE, Explorer
from autoplan.viz._widget import PlotView, figure_json, plotly_js_bytes

SEARCH_TIMEOUT = 900
USER_MODELS = pathlib.Path(__file__).resolve().parents[1] / "user_models"


def shown(view: PlotView) -> dict:
    return json.loads(json.dumps(view.figure))


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
    ex._model.value = "mlp"
    assert (ex._size.value, ex._size.disabled) == ("tiny", False)
    assert ex.launch_spec() == {"model": "mlp", "size": "tiny"}
    ex._model.value = "optax_mlp:workload"
    assert ex._size.disabled and ex.launch_spec() == {"model": "optax_mlp:workload"}
    ex._model.value = "not a model"
    with pytest.raises(autoplan.ModelError, match="the model box should hold one of"):
        ex._get_workload()
    with pytest.raises(autoplan.ModelError, match="no attribute 'nope'"):
        Explorer("optax_mlp:nope", autostart=False)


def test_bad_arguments_are_autoplan_errors():
    with pytest.raises(autoplan.ModelError, match="model should be one of"):
        Explorer(model="bert", autostart=False)
    with pytest.raises(autoplan.ModelError, match="size should be one of"):
        Explorer(model="gpt", size="huge", autostart=False)
    with pytest.raises(autoplan.SearchError, match="level should be one of"):
        Explorer(level="fast", autostart=False)
    with pytest.raises(autoplan.SearchError, match="microbatches"):
        Explorer(microbatches=0, autostart=False)
    with pytest.raises(autoplan.SearchError, match="memory_budget"):
        Explorer(memory_budget=-1, autostart=False)
    with pytest.raises(autoplan.ClusterError):
        Explorer(cluster="nosuch:2", autostart=False)
    with pytest.raises(autoplan.ModelError, match="workload should be a spec"):
        Explorer(workload=42, autostart=False)


def test_search_errors_go_to_the_output(monkeypatch):
    def broken(*args, **kwargs):
        kwargs["progress"]("tracing", 0.0)
        raise RuntimeError("the solver exploded")

    monkeypatch.setattr(autoplan, "search", broken)
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


def test_controls_build_the_search_arguments(monkeypatch):
    seen = {}

    def fake(workload, cluster, **kwargs):
        seen.update(workload=workload, cluster=cluster, **kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(autoplan, "search", fake)
    ex = Explorer(cluster="p3.16xlarge:2", level="exhaustive", schedule="gpipe", microbatches=8,
                  memory_budget=4 * 2**30, autostart=False)
    assert (ex._preset.value, ex._nodes.value, ex._nodes.description) == ("p3.16xlarge", 2, "nodes")
    ex._model.value = "mlp"
    assert ex._size.value == "tiny"
    ex.search()
    ex.wait_idle(120)
    assert (seen["workload"].name, seen["workload"].size) == ("mlp", "tiny")
    assert seen["cluster"].spec == "p3.16xlarge:2"
    assert (seen["level"], seen["schedule"], seen["microbatches"]) == ("exhaustive", "gpipe", 8)
    assert seen["memory_budget"] == 4 * 2**30 and seen["pipeline"] == "auto"
    assert callable(seen["partial"])
    ex._preset.value = "cpu"
    ex._nodes.value = 4
    ex._microbatches.value = 0  # "auto"
    ex._budget.value = ""  # the device's memory
    ex.search()
    ex.wait_idle(120)
    assert seen["cluster"].spec == "cpu:4" and seen["cluster"].num_devices == 4
    assert seen["microbatches"] is None and seen["memory_budget"] is None
    assert ex._nodes.description == "devices"
    assert ex.launch_spec() == {"model": "mlp", "size": "tiny"}
    assert len(repr(ex)) < 200 and "plans=0" in repr(ex)
    assert Explorer(autostart=False)._level.value == "auto"  # the search's default level


def test_the_cluster_control_offers_this_machines_measured_profile(monkeypatch):
    """Choosing "this machine (measured)" searches on Cluster.detect(quick=True) (profiled once,
    in the search's thread) and says so; the node count is not asked for."""
    seen, calls = {}, []
    measured = dataclasses.replace(autoplan.Cluster.parse("cpu:8"), name="local",
                                   launch_overhead=2e-4)

    def detect(cls, devices=None, *, quick=False, progress=True, refresh=False):
        calls.append((quick, progress, threading.current_thread() is threading.main_thread()))
        return measured

    def fake(workload, cluster, **kwargs):
        seen["cluster"] = cluster
        raise RuntimeError("stop here")

    monkeypatch.setattr(autoplan.Cluster, "detect", classmethod(detect))
    monkeypatch.setattr(autoplan, "search", fake)
    ex = Explorer(model="mlp", cluster="cpu:8", autostart=False)
    assert ("this machine (measured)", "local") in ex._preset.options
    ex._preset.value = "local"
    assert ex._nodes.disabled
    for _ in range(2):
        ex.search()
        ex.wait_idle(120)
        assert seen["cluster"] is measured
    assert calls == [(True, False, False)]  # profiled once, off the main thread
    ex._preset.value = "cpu"
    assert not ex._nodes.disabled
    ex.search()
    ex.wait_idle(120)
    assert seen["cluster"].name == "cpu" and len(calls) == 1


def test_a_given_workload_keeps_its_overrides_until_the_model_changes():
    ex = Explorer(models.get("gpt", "tiny", layers=1, hidden=64), cluster="cpu:4", autostart=False)
    assert (ex._model.value, ex._size.value) == ("gpt", "tiny")
    assert ex.launch_spec() == {"model": "gpt", "size": "tiny", "layers": 1, "hidden": 64}
    ex._model.value = "mlp"
    ex._model.value = "gpt"
    assert ex.launch_spec() == {"model": "gpt", "size": "tiny"}


def test_the_memory_budget_box_reads_and_writes_units_for_their_size():
    ex = Explorer(model="gpt", size="tiny", cluster="cpu:8", memory_budget=2e-5 * 2**30,
                  autostart=False)
    assert ex._budget.value == "21 KiB"  # not "0.0000" GiB
    assert _explorer.parse_budget(ex._budget.value) == 21 * 2**10
    assert [_explorer.parse_budget(t) for t in ("8 GiB", "512MiB", "1.5", "", "0", "2e9 B")] == [
        8 * 2**30, 512 * 2**20, 1.5 * 2**30, None, None, 2e9]
    assert [_explorer.fmt_budget(b) for b in (None, 8 * 2**30, 1536 * 2**20, 700)] == [
        "", "8 GiB", "1.5 GiB", "700 B"]
    for bad in ("lots", "-1 GiB", "8 parsecs"):
        with pytest.raises(autoplan.SearchError, match="memory budget.*Fix: e.g. 8 GiB"):
            _explorer.parse_budget(bad)


def test_cluster_names_say_their_devices_and_errors_keep_their_fix():
    local = dataclasses.replace(autoplan.Cluster.preset("cpu", 1, devices_per_node=8), name="local")
    assert _explorer.cluster_text(autoplan.Cluster.parse("cpu:8")) == "cpu:8 (8 devices)"
    assert _explorer.cluster_text(autoplan.Cluster.parse("p3.16xlarge:2")) == \
        "p3.16xlarge:2 (16 devices)"
    assert _explorer.cluster_text(local) == "this machine (8 devices, measured)"
    long = "the search could not place " + "a very long reason " * 30 + "Fix: use fewer devices."
    short = _explorer.short_error(long)
    assert short.endswith("Fix: use fewer devices.") and len(short) <= 260
    assert _explorer.short_error("short. Fix: x") == "short. Fix: x"
    # the status lines wrap instead of cutting the line (a Label's ellipsis would hide the Fix)
    ex = Explorer(model="gpt", size="tiny", cluster="cpu:8", autostart=False)
    assert "autoplan-status" in ex._status._dom_classes
    assert "autoplan-status" in ex._launch_status._dom_classes
    assert ".autoplan-explorer .autoplan-status {white-space: normal !important" in _explorer._CSS


def test_the_plot_view_holds_its_whole_figure_and_serves_plotly_js(intra_plan):
    fig = sharding_figure(intra_plan)
    view = PlotView(fig)
    assert view.figure == figure_json(fig)
    assert view.to_figure().layout.title.text == fig.layout.title.text
    sent = []
    view.send = lambda content, buffers=None: sent.append((content, buffers))
    view._on_message(view, {"type": "plotly.js?"}, [])
    assert sent[0][0] == {"type": "plotly.js"} and sent[0][1] == [plotly_js_bytes()]
    assert b"window.Plotly" in sent[0][1][0]
    clicks = []
    view.on_click(clicks.append)
    view._on_message(view, {"type": "click", "trace": 2, "point": [0], "customdata": [1]}, [])
    assert clicks == [{"trace": 2, "point": [0], "x": None, "y": None, "customdata": [1]}]
    # the widget state is the figure (tens of kilobytes), never plotly.js (megabytes)
    state = view.get_state()
    assert len(json.dumps(state, default=str)) < 200_000
    assert "window.Plotly = Plotly" not in json.dumps(state, default=str)


# ---- with a real search -----------------------------------------------------------------------
def test_candidates_list_equivalent_plans_once(explorer):
    res = explorer.result
    plans = explorer.plans
    assert plans == res.plans and len(plans) >= 4
    groups = equivalent_groups(plans)
    assert [v for _, v in explorer._candidate.options] == [g[0] for g in groups]
    assert len(groups) < len(plans)  # 8x1 and 1x8 are one plan here
    labels = [label for label, _ in explorer._candidate.options]
    for label, g in zip(labels, groups):
        p = plans[g[0]]
        assert label.startswith(f"{g[0]}. {p.label}: {p.describe()}")
        assert all(f"= #{j}" in label for j in g[1:])
    assert explorer.candidates == [plans[g[0]] for g in groups]
    assert any(p.label.startswith("baseline") for p in plans)
    assert explorer._progress.value == 1.0 and "plans for gpt (tiny) on cpu:8" in explorer._status.value
    assert not explorer._launch_button.disabled
    assert explorer._errors.outputs == ()


def test_every_view_holds_the_figure_of_the_selected_plan(explorer):
    res = explorer.result
    j = next(k for k, p in enumerate(res.plans) if p.is_pipeline)
    views = dict(explorer.figures)
    for index in (0, j):
        plan = explorer.select(index)
        assert plan is res.plans[index] is explorer.plan
        want = {"sharding": sharding_figure(plan), "stage": stage_figure(plan),
                "memory": memory_figure(plan), "timeline": timeline_figure(plan),
                "graph": graph_figure(plan), "compare": compare_figure(res.plans, highlight=index)}
        for name, fig in want.items():
            assert shown(explorer.figures[name]) == figure_json(fig), name
        assert plan.label in explorer._summary.value
        assert explorer.code.code == plan.to_code()
    assert all(explorer.figures[n] is views[n] for n in FIGURES)  # the same widgets throughout
    with pytest.raises(IndexError):
        explorer.select(len(res.plans))
    # selecting a plan merged into another's entry selects that entry
    g = next(g for g in equivalent_groups(res.plans) if len(g) > 1)
    explorer.select(g[1])
    assert explorer._candidate.value == g[0]
    explorer.select(0)


def test_the_display_carries_a_static_snapshot_of_the_plan(explorer, monkeypatch):
    """After the widget, the display shows a static snapshot (no script) that a front end
    without the widget's kernel shows: the selected plan, the candidates and the figures'
    numbers; it follows the selection; the live widget hides it."""
    import IPython.display  # noqa: PLC0415

    shown = []

    class Handle:
        def __init__(self):
            self.pages = []

        def update(self, obj):
            self.pages.append(obj.data)

    def display(obj, display_id=None):
        shown.append(obj)
        return Handle() if display_id else None

    monkeypatch.setattr(IPython.display, "display", display)
    res = explorer.result
    plan = explorer.select(0)
    explorer._ipython_display_()
    assert shown[0] is explorer.widget
    page = shown[1].data
    # the widget holds the same snapshot (shown where it is drawn from saved state, disconnected)
    assert explorer._saved_snapshot.value == page and explorer._saved_snapshot in explorer.widget.children
    assert (".autoplan-explorer.jupyter-widgets-disconnected .autoplan-static {display: block;}"
            in _explorer._CSS)
    assert "class='autoplan-static'" in page and ".autoplan-static {display: none;}" in _explorer._CSS
    assert "<script" not in page and plan.label in page and plan.describe() in page
    assert explorer._status.value.split(";")[0] in page
    assert all(f"#{k}" in page for _, k in explorer._candidate.options)
    assert "\u2605 best" in page  # the shown plan is the best
    # where the step time goes: the parts as the comparison draws them, and the step time
    unit = _explorer.time_unit(max(p.predicted.step_time for p in explorer.plans))
    for name, v in cost_parts(plan).items():
        if v:
            assert f"<td>{name}</td><td>{_explorer.fmt_in_unit(v, unit)}</td>" in page
    for s in plan.stages:
        assert f"<td>stage {s.index}</td><td>{', '.join(s.layers)}</td>" in page
    # the snapshot follows the selection
    handle = explorer._snapshots[-1]
    other = explorer.select(next(k for k, p in enumerate(res.plans) if p.is_pipeline != plan.is_pipeline))
    assert other.describe() in handle.pages[-1]
    assert explorer._saved_snapshot.value == handle.pages[-1]
    explorer.select(0)
    explorer._snapshots.clear()
    explorer._saved_snapshot.value = ""


def test_a_candidate_change_from_the_page_runs_off_the_main_thread(explorer):
    explorer.select(0)
    k = explorer._candidate.options[1][1]
    explorer._candidate.value = k  # what the page's Dropdown does
    explorer.wait_idle(120)
    assert explorer.plan is explorer.plans[k]
    explorer.select(0)


def shapes(explorer, name, kind="highlight"):
    return [s for s in explorer.figures[name].figure_layout.get("shapes", []) if s.get("name") == kind]


def test_layer_selection_highlights_it_in_every_view(explorer):
    plan = explorer.select(0)
    explorer.select_layer("layers_0")
    assert explorer.focus == "layer:layers_0"
    cols = explorer.figures["sharding"].figure_layout["meta"]["columns"]
    hit = [k for k, c in enumerate(cols) if "layers_0" in c["layers"]]
    boxes = shapes(explorer, "sharding")
    assert [round(b["x0"]) for b in boxes] == hit and shapes(explorer, "sharding", "dim")
    # the mined subgraphs dim every segment but the layer's
    bars = next(t for t in explorer.figures["graph"].data if t["meta"]["kind"] == "layers")
    assert [o == 1.0 for o in bars["marker"]["opacity"]] == [n == "layers_0" for n in bars["meta"]["names"]]
    # the stage owning it is outlined in the stage view
    stage = next(s for s in plan.stages if "layers_0" in s.layers)
    assert shapes(explorer, "stage") and "layers_0" in explorer._focus_info.value
    assert f"stage {stage.index}" in explorer._focus_info.value
    # clearing restores every view to the figure as drawn
    explorer.clear_selection()
    assert explorer.focus == ""
    assert shown(explorer.figures["sharding"]) == figure_json(sharding_figure(plan))
    assert shown(explorer.figures["stage"]) == figure_json(stage_figure(plan))
    with pytest.raises(ValueError, match="not a layer or stage"):
        explorer.select_layer("no_such_layer")


def test_stage_selection_on_a_pipeline_plan(explorer):
    j = next(k for k, p in enumerate(explorer.plans) if p.is_pipeline)
    plan = explorer.select(j)
    last = plan.stages[-1]
    explorer.select_stage(last.index)
    tl = [t for t in explorer.figures["timeline"].data if t["meta"]["kind"] == "events"]
    assert all((t["opacity"] == 1.0) == (t["meta"]["stage"] == last.index) for t in tl)
    mem = explorer.figures["memory"].data[0]["marker"]["opacity"]
    assert mem == [1.0 if s.index == last.index else _explorer.DIM for s in plan.stages]
    img = next(t for t in explorer.figures["stage"].data if t["meta"]["kind"] == "devices")
    base = next(t for t in figure_json(stage_figure(plan))["data"] if t["meta"]["kind"] == "devices")
    per = img["meta"]["per_host"]
    for d in range(plan.cluster.num_devices):  # the other stages' devices are faded
        h, k = divmod(d, per)
        assert (img["z"][h][k] == base["z"][h][k]) == (d in last.device_ids)
    explorer.clear_selection()
    explorer.select(0)


def click(explorer, figure, kind, point=0, **extra):
    data = explorer.figures[figure].data
    k = next(i for i, t in enumerate(data) if (t.get("meta") or {}).get("kind") == kind)
    t = data[k]
    cd = t.get("customdata")
    event = {"trace": k, "point": [point], "x": None, "y": None,
             "customdata": cd[point] if cd else None, **extra}
    explorer.on_figure_click(figure, event)
    return t


def test_clicks_select_layers_stages_and_pin_targets(explorer):
    plan = explorer.select(0)
    hover = click(explorer, "sharding", "tensors", point=0)
    op, tensor = hover["customdata"][0][:2]
    layer = _explorer.op_layers(plan)[op]
    assert explorer.focus == f"layer:{layer}"
    names = {i.name for i in plan.inputs}
    w = next(t.name for o in plan.ops if o.op == op for t in o.tensors if t.role == "weight")
    assert explorer._state.pin_target == (tensor if tensor in names else w)
    explorer.clear_selection()
    # the stage view's image: a click at row 0, column 3 selects device 3's stage
    k = next(i for i, t in enumerate(explorer.figures["stage"].data) if t["meta"]["kind"] == "devices")
    explorer.on_figure_click("stage", {"trace": k, "point": [0, 3], "x": 3, "y": 0})
    assert explorer.focus == f"stage:{next(s.index for s in plan.stages if 3 in s.device_ids)}"
    explorer.clear_selection()
    click(explorer, "graph", "layers", point=2)
    assert explorer.focus == "layer:layers_1"
    click(explorer, "timeline", "events")
    assert explorer.focus == "stage:0"
    explorer.clear_selection()
    click(explorer, "memory", "memory")
    assert explorer.focus == "stage:0"
    explorer.clear_selection()
    # the comparison: clicking a point selects its plan
    pts = next(t for t in explorer.figures["compare"].data if t["meta"]["kind"] == "plans")
    target = pts["customdata"][-1][0]
    click(explorer, "compare", "plans", point=len(pts["customdata"]) - 1)
    explorer.wait_idle(120)
    assert explorer.plan is explorer.plans[target] or explorer._candidate.value == target
    explorer.select(0)
    assert explorer._errors.outputs == ()


def test_drill_down_into_a_layer(explorer):
    explorer.select(0)
    explorer.select_layer("layers_1")
    explorer.drill_down(True)
    meta = explorer.figures["sharding"].figure_layout["meta"]
    assert meta["layer"] == "layers_1"
    assert len(meta["columns"]) == sum(1 for n in _explorer.op_layers(explorer.plan).values()
                                       if n == "layers_1")
    explorer.drill_down(False)
    assert explorer.figures["sharding"].figure_layout["meta"]["layer"] is None
    explorer.clear_selection()


def test_what_if_pin_re_solves_compares_and_undoes(explorer):
    i0 = next(i for i, p in enumerate(explorer.plans) if not p.is_pipeline)
    before = explorer.select(i0)
    n = len(explorer.plans)
    name = "params['layers'][0]['mlp']['fc1']['kernel']"
    assert explorer.set_pin_target(name) == name
    choices = explorer.pin_choices()
    current = next(i for i in before.inputs if i.name == name).spec
    assert choices[0][1] == current and "(current)" in choices[0][0]
    assert len(choices) > 2 and len({c[1] for c in choices}) == len(choices)
    spec = choices[1][1]
    assert explorer.what_if(name, spec)
    explorer.wait_idle(300)
    assert explorer._errors.outputs == ()
    after = explorer.plan
    assert len(explorer.plans) == n + 1 and after is explorer.plans[-1]
    assert after.label.startswith("what-if: ") and name in after.label
    assert next(i for i in after.inputs if i.name == name).spec == spec
    assert after.mesh_shape == before.mesh_shape
    # the comparison shows both plans and the difference broken down
    cmp = explorer.figures["compare"]
    diff = next(t for t in cmp.data if t["meta"]["kind"] == "difference")
    assert diff["meta"]["seconds"][-1] == pytest.approx(after.predicted.step_time
                                                        - before.predicted.step_time)
    assert next(t for t in cmp.data if t["meta"]["kind"] == "reference")["meta"]["plan"] == i0
    assert "step time" in explorer._pins_html.value and "&rarr;" in explorer._pins_html.value
    # pins stack: a second pin keeps the first
    other = "params['layers'][1]['mlp']['fc1']['kernel']"
    explorer.set_pin_target(other)
    assert explorer.what_if(other, explorer.pin_choices()[1][1])
    explorer.wait_idle(300)
    second = explorer.plan
    assert next(i for i in second.inputs if i.name == name).spec == spec
    assert explorer.undo() is after and explorer.plan is after
    assert explorer.undo() is before and explorer.plan is before
    assert explorer.undo() is None and len(explorer.plans) == n
    # pipeline plans take no pins: said in the panel, refused by the API
    j = next(k for k, p in enumerate(explorer.plans) if p.is_pipeline)
    explorer.select(j)
    target = explorer.set_pin_target(explorer.plan.inputs[0].name)
    assert target and "pins apply to intra-operator plans" in explorer._pin_info.value
    with pytest.raises(autoplan.SearchError, match="intra-operator"):
        explorer.what_if(target, explorer.pin_choices()[0][1])
    explorer.select(0)


def test_a_repeated_search_is_instant_and_settings_changes_compare(explorer):
    res = explorer.result
    best = explorer.select(0)
    assert explorer.search()
    explorer.wait_idle(60)
    assert explorer.result is res  # the same result, from this explorer's memo
    assert "repeated search" in explorer._status.value
    # a changed setting searches again and compares with the previous answer
    explorer._budget.value = "1 GiB"  # every tiny plan fits
    assert explorer.search()
    explorer.wait_idle(SEARCH_TIMEOUT)
    assert explorer.result is not res
    ref = next(t for t in explorer.figures["compare"].data if t["meta"]["kind"] in ("reference",
                                                                                      "plans"))
    assert ref is not None and "previous answer" in explorer._summary.value
    explorer._budget.value = "0"
    explorer.search()
    explorer.wait_idle(60)
    assert explorer.result is res and explorer.plan == best


def test_the_first_candidates_show_before_the_pipeline_search_ends(monkeypatch, explorer):
    res = explorer.result
    intra = [p for p in res.plans if not p.is_pipeline and not p.label.startswith("baseline")]
    seen = []

    def staged(workload, cluster, **kwargs):
        part = type(res)(best=intra[0], plans=intra, stats={"partial": True}, graph=res.graph)
        kwargs["partial"](part)
        seen.append([label for label, _ in ex._candidate.options])
        seen.append(ex._status.value)
        return res

    monkeypatch.setattr(autoplan, "search", staged)
    ex = Explorer(model="gpt", size="tiny", cluster="cpu:8", autostart=False)
    ex.search()
    ex.wait_idle(120)
    assert len(seen[0]) == len(equivalent_groups(intra)) < len(ex._candidate.options)
    assert "intra-operator plans so far" in seen[1]
    assert ex.result is res


def staged_search(res, during=None):
    """A search that hands the explorer the real result's intra-operator plans as its partial
    result (their best first), runs ``during(explorer)`` and returns the real result."""
    intra = [p for p in res.plans if not p.is_pipeline and not p.label.startswith("baseline")]
    part = type(res)(best=intra[0], plans=intra, stats={"partial": True}, graph=res.graph)
    box = {}

    def staged(workload, cluster, **kwargs):
        kwargs["partial"](part)
        box["partial plan"] = box["explorer"].plan
        if during is not None:
            during(box["explorer"])
        return res

    return staged, part, box


def assert_page_shows(ex, plan):
    """Every part of the page shows ``plan``: the candidate box, summary, figures, the
    comparison's star, the code pane and what Launch would run."""
    index = ex.plans.index(plan)
    assert ex.plan is plan and ex._candidate.value == index
    assert plan.label in ex._summary.value and plan.describe() in ex._summary.value
    want = {"sharding": sharding_figure(plan), "stage": stage_figure(plan),
            "memory": memory_figure(plan), "timeline": timeline_figure(plan),
            "graph": graph_figure(plan), "compare": compare_figure(ex.plans, highlight=index)}
    for name, fig in want.items():
        assert shown(ex.figures[name]) == figure_json(fig), name
    fig = shown(ex.figures["compare"])
    pts = next(t for t in fig["data"] if t["meta"]["kind"] == "plans")
    stars = [cd for cd, sym in zip(pts["customdata"], pts["marker"]["symbol"]) if sym == "star"]
    assert len(stars) == 1 and index in stars[0] and fig["layout"]["meta"]["highlight"] == index
    assert ex.code.code == plan.to_code() and not ex._launch_button.disabled


def test_the_final_result_shows_its_best_after_the_partial_one(monkeypatch, explorer):
    res = explorer.result
    staged, part, box = staged_search(res)
    assert not (part.best.label == res.best.label and part.best.describe() == res.best.describe())
    monkeypatch.setattr(autoplan, "search", staged)
    ex = box["explorer"] = Explorer(model="gpt", size="tiny", cluster="cpu:8", autostart=False)
    ex.search()
    ex.wait_idle(120)
    assert box["partial plan"] is part.best  # the partial result's best while the search ran
    assert_page_shows(ex, res.best)  # then the final result's best, everywhere
    assert f"best: {res.best.label}" in ex._status.value and "not the best" not in ex._status.value


def test_a_candidate_picked_during_the_search_stays_selected(monkeypatch, explorer):
    res = explorer.result
    staged, part, box = staged_search(res, during=lambda ex: ex.select(2))
    monkeypatch.setattr(autoplan, "search", staged)
    ex = box["explorer"] = Explorer(model="gpt", size="tiny", cluster="cpu:8", autostart=False)
    ex.search()
    ex.wait_idle(120)
    picked = part.plans[2]
    kept = next(p for p in res.plans if p.label == picked.label and p.describe() == picked.describe())
    assert_page_shows(ex, kept)
    assert f"best: {res.best.label}" in ex._status.value
    assert f"showing #{ex.plans.index(kept)} {kept.label}" in ex._status.value
    assert "not the best" in ex._status.value
    # the next search (the same settings: this explorer's memo) ends on the best again
    monkeypatch.setattr(autoplan, "search", lambda *a, **k: pytest.fail("memo expected"))
    ex.search()
    ex.wait_idle(60)
    assert_page_shows(ex, res.best)


def test_the_launch_panel_is_cleared_when_the_model_changes(explorer, monkeypatch):
    res = explorer.result
    plan = explorer.select(0)
    rec = _explorer.LaunchRecord(plan=plan, spec={}, num_processes=2, devices_per_process=4,
                                 steps=2, context=("gpt", "tiny", "cpu:8"))
    explorer.last_launch = rec
    explorer._launch_result.value = "<div>launch finished: 591x the prediction</div>"
    explorer._launch_table.value = "<table>...</table>"
    # the same model and cluster: the panel stays
    explorer._apply_result(res, explorer._state.search_key_now, ("gpt", "tiny", "cpu:8"))
    assert explorer.last_launch is rec and "launch finished" in explorer._launch_result.value
    # another size (or model, or cluster): cleared
    explorer._apply_result(res, ("other",), ("gpt", "1.3B", "p3.16xlarge:2"))
    assert explorer.last_launch is None and explorer._launch_result.value == ""
    assert explorer._launch_table.value == "" and "no launch yet for gpt" in explorer._launch_status.value
    assert explorer.figures["launch"].data[0]["y"] == []
    explorer._apply_result(res, ("gpt-again",), ("gpt", "tiny", "cpu:8"))


def test_the_summary_names_a_users_layers_and_its_throughput(in_user_folder):
    ex = Explorer("optax_mlp:workload", cluster="cpu:8", level="exhaustive")
    ex.wait_idle(SEARCH_TIMEOUT)
    assert ex.result is not None, ex._errors.outputs
    intra = next(k for k, p in enumerate(ex.plans) if not p.is_pipeline)
    plan = ex.select(intra)
    assert plan.predicted.throughput > 0  # from the batch dimension (16 samples)
    assert "throughput 0.0" not in ex._summary.value
    assert "layers named from parameter paths: params[0], params[1], params[2]" in ex._summary.value
    cols = ex.figures["sharding"].figure_layout["meta"]["columns"]
    assert {n for c in cols for n in c["layers"]} == {"params[0]", "params[1]", "params[2]"}
    assert "(root)" not in json.dumps(ex.figures["sharding"].figure_layout["xaxis"]["ticktext"])


def test_a_traced_graph_and_a_workload_object_are_explored(monkeypatch):
    wl = models.get("mlp", "tiny")
    graph = autoplan.trace(wl)
    ex = Explorer(graph, cluster="cpu:8")
    ex.wait_idle(SEARCH_TIMEOUT)
    assert ex.result is not None, ex._errors.outputs
    assert not any(p.is_pipeline for p in ex.plans)  # a graph: intra-operator plans only
    assert ex._model.value == graph.name and ex._size.disabled
    assert ex.plan.predicted.throughput > 0  # the batch inputs' leading dimension
    with pytest.raises(autoplan.LaunchError, match="traced graph"):
        ex.launch_spec()
    user = autoplan.Workload(wl.fn, wl.args, wl.arg_kinds, name="my_mlp")
    ex = Explorer(user, cluster="cpu:8", autostart=False)
    assert ex._model.value == "my_mlp" and ex._get_workload() is user
    with pytest.raises(autoplan.LaunchError, match="module:function"):
        ex.launch_spec()


def test_a_memory_budget_no_plan_fits_is_reported():
    ex = Explorer(model="mlp", size="tiny", cluster="cpu:8", memory_budget=1024)
    ex.wait_idle(SEARCH_TIMEOUT)
    assert ex.result is None
    assert "InfeasiblePlanError" in ex._status.value
    assert "InfeasiblePlanError" in "".join(o.get("text", "") for o in ex._errors.outputs)


def test_launch_streams_losses_and_reports_the_result(explorer):
    plan = explorer.select(0)
    assert plan.num_devices == 8
    assert explorer.launch(steps=3)
    explorer.wait_idle(900)
    rec = explorer.last_launch
    assert rec is not None and rec.done and rec.error is None, (rec, explorer._errors.outputs)
    assert (rec.num_processes, rec.devices_per_process) == (2, 4)
    assert rec.spec == {"model": "gpt", "size": "tiny"}
    losses = rec.losses
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert {e["process"] for e in rec.step_events} == {0, 1}
    assert rec.matched is True
    assert rec.measured_step_time and rec.measured_step_time > 0
    for x in losses:
        assert f"{x:.6f}" in explorer._launch_table.value
    fig = explorer.figures["launch"]
    assert fig.data[0]["y"] == pytest.approx(losses)
    assert len(fig.data[1]["y"]) == 3
    unit = fig.figure_layout["meta"]["unit"]
    scale = {"s": 1.0, "ms": 1e-3, "\u00b5s": 1e-6}[unit]
    assert fig.data[2]["y"] == pytest.approx([plan.predicted.step_time / scale] * 2)
    assert fig.figure_layout["yaxis2"]["title"]["text"] == f"step time ({unit}, log)"
    html = explorer._launch_result.value
    assert "launch finished" in html and "matched single-device results" in html
    assert "x the prediction: the prediction is the cost model of the preset cluster" in html
    assert f"{losses[-1]:.6f}" in html and f"{plan.predicted.step_time * 1e3:.3f} ms" in html
    assert explorer._launch_status.value.startswith("finished: 3 steps")


def test_a_pipeline_plan_launches_on_two_processes(explorer):
    j = next(k for k, p in enumerate(explorer.plans) if p.is_pipeline and p.num_devices == 8)
    plan = explorer.select(j)
    assert explorer.launch(steps=2)
    explorer.wait_idle(900)
    rec = explorer.last_launch
    assert rec is not None and rec.error is None, (rec, explorer._errors.outputs)
    assert (rec.num_processes, rec.devices_per_process) == (2, 4)
    assert rec.matched is True and len(rec.losses) == 2
    assert rec.plan is plan and "launch finished" in explorer._launch_result.value
    explorer.select(0)


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


def test_stage_view_cells_map_back_to_devices():
    for per, hosts in ((8, 2), (64, 1), (40, 3)):
        meta = {"per_host": per, "width": min(per, 16), "rows_per_host": -(-per // min(per, 16))}
        cell = _explorer._cell_of(meta)
        for d in range(per * hosts):
            assert _explorer._device_at(meta, *cell(d)) == d
        assert _explorer._device_at(meta, 0, 16) is None
