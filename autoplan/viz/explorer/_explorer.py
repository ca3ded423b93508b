"""The :class:`Explorer`: its arguments checked, its panels composed and wired, its display,
and the background threads its searches, view updates, what-ifs and launches run in."""

from __future__ import annotations

import atexit
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from autoplan._errors import ModelError, SearchError, WaitTimeoutError
from autoplan._gc import paused
from autoplan.costs._cluster import PRESETS, Cluster
from autoplan.plans._plan import LEVELS, Plan
from autoplan.plans._schedule import check_schedule_choice

from ._candidates import CandidatePanel
from ._focus import FocusPanel
from ._launch import LaunchPanel
from ._layout import NO_SIZE, ExplorerLayout
from ._search import SearchPanel
from ._state import ExplorerState, LaunchRecord, _is_graph
from ._whatif import WhatIfPanel


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
    check_schedule_choice(schedule, "Explorer")
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


class Explorer(ExplorerLayout, SearchPanel, CandidatePanel, FocusPanel, WhatIfPanel, LaunchPanel):
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
        # a cluster passed in that no preset names stays the cluster control's choice
        self._state = ExplorerState(models, workload, cl if cl.name not in PRESETS else None)
        self._lock = threading.RLock()
        self._threads: dict[str, threading.Thread] = {}  # kind of job -> its latest thread
        _LIVE.add(self)
        self._quiet = 0  # > 0 while the explorer sets a widget itself: its observer ignores it
        self._snapshots: list[Any] = []  # display handles of the static snapshots shown
        self._build_controls(model, size, cl, level, schedule, microbatches, memory_budget)
        self._build_figures()
        self._build_what_if_and_launch()
        self.widget = self._layout()
        self.widget.add_class("autoplan-explorer")
        self._wire_callbacks()
        if autostart:
            self.search()

    # ---- the state's public attributes -------------------------------------------------------
    @property
    def result(self) -> Any:
        """The last ``SearchResult`` (None before the first search ranks plans)."""
        return self._state.result

    @result.setter
    def result(self, value: Any) -> None:
        self._state.result = value

    @property
    def plan(self) -> Plan | None:
        """The selected plan (None before)."""
        return self._state.plan

    @plan.setter
    def plan(self, value: Plan | None) -> None:
        self._state.plan = value

    @property
    def last_launch(self) -> LaunchRecord | None:
        """The last :class:`LaunchRecord` (None before the first launch)."""
        return self._state.last_launch

    @last_launch.setter
    def last_launch(self, value: LaunchRecord | None) -> None:
        self._state.last_launch = value

    # ---- wiring ------------------------------------------------------------------------------
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
        from autoplan.viz._static import explorer_snapshot  # noqa: PLC0415

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

    def _start(self, kind: str, target: Callable[[], None], pause_gc: bool = False) -> bool:
        """Run ``target`` in a background thread of its ``kind`` (False when one still runs);
        ``pause_gc``: with the cyclic collector paused (:func:`autoplan._gc.paused`: a search
        or what-if, which the notebook waits for)."""
        with self._lock:
            t = self._threads.get(kind)
            if t is not None and t.is_alive():
                return False
            job = target
            if pause_gc:
                def job() -> None:
                    with paused():
                        target()
            t = threading.Thread(target=self._guarded(kind, job), name=f"autoplan-explorer-{kind}",
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

    def busy_with(self, kind: str) -> bool:
        t = self._threads.get(kind)
        return t is not None and t.is_alive()

