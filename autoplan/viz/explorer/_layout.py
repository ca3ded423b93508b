"""The explorer's widgets: the search controls, the figures, the what-if, code and launch
widgets, and the page they are laid out on (with its CSS)."""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from autoplan.costs._cluster import PRESETS, Cluster
from autoplan.plans._plan import LEVELS
from autoplan.plans._schedule import SCHEDULE_CHOICES
from autoplan.viz._style import TEMPLATE
from autoplan.viz._widget import CodeView, PlotView

from ._state import fmt_budget

#: the cluster control's entry for this machine's measured profile (``Cluster.parse("local")``)
LOCAL_LABEL = "this machine (measured)"

SCHEDULES = SCHEDULE_CHOICES
MICROBATCH_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128)
FIGURES = ("sharding", "stage", "memory", "graph", "timeline", "compare", "launch")
AUTO = 0  # the micro-batches Dropdown's value for "searched" (ipywidgets shows None as blank)
NO_SIZE = "-"  # the size Dropdown's value for a user's workload (it has no zoo sizes)
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



class ExplorerLayout:
    """Builds the explorer's widgets as attributes (``_model``, ``_status``, ``figures``,
    ``code``, ``_launch_button``...) and the root ``VBox`` holding them."""

    def _build_controls(self, model: str, size: str, cl: Cluster, level: str, schedule: str,
                        microbatches: int | None, memory_budget: float | None) -> None:
        """The search controls (model, size, cluster, level, schedule, micro-batches, budget),
        the candidate and layer pickers, and the status and summary lines."""
        models = self._state.models
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
        if self._state.custom_cluster is not None and cl.name != "local":
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
