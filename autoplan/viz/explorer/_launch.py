"""The launch panel: the selected plan run on the devices attached, its losses and step times
streamed into a figure and a table, and the measured step time set against the prediction."""

from __future__ import annotations

import html
import math
import time
from typing import Any

from autoplan._errors import StateError
from autoplan.plans._plan import Plan
from autoplan.viz._style import TEMPLATE, axis_ticks, fmt_in_unit, time_unit

from ._layout import LOCAL_LABEL
from ._state import LaunchRecord, _is_graph, _loss, _ms, cluster_text, short_error


class LaunchPanel:
    """:meth:`launch_spec`, :meth:`launch` and its job, and the launch figure, table and
    result."""

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
        context = self._state.context
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

