"""The interactive plan explorer: search, inspect and launch plans from a notebook.

:class:`Explorer` is an ipywidgets layer over the static figures of :mod:`autoplan.viz`:

* controls for the model (a zoo name, or a user's ``module:function`` typed into the model box,
  loaded by :func:`autoplan._loader.load_workload`) and size, the cluster preset and its node
  count, the search level, the
  pipeline schedule and the number of micro-batches, and a Search button with a progress bar fed
  by the search's ``progress(message, fraction)`` callback;
* a candidate selector over every ranked plan of the :class:`~autoplan.search.SearchResult`
  (candidates and baselines), a summary pane (``plan._repr_html_()``) and four
  ``plotly.graph_objects.FigureWidget`` views (operator sharding, stages on the cluster, the
  pipeline timeline, the comparison of all plans). The FigureWidgets are created once, with the
  explorer, and changed in place under ``batch_update()`` when the candidate changes: each one
  stores ~5 MB of plotly.js in a notebook's widget state, so none is ever added;
* linked selection: clicking an operator's tile in the sharding view selects its layer, clicking a
  device in the stage view or a bar of the timeline selects that stage (the layer Dropdown does
  either); the other views then highlight it (the layer's operators in the sharding view, the
  owning stage's devices and timeline bars);
* a Launch button that runs the selected plan with :func:`autoplan.exec.launch` on the devices
  attached, as ``autoplan launch`` does (platform and worker counts detected: one worker per
  GPU, or emulated CPU devices in 2 processes when no accelerator is attached), streams each
  step's loss and step time
  into a table and a live figure, and at the end shows the measured step time and loss against
  the plan's prediction and whether the run matched single-device results.

Searches and launches run in background threads, so the kernel stays free; their results reach
the page through widget state, and every error is written into the explorer's ``Output``. The
explorer calls ``autoplan.search`` and ``autoplan.exec`` only when asked to (imports inside the
methods), so importing :mod:`autoplan.viz` still imports neither.

Example (in a notebook)::

    from autoplan.viz._explorer import Explorer
    ex = Explorer(model="gpt", size="tiny", cluster="cpu:8")   # starts the search
    ex                                                          # shows the widget
    ex.wait_idle(300); ex.select(1); ex.select_layer("layers_0"); ex.launch()
"""

from __future__ import annotations

import html
import statistics
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from .._cluster import PRESETS, Cluster
from .._plan import Plan
from ._compare import compare_figure
from ._pipeline import stage_figure, timeline_figure
from ._sharding import sharding_figure
from ._style import TEMPLATE

__all__ = ["Explorer", "LaunchRecord", "sync_figure", "fill_width"]

LEVELS = ("folded", "hierarchical", "exhaustive")
SCHEDULES = ("1f1b", "gpipe")
MICROBATCH_CHOICES = (1, 2, 4, 8, 16, 32, 64)
FIGURES = ("sharding", "stage", "timeline", "compare", "launch")
AUTO = 0  # the micro-batches Dropdown's value for "searched" (ipywidgets shows None as blank)
NO_SIZE = "-"  # the size Dropdown's value for a user's workload (it has no zoo sizes)
_CSS = ("<style>.autoplan-explorer pre {white-space: pre; font-size: 11px; line-height: 1.3;}"
        ".autoplan-explorer table {font-size: 12px; border-collapse: collapse;}"
        ".autoplan-explorer td, .autoplan-explorer th {padding: 1px 8px; text-align: right;}</style>")
DIM = 0.25  # opacity of what is not selected
HIGHLIGHT_LINE = "#111111"


@dataclass
class LaunchRecord:
    """One launch of a plan from the explorer (``Explorer.last_launch``).

    Attributes:
        plan: the plan launched; ``spec`` the workload spec given to ``autoplan.exec.launch``.
        num_processes, devices_per_process, steps: how it ran (0 devices until the launcher has
            chosen the layout); ``layout`` says it in words (platform included).
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


def _ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.3f} ms"


def _loss(v: Any) -> str:
    return "-" if v is None else f"{float(v):.6f}"


def sync_figure(fw: go.FigureWidget, fig: go.Figure) -> None:
    """Make FigureWidget ``fw`` show ``fig``, in place.

    When the traces have the same count and types, every trace and the layout are restyled in one
    ``batch_update()`` (one message); otherwise the traces are swapped (one delete and one add
    message) and the layout relaid out in the batch. Properties that ``fig`` does not set are
    removed, so nothing of the previous figure is left behind.

    A figure without a width fills the page's container: plotly.js answers a relayout of
    ``height`` by fixing ``width`` at its current value and turning ``autosize`` off, so a
    relayout of ``autosize=True, width=None`` follows every update.
    """
    new = [t.to_plotly_json() for t in fig.data]
    same = [t.type for t in fw.data] == [t.get("type", "scatter") for t in new]
    lay = fig.layout.to_plotly_json()
    fill = lay.get("width") is None
    if fill:
        lay["autosize"] = True
    with fw.batch_update():
        if same:
            for tr, d in zip(fw.data, new):
                old = tr.to_plotly_json()
                for k in set(old) - set(d) - {"type", "uid"}:
                    tr[k] = None
                tr.update(d, overwrite=True)
        else:
            fw.data = []
            fw.add_traces(new)
        for k in set(fw.layout.to_plotly_json()) - set(lay):
            fw.layout[k] = None
        fw.layout.update(lay, overwrite=True)
    if fill:
        fill_width(fw)


def fill_width(fw: go.FigureWidget) -> None:
    """Tell the page's views of ``fw`` to size its width to their container (keeping its height).

    The Python layout already says so (``autosize=True``, no width); this relayout undoes what
    plotly.js does on the page when a relayout sets ``height`` (it fixes ``width`` at its current
    value and turns ``autosize`` off), and sizes views first drawn before they were attached.
    """
    if hasattr(fw, "_send_relayout_msg"):
        fw._send_relayout_msg({"autosize": True, "width": None, "height": fw.layout.height})


def _search_function() -> Callable[..., Any]:
    """``autoplan.search`` (a function re-exported by the package, or the subpackage's)."""
    import importlib  # noqa: PLC0415

    import autoplan  # noqa: PLC0415

    fn = getattr(autoplan, "search", None)
    if callable(fn):
        return fn
    return importlib.import_module("autoplan.search").search


class Explorer:
    """Search, compare, inspect and launch plans in a notebook.

    Args:
        workload: what to plan: a spec (a zoo name, a user's ``"module:function"``, or a dict
            ``{"model": ..., **kwargs}``, see :mod:`autoplan._loader`), an
            :class:`autoplan.models.Workload` (its name, size and config overrides are used), or
            a workload loaded from ``"module:function"``; changing the model or size in the widget
            replaces it. Default: the zoo's ``model`` at ``size``.
        cluster: a :class:`~autoplan.Cluster` or ``"preset:nodes"`` (``"cpu:8"`` = 8 emulated
            devices on one host).
        model, size: the workload when ``workload`` is None (``model`` may be
            ``"module:function"``; the model box takes either too).
        level: ``"folded"``, ``"hierarchical"`` or ``"exhaustive"``.
        schedule: ``"1f1b"`` or ``"gpipe"``.
        microbatches: the number of micro-batches of pipeline plans (None: searched).
        autostart: start a search now (in the background).

    Attributes:
        widget: the root ``ipywidgets.VBox`` (displaying the explorer displays it).
        result: the last ``SearchResult`` (None before the first search finishes).
        plan: the selected plan (None before).
        last_launch: the last :class:`LaunchRecord` (None before the first launch).
        figures: ``{name: FigureWidget}`` for ``sharding``, ``stage``, ``timeline``, ``compare``
            and ``launch``; the same five objects for the explorer's whole life.
    """

    def __init__(self, workload: Any = None, cluster: Cluster | str = "cpu:8", *, model: str = "gpt",
                 size: str = "tiny", level: str = "folded", schedule: str = "1f1b",
                 microbatches: int | None = None, autostart: bool = True) -> None:
        from autoplan._loader import is_function_spec, load_workload, workload_spec  # noqa: PLC0415
        from autoplan.models import list_models  # noqa: PLC0415

        models = list_models()
        if isinstance(workload, (str, Mapping)):
            workload = load_workload(workload)  # a spec: loaded now, so a bad one fails here
        if workload is not None:
            spec = workload_spec(workload) or {}
            model = str(spec.get("model") or getattr(workload, "name", None) or "(given workload)")
            size = spec.get("size", getattr(workload, "size", None) or NO_SIZE)
        if not (model in models or is_function_spec(model) or workload is not None):
            raise ValueError(f"Explorer: model should be one of {sorted(models)} or a user's "
                             f"'module:function'. Got {model!r}.")
        if model in models and size not in models[model]:
            raise ValueError(f"Explorer: size should be one of {models[model]} for {model!r}. "
                             f"Got {size!r}.")
        if level not in LEVELS:
            raise ValueError(f"Explorer: level should be one of {LEVELS}. Got {level!r}.")
        if schedule not in SCHEDULES:
            raise ValueError(f"Explorer: schedule should be one of {SCHEDULES}. Got {schedule!r}.")
        cl = Cluster.parse(cluster)
        self._models = models
        self._workload = workload
        self._custom_cluster = cl if cl.name not in PRESETS else None
        self.result: Any = None
        self.plan: Plan | None = None
        self.last_launch: LaunchRecord | None = None
        self._lock = threading.RLock()
        self._threads: dict[str, threading.Thread] = {}
        self._layer_of_op: dict[int, str] = {}
        self._stage_of_layer: dict[str, int] = {}
        self._base: dict[str, list[dict[str, Any]]] = {}
        self._base_shapes: dict[str, list[Any]] = {}
        self._quiet = 0

        wide = {"description_width": "initial"}
        # ---- controls
        # the model box: a zoo name from the list, or a user's module:function typed in
        self._model = widgets.Combobox(options=list(models), value=model, description="model",
                                       placeholder="zoo name or module:function",
                                       ensure_option=False, continuous_update=False, style=wide,
                                       layout=widgets.Layout(width="260px"))
        zoo = model in models
        self._size = widgets.Dropdown(options=models[model] if zoo else [NO_SIZE],
                                      value=size if zoo else NO_SIZE, description="size",
                                      disabled=not zoo, style=wide,
                                      layout=widgets.Layout(width="130px"))
        presets = sorted(PRESETS) + ([cl.name] if self._custom_cluster else [])
        self._preset = widgets.Dropdown(options=presets, value=cl.name, description="cluster",
                                        style=wide, layout=widgets.Layout(width="210px"))
        count = cl.devices_per_node if cl.name == "cpu" else cl.nodes
        self._nodes = widgets.BoundedIntText(value=count, min=1, max=1024,
                                             description="devices" if cl.name == "cpu" else "nodes",
                                             style=wide, layout=widgets.Layout(width="130px"))
        self._level = widgets.Dropdown(options=list(LEVELS), value=level, description="level",
                                       style=wide, layout=widgets.Layout(width="170px"))
        self._schedule = widgets.Dropdown(options=list(SCHEDULES), value=schedule,
                                          description="schedule", style=wide,
                                          layout=widgets.Layout(width="150px"))
        if microbatches is not None and (not isinstance(microbatches, int) or microbatches <= 0):
            raise ValueError(f"Explorer: microbatches should be None or a positive integer. Got "
                             f"{microbatches!r}.")
        mb_opts = [("auto", AUTO)] + [(str(m), m) for m in MICROBATCH_CHOICES]
        if microbatches is not None and microbatches not in MICROBATCH_CHOICES:
            mb_opts.append((str(microbatches), microbatches))
        self._microbatches = widgets.Dropdown(options=mb_opts, value=microbatches or AUTO,
                                              description="micro-batches", style=wide,
                                              layout=widgets.Layout(width="180px"))
        self._search_button = widgets.Button(description="Search", button_style="primary",
                                             icon="search", tooltip="search plans with these settings")
        self._progress = widgets.FloatProgress(value=0.0, min=0.0, max=1.0,
                                               layout=widgets.Layout(width="240px"))
        self._status = widgets.Label(value="no search yet")
        self._candidate = widgets.Dropdown(options=[], description="candidate", style=wide,
                                           layout=widgets.Layout(width="720px"))
        self._focus = widgets.Dropdown(options=[("(no selection)", "")], value="",
                                       description="layer", style=wide,
                                       layout=widgets.Layout(width="340px"))
        self._focus_info = widgets.HTML(value="")
        self._summary = widgets.HTML(value="<i>the selected plan's summary shows here</i>")
        self._errors = widgets.Output(layout=widgets.Layout(max_height="240px", overflow="auto"))
        # ---- figures: created once, updated in place
        self.figures: dict[str, go.FigureWidget] = {}
        for name in FIGURES:
            self.figures[name] = go.FigureWidget(layout={
                "template": TEMPLATE, "autosize": True, "height": 300 if name == "launch" else 360,
                "title": {"text": f"{name}: run a search" if name != "launch"
                          else "launch: loss and step time per step"}})
        self._init_launch_figure()
        # ---- launch controls
        self._steps = widgets.BoundedIntText(value=5, min=2, max=1000, description="steps",
                                             style=wide, layout=widgets.Layout(width="120px"))
        self._launch_button = widgets.Button(description="Launch", button_style="success",
                                             icon="play", disabled=True,
                                             tooltip="run the selected plan on the devices attached")
        self._launch_status = widgets.Label(value="no launch yet")
        self._launch_table = widgets.HTML(value="")
        self._launch_result = widgets.HTML(value="")

        def box(fig: go.FigureWidget, width: str) -> widgets.VBox:
            # a column: the figure's element stretches to the box's width, and plotly sizes the
            # figure to it (figures set no width of their own)
            return widgets.VBox([fig], layout=widgets.Layout(width=width, min_width="0"))

        self.widget = widgets.VBox([
            widgets.HTML(_CSS + "<b>autoplan explorer</b>: search parallelisation plans, inspect "
                         "and launch them"),
            widgets.HBox([self._model, self._size, self._preset, self._nodes, self._level,
                          self._schedule, self._microbatches],
                         layout=widgets.Layout(flex_flow="row wrap")),
            widgets.HBox([self._search_button, self._progress, self._status]),
            self._errors,
            widgets.HBox([self._candidate, self._focus], layout=widgets.Layout(flex_flow="row wrap")),
            self._focus_info,
            widgets.HBox([widgets.Box([self._summary], layout=widgets.Layout(
                              width="45%", max_height="420px", overflow="auto")),
                          box(self.figures["stage"], "55%")]),
            box(self.figures["sharding"], "100%"),
            box(self.figures["timeline"], "100%"),
            box(self.figures["compare"], "100%"),
            widgets.HTML("<b>launch</b> the selected plan on the devices attached (emulated CPU "
                         "devices when there is no accelerator)"),
            widgets.HBox([self._steps, self._launch_button, self._launch_status]),
            widgets.HBox([box(self.figures["launch"], "55%"),
                          widgets.Box([self._launch_table], layout=widgets.Layout(
                              width="45%", max_height="320px", overflow="auto"))]),
            self._launch_result,
        ], layout=widgets.Layout(width="100%"))
        self.widget.add_class("autoplan-explorer")

        # ---- wiring
        self._model.observe(self._on_model, names=["value"])
        self._size.observe(self._on_size, names=["value"])
        self._preset.observe(self._on_preset, names=["value"])
        self._candidate.observe(self._on_candidate, names=["value"])
        self._focus.observe(self._on_focus, names=["value"])
        self._search_button.on_click(lambda _b: self.search())
        self._launch_button.on_click(lambda _b: self.launch())
        if autostart:
            self.search()

    # ---- display ---------------------------------------------------------------------------
    def __repr__(self) -> str:
        n = len(self.result.plans) if self.result is not None else 0
        sel = self._candidate.value if self.plan is not None else None
        return (f"Explorer(model={self._model.value!r}, size={self._size.value!r}, "
                f"cluster={self._cluster_spec()!r}, plans={n}, selected={sel})")

    def _ipython_display_(self) -> None:
        from IPython.display import display  # noqa: PLC0415

        display(self.widget)

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
        """Wait until no search, view update or launch is running.

        Raises:
            TimeoutError: still busy after ``timeout`` seconds.
        """
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                busy = [t for t in self._threads.values() if t.is_alive()]
            if not busy:
                return self
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"Explorer.wait_idle: still running after {timeout} s: "
                                   f"{', '.join(t.name for t in busy)}. Status: {self._status.value!r}; "
                                   f"launch: {self._launch_status.value!r}.")
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
        self._custom_cluster = None if change["new"] in PRESETS else self._custom_cluster
        self._nodes.description = "devices" if change["new"] == "cpu" else "nodes"

    def _cluster_spec(self) -> str:
        if self._custom_cluster is not None and self._preset.value == self._custom_cluster.name:
            return self._custom_cluster.spec
        return f"{self._preset.value}:{self._nodes.value}"

    def _cluster(self) -> Cluster:
        if self._custom_cluster is not None and self._preset.value == self._custom_cluster.name:
            return self._custom_cluster
        return Cluster.parse(self._cluster_spec())

    def _get_workload(self) -> Any:
        if self._workload is not None:
            return self._workload
        from autoplan._loader import is_function_spec, load_workload  # noqa: PLC0415

        name = str(self._model.value or "").strip()
        if name not in self._models and not is_function_spec(name):
            raise ValueError(f"Explorer: the model box should hold one of {sorted(self._models)} "
                             f"or a user's 'module:function'. Got {name!r}.")
        size = self._size.value if name in self._models else None
        self._workload = load_workload(name, size=size)
        return self._workload

    def launch_spec(self) -> dict[str, Any]:
        """The workload spec a launch passes to ``autoplan.exec.launch``: ``{"model", "size"}`` and
        the workload's config fields that differ from the size's defaults, or ``{"model":
        "module:function", **kwargs}`` for a user's workload.

        Raises:
            LaunchError: a workload built in the notebook only (define it in a module instead).
        """
        from autoplan.exec import describe_workload  # noqa: PLC0415

        return describe_workload(self._get_workload())

    # ---- search ----------------------------------------------------------------------------
    def search(self) -> bool:
        """Start a search with the current settings in the background.

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

    def _search_job(self) -> None:
        self._search_button.disabled = True
        self._progress.bar_style = ""
        self._progress.value = 0.0
        t0 = time.perf_counter()
        try:
            self._status.value = f"building {self._model.value}" + (
                f" ({self._size.value})" if self._size.value != NO_SIZE else "")
            wl = self._get_workload()
            cl = self._cluster()
            res = _search_function()(wl, cl, pipeline="auto", schedule=self._schedule.value,
                         microbatches=self._microbatches.value or None, level=self._level.value,
                         progress=self._progress_cb)
        except Exception as err:
            self._progress.bar_style = "danger"
            self._status.value = f"search failed: {type(err).__name__}: {str(err)[:200]}"
            raise
        finally:
            self._search_button.disabled = False
        secs = time.perf_counter() - t0
        self._apply_result(res)
        self._progress.value = 1.0
        self._progress.bar_style = "success"
        size = getattr(wl, "size", None)
        self._status.value = (f"{len(res.plans)} plans for {wl.name}"
                              f"{f' ({size})' if size else ''} on {cl.spec} in "
                              f"{secs:.1f} s; best: {res.best.label}, {res.best.describe()}, "
                              f"{_ms(res.best.predicted.step_time)}")

    def _apply_result(self, res: Any) -> None:
        with self._lock:
            self.result = res
            self.plan = None
            opts = []
            for k, p in enumerate(res.plans):
                fits = p.predicted.memory_per_device <= p.cluster.device_memory
                opts.append((f"{k}. {p.label}: {p.describe()}, {_ms(p.predicted.step_time)}"
                             + ("" if fits else " (does not fit)"), k))
            self._quiet += 1
            try:
                self._candidate.options = opts
                self._candidate.value = None
            finally:
                self._quiet -= 1
        self.select(0)

    # ---- candidate -------------------------------------------------------------------------
    @property
    def candidates(self) -> list[Plan]:
        """The plans the candidate selector offers, in its order (the result's ranked plans)."""
        return [self.result.plans[v] for _, v in self._candidate.options] if self.result else []

    def select(self, index: int) -> Plan:
        """Select candidate ``index`` of the result's ranked plans and update every view (in the
        calling thread).

        Raises:
            RuntimeError: no search result yet. IndexError: no such candidate.
        """
        if self.result is None:
            raise RuntimeError("Explorer.select: no search result yet. Fix: run ex.search() and "
                               "ex.wait_idle() first.")
        n = len(self.result.plans)
        if not isinstance(index, int) or not 0 <= index < n:
            raise IndexError(f"Explorer.select: index should be in [0, {n}). Got {index!r}.")
        with self._lock:
            self._quiet += 1
            try:
                self._candidate.value = index
            finally:
                self._quiet -= 1
            self._show(index)
            return self.plan  # type: ignore[return-value]

    def _on_candidate(self, change: Mapping[str, Any]) -> None:
        if self._quiet or change["new"] is None:
            return
        # a change from the page: build the figures off the kernel's main thread
        self._start("view", lambda: self._show(change["new"]))

    def _show(self, index: int) -> None:
        with self._lock:
            plan = self.result.plans[index]
            self.plan = plan
            self._layer_of_op = {o.op: o.layer for s in plan.stages for o in s.ops}
            self._stage_of_layer = {}
            for s in plan.stages:
                for name in s.layers:
                    self._stage_of_layer.setdefault(name, s.index)
            figs = {"sharding": sharding_figure(plan), "stage": stage_figure(plan),
                    "timeline": timeline_figure(plan),
                    "compare": compare_figure(self.result.plans, highlight=index)}
            for name, fig in figs.items():
                sync_figure(self.figures[name], fig)
                self._base[name] = [_restyle_base(t) for t in self.figures[name].data]
                self._base_shapes[name] = list(fig.layout.shapes or ())
            self._wire_clicks()
            fill_width(self.figures["launch"])
            self._summary.value = plan._repr_html_()
            old = self._focus.value
            opts: list[tuple[str, str]] = [("(no selection)", "")]
            for s in plan.stages:
                lo, hi = s.layer_range
                opts.append((f"stage {s.index}: layers {lo}-{hi - 1}, mesh "
                             f"{'x'.join(map(str, s.mesh_shape))}", f"stage:{s.index}"))
                for name in s.layers:
                    opts.append((f"  {name} (stage {s.index})", f"layer:{name}"))
            self._quiet += 1
            try:
                self._focus.options = opts
                self._focus.value = old if old in {v for _, v in opts} else ""
            finally:
                self._quiet -= 1
            self._highlight(self._focus.value)
            self._launch_button.disabled = False

    # ---- linked selection ------------------------------------------------------------------
    @property
    def focus(self) -> str:
        """The selection: ``""``, ``"layer:<name>"`` or ``"stage:<index>"``."""
        return self._focus.value

    def select_layer(self, name: str) -> None:
        """Select layer ``name`` of the selected plan and highlight it in every view."""
        self._set_focus(f"layer:{name}")

    def select_stage(self, index: int) -> None:
        """Select stage ``index`` of the selected plan and highlight it in every view."""
        self._set_focus(f"stage:{index}")

    def clear_selection(self) -> None:
        self._set_focus("")

    def _set_focus(self, value: str) -> None:
        if self.plan is None:
            raise RuntimeError("Explorer: select a candidate before selecting a layer.")
        allowed = {v for _, v in self._focus.options}
        if value not in allowed:
            layers = [v.split(":", 1)[1] for v in allowed if v.startswith("layer:")]
            raise ValueError(f"Explorer: {value!r} is not a layer or stage of the selected plan; its "
                             f"layers are {layers}.")
        with self._lock:
            self._quiet += 1
            try:
                self._focus.value = value
            finally:
                self._quiet -= 1
            self._highlight(value)

    def _on_focus(self, change: Mapping[str, Any]) -> None:
        if self._quiet or self.plan is None:
            return
        with self._lock:
            self._highlight(change["new"] or "")

    def _focus_sets(self, value: str) -> tuple[set[str], int | None]:
        plan = self.plan
        if not value or plan is None:
            return set(), None
        kind, _, arg = value.partition(":")
        if kind == "stage":
            k = int(arg)
            st = next((s for s in plan.stages if s.index == k), None)
            return (set(st.layers) if st else set()), k
        return {arg}, self._stage_of_layer.get(arg)

    def _highlight(self, value: str) -> None:
        """Dim what is not selected and outline what is, in the sharding, stage and timeline views."""
        plan = self.plan
        if plan is None:
            return
        layers, stage = self._focus_sets(value)
        on = bool(value)
        # sharding: the selected layer's (or stage's) operator columns
        fw = self.figures["sharding"]
        cols: set[int] = set()
        with fw.batch_update():
            for tr in fw.data:
                meta = tr.meta if isinstance(tr.meta, dict) else {}
                if meta.get("kind") != "tile":
                    continue
                if value.startswith("stage:"):
                    hit = meta.get("stage") == stage
                else:
                    hit = self._layer_of_op.get(meta.get("op")) in layers
                if hit:
                    cols.add(int(meta["column"]))
                tr.opacity = (1.0 if hit else DIM) if on else None
            shapes = list(self._base_shapes.get("sharding", []))
            for a, b in _runs(sorted(cols)):
                shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": a + 0.02,
                               "x1": b + 0.98, "y0": 0.0, "y1": 1.0, "name": "highlight",
                               "line": {"color": HIGHLIGHT_LINE, "width": 2.5},
                               "fillcolor": "rgba(0,0,0,0)"})
            fw.layout.shapes = shapes
        # stage view: the owning stage's devices
        fw = self.figures["stage"]
        devices: list[int] = []
        with fw.batch_update():
            for tr, base in zip(fw.data, self._base.get("stage", [])):
                meta = tr.meta if isinstance(tr.meta, dict) else {}
                if meta.get("kind") != "device":
                    continue
                hit = on and stage is not None and stage in (meta.get("stages") or [meta.get("stage")])
                if hit:
                    devices.append(int(meta["device"]))
                    tr.line = {"color": HIGHLIGHT_LINE, "width": 3}
                else:
                    tr.line = base["line"]
                tr.opacity = (1.0 if hit else DIM) if on else None
        # timeline: the owning stage's bars
        fw = self.figures["timeline"]
        with fw.batch_update():
            for tr, base in zip(fw.data, self._base.get("timeline", [])):
                meta = tr.meta if isinstance(tr.meta, dict) else {}
                if meta.get("kind") != "events":
                    continue
                hit = on and meta.get("stage") == stage
                tr.opacity = (1.0 if hit else DIM) if on else None
                tr.marker.line = {"color": HIGHLIGHT_LINE, "width": 1.5} if hit else base["marker_line"]
        if not on:
            self._focus_info.value = ("<small>click an operator in the sharding view, a device in "
                                      "the stage view or a bar of the timeline to select its layer "
                                      "or stage</small>")
            return
        ops = [o for s in plan.stages for o in s.ops if o.layer in layers]
        what = value.split(":", 1)[1]
        label = f"stage {what}" if value.startswith("stage:") else f"layer <code>{html.escape(what)}</code>"
        self._focus_info.value = (
            f"<small>selected {label}: {len(ops)} planned operators "
            f"({len(cols)} drawn in the sharding view), stage {stage}, devices "
            f"{_span(sorted(devices))}</small>")

    def _wire_clicks(self) -> None:
        for tr in self.figures["sharding"].data:
            tr.on_click(self._guarded("click", self._on_tile_click), append=False)
        for name in ("stage", "timeline"):
            for tr in self.figures[name].data:
                tr.on_click(self._guarded("click", self._on_stage_click), append=False)

    def _on_tile_click(self, trace: Any, points: Any, _state: Any = None) -> None:
        if not points.point_inds:
            return
        meta = trace.meta if isinstance(trace.meta, dict) else {}
        layer = self._layer_of_op.get(meta.get("op"))
        if layer and f"layer:{layer}" in {v for _, v in self._focus.options}:
            self.select_layer(layer)

    def _on_stage_click(self, trace: Any, points: Any, _state: Any = None) -> None:
        if not points.point_inds:
            return
        meta = trace.meta if isinstance(trace.meta, dict) else {}
        stage = meta.get("stage")
        if meta.get("kind") == "events" and trace.customdata is not None:
            stage = int(trace.customdata[points.point_inds[0]][4])
        if stage is not None:
            self.select_stage(int(stage))

    # ---- launch ----------------------------------------------------------------------------
    def _init_launch_figure(self) -> None:
        fw = self.figures["launch"]
        fw.add_traces([
            go.Scatter(x=[], y=[], mode="lines+markers", name="loss", line={"color": "#4c78a8"},
                       meta={"kind": "loss"}),
            go.Scatter(x=[], y=[], mode="lines+markers", name="step time", yaxis="y2",
                       line={"color": "#e45756"}, meta={"kind": "step_time"}),
            go.Scatter(x=[], y=[], mode="lines", name="predicted step time", yaxis="y2",
                       line={"color": "#e45756", "dash": "dot"}, meta={"kind": "predicted"}),
        ])
        fw.update_layout(xaxis={"title": {"text": "step"}, "dtick": 1},
                         yaxis={"title": {"text": "loss"}},
                         # log: emulated CPU devices run ~100x slower than the cluster predicted
                         yaxis2={"title": {"text": "step time (log)"}, "overlaying": "y",
                                 "side": "right", "type": "log", "dtick": 1, "tickformat": "~s",
                                 "ticksuffix": "s", "showgrid": False},
                         legend={"orientation": "h", "y": -0.25},
                         margin={"t": 60, "l": 60, "r": 60, "b": 40})

    def launch(self, steps: int | None = None, timeout: float = 900.0) -> bool:
        """Run the selected plan on the devices attached, in the background.

        The launcher detects the platform and chooses the workers as ``autoplan launch`` does (one
        per GPU; emulated CPU devices in 2 processes when no accelerator is attached); a plan that
        needs more devices than attached fails with the cluster commands in the status.

        Args:
            steps: training steps (default: the widget's value).
            timeout: seconds before the launch is cancelled.

        Returns:
            False (and starts nothing) when a launch is already running.

        Raises:
            RuntimeError: no plan is selected.
        """
        plan = self.plan
        if plan is None:
            raise RuntimeError("Explorer.launch: no plan selected. Fix: run a search first.")
        if steps is not None:
            self._steps.value = int(steps)
        n = int(self._steps.value)
        started = self._start("launch", lambda: self._launch_job(plan, n, timeout))
        if not started:
            self._launch_status.value = "a launch is already running"
        return started

    def _launch_job(self, plan: Plan, steps: int, timeout: float) -> None:
        from autoplan.exec import launch  # noqa: PLC0415

        rec = LaunchRecord(plan=plan, spec={}, num_processes=0, devices_per_process=0, steps=steps)
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
            self._launch_status.value = f"launching [{plan.label}] {plan.describe()} on {rec.layout}"
            # the handle supervises its workers (errors, hangs, its timeout); poll until it is over
            while not rec.handle.done:
                new = list(rec.handle.poll() or [])
                if new:
                    rec.events.extend(new)
                    self._draw_launch(rec)
                    self._launch_status.value = self._running_text(rec)
                time.sleep(0.2)
            rec.result = rec.handle.wait(60)
            rec.events = list(rec.handle.events)
        except Exception as err:
            rec.error = f"{type(err).__name__}: {err}"
            self._launch_status.value = f"launch failed: {rec.error[:200]}"
            # the whole message: the workers' last lines, or the cluster commands for a plan
            # that needs more devices than attached
            self._launch_result.value = (f"<pre class='autoplan-launch-error'>"
                                         f"{html.escape(rec.error)}</pre>")
            raise
        finally:
            rec.finished = time.time()
            self._launch_button.disabled = self.plan is None
            self._draw_launch(rec)
        self._launch_status.value = (f"finished: {len(rec.losses)} steps in "
                                     f"{rec.finished - rec.started:.1f} s")
        self._launch_result.value = self._launch_summary_html(rec)

    @staticmethod
    def _running_text(rec: LaunchRecord) -> str:
        errs = [e for e in rec.events if e.get("event") == "error"]
        if errs:
            return f"error in process {errs[0].get('process')}: {str(errs[0].get('message'))[:200]}"
        steps = {int(e["step"]) for e in rec.step_events}
        if not steps:
            started = {e.get("process") for e in rec.events if e.get("event") == "start"}
            return (f"{len(started)} of {rec.num_processes} workers joined; tracing and compiling "
                    "the first step")
        return f"running [{rec.plan.label}] on {rec.layout}: {len(steps)}/{rec.steps} steps"

    def _draw_launch(self, rec: LaunchRecord) -> None:
        fw = self.figures["launch"]
        losses, times = rec.losses, rec.step_times
        with fw.batch_update():
            fw.data[0].x, fw.data[0].y = list(range(len(losses))), losses
            fw.data[1].x, fw.data[1].y = list(range(len(times))), times
            fw.data[2].x = [0, max(rec.steps - 1, 1)]
            fw.data[2].y = [rec.plan.predicted.step_time] * 2
            fw.layout.title = {"text": f"launch of [{html.escape(rec.plan.label)}]: "
                                       f"{len(losses)}/{rec.steps} steps"}
        fill_width(fw)
        rows = "".join(
            f"<tr><td>{e.get('step')}</td><td>{e.get('process', 0)}</td>"
            f"<td>{_loss(e.get('loss'))}</td>"
            f"<td>{_ms(e.get('step_time'))}</td></tr>"
            for e in rec.step_events[-40:])
        self._launch_table.value = (
            "<table class='autoplan-launch-table'><tr><th>step</th><th>process</th><th>loss</th>"
            f"<th>step time</th></tr>{rows}</table>" if rows else "<i>waiting for the first step</i>")

    def _launch_summary_html(self, rec: LaunchRecord) -> str:
        pred = rec.plan.predicted.step_time
        meas = rec.measured_step_time
        ratio = f" ({meas / pred:.1f}x the prediction)" if meas and pred > 0 else ""
        m = rec.matched
        check = {True: "<b style='color:#2ca02c'>matched single-device results</b>",
                 False: "<b style='color:#d62728'>did NOT match single-device results</b>",
                 None: "single-device check: not reported"}[m]
        loss = rec.final_loss
        err = f"<br><b style='color:#d62728'>error</b>: {html.escape(rec.error)}" if rec.error else ""
        return (f"<div class='autoplan-launch-result'><b>launch finished</b>: [{html.escape(rec.plan.label)}] "
                f"{html.escape(rec.plan.describe())}, {html.escape(rec.layout)}, "
                f"{len(rec.losses)} steps<br>measured step time {_ms(meas)}{ratio}; "
                f"predicted {_ms(pred)} (for {html.escape(rec.plan.cluster.spec)}, "
                f"{html.escape(rec.plan.cluster.describe_profile())})<br>final loss "
                f"{_loss(loss)}; {check}{err}</div>")


def _restyle_base(trace: Any) -> dict[str, Any]:
    """What highlighting changes on a trace, as the figure drew it (restored on clearing)."""
    line = getattr(trace, "line", None)
    marker = getattr(trace, "marker", None)
    mline = getattr(marker, "line", None) if marker is not None else None
    return {"line": line.to_plotly_json() if line is not None else None,
            "marker_line": mline.to_plotly_json() if mline is not None else None}


def _runs(values: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for v in values:
        if out and v == out[-1][1] + 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


def _span(ids: list[int]) -> str:
    if not ids:
        return "-"
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}"
    return ", ".join(map(str, ids))

