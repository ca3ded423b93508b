"""The interactive plan explorer: search, inspect, question and launch plans from a notebook.

:class:`Explorer` is an ipywidgets layer over the static figures of :mod:`autoplan.viz`:

* controls for the workload (a zoo name and size, a user's ``module:function`` typed into the
  model box, or a workload object or traced graph passed in), the cluster (a preset and its node
  count), the search level (``auto`` by default), the pipeline schedule and micro-batches, and a
  per-device memory budget; **Search** runs ``autoplan.search`` in a background thread, shows the
  intra-operator candidates as soon as they are ranked (before the pipeline search ends), and
  keeps every result of the session, so a repeated search with the same settings is instant;
* a candidate selector over the ranked plans (equivalent plans, the same shardings up to swapping
  mesh axes, listed once), a full-width summary, and seven views: operator sharding (folded by
  layer class, with a drill-down into one layer), stages on the cluster, memory per device,
  the mined subgraphs (segments coloured by class, critical nodes, fold ratio, ILPs), the
  pipeline timeline, the comparison of all plans (against the previous answer or the plan
  before a what-if), and the launch;
* linked selection: clicking an operator, a device, a stage's memory bar, a timeline bar or a
  mined segment selects its layer or stage, and every view highlights it;
* what-if: clicking a tensor in the sharding view picks a graph input (the operator's weight for
  an activation), a spec from its candidates on the plan's mesh pins it, and a re-solve with
  ``search(..., pins=...)`` adds the new plan beside the old one, with the cost difference broken
  down; **undo** takes the last pin back;
* a code pane with ``plan.to_code()`` and a copy button;
* a Launch button that runs the selected plan with :func:`autoplan.exec.launch` on the devices
  attached, as ``autoplan launch`` does (platform and worker counts detected: one worker per
  GPU, or emulated CPU devices in 2 processes when no accelerator is attached; pipeline plans
  run their stages on their own submeshes across the processes), streams each step's loss and
  step time, and at the end shows the measured step time against the prediction and whether
  the run matched single-device results. The panel is cleared when the model, size or cluster
  changes.

Every figure is a :class:`~autoplan.viz._widget.PlotView`: its whole state is one synced trait,
so the views are right after the first search, after a page reload and in a reopened notebook
whose kernel still runs, and plotly.js is loaded once per page (never stored in the notebook).
Displaying the explorer also shows a static snapshot after the widget (:meth:`Explorer.static_html`:
the status, the candidates, the selected plan's summary and its figures' numbers), kept up to
date and hidden by the live widget, for a front end without the widget's kernel; the widget holds
the same snapshot in its state, shown where it is drawn from the state saved with the notebook
and no kernel holds it (JupyterLab with ``saveState``, see docs/explorer.md). Searches, redraws and
launches run in background threads, so the kernel stays free; every error is written into the
explorer's ``Output``. The explorer reaches ``autoplan.search`` and ``autoplan.exec`` only when
asked to (imports inside the methods), so importing :mod:`autoplan.viz` imports neither.

Example (in a notebook)::

    from autoplan.viz import Explorer
    ex = Explorer(model="gpt", size="tiny", cluster="cpu:8")   # starts the search
    ex                                                          # shows the widget
    ex.wait_idle(300); ex.select(1); ex.select_layer("layers_0"); ex.launch()
"""

from __future__ import annotations

import atexit
import copy
import html
import json
import math
import re
import statistics
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ipywidgets as widgets

import autoplan
from autoplan.costs._cluster import PRESETS, Cluster
from autoplan.plans._plan import LEVELS, Plan
from autoplan.plans._spec import Spec
from autoplan.viz._graph_figure import graph_figure
from autoplan.viz._timeline import memory_figure, stage_figure, timeline_figure

from .._errors import (
    ArgumentError,
    ArgumentIndexError,
    AutoplanError,
    ModelError,
    SearchError,
    StateError,
    WaitTimeoutError,
)
from ._compare import compare_figure, cost_parts, equivalent_groups
from ._sharding import op_layers, sharding_figure
from ._style import TEMPLATE, axis_ticks, fmt_bytes, fmt_in_unit, fmt_sig, id_span, time_unit
from ._widget import CodeView, PlotView

__all__ = ["Explorer", "LaunchRecord", "FIGURES", "LEVELS"]

#: the cluster control's entry for this machine's measured profile (``Cluster.parse("local")``)
LOCAL_LABEL = "this machine (measured)"

SCHEDULES = ("1f1b", "gpipe", "interleaved", "zb-h1", "auto")
MICROBATCH_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128)
FIGURES = ("sharding", "stage", "memory", "graph", "timeline", "compare", "launch")
AUTO = 0  # the micro-batches Dropdown's value for "searched" (ipywidgets shows None as blank)
NO_SIZE = "-"  # the size Dropdown's value for a user's workload (it has no zoo sizes)
DIM = 0.25  # opacity of what is not selected
HIGHLIGHT_LINE = "#111111"
_CSS = ("<style>.autoplan-explorer pre {white-space: pre-wrap; font-size: 11px; line-height: 1.3;"
        " margin: 2px 0;}"
        ".autoplan-explorer .autoplan-plan table {font-size: 12px; border-collapse: collapse;}"
        ".autoplan-explorer .autoplan-plan td, .autoplan-explorer .autoplan-plan th "
        "{padding: 1px 8px; text-align: left;}"
        ".autoplan-explorer .autoplan-section {font-weight: 600; margin-top: 8px;}"
        ".autoplan-explorer table.autoplan-diff td {padding: 1px 10px; text-align: right;}"
        ".autoplan-explorer .autoplan-status {white-space: normal !important; overflow: visible"
        " !important; height: auto !important; line-height: 1.3;}"
        # the live widget hides the static snapshots shown for front ends without it; drawn
        # from the state saved with the notebook, without its kernel (ipywidgets marks it
        # disconnected), it shows the one it holds, as current as its state: its figures cannot
        # be drawn there
        ".autoplan-static {display: none;}"
        ".autoplan-explorer.jupyter-widgets-disconnected .autoplan-static {display: block;}"
        "</style>")


@dataclass
class LaunchRecord:
    """One launch of a plan from the explorer (``Explorer.last_launch``).

    Attributes:
        plan: the plan launched; ``spec`` the workload spec given to ``autoplan.exec.launch``.
        num_processes, devices_per_process, steps: how it ran (0 devices until the launcher has
            chosen the layout); ``layout`` says it in words (platform included).
        context: ``(model, size, cluster)`` of the search the plan came from.
        handle: the ``LaunchHandle`` (None until the launch has started).
        events: every event polled from the handle, in order.
        result: the ``LaunchResult`` (None until finished).
        error: an error message when the launch failed, else None.
        started, finished: ``time.time()`` stamps (``finished`` None while running).
    """

    plan: Plan
    spec: dict[str, Any]
    num_processes: int
    devices_per_process: int
    steps: int
    context: tuple[str, str, str] = ("", "", "")
    layout: str = ""
    handle: Any = None
    events: list[dict[str, Any]] = field(default_factory=list)
    result: Any = None
    error: str | None = None
    started: float = field(default_factory=time.time)
    finished: float | None = None

    @property
    def done(self) -> bool:
        return self.finished is not None

    @property
    def step_events(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == "step"]

    @property
    def losses(self) -> list[float]:
        """The loss of each step (process 0's; every process computes the same)."""
        if self.result is not None:
            return [float(x) for x in self.result.loss]
        by_step: dict[int, tuple[int, float]] = {}
        for e in self.step_events:
            if e.get("loss") is None:
                continue
            s, p = int(e["step"]), int(e.get("process", 0))
            if s not in by_step or p < by_step[s][0]:
                by_step[s] = (p, float(e["loss"]))
        return [by_step[s][1] for s in sorted(by_step)]

    @property
    def step_times(self) -> list[float]:
        """The time of each step: the slowest process's."""
        if self.result is not None and self.result.step_times:
            per = list(self.result.step_times.values())
            return [max(p[k] for p in per if k < len(p)) for k in range(max(map(len, per)))]
        by_step: dict[int, float] = {}
        for e in self.step_events:
            if e.get("step_time") is None:
                continue
            s = int(e["step"])
            by_step[s] = max(by_step.get(s, 0.0), float(e["step_time"]))
        return [by_step[s] for s in sorted(by_step)]

    @property
    def measured_step_time(self) -> float | None:
        """The median step time after the first step (which includes compilation)."""
        times = self.step_times
        if not times:
            return None
        return statistics.median(times[1:] if len(times) > 1 else times)

    @property
    def final_loss(self) -> float | None:
        losses = self.losses
        return losses[-1] if losses else None

    @property
    def matched(self) -> bool | None:
        """Whether every process matched single-device execution (None when not known)."""
        if self.result is not None:
            return self.result.matched
        flags = [e.get("matched") for e in self.events if e.get("event") == "done"]
        flags = [f for f in flags if isinstance(f, bool)]
        return all(flags) if flags else None

    def __repr__(self) -> str:
        state = "error" if self.error else ("done" if self.done else "running")
        return (f"LaunchRecord({self.plan.label!r}, {self.num_processes}x{self.devices_per_process} "
                f"devices, {state}, {len(self.step_events)} step events)")


_BYTE_UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
               "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12}


def parse_budget(text: Any) -> float | None:
    """The memory budget box's text in bytes: ``"8 GiB"``, ``"512 MiB"``, ``"1.5e9 B"``, a bare
    number of GiB; None (the device's memory) for ``""`` or 0.

    Raises:
        SearchError: anything else, or a negative amount.
    """
    raw = str(text if text is not None else "").strip()
    m = re.fullmatch(r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z]*)", raw)
    unit = (m.group(2).lower() or "gib") if m else None
    if raw and (m is None or unit not in _BYTE_UNITS or float(m.group(1)) < 0
                or not math.isfinite(float(m.group(1)))):
        raise SearchError(f"Explorer: the memory budget should be an amount of memory such as "
                          f"'8 GiB' or '512 MiB' (a bare number is GiB), or empty for the "
                          f"device's memory. Got {raw!r}. Fix: e.g. 8 GiB.")
    v = float(m.group(1)) * _BYTE_UNITS[unit] if raw else 0.0
    return v if v > 0 else None


def fmt_budget(nbytes: float | None) -> str:
    """A memory budget in the unit its size calls for, at most 3 significant digits
    (``"20 KiB"``, ``"8 GiB"``); ``""`` for None (the device's memory)."""
    if not nbytes:
        return ""
    unit, name = next(((2.0 ** p, n) for p, n in ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB"))
                       if nbytes >= 2.0 ** p), (1.0, "B"))
    return f"{fmt_sig(nbytes / unit)} {name}"


def cluster_text(cl: Cluster) -> str:
    """A cluster as the page names it, with its device count: ``cpu:8 (8 devices)``, ``local
    (8 devices, measured)``, ``p3.16xlarge:2 (16 devices)``."""
    n = cl.num_devices
    if cl.name == "local":
        return f"this machine ({n} device{'s' if n != 1 else ''}, measured)"
    return f"{cl.spec} ({n} device{'s' if n != 1 else ''})"


def short_error(text: str, limit: int = 240) -> str:
    """An error message cut to about ``limit`` characters for a status line, keeping its
    ``Fix:`` (and what follows it) whole."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    cut = text.find("Fix:")
    if cut < 0:
        return text[:limit - 1] + "\u2026"
    fix = text[cut:]
    head = max(60, limit - len(fix) - 3)
    return (text[:head].rstrip() + " \u2026 " + fix) if head < cut else text


def _ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.3f} ms"


def _loss(v: Any) -> str:
    return "-" if v is None else f"{float(v):.6f}"


def _is_graph(obj: Any) -> bool:
    from autoplan.tracing._graph import OpGraph  # noqa: PLC0415

    return isinstance(obj, OpGraph)


def spec_choices(shape: Sequence[int], mesh_shape: Sequence[int], axis_names: Sequence[str]
                 ) -> list[tuple]:
    """Every spec of a tensor of ``shape`` on the mesh, replicated first: each mesh axis of more
    than one device unused or splitting one dimension it divides (several axes on a dimension in
    mesh order); as the search enumerates them."""
    from autoplan.search.intra._spec_space import enumerate_specs  # noqa: PLC0415

    cl = Cluster.preset("cpu", 1, devices_per_node=max(1, math.prod(mesh_shape)))
    mesh = cl.logical_mesh(tuple(mesh_shape))
    names = dict(zip(mesh.axis_names, axis_names))
    return [Spec(*[None if not e else tuple(names.get(a, a) for a in e) for e in s])
            for s in enumerate_specs(tuple(shape), mesh)]


def _checked_arguments(workload: Any, model: str, size: str, level: str, schedule: str,
                       microbatches: int | None, memory_budget: float | None
                       ) -> tuple[dict[str, list[str]], Any, str, str]:
    """The Explorer's arguments checked: the zoo's models, the workload (a spec loaded), and the
    model and size to show (a workload's own name and zoo size when given one)."""
    from autoplan.models import list_models  # noqa: PLC0415
    from autoplan.tracing._loader import is_function_spec, load_workload  # noqa: PLC0415
    from autoplan.tracing._workload import as_workload  # noqa: PLC0415

    models = list_models()
    if isinstance(workload, (str, Mapping)):
        workload = load_workload(workload)  # a spec: loaded now, so a bad one fails here
    if workload is not None:
        if not (_is_graph(workload) or (hasattr(workload, "fn") and hasattr(workload, "args"))):
            raise ModelError(
                "Explorer: workload should be a spec ('gpt', 'mypkg.train:workload', a dict), "
                "a workload (an autoplan.Workload or anything with fn and args) or an OpGraph "
                f"from autoplan.trace. Got {type(workload).__name__}. Fix: "
                "Explorer(autoplan.Workload(train_step, (params, opt_state, batch))).")
        if _is_graph(workload):
            model, size = workload.name or "workload", NO_SIZE
        else:
            workload = as_workload(workload, "Explorer")
            # the zoo name, the 'module:function' or the workload's own name; a zoo size only
            # for a zoo workload
            model, size = workload.origin.model, workload.size or NO_SIZE
    if not (model in models or is_function_spec(model) or workload is not None):
        raise ModelError(f"Explorer: model should be one of {sorted(models)} or a user's "
                         f"'module:function'. Got {model!r}. Fix: e.g. model='gpt'.")
    if model in models and size not in models[model] and workload is None:
        raise ModelError(f"Explorer: size should be one of {models[model]} for {model!r}. "
                         f"Got {size!r}.")
    if level not in LEVELS:
        raise SearchError(f"Explorer: level should be one of {LEVELS}. Got {level!r}. "
                          "Fix: level='auto' (default).")
    if schedule not in SCHEDULES:
        raise SearchError(f"Explorer: schedule should be one of {SCHEDULES}. Got {schedule!r}.")
    if microbatches is not None and (not isinstance(microbatches, int) or microbatches <= 0):
        raise SearchError(f"Explorer: microbatches should be None or a positive integer. Got "
                          f"{microbatches!r}.")
    if memory_budget is not None and not (isinstance(memory_budget, int | float)
                                          and memory_budget > 0):
        raise SearchError(f"Explorer: memory_budget should be None or a positive number of "
                          f"bytes. Got {memory_budget!r}. Fix: e.g. memory_budget=8 * 2**30.")
    return models, workload, model, size


#: the Explorers of this process whose background work (a search, a launch) is still running
_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _finish_background_work() -> None:
    """At the interpreter's exit, wait for every Explorer's background threads: a script (or a
    kernel shut down) that ends while a search runs would otherwise stop JAX's compiler inside a
    daemon thread, which aborts the process."""
    for ex in list(_LIVE):
        with ex._lock:
            threads = [t for t in ex._threads.values() if t.is_alive()]
        for t in threads:
            t.join()


class Explorer:
    """Search, compare, inspect, question and launch plans in a notebook.

    Args:
        workload: what to plan: a spec (a zoo name, a user's ``"module:function"``, or a dict
            ``{"model": ..., **kwargs}``, see :mod:`autoplan.tracing._loader`), a workload object (an
            :class:`autoplan.Workload`: a zoo one, whose name, size and config overrides are
            kept, one loaded from ``"module:function"``, or a user's), or an
            :class:`autoplan.OpGraph` from :func:`autoplan.trace` (intra-operator plans only;
            launching needs a workload the workers can import). Changing the model or size in
            the widget replaces it. Default: the zoo's ``model`` at ``size``.
        cluster: a :class:`~autoplan.Cluster` or ``"preset:nodes"`` (``"cpu:8"`` = 8 emulated
            devices on one host).
        model, size: the workload when ``workload`` is None (``model`` may be
            ``"module:function"``; the model box takes either too).
        level: ``"auto"`` (default), ``"exhaustive"``, ``"hierarchical"`` or ``"folded"``.
        schedule: ``"1f1b"``, ``"gpipe"``, ``"interleaved"``, ``"zb-h1"`` or ``"auto"`` (see
            :func:`autoplan.search`).
        microbatches: the number of micro-batches of pipeline plans (None: searched).
        memory_budget: bytes per device the plans must fit (None: the device's memory ranks them).
        autostart: start a search now (in the background).

    Raises:
        ModelError: an unknown model or size. SearchError: a bad level, schedule, number of
            micro-batches or memory budget. ClusterError: a bad cluster.

    Attributes:
        widget: the root ``ipywidgets.VBox`` (displaying the explorer displays it).
        result: the last ``SearchResult`` (None before the first search ranks plans).
        plan: the selected plan (None before).
        last_launch: the last :class:`LaunchRecord` (None before the first launch).
        figures: ``{name: PlotView}`` for ``sharding``, ``stage``, ``memory``, ``graph``,
            ``timeline``, ``compare`` and ``launch``; the same objects for the explorer's life.
        code: the :class:`~autoplan.viz._widget.CodeView` showing ``plan.to_code()``.
    """

    def __init__(self, workload: Any = None, cluster: Cluster | str = "cpu:8", *, model: str = "gpt",
                 size: str = "tiny", level: str = "auto", schedule: str = "1f1b",
                 microbatches: int | None = None, memory_budget: float | None = None,
                 autostart: bool = True) -> None:
        models, workload, model, size = _checked_arguments(
            workload, model, size, level, schedule, microbatches, memory_budget)
        cl = Cluster.parse(cluster)
        self._init_state(models, workload, cl)
        self._build_controls(model, size, cl, level, schedule, microbatches, memory_budget)
        self._build_figures()
        self._build_what_if_and_launch()
        self.widget = self._layout()
        self.widget.add_class("autoplan-explorer")
        self._wire_callbacks()
        if autostart:
            self.search()

    def _init_state(self, models: dict[str, list[str]], workload: Any, cl: Cluster) -> None:
        """The explorer's state before any search: no result, plan, pins or memo."""
        self._models = models
        self._workload = workload
        self._custom_cluster = cl if cl.name not in PRESETS else None
        self.result: Any = None
        self.plan: Plan | None = None
        self.last_launch: LaunchRecord | None = None
        self._lock = threading.RLock()
        self._threads: dict[str, threading.Thread] = {}
        _LIVE.add(self)
        self._quiet = 0
        self._whatif: list[Plan] = []  # plans made by what-if pins, after the result's
        self._pins: list[dict[str, Any]] = []  # {"name", "spec", "before", "plan"}
        self._pin_target: str | None = None
        self._reference: Plan | None = None
        self._reference_note = ""
        self._memo: dict[tuple, Any] = {}
        self._context: tuple[str, str, str] = ("", "", "")
        self._search_key_now: tuple | None = None
        self._base: dict[str, dict[str, Any]] = {}
        self._op_layer: dict[int, str] = {}
        self._stage_of_op: dict[int, int] = {}
        self._generation = 0
        self._picked: Plan | None = None  # the plan the user selected since the search began
        self._cluster_names: dict[str, str] = {}  # cluster spec -> its name with its devices
        self._snapshots: list[Any] = []  # display handles of the static snapshots shown

    def _build_controls(self, model: str, size: str, cl: Cluster, level: str, schedule: str,
                        microbatches: int | None, memory_budget: float | None) -> None:
        """The search controls (model, size, cluster, level, schedule, micro-batches, budget),
        the candidate and layer pickers, and the status and summary lines."""
        models = self._models
        wide = {"description_width": "initial"}
        self._model = widgets.Combobox(options=list(models), value=model, description="model",
                                       placeholder="zoo name or module:function",
                                       ensure_option=False, continuous_update=False, style=wide,
                                       layout=widgets.Layout(width="260px"))
        zoo = model in models and size in models[model]
        self._size = widgets.Dropdown(options=models[model] if zoo else [NO_SIZE],
                                      value=size if zoo else NO_SIZE, description="size",
                                      disabled=not zoo, style=wide,
                                      layout=widgets.Layout(width="130px"))
        # the presets (datasheet profiles), this machine's measured profile ("local": profiled
        # once in the background and cached on disk), and a cluster passed in
        presets = [(n, n) for n in sorted(PRESETS)] + [(LOCAL_LABEL, "local")]
        if self._custom_cluster is not None and cl.name != "local":
            presets.append((cl.name, cl.name))
        self._preset = widgets.Dropdown(options=presets, value=cl.name, description="cluster",
                                        style=wide, layout=widgets.Layout(width="250px"))
        count = cl.devices_per_node if cl.name == "cpu" else cl.nodes
        self._nodes = widgets.BoundedIntText(value=count, min=1, max=4096,
                                             description="devices" if cl.name == "cpu" else "nodes",
                                             disabled=cl.name == "local",
                                             style=wide, layout=widgets.Layout(width="130px"))
        self._level = widgets.Dropdown(options=list(LEVELS), value=level, description="level",
                                       style=wide, layout=widgets.Layout(width="170px"))
        self._schedule = widgets.Dropdown(options=list(SCHEDULES), value=schedule,
                                          description="schedule", style=wide,
                                          layout=widgets.Layout(width="150px"))
        mb_opts = [("auto", AUTO)] + [(str(m), m) for m in MICROBATCH_CHOICES]
        if microbatches is not None and microbatches not in MICROBATCH_CHOICES:
            mb_opts.append((str(microbatches), microbatches))
        self._microbatches = widgets.Dropdown(options=mb_opts, value=microbatches or AUTO,
                                              description="micro-batches", style=wide,
                                              layout=widgets.Layout(width="180px"))
        self._budget = widgets.Text(
            value=fmt_budget(memory_budget), description="memory budget", style=wide,
            placeholder="device memory",
            tooltip="per-device memory the plans must fit, e.g. 8 GiB or 512 MiB (a bare number "
                    "is GiB); empty or 0: the device's memory",
            continuous_update=False, layout=widgets.Layout(width="220px"))
        self._search_button = widgets.Button(description="Search", button_style="primary",
                                             icon="search", tooltip="search plans with these settings")
        self._progress = widgets.FloatProgress(value=0.0, min=0.0, max=1.0,
                                               layout=widgets.Layout(width="240px"))
        # status lines wrap (a Label cuts a long line with an ellipsis: an error's Fix would go)
        self._status = widgets.Label(value="no search yet",
                                     layout=widgets.Layout(flex="1 1 320px", min_width="0"))
        self._status.add_class("autoplan-status")
        self._candidate = widgets.Dropdown(options=[], description="candidate", style=wide,
                                           layout=widgets.Layout(width="760px"))
        self._focus = widgets.Dropdown(options=[("(no selection)", "")], value="",
                                       description="layer", style=wide,
                                       layout=widgets.Layout(width="340px"))
        self._drill = widgets.ToggleButton(value=False, description="drill into layer",
                                           icon="search-plus", disabled=True,
                                           tooltip="show every operator of the selected layer in "
                                                   "the sharding view")
        self._focus_info = widgets.HTML(value="")
        self._summary = widgets.HTML(value="<i>the selected plan's summary shows here</i>",
                                     layout=widgets.Layout(width="100%"))
        self._errors = widgets.Output(layout=widgets.Layout(max_height="240px", overflow="auto"))

    def _build_figures(self) -> None:
        """The figures, created once and updated in place, each answering clicks."""
        self.figures: dict[str, PlotView] = {}
        for name in FIGURES:
            self.figures[name] = PlotView(layout=widgets.Layout(width="100%", min_width="0"))
            self.figures[name].show({"data": [], "layout": {
                "template": TEMPLATE, "height": 300 if name in ("launch", "memory") else 340,
                "title": {"text": f"{name}: run a search" if name != "launch"
                          else "launch: loss and step time per step"}}})
            self.figures[name].on_click(self._guarded("click", self._click_handler(name)))

    def _build_what_if_and_launch(self) -> None:
        """The what-if pin controls, the code view and the launch controls and figure."""
        wide = {"description_width": "initial"}
        self._pin_info = widgets.HTML(value=self._pin_hint())
        self._pin_spec = widgets.Dropdown(options=[], description="spec", style=wide,
                                          layout=widgets.Layout(width="300px"), disabled=True)
        self._pin_button = widgets.Button(description="pin and re-solve", icon="thumb-tack",
                                          disabled=True, tooltip="fix this input's spec and "
                                                                 "search the plan's mesh again")
        self._undo_button = widgets.Button(description="undo", icon="undo", disabled=True,
                                           tooltip="take the last pin back")
        self._pins_html = widgets.HTML(value="")
        self.code = CodeView(layout=widgets.Layout(width="100%"))
        self._steps = widgets.BoundedIntText(value=5, min=2, max=1000, description="steps",
                                             style=wide, layout=widgets.Layout(width="120px"))
        self._launch_button = widgets.Button(description="Launch", button_style="success",
                                             icon="play", disabled=True,
                                             tooltip="run the selected plan on the devices attached")
        self._launch_status = widgets.Label(value="no launch yet",
                                            layout=widgets.Layout(flex="1 1 320px", min_width="0"))
        self._launch_status.add_class("autoplan-status")
        self._launch_table = widgets.HTML(value="")
        self._launch_result = widgets.HTML(value="")
        self._init_launch_figure()

    def _layout(self) -> widgets.VBox:
        """The root widget: controls, figures, what-if, code and launch sections in order."""
        def section(text: str) -> widgets.HTML:
            return widgets.HTML(f"<div class='autoplan-section'>{text}</div>")

        def col(children: list[Any], width: str) -> widgets.VBox:
            return widgets.VBox(children, layout=widgets.Layout(width=width, min_width="0"))

        wrap = widgets.Layout(flex_flow="row wrap", width="100%")
        # the static snapshot as widget state: hidden while the widget is live, shown where the
        # widget is drawn from the state saved with the notebook (see _CSS)
        self._saved_snapshot = widgets.HTML()
        return widgets.VBox([
            widgets.HTML(_CSS + "<b>autoplan explorer</b>: search parallelisation plans, see "
                         "why they win, ask what if, and launch them"),
            widgets.HBox([self._model, self._size, self._preset, self._nodes, self._level,
                          self._schedule, self._microbatches, self._budget], layout=wrap),
            widgets.HBox([self._search_button, self._progress, self._status], layout=wrap),
            self._errors,
            widgets.HBox([self._candidate, self._focus, self._drill], layout=wrap),
            self._focus_info,
            self._summary,
            widgets.HBox([col([self.figures["stage"]], "55%"), col([self.figures["memory"]], "45%")],
                         layout=widgets.Layout(width="100%")),
            self.figures["sharding"],
            section("what if: click a tensor in the sharding view, pick a spec, re-solve"),
            widgets.HBox([self._pin_spec, self._pin_button, self._undo_button], layout=wrap),
            self._pin_info,
            self._pins_html,
            self.figures["graph"],
            self.figures["timeline"],
            self.figures["compare"],
            section("code: the selected plan's mesh and shardings for your training script"),
            self.code,
            section("launch the selected plan on the devices attached (emulated CPU devices when "
                    "there is no accelerator)"),
            widgets.HBox([self._steps, self._launch_button, self._launch_status], layout=wrap),
            widgets.HBox([col([self.figures["launch"]], "58%"),
                          widgets.Box([self._launch_table], layout=widgets.Layout(
                              width="42%", max_height="320px", overflow="auto"))],
                         layout=widgets.Layout(width="100%")),
            self._launch_result,
            self._saved_snapshot,
        ], layout=widgets.Layout(width="100%"))

    def _wire_callbacks(self) -> None:
        """Controls observe their values; buttons run search, launch, pin and undo."""
        self._model.observe(self._on_model, names=["value"])
        self._size.observe(self._on_size, names=["value"])
        self._preset.observe(self._on_preset, names=["value"])
        self._candidate.observe(self._on_candidate, names=["value"])
        self._focus.observe(self._on_focus, names=["value"])
        self._drill.observe(self._on_drill, names=["value"])
        self._search_button.on_click(lambda _b: self.search())
        self._launch_button.on_click(lambda _b: self.launch())
        self._pin_button.on_click(lambda _b: self._guarded("what-if", self._pin_clicked)())
        self._undo_button.on_click(lambda _b: self._guarded("undo", self.undo)())

    # ---- display ---------------------------------------------------------------------------
    def __repr__(self) -> str:
        n = len(self.plans)
        sel = self._candidate.value if self.plan is not None else None
        return (f"Explorer(model={self._model.value!r}, size={self._size.value!r}, "
                f"cluster={self._cluster_spec()!r}, plans={n}, selected={sel})")

    def _ipython_display_(self) -> None:
        """Show the widget, and after it a static snapshot of what it shows
        (:meth:`static_html`), kept up to date as the explorer changes. The live widget hides
        the snapshot; a front end without the widget's kernel (a notebook reopened after its
        kernel is gone, nbconvert, a notebook viewer) shows it: the plan, not only a widget that
        cannot be drawn. The widget holds the same snapshot in its state (kept current through
        the widget's state, which reaches the page where display updates do not): JupyterLab
        saving widget state with the notebook draws the widget from it without its kernel,
        disconnected, and shows that snapshot in it instead of the figures.

        plotly.js is not sent with the widgets: the first view drawn on a page without it asks
        the kernel once (sending 5 MB here would hold the cell's completion on the page for
        seconds while the message crosses the websocket)."""
        from IPython.display import HTML, display  # noqa: PLC0415

        page = self.static_html()
        self._saved_snapshot.value = page
        display(self.widget)
        handle = display(HTML(page), display_id=True)
        if handle is not None:
            self._snapshots.append(handle)

    def _refresh_snapshot(self) -> None:
        """Write the current state into every static snapshot displayed, and into the one the
        widget holds (once the explorer has been displayed)."""
        if not self._snapshots and not self._saved_snapshot.value:
            return
        from IPython.display import HTML  # noqa: PLC0415

        page = self.static_html()
        self._saved_snapshot.value = page
        for handle in self._snapshots:
            handle.update(HTML(page))

    def static_html(self) -> str:
        """A self-contained HTML snapshot of the explorer (no script, no kernel): the status
        line, every candidate with its prediction, the selected plan's summary and
        PartitionSpecs, and its figures' numbers (where the step time goes, memory per stage,
        the stages on the devices)."""
        from ._static import explorer_snapshot  # noqa: PLC0415

        return explorer_snapshot(self)

    # ---- errors and threads ------------------------------------------------------------------
    def _report(self, where: str, err: BaseException) -> None:
        text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        self._errors.append_stdout(f"[{time.strftime('%H:%M:%S')}] {where} failed:\n{text}\n")

    def _guarded(self, where: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as err:  # noqa: BLE001 - shown to the user in the Output
                self._report(where, err)
                return None
        return run

    def _start(self, kind: str, target: Callable[[], None]) -> bool:
        with self._lock:
            t = self._threads.get(kind)
            if t is not None and t.is_alive():
                return False
            t = threading.Thread(target=self._guarded(kind, target), name=f"autoplan-explorer-{kind}",
                                 daemon=True)
            self._threads[kind] = t
            t.start()
            return True

    def wait_idle(self, timeout: float | None = None) -> Explorer:
        """Wait until no search, view update, what-if or launch is running.

        Raises:
            WaitTimeoutError: still busy after ``timeout`` seconds (also a TimeoutError).
        """
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                busy = [t for t in self._threads.values() if t.is_alive()]
            if not busy:
                # from the cell that waits: front ends drop display updates a background thread
                # sends after the cell that displayed the explorer has finished
                self._refresh_snapshot()
                return self
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise WaitTimeoutError(f"Explorer.wait_idle: still running after {timeout} s: "
                                       f"{', '.join(t.name for t in busy)}. Status: {self._status.value!r}; "
                                       f"launch: {self._launch_status.value!r}. Fix: wait longer "
                                       "(a larger timeout, or None), or check the status line.")
            busy[0].join(None if left is None else min(left, 1.0))

    @property
    def busy(self) -> bool:
        with self._lock:
            return any(t.is_alive() for t in self._threads.values())

    # ---- controls --------------------------------------------------------------------------
    def _on_model(self, change: Mapping[str, Any]) -> None:
        self._workload = None
        name = str(change["new"] or "").strip()
        sizes = self._models.get(name)
        if sizes is None:  # a user's module:function (loaded at the next search): no sizes
            self._size.options = [NO_SIZE]
            self._size.value = NO_SIZE
            self._size.disabled = True
            return
        self._size.disabled = False
        self._size.options = sizes
        self._size.value = "tiny" if "tiny" in sizes else sizes[0]

    def _on_size(self, change: Mapping[str, Any]) -> None:
        self._workload = None

    def _on_preset(self, change: Mapping[str, Any]) -> None:
        new = change["new"]
        if new in PRESETS or new == "local":
            self._custom_cluster = None if new in PRESETS else self._custom_cluster
        self._nodes.description = "devices" if new == "cpu" else "nodes"
        self._nodes.disabled = new == "local"

    def _cluster_spec(self) -> str:
        if self._custom_cluster is not None and self._preset.value == self._custom_cluster.name:
            return self._custom_cluster.spec
        if self._preset.value == "local":
            return "local"
        return f"{self._preset.value}:{self._nodes.value}"

    def _cluster(self) -> Cluster:
        """The cluster the controls name. ``local``: this machine's devices as measured by
        :meth:`Cluster.detect` (a quick profile on first use, about half a minute on 8 emulated
        CPU devices, then read from the on-disk cache), called from the search's thread."""
        if self._custom_cluster is not None and self._preset.value == self._custom_cluster.name:
            return self._custom_cluster
        if self._preset.value == "local":
            self._status.value = ("profiling this machine's devices (once: the profile is cached "
                                  "on disk)")
            cl = Cluster.detect(quick=True, progress=False)
            self._custom_cluster = cl
            return cl
        return Cluster.parse(self._cluster_spec())

    def _get_workload(self) -> Any:
        if self._workload is not None:
            return self._workload
        from autoplan.tracing._loader import is_function_spec, load_workload  # noqa: PLC0415

        name = str(self._model.value or "").strip()
        if name not in self._models and not is_function_spec(name):
            raise ModelError(f"Explorer: the model box should hold one of {sorted(self._models)} "
                             f"or a user's 'module:function'. Got {name!r}.")
        size = self._size.value if name in self._models else None
        self._workload = load_workload(name, size=size)
        return self._workload

    def launch_spec(self) -> dict[str, Any]:
        """The workload spec a launch passes to ``autoplan.exec.launch``: ``{"model", "size"}`` and
        the workload's config fields that differ from the size's defaults, or ``{"model":
        "module:function", **kwargs}`` for a user's workload.

        Raises:
            LaunchError: a workload built in the notebook only, or a traced graph (define a
                function returning the workload in a module instead).
        """
        from autoplan._errors import LaunchError  # noqa: PLC0415
        from autoplan.exec import describe_workload  # noqa: PLC0415

        wl = self._get_workload()
        if _is_graph(wl):
            raise LaunchError(
                f"launch: the explorer was given a traced graph ({wl.name}), which holds no "
                "training step the workers can run. Fix: give the explorer the workload as "
                "'module:function' (a function in a module that returns it).")
        return describe_workload(wl)

    def _memory_budget(self) -> float | None:
        return parse_budget(self._budget.value)

    def _options(self) -> dict[str, Any]:
        return {"schedule": self._schedule.value, "microbatches": self._microbatches.value or None,
                "level": self._level.value, "memory_budget": self._memory_budget()}

    # ---- search ----------------------------------------------------------------------------
    def search(self) -> bool:
        """Start a search with the current settings in the background.

        A search whose workload, cluster and options equal an earlier one of this explorer
        shows that result at once. The intra-operator candidates are shown as soon as they are
        ranked; the pipeline candidates and baselines join them when the search ends.

        Returns:
            False (and starts nothing) when a search is already running.
        """
        started = self._start("search", self._search_job)
        if not started:
            self._status.value = "a search is already running"
        return started

    def _progress_cb(self, message: str, fraction: float) -> None:
        self._progress.value = max(0.0, min(1.0, float(fraction)))
        self._status.value = f"{message} ({fraction * 100:.0f}%)"

    def _workload_key(self, wl: Any) -> tuple:
        from autoplan.tracing._loader import workload_spec  # noqa: PLC0415

        if _is_graph(wl):
            return ("graph", wl.fingerprint, id(wl))
        spec = workload_spec(wl)
        if spec is None:
            return ("object", id(wl))
        return ("spec", json.dumps(spec, sort_keys=True, default=str))

    def _search_job(self) -> None:
        self._picked = None
        self._search_button.disabled = True
        self._progress.bar_style = ""
        self._progress.value = 0.0
        t0 = time.perf_counter()
        try:
            self._status.value = f"building {self._model.value}" + (
                f" ({self._size.value})" if self._size.value != NO_SIZE else "")
            wl = self._get_workload()
            cl = self._cluster()
            opts = self._options()
            key = (self._workload_key(wl), json.dumps(cl.to_dict(), sort_keys=True, default=str),
                   json.dumps(opts, sort_keys=True))
            context = (str(self._model.value), str(self._size.value), cl.spec)
            self._cluster_names[cl.spec] = cluster_text(cl)
            res = self._memo.get(key)
            repeated = res is not None
            if res is None:
                kw: dict[str, Any] = dict(opts, pipeline=False if _is_graph(wl) else "auto",
                                          progress=self._progress_cb)
                kw["partial"] = lambda part: self._apply_result(part, key, context, partial=True)
                res = autoplan.search(wl, cl, **kw)
                self._memo[key] = res
        except Exception as err:
            self._progress.bar_style = "danger"
            self._status.value = f"search failed: {type(err).__name__}: {short_error(str(err))}"
            raise
        finally:
            self._search_button.disabled = False
        secs = time.perf_counter() - t0
        self._apply_result(res, key, context)
        self._progress.value = 1.0
        self._progress.bar_style = "success"
        size = None if _is_graph(wl) else wl.size
        name = wl.name or str(self._model.value)
        how = "repeated search: this explorer's earlier result" if repeated else f"in {secs:.1f} s"
        status = (f"{len(res.plans)} plans for {name}{f' ({size})' if size else ''} on {cluster_text(cl)} "
                  f"{how}; best: {res.best.label}, {res.best.describe()}, "
                  f"{_ms(res.best.predicted.step_time)}"
                  + "".join(f"; note: {n}" for n in getattr(res, "notes", ())))
        shown = self.plan
        if shown is not None and not _same_plan(shown, res.best):
            status += (f"; showing #{self._candidate.value} {shown.label}, "
                       f"{_ms(shown.predicted.step_time)}, picked during the search: not the best")
        self._status.value = status
        self._refresh_snapshot()

    def _apply_result(self, res: Any, key: tuple, context: tuple[str, str, str], *,
                      partial: bool = False) -> None:
        with self._lock:
            same_search = key == self._search_key_now
            keep = self.plan if same_search else None
            if not same_search:
                before = self.plan
                self._reference, self._reference_note = None, ""
                if before is not None and context[:2] == self._context[:2] and not before.label.startswith("what-if"):
                    self._reference = before
                    self._reference_note = "the previous answer (before the settings changed)"
                self._whatif, self._pins, self._pin_target = [], [], None
            where = self._cluster_names.get(context[2], context[2])
            if (self.last_launch is not None and self.last_launch.context != context):
                self._clear_launch(f"no launch yet for {context[0]} on {where}")
            elif self.last_launch is None and context != self._context:
                self._launch_status.value = f"no launch yet for {context[0]} on {where}"
            self._search_key_now = key
            self._context = context
            self.result = res
            self._generation += 1
            self._refresh_candidates()
            plans = self.plans
            best = next((k for k, p in enumerate(plans) if p is res.best),
                        next((k for k, p in enumerate(plans) if _same_plan(p, res.best)), 0))
            index = best
            # a candidate the user picked while this search ran stays selected; anything else
            # (the partial result's best, the plan of an earlier search) gives way to the best
            if keep is not None and same_search and self._picked is not None:
                index = next((k for k, p in enumerate(plans) if _same_plan(p, self._picked)),
                             best)
            if partial:
                self._status.value = (f"{len(res.plans)} intra-operator plans so far; searching "
                                      "pipeline plans and baselines")
        self._select(index, picked=False)

    def _refresh_candidates(self) -> None:
        plans = self.plans
        opts = []
        for g in equivalent_groups(plans):
            k = g[0]
            p = plans[k]
            fits = p.predicted.memory_per_device <= p.cluster.device_memory
            same = "".join(f" = #{j} {plans[j].describe().split(' on mesh ')[-1]}" for j in g[1:])
            opts.append((f"{k}. {p.label}: {p.describe()}, {_ms(p.predicted.step_time)}"
                         + same + ("" if fits else " (does not fit)"), k))
        self._quiet += 1
        try:
            self._candidate.options = opts
            self._candidate.value = None
        finally:
            self._quiet -= 1

    # ---- candidate -------------------------------------------------------------------------
    @property
    def plans(self) -> list[Plan]:
        """Every plan the explorer holds: the result's ranked plans, then the what-if plans."""
        return (list(self.result.plans) if self.result is not None else []) + list(self._whatif)

    @property
    def candidates(self) -> list[Plan]:
        """The plans the candidate selector offers, in its order (one per group of equivalent
        plans)."""
        plans = self.plans
        return [plans[v] for _, v in self._candidate.options]

    def select(self, index: int) -> Plan:
        """Select plan ``index`` of :attr:`plans` (a plan of a group of equivalent plans selects
        the group) and update every view (in the calling thread). A plan selected while a
        search runs stays selected when the search ends (the status line then says that it is
        not the best); otherwise every search ends on its best plan.

        Raises:
            StateError: no search result yet. ArgumentIndexError: no such plan.
        """
        return self._select(index, picked=True)

    def _select(self, index: int, *, picked: bool) -> Plan:
        if self.result is None:
            raise StateError("Explorer.select: no search result yet. Fix: run ex.search() and "
                             "ex.wait_idle() first.")
        plans = self.plans
        n = len(plans)
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < n:
            raise ArgumentIndexError(f"Explorer.select: index should be in [0, {n}). Got {index!r}. "
                                     "Fix: pass the index of one of ex.plans.")
        with self._lock:
            shown = {v for _, v in self._candidate.options}
            if index not in shown:  # an equivalent plan: its group's entry
                group = next(g for g in equivalent_groups(plans) if index in g)
                index = next(k for k in group if k in shown)
            self._quiet += 1
            try:
                self._candidate.value = index
            finally:
                self._quiet -= 1
            if picked:
                self._picked = plans[index]
            self._show(index)
            return self.plan  # type: ignore[return-value]

    def _on_candidate(self, change: Mapping[str, Any]) -> None:
        if self._quiet or change["new"] is None:
            return
        # a change from the page: build the figures off the kernel's main thread
        self._start("view", lambda: self.select(change["new"]))

    def _reference_for(self, plan: Plan) -> tuple[Plan | None, str]:
        for p in self._pins:
            if p["plan"] is plan:
                return p["before"], f"before pinning {p['name']} to {p['spec'].pspec_text()}"
        if self._reference is not None and self._reference is not plan:
            return self._reference, self._reference_note
        return None, ""

    def _show(self, index: int) -> None:
        with self._lock:
            plans = self.plans
            plan = plans[index]
            self.plan = plan
            self._op_layer = op_layers(plan)
            self._stage_of_op = {o.op: s.index for s in plan.stages for o in s.ops}
            ref, note = self._reference_for(plan)
            figs = {"stage": stage_figure(plan), "memory": memory_figure(plan),
                    "timeline": timeline_figure(plan),
                    "compare": compare_figure(plans, highlight=index, reference=ref),
                    "graph": self._graph_figure(plan)}
            for name, fig in figs.items():
                self._set_base(name, fig)
            self._summary.value = self._summary_html(plan, note)
            self._refresh_focus_options(plan)
            self._draw_sharding()
            self._highlight(self._focus.value)
            self._launch_button.disabled = False
            self.code.code = plan.to_code()
            self.code.note = (f"plan [{plan.label}] {plan.describe()}; "
                              "shardings_for(args) equals plan.named_shardings(like=args)")
            if self._pin_target is not None and not any(i.name == self._pin_target for i in plan.inputs):
                self._pin_target = None
            self._refresh_pin_panel()
            self._refresh_snapshot()

    def _graph_figure(self, plan: Plan) -> Any:
        import plotly.graph_objects as go  # noqa: PLC0415

        if plan.analysis:
            return graph_figure(plan)
        return go.Figure(layout={"template": TEMPLATE, "height": 200, "title": {
            "text": f"Mined subgraphs: plan [{html.escape(plan.label)}] carries no folding analysis"}})

    def _set_base(self, name: str, fig: Any) -> None:
        from ._widget import figure_json  # noqa: PLC0415

        self._base[name] = figure_json(fig)
        self.figures[name].show(self._base[name])

    def _summary_html(self, plan: Plan, reference_note: str) -> str:
        text = plan.summary()
        # layers that no scope names: the search named them from the parameters they read
        generic = plan.ops and not any(
            o.layer and o.layer.split("/")[-1] in o.scope.split("/") for o in plan.ops)
        layers = ""
        if generic:
            names = list(dict.fromkeys(self._op_layer.values()))
            layers = (f"<br><small>layers named from parameter paths: "
                      f"{html.escape(', '.join(names[:12]))}{' ...' if len(names) > 12 else ''}</small>")
        ref = (f"<br><small>compared with {html.escape(reference_note)}</small>"
               if reference_note else "")
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in plan.notes)
        rows = "".join(
            f"<tr><td><code>{html.escape(i.name)}</code></td><td>{i.kind}</td>"
            f"<td>{'x'.join(map(str, i.shape))}</td><td><code>{html.escape(str(i.spec.to_pspec()))}"
            f"</code></td><td>{i.stage}</td></tr>" for i in plan.inputs[:300])
        more = f"<p>... {len(plan.inputs) - 300} more inputs</p>" if len(plan.inputs) > 300 else ""
        return (f"<div class='autoplan-plan'><pre>{html.escape(text)}</pre>{layers}{ref}"
                f"<details><summary>notes of the search</summary><ul>{notes}</ul></details>"
                "<details><summary>PartitionSpecs</summary><table><tr><th>input</th><th>kind</th>"
                f"<th>shape</th><th>PartitionSpec</th><th>stage</th></tr>{rows}</table>{more}"
                "</details></div>")

    # ---- linked selection ------------------------------------------------------------------
    @property
    def focus(self) -> str:
        """The selection: ``""``, ``"layer:<name>"`` or ``"stage:<index>"``."""
        return self._focus.value

    def _refresh_focus_options(self, plan: Plan) -> None:
        old = self._focus.value
        opts: list[tuple[str, str]] = [("(no selection)", "")]
        shown: set[str] = set()
        layers_of_stage: dict[int, list[str]] = {}
        for op, name in self._op_layer.items():
            st = self._stage_of_op.get(op, 0)
            if name not in layers_of_stage.setdefault(st, []):
                layers_of_stage[st].append(name)
        for s in plan.stages:
            lo, hi = s.layer_range
            opts.append((f"stage {s.index}: layers {lo}-{hi - 1}, mesh "
                         f"{'x'.join(map(str, s.mesh_shape))}", f"stage:{s.index}"))
            names = [n for n in s.layers if n not in ("", "(root)")]
            names += [n for n in layers_of_stage.get(s.index, []) if n not in names]
            for name in names:
                if name in shown:
                    continue
                shown.add(name)
                opts.append((f"  {name} (stage {s.index})", f"layer:{name}"))
        self._quiet += 1
        try:
            self._focus.options = opts
            self._focus.value = old if old in {v for _, v in opts} else ""
        finally:
            self._quiet -= 1
        self._drill.disabled = not self._focus.value.startswith("layer:")

    def select_layer(self, name: str) -> None:
        """Select layer ``name`` of the selected plan and highlight it in every view."""
        self._set_focus(f"layer:{name}")

    def select_stage(self, index: int) -> None:
        """Select stage ``index`` of the selected plan and highlight it in every view."""
        self._set_focus(f"stage:{index}")

    def clear_selection(self) -> None:
        self._set_focus("")

    def drill_down(self, on: bool = True) -> None:
        """Show every operator of the selected layer in the sharding view (``on=False``: the
        folded overview again)."""
        self._quiet += 1
        try:
            self._drill.value = bool(on)
        finally:
            self._quiet -= 1
        with self._lock:
            self._draw_sharding()
            self._highlight(self._focus.value)

    def _set_focus(self, value: str) -> None:
        if self.plan is None:
            raise StateError("Explorer: a candidate should be selected before a layer. Got none. Fix: "
                             "ex.select(0) first.")
        allowed = {v for _, v in self._focus.options}
        if value not in allowed:
            layers = [v.split(":", 1)[1] for v in allowed if v.startswith("layer:")]
            raise ArgumentError(f"Explorer: {value!r} is not a layer or stage of the selected plan; its "
                                f"layers are {layers}. Fix: pass one of them.")
        with self._lock:
            self._quiet += 1
            try:
                self._focus.value = value
            finally:
                self._quiet -= 1
            self._after_focus(value)

    def _on_focus(self, change: Mapping[str, Any]) -> None:
        if self._quiet or self.plan is None:
            return
        with self._lock:
            self._after_focus(change["new"] or "")

    def _on_drill(self, change: Mapping[str, Any]) -> None:
        if self._quiet or self.plan is None:
            return
        self._start("view", lambda: self.drill_down(bool(change["new"])))

    def _after_focus(self, value: str) -> None:
        self._drill.disabled = not value.startswith("layer:")
        if self._drill.value:
            self._draw_sharding()
        self._highlight(value)

    def _draw_sharding(self) -> None:
        plan = self.plan
        if plan is None:
            return
        value = self._focus.value
        layer = value.split(":", 1)[1] if (self._drill.value and value.startswith("layer:")) else None
        from ._widget import figure_json  # noqa: PLC0415

        self._base["sharding"] = figure_json(sharding_figure(plan, layer=layer))

    def _selection(self, value: str) -> tuple[set[int], int | None, set[str]]:
        """The selected planned operator ids, the stage owning the selection and the layers."""
        plan = self.plan
        if not value or plan is None:
            return set(), None, set()
        kind, _, arg = value.partition(":")
        if kind == "stage":
            k = int(arg)
            ops = {o for o, s in self._stage_of_op.items() if s == k}
            st = next((s for s in plan.stages if s.index == k), None)
            return ops, k, set(st.layers if st else ()) | {self._op_layer[o] for o in ops}
        ops = {o for o, name in self._op_layer.items() if name == arg}
        stage = next((self._stage_of_op[o] for o in sorted(ops)), None)
        if stage is None:
            stage = next((s.index for s in plan.stages if arg in s.layers), None)
        return ops, stage, {arg}

    def _highlight(self, value: str) -> None:
        """Draw the selection in every view: the sharding view boxes its columns and dims the
        rest, the stage view outlines the owning stage's devices, the memory and graph views
        and the timeline dim what is not selected."""
        plan = self.plan
        if plan is None:
            return
        ops, stage, layers = self._selection(value)
        on = bool(value)
        cols, hit_cols = self._highlight_sharding(value, ops, stage, layers)
        self._highlight_stage(stage, on)
        self._highlight_memory(plan, stage, on)
        self._highlight_graph(ops, layers, on)
        self._highlight_timeline(stage, on)
        self._describe_selection(plan, value, ops, stage, cols, hit_cols)

    def _highlight_sharding(self, value: str, ops: set[int], stage: int | None, layers: set[str]
                            ) -> tuple[list[dict[str, Any]], list[int]]:
        """Box the sharding view's columns holding a selected operator (or layer, or the selected
        stage's) and dim the rest; returns the columns and the indices of those boxed."""
        on = bool(value)
        fig = copy.deepcopy(self._base["sharding"])
        cols = [c for c in (fig["layout"].get("meta") or {}).get("columns", [])]
        hit_cols = [k for k, c in enumerate(cols)
                    if on and (set(c["ops"]) & ops or set(c["layers"]) & layers
                               or (value.startswith("stage:") and stage in c["stages"]))]
        shapes = list(fig["layout"].get("shapes") or [])
        if on and cols:
            for k in range(len(cols)):
                if k in hit_cols:
                    shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": k + 0.01,
                                   "x1": k + 0.99, "y0": 0.0, "y1": 1.0, "name": "highlight",
                                   "line": {"color": HIGHLIGHT_LINE, "width": 2.5},
                                   "fillcolor": "rgba(0,0,0,0)"})
                else:
                    shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": k,
                                   "x1": k + 1, "y0": 0.0, "y1": 1.0, "name": "dim", "layer": "above",
                                   "line": {"width": 0}, "fillcolor": "rgba(255,255,255,0.7)"})
        _set_shapes(fig, shapes)
        self.figures["sharding"].show(fig)
        return cols, hit_cols

    def _highlight_stage(self, stage: int | None, on: bool) -> None:
        """Outline the selected stage's devices in the stage view and fade the others."""
        fig = copy.deepcopy(self._base["stage"])
        meta = fig["layout"].get("meta") or {}
        owner = meta.get("owner", [])
        cell = _cell_of(meta)
        devices = [d for d, s in enumerate(owner) if on and s == stage]
        img = next((t for t in fig["data"] if (t.get("meta") or {}).get("kind") == "devices"), None)
        shapes = list(fig["layout"].get("shapes") or [])
        if on and stage is not None and img is not None:
            for d, s in enumerate(owner):
                if s != stage:
                    r, c = cell(d)
                    img["z"][r][c] = [round(v + (255 - v) * (1 - DIM)) for v in img["z"][r][c]]
            for r, a, b in _row_runs([cell(d) for d in devices]):
                shapes.append({"type": "rect", "x0": a - 0.5, "x1": b + 0.5, "y0": r - 0.5,
                               "y1": r + 0.5, "name": "highlight", "layer": "above",
                               "line": {"color": HIGHLIGHT_LINE, "width": 3},
                               "fillcolor": "rgba(0,0,0,0)"})
        _set_shapes(fig, shapes)
        self.figures["stage"].show(fig)

    def _highlight_memory(self, plan: Plan, stage: int | None, on: bool) -> None:
        """Dim every memory bar but the selected stage's."""
        fig = copy.deepcopy(self._base["memory"])
        if on and stage is not None:
            for t in fig["data"]:
                n = len(t.get("y") or [])
                t.setdefault("marker", {})["opacity"] = [
                    1.0 if s.index == stage else DIM for s in plan.stages][:n]
        self.figures["memory"].show(fig)

    def _highlight_graph(self, ops: set[int], layers: set[str], on: bool) -> None:
        """Dim the graph view's segments holding no selected operator (nor named as a selected
        layer)."""
        fig = copy.deepcopy(self._base["graph"])
        for t in fig["data"]:
            m = t.get("meta") or {}
            if m.get("kind") != "layers":
                continue
            hit = [bool(on and (set(p) & ops or nm in layers))
                   for nm, p in zip(m.get("names", []), m.get("planned", []))]
            if on and any(hit):
                t.setdefault("marker", {})["opacity"] = [1.0 if h else DIM for h in hit]
        self.figures["graph"].show(fig)

    def _highlight_timeline(self, stage: int | None, on: bool) -> None:
        """Outline the selected stage's bars in the timeline and dim the others."""
        fig = copy.deepcopy(self._base["timeline"])
        for t in fig["data"]:
            m = t.get("meta") or {}
            if m.get("kind") == "events" and on:
                t["opacity"] = 1.0 if m.get("stage") == stage else DIM
                if m.get("stage") == stage:
                    t.setdefault("marker", {})["line"] = {"color": HIGHLIGHT_LINE, "width": 1.5}
        self.figures["timeline"].show(fig)

    def _describe_selection(self, plan: Plan, value: str, ops: set[int], stage: int | None,
                            cols: list[dict[str, Any]], hit_cols: list[int]) -> None:
        """The line under the pickers: what is selected, its columns, stage and devices (or how
        to select, with nothing selected)."""
        on = bool(value)
        if not on:
            self._focus_info.value = ("<small>click an operator in the sharding view, a device in "
                                      "the stage view, a segment of the mined subgraphs, a memory "
                                      "bar or a bar of the timeline to select its layer or stage"
                                      "</small>")
            return
        what = value.split(":", 1)[1]
        label = f"stage {what}" if value.startswith("stage:") else f"layer <code>{html.escape(what)}</code>"
        folded = ""
        if value.startswith("layer:") and hit_cols and cols:
            c = cols[hit_cols[0]]
            if len(c["layers"]) > 1:
                folded = f", one of {len(c['layers'])} layers sharded alike (one column)"
        st_devices = next((list(s.device_ids) for s in plan.stages if s.index == stage), [])
        self._focus_info.value = (
            f"<small>selected {label}: {len(ops)} planned operators in {len(hit_cols)} column"
            f"{'s' if len(hit_cols) != 1 else ''} of the sharding view{folded}; stage {stage}, "
            f"devices {id_span(st_devices)}</small>")

    # ---- clicks ------------------------------------------------------------------------------
    def _click_handler(self, name: str) -> Callable[[dict[str, Any]], None]:
        return lambda event: self.on_figure_click(name, event)

    def on_figure_click(self, figure: str, event: Mapping[str, Any]) -> None:
        """What a click on the page does (also callable with an event dict, as the page sends
        it: ``{"trace", "point", "x", "y", "customdata"}``): in the sharding view it selects the
        operator's layer and picks the tensor for a what-if pin; in the stage, memory and
        timeline views it selects the stage; in the mined subgraphs the segment's layer; in
        the comparison the plan."""
        if self.plan is None:
            return
        base = self._base.get(figure)
        data = (base or {}).get("data", [])
        k = event.get("trace")
        if not isinstance(k, int) or not 0 <= k < len(data):
            return
        meta = data[k].get("meta") or {}
        kind = meta.get("kind")
        point = list(event.get("point") or [0])
        cd = event.get("customdata")
        if figure == "sharding" and kind == "tensors":
            op, tensor = int(cd[0]), str(cd[1])
            layer = self._op_layer.get(op)
            if layer and f"layer:{layer}" in {v for _, v in self._focus.options}:
                self.select_layer(layer)
            self.set_pin_target(tensor, op=op)
        elif figure == "stage" and kind == "devices":
            meta_l = base["layout"].get("meta") or {}
            owner = meta_l.get("owner", [])
            row, col = (point + [0, 0])[:2] if len(point) >= 2 else (int(event.get("y") or 0),
                                                                     int(event.get("x") or 0))
            d = _device_at(meta_l, int(row), int(col))
            if d is not None and 0 <= d < len(owner) and owner[d] is not None:
                self.select_stage(int(owner[d]))
        elif figure == "memory" and kind == "memory":
            i = int(point[0])
            if 0 <= i < len(self.plan.stages):
                self.select_stage(self.plan.stages[i].index)
        elif figure == "timeline" and kind in ("events", "steady") and cd:
            self.select_stage(int(cd[4]))
        elif figure == "graph" and kind == "layers":
            i = int(point[0])
            names, planned = meta.get("names", []), meta.get("planned", [])
            opts = {v for _, v in self._focus.options}
            if i < len(names) and f"layer:{names[i]}" in opts:
                self.select_layer(names[i])
            elif i < len(planned):
                layer = next((self._op_layer[o] for o in planned[i] if o in self._op_layer), None)
                if layer:
                    self.select_layer(layer)
        elif figure == "compare" and kind in ("plans", "reference"):
            target = int(cd[0]) if isinstance(cd, list) and cd else meta.get("plan")
            if target is not None:
                self._start("view", lambda: self.select(int(target)))

    # ---- what-if -----------------------------------------------------------------------------
    def _pin_hint(self) -> str:
        return ("<small>click a tensor in the sharding view: a parameter, optimizer state or batch "
                "input is pinned as chosen (for an activation, its operator's weight)</small>")

    def set_pin_target(self, tensor: str, op: int | None = None) -> str | None:
        """Choose the graph input a what-if pin will fix: ``tensor`` when it is an input of the
        selected plan, else the weight of operator ``op``. Returns the input's name (None when
        neither is an input)."""
        plan = self.plan
        if plan is None:
            raise StateError("Explorer: a candidate should be selected first. Got none. Fix: "
                             "ex.select(0) first.")
        names = {i.name for i in plan.inputs}
        target = tensor if tensor in names else None
        if target is None and op is not None:
            o = next((o for o in plan.ops if o.op == op), None)
            if o is not None:
                target = next((t.name for t in o.tensors if t.role == "weight" and t.name in names),
                              None)
        self._pin_target = target
        self._refresh_pin_panel(None if target else
                                f"{html.escape(tensor)} is an activation and operator {op} reads "
                                "no parameter: pick a weight, an optimizer state or a batch input")
        return target

    def pin_choices(self) -> list[tuple[str, tuple]]:
        """``(label, spec)`` for every spec the pin target can take on the selected plan's mesh
        (its current spec first)."""
        plan = self.plan
        if plan is None or self._pin_target is None:
            return []
        inp = next(i for i in plan.inputs if i.name == self._pin_target)
        st = next((s for s in plan.stages if s.index == inp.stage), plan.stages[0])
        specs = spec_choices(inp.shape, st.mesh_shape, st.axis_names)
        cur = inp.spec
        specs = [cur] + [s for s in specs if s != cur]
        return [(f"{s.pspec_text()} = {s}" + (" (current)" if s == cur else ""), s)
                for s in specs]

    def _refresh_pin_panel(self, message: str | None = None) -> None:
        plan = self.plan
        target = self._pin_target
        pipeline = plan is not None and plan.is_pipeline
        if target is None or plan is None:
            self._pin_spec.options = []
            self._pin_spec.disabled = True
            self._pin_button.disabled = True
            self._pin_info.value = f"<small>{message}</small>" if message else self._pin_hint()
        else:
            inp = next(i for i in plan.inputs if i.name == target)
            choices = self.pin_choices()
            self._quiet += 1
            try:
                self._pin_spec.options = [(lab, k) for k, (lab, _) in enumerate(choices)]
                self._pin_spec.value = 1 if len(choices) > 1 else 0
            finally:
                self._quiet -= 1
            self._pin_spec.disabled = pipeline
            self._pin_button.disabled = pipeline or self.busy_with("what-if")
            why = ("<br><b>pins apply to intra-operator plans</b>: pipeline stages are searched "
                   "per layer and take no pins; select an intra-operator candidate"
                   if pipeline else "")
            self._pin_info.value = (
                f"<small>pin <code>{html.escape(target)}</code> ({inp.kind}, "
                f"{'x'.join(map(str, inp.shape)) or 'scalar'}, now {inp.spec.pspec_text()}) on mesh "
                f"{'x'.join(map(str, plan.mesh_shape))}: {len(choices)} specs{why}</small>")
        self._undo_button.disabled = not self._pins
        rows = "".join(
            f"<li><code>{html.escape(p['name'])}</code> = {html.escape(p['spec'].pspec_text())}: "
            f"{self._diff_text(p['before'], p['plan'])}</li>" for p in self._pins)
        self._pins_html.value = f"<small>pins:<ol>{rows}</ol></small>" if rows else ""

    def busy_with(self, kind: str) -> bool:
        t = self._threads.get(kind)
        return t is not None and t.is_alive()

    @staticmethod
    def _diff_text(before: Plan, after: Plan) -> str:
        unit = time_unit(max(before.predicted.step_time, after.predicted.step_time))
        a, b = cost_parts(before), cost_parts(after)
        parts = []
        for k in dict.fromkeys([*a, *b]):
            d = b.get(k, 0.0) - a.get(k, 0.0)
            if abs(d) > 1e-12 * max(1.0, before.predicted.step_time):
                parts.append(f"{k} {'+' if d >= 0 else '&minus;'}{fmt_in_unit(abs(d), unit)}")
        dt = after.predicted.step_time - before.predicted.step_time
        dm = after.predicted.memory_per_device - before.predicted.memory_per_device
        return (f"step time {fmt_in_unit(before.predicted.step_time, unit)} &rarr; "
                f"{fmt_in_unit(after.predicted.step_time, unit)} "
                f"({'+' if dt >= 0 else '&minus;'}{fmt_in_unit(abs(dt), unit)}"
                + (f": {', '.join(parts)}" if parts else "") + "); memory "
                f"{'+' if dm >= 0 else '&minus;'}{fmt_bytes(abs(dm))} per device")

    def _pin_clicked(self) -> None:
        choices = self.pin_choices()
        if not choices or self._pin_target is None:
            return
        self.what_if(self._pin_target, choices[int(self._pin_spec.value or 0)][1])

    def what_if(self, name: str, spec: Any) -> bool:
        """Pin input ``name`` to ``spec`` (a spec tuple or a ``PartitionSpec``), with the pins
        made before, and re-solve the selected plan's mesh in the background; the new plan
        joins the candidates (label ``what-if: ...``), is selected and compared with the plan
        before it.

        Returns:
            False (and starts nothing) when a what-if is already running.

        Raises:
            StateError: no plan selected. SearchError: the selected plan is a pipeline plan,
                or ``name`` is not one of its inputs.
        """
        plan = self.plan
        if plan is None:
            raise StateError("Explorer.what_if: no plan selected. Fix: run a search first.")
        if plan.is_pipeline:
            raise SearchError("Explorer.what_if: pins apply to intra-operator plans; the selected "
                              f"plan [{plan.label}] has {len(plan.stages)} pipeline stages. Fix: "
                              "select an intra-operator candidate.")
        inp = next((i for i in plan.inputs if i.name == name), None)
        if inp is None:
            raise SearchError(f"Explorer.what_if: {name!r} is not an input of the selected plan. "
                              f"Fix: pick one of its inputs, e.g. {plan.inputs[0].name!r}.")
        spec = Spec.from_pspec(spec, len(inp.shape))
        started = self._start("what-if", lambda: self._what_if_job(plan, name, spec))
        if started:
            self._pin_button.disabled = True
            self._pin_info.value = (f"<small>re-solving mesh {'x'.join(map(str, plan.mesh_shape))} "
                                    f"with <code>{html.escape(name)}</code> = "
                                    f"{html.escape(spec.pspec_text())}...</small>")
        return started

    def _what_if_job(self, before: Plan, name: str, spec: Spec) -> None:
        generation = self._generation
        pins = {("^" + re.escape(p["name"]) + "$"): p["spec"].to_pspec()
                for p in self._pins if self._chain_has(before, p)}
        pins["^" + re.escape(name) + "$"] = spec.to_pspec()
        wl = self._get_workload()
        opts = self._options()
        t0 = time.perf_counter()
        try:
            res = autoplan.search(wl, self._cluster(), pipeline=False,
                                  mesh_shape=tuple(before.mesh_shape), level=opts["level"],
                                  memory_budget=opts["memory_budget"], pins=pins,
                                  baselines=False)
        except AutoplanError as err:
            self._refresh_pin_panel(f"the pin cannot be honoured: {html.escape(str(err))}")
            raise
        new = res.best.with_(label=f"what-if: {name} = {spec.pspec_text()}")
        with self._lock:
            if generation != self._generation:
                return  # a new search replaced the result meanwhile
            self._whatif.append(new)
            self._pins.append({"name": name, "spec": spec, "before": before, "plan": new,
                               "seconds": time.perf_counter() - t0})
            self._refresh_candidates()
        self.select(len(self.plans) - 1)

    def _chain_has(self, plan: Plan, pin: Mapping[str, Any]) -> bool:
        """Whether ``pin`` was made on the way to ``plan`` (pins stack: a what-if of a what-if
        keeps the first pin)."""
        p = plan
        seen = 0
        while p is not None and seen < 100:
            step = next((q for q in self._pins if q["plan"] is p), None)
            if step is None:
                return False
            if step is pin:
                return True
            p = step["before"]
            seen += 1
        return False

    def undo(self) -> Plan | None:
        """Take the last what-if pin back: its plan leaves the candidates and the plan before it
        is selected again. Returns that plan (None when there was no pin)."""
        with self._lock:
            if not self._pins:
                return None
            last = self._pins.pop()
            self._whatif = [p for p in self._whatif if p is not last["plan"]]
            self._refresh_candidates()
            before = last["before"]
            index = next((k for k, p in enumerate(self.plans) if p is before),
                         next((k for k, p in enumerate(self.plans) if p == before), 0))
            self.select(index)
            return before

    # ---- launch ----------------------------------------------------------------------------
    def _launch_figure(self, rec: LaunchRecord | None) -> dict[str, Any]:
        losses = rec.losses if rec else []
        times = rec.step_times if rec else []
        pred = rec.plan.predicted.step_time if rec else None
        unit = time_unit(max([*times, pred or 0.0]) if (times or pred) else 0.0)
        steps = rec.steps if rec else 0
        data = [
            {"type": "scatter", "x": list(range(len(losses))), "y": losses, "mode": "lines+markers",
             "name": "loss", "line": {"color": "#4c78a8"}, "meta": {"kind": "loss"}},
            {"type": "scatter", "x": list(range(len(times))), "y": [t / unit[0] for t in times],
             "mode": "lines+markers", "name": "step time", "yaxis": "y2",
             "line": {"color": "#e45756"}, "meta": {"kind": "step_time", "unit": unit[1]},
             "customdata": [fmt_in_unit(t, unit) for t in times],
             "hovertemplate": "step %{x}: %{customdata}<extra></extra>"},
            {"type": "scatter", "x": [0, max(steps - 1, 1)] if rec else [],
             "y": [pred / unit[0]] * 2 if rec else [], "mode": "lines",
             "name": "predicted step time", "yaxis": "y2",
             "line": {"color": "#e45756", "dash": "dot"}, "meta": {"kind": "predicted"}},
        ]
        title = ("launch: loss and step time per step" if rec is None else
                 f"launch of [{html.escape(rec.plan.label)}]: {len(losses)}/{rec.steps} steps")
        # every axis with its own ticks (one unit, at most 3 significant digits): the step-time
        # axis is log (emulated CPU devices run far slower than the cluster the plan was costed
        # on) and must not borrow the loss axis's ticks
        last = max(steps - 1, 1)
        xt = axis_ticks(0, last)
        keep = [k for k, v in enumerate(xt.get("tickvals", [])) if float(v).is_integer()]
        xt = {"tickmode": "array", "tickvals": [xt["tickvals"][k] for k in keep],
              "ticktext": [xt["ticktext"][k] for k in keep]} if len(keep) >= 2 else {
            "tickmode": "array", "tickvals": list(range(last + 1)),
            "ticktext": [str(k) for k in range(last + 1)]}
        xaxis = {"title": {"text": "step"}, "range": [-0.3, last + 0.3], **xt}
        yaxis: dict[str, Any] = {"title": {"text": "loss"}, "tickmode": "auto"}
        if losses:
            lo, hi = min(losses), max(losses)
            pad = 0.1 * ((hi - lo) or abs(hi) or 1.0)
            yaxis.update(range=[lo - pad, hi + pad], **axis_ticks(lo - pad, hi + pad, count=4))
        yaxis2: dict[str, Any] = {"title": {"text": f"step time ({unit[1]}, log)", "standoff": 8},
                                  "overlaying": "y", "side": "right", "type": "log",
                                  "showgrid": False, "tickmode": "auto", "automargin": True}
        annotations = []
        shown = [t / unit[0] for t in [*times, *([pred] if pred else [])] if t and t > 0]
        if shown:
            lo, hi = min(shown) / 1.6, max(shown) * 1.6
            yaxis2.update(range=[math.log10(lo), math.log10(hi)], **axis_ticks(lo, hi, log=True))
        else:  # nothing measured yet: no made-up ticks
            yaxis2["showticklabels"] = False
            yaxis["showticklabels"] = False
        if rec is not None and pred:
            # the prediction's label by its line (a log axis places annotations at log10(y))
            annotations.append({"x": last, "y": math.log10(pred / unit[0]), "xref": "x",
                                "yref": "y2", "xanchor": "right", "yanchor": "bottom",
                                "showarrow": False, "font": {"size": 10, "color": "#e45756"},
                                "text": f"predicted {fmt_in_unit(pred, unit)}"})
        layout = {
            "template": TEMPLATE, "height": 300, "title": {"text": title},
            "xaxis": xaxis, "yaxis": yaxis, "yaxis2": yaxis2, "annotations": annotations,
            "legend": {"orientation": "h", "y": -0.25},
            "margin": {"t": 60, "l": 60, "r": 80, "b": 40},
            "meta": {"kind": "launch", "unit": unit[1]},
        }
        return {"data": data, "layout": layout}

    def _init_launch_figure(self) -> None:
        self.figures["launch"].show(self._launch_figure(None))

    def _clear_launch(self, status: str = "no launch yet") -> None:
        self.last_launch = None
        self._launch_status.value = status
        self._launch_table.value = ""
        self._launch_result.value = ""
        self._init_launch_figure()

    def launch(self, steps: int | None = None, timeout: float = 900.0) -> bool:
        """Run the selected plan on the devices attached, in the background.

        The launcher detects the platform and chooses the workers as ``autoplan launch`` does (one
        per GPU; emulated CPU devices in 2 processes when no accelerator is attached); pipeline
        plans run each stage on its own submesh across the processes. A plan that needs more
        devices than attached fails with the cluster commands in the status.

        Args:
            steps: training steps (default: the widget's value).
            timeout: seconds before the launch is cancelled.

        Returns:
            False (and starts nothing) when a launch is already running.

        Raises:
            StateError: no plan is selected.
        """
        plan = self.plan
        if plan is None:
            raise StateError("Explorer.launch: no plan selected. Fix: run a search first.")
        if steps is not None:
            self._steps.value = int(steps)
        n = int(self._steps.value)
        context = self._context
        started = self._start("launch", lambda: self._launch_job(plan, n, timeout, context))
        if not started:
            self._launch_status.value = "a launch is already running"
        return started

    def _current(self, rec: LaunchRecord) -> bool:
        return self.last_launch is rec

    def _launch_job(self, plan: Plan, steps: int, timeout: float,
                    context: tuple[str, str, str]) -> None:
        from autoplan.exec import launch  # noqa: PLC0415

        rec = LaunchRecord(plan=plan, spec={}, num_processes=0, devices_per_process=0, steps=steps,
                           context=context)
        self.last_launch = rec
        self._launch_button.disabled = True
        self._launch_result.value = ""
        self._launch_status.value = (f"launching [{plan.label}] {plan.describe()}: finding the "
                                     "devices and checking the workload")
        try:
            rec.spec = self.launch_spec()
            self._draw_launch(rec)
            # the workload object (sent as rec.spec): its fingerprint is checked in this kernel,
            # from the trace the search made, instead of in a probe process
            rec.handle = launch(plan, self._get_workload(), steps=steps, timeout=timeout)
            lay = rec.handle.layout
            rec.num_processes, rec.devices_per_process = lay.num_processes, lay.devices_per_process
            rec.layout = lay.describe()
            if self._current(rec):
                self._launch_status.value = f"launching [{plan.label}] {plan.describe()} on {rec.layout}"
            # the handle supervises its workers (errors, hangs, its timeout); poll until it is over
            while not rec.handle.done:
                new = list(rec.handle.poll() or [])
                if new:
                    rec.events.extend(new)
                    if self._current(rec):
                        self._draw_launch(rec)
                        self._launch_status.value = self._running_text(rec)
                time.sleep(0.2)
            rec.result = rec.handle.wait(60)
            rec.events = list(rec.handle.events)
        except Exception as err:
            rec.error = f"{type(err).__name__}: {err}"
            if self._current(rec):
                self._launch_status.value = f"launch failed: {short_error(rec.error)}"
                # the whole message: the workers' last lines, or the cluster commands for a plan
                # that needs more devices than attached
                self._launch_result.value = (f"<pre class='autoplan-launch-error'>"
                                             f"{html.escape(rec.error)}</pre>")
            raise
        finally:
            rec.finished = time.time()
            self._launch_button.disabled = self.plan is None
            if self._current(rec):
                self._draw_launch(rec)
        if not self._current(rec):
            return
        self._launch_status.value = (f"finished: {len(rec.losses)} steps in "
                                     f"{rec.finished - rec.started:.1f} s")
        self._launch_result.value = self._launch_summary_html(rec)

    @staticmethod
    def _running_text(rec: LaunchRecord) -> str:
        errs = [e for e in rec.events if e.get("event") == "error"]
        if errs:
            return f"error in process {errs[0].get('process')}: {short_error(str(errs[0].get('message')))}"
        steps = {int(e["step"]) for e in rec.step_events}
        if not steps:
            started = {e.get("process") for e in rec.events if e.get("event") == "start"}
            return (f"{len(started)} of {rec.num_processes} workers joined; tracing and compiling "
                    "the first step")
        return f"running [{rec.plan.label}] on {rec.layout}: {len(steps)}/{rec.steps} steps"

    def _draw_launch(self, rec: LaunchRecord) -> None:
        self.figures["launch"].show(self._launch_figure(rec))
        unit = time_unit(max(rec.step_times, default=0.0))
        rows = "".join(
            f"<tr><td>{e.get('step')}</td><td>{e.get('process', 0)}</td>"
            f"<td>{_loss(e.get('loss'))}</td>"
            f"<td>{fmt_in_unit(e.get('step_time'), unit) if e.get('step_time') is not None else '-'}"
            f"</td></tr>"
            for e in rec.step_events[-40:])
        self._launch_table.value = (
            "<table class='autoplan-launch-table'><tr><th>step</th><th>process</th><th>loss</th>"
            f"<th>step time</th></tr>{rows}</table>" if rows else "<i>waiting for the first step</i>")

    def _launch_summary_html(self, rec: LaunchRecord) -> str:
        pred = rec.plan.predicted.step_time
        meas = rec.measured_step_time
        ratio = ""
        if meas and pred > 0:
            ratio = f" ({meas / pred:.1f}x the prediction"
            cl = rec.plan.cluster
            if cl.name == "local":
                ratio += (": the prediction used this machine's measured profile; emulated CPU "
                          "devices share its cores, and their step times vary with its load")
            elif cl.device_kind == "cpu" or cl.name == "cpu":
                ratio += (": the prediction is the cost model of the preset cluster "
                          f"{html.escape(cl.spec)}, and emulated CPU devices share this "
                          f"machine's cores; choose the cluster '{LOCAL_LABEL}' to cost plans "
                          "on a profile of this machine")
            else:
                ratio += (f": the prediction is for {html.escape(cl.spec)} "
                          f"({html.escape(cl.device_kind)}), not the devices that ran it")
            ratio += ")"
        m = rec.matched
        check = {True: "<b style='color:#2ca02c'>matched single-device results</b>",
                 False: "<b style='color:#d62728'>did NOT match single-device results</b>",
                 None: "single-device check: not reported"}[m]
        loss = rec.final_loss
        err = f"<br><b style='color:#d62728'>error</b>: {html.escape(rec.error)}" if rec.error else ""
        return (f"<div class='autoplan-launch-result'><b>launch finished</b>: [{html.escape(rec.plan.label)}] "
                f"{html.escape(rec.plan.describe())}, {html.escape(rec.layout)}, "
                f"{len(rec.losses)} steps<br>measured step time {_ms(meas)}; "
                f"predicted {_ms(pred)} (for {html.escape(cluster_text(rec.plan.cluster))}, "
                f"{html.escape(rec.plan.cluster.describe_profile())}){ratio}<br>final loss "
                f"{_loss(loss)}; {check}{err}</div>")


def _set_shapes(fig: dict[str, Any], shapes: list[dict[str, Any]]) -> None:
    """A figure's layout shapes, or none (as drawn) when the list is empty."""
    if shapes:
        fig["layout"]["shapes"] = shapes
    else:
        fig["layout"].pop("shapes", None)


def _same_plan(a: Plan, b: Plan) -> bool:
    """The same plan found again (a later result of one search: equal up to its timings)."""
    return (a.label, a.describe(), a.predicted.step_time, a.predicted.memory_per_device) == (
        b.label, b.describe(), b.predicted.step_time, b.predicted.memory_per_device)


def _cell_of(meta: Mapping[str, Any]) -> Callable[[int], tuple[int, int]]:
    """Device id -> ``(row, column)`` of its cell in the stage view (see ``stage_figure``)."""
    per = int(meta.get("per_host", 1))
    width = int(meta.get("width", per))
    rows_per_host = int(meta.get("rows_per_host", 1))

    def cell(d: int) -> tuple[int, int]:
        h, j = divmod(d, per)
        return h * rows_per_host + j // width, j % width

    return cell


def _device_at(meta: Mapping[str, Any], row: int, col: int) -> int | None:
    """The device drawn at ``(row, col)`` of the stage view, or None."""
    per = int(meta.get("per_host", 1))
    width = int(meta.get("width", per))
    rows_per_host = int(meta.get("rows_per_host", 1))
    h, r = divmod(row, rows_per_host)
    j = r * width + col
    return h * per + j if 0 <= col < width and j < per else None


def _row_runs(cells: Sequence[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """``(row, first column, last column)`` of each run of adjacent cells on one row."""
    out: list[tuple[int, int, int]] = []
    for r, c in sorted(cells):
        if out and out[-1][0] == r and out[-1][2] == c - 1:
            out[-1] = (r, out[-1][1], c)
        else:
            out.append((r, c, c))
    return out


