"""The explorer as static HTML: what a front end without the explorer's kernel shows.

A notebook saved with an :class:`~autoplan.viz.Explorer` and reopened without the kernel that
made it holds no widget models; :func:`explorer_snapshot` is the ``text/html`` the explorer puts
beside its widget view in its display, written from what the explorer holds when displayed:
the status line, every candidate, the selected plan's summary and the numbers of its figures
(where the step time goes, memory per stage, the stages on the devices). No script, no
plotly.js: it renders in any notebook viewer.
"""

from __future__ import annotations

import html
from typing import Any

from autoplan.viz._timeline import memory_breakdown

from ._compare import cost_parts
from ._style import fmt_bytes, fmt_in_unit, id_span, time_unit

__all__ = ["explorer_snapshot"]

_CSS = ("<style>.autoplan-static table {border-collapse: collapse; font-size: 12px; margin: 4px 0;}"
        ".autoplan-static td, .autoplan-static th {padding: 1px 8px; text-align: right;}"
        ".autoplan-static td:first-child, .autoplan-static th:first-child {text-align: left;}"
        ".autoplan-static .autoplan-section {font-weight: 600; margin-top: 8px;}</style>")


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def explorer_snapshot(ex: Any) -> str:
    """The static HTML of explorer ``ex`` (see the module docstring)."""
    parts = [_CSS, "<div class='autoplan-static'><b>autoplan explorer</b> "
             "<small>(a static snapshot: run the cell again for the interactive explorer)</small>"]
    parts.append(f"<div class='autoplan-status'>{html.escape(str(ex._status.value))}</div>")
    plan = ex.plan
    result = ex.result
    if result is None or plan is None:
        parts.append("<p><i>no plan yet</i></p></div>")
        return "".join(parts)
    plans = ex.plans
    best = result.best
    unit = time_unit(max((p.predicted.step_time for p in plans), default=0.0))
    shown = [k for _, k in ex._candidate.options]
    rows = []
    for k in shown:
        p = plans[k]
        mark = ("\u2605 " if p is plan else "") + ("best" if p is best else "")
        fits = p.predicted.memory_per_device <= p.cluster.device_memory
        rows.append([f"#{k}", html.escape(p.label), html.escape(p.describe()),
                     fmt_in_unit(p.predicted.step_time, unit), fmt_bytes(p.predicted.memory_per_device)
                     + ("" if fits else " (does not fit)"), mark])
    parts.append("<div class='autoplan-section'>candidates (\u2605 = shown below)</div>")
    parts.append(_table(["#", "plan", "layout", "step time", "memory / device", ""], rows))
    parts.append(f"<div class='autoplan-section'>plan #{ex._candidate.value} "
                 f"[{html.escape(plan.label)}]</div>")
    parts.append(ex._summary.value)
    # where the step time goes: the parts add up to the step time (see cost_parts)
    cp = cost_parts(plan)
    rows = [[html.escape(n), fmt_in_unit(v, unit)] for n, v in cp.items() if abs(v) > 0]
    rows.append(["<b>step time</b>", f"<b>{fmt_in_unit(plan.predicted.step_time, unit)}</b>"])
    parts.append("<div class='autoplan-section'>where the step time goes (overlap: collectives "
                 "during compute; bubble: the busiest stage's wait)</div>")
    parts.append(_table(["part", "time"], rows))
    rows = []
    for s, m in zip(plan.stages, memory_breakdown(plan)):
        rows.append([f"stage {s.index}", html.escape(", ".join(s.layers)),
                     "x".join(map(str, s.mesh_shape)), id_span(list(s.device_ids)),
                     fmt_bytes(m["parameters"]), fmt_bytes(m["optimizer_state"]),
                     fmt_bytes(m["batch"]), fmt_bytes(m["activations"]), fmt_bytes(m["total"])])
    parts.append("<div class='autoplan-section'>stages and memory per device</div>")
    parts.append(_table(["stage", "layers", "mesh", "devices", "parameters", "optimizer state",
                         "batch", "activations", "total"], rows))
    parts.append("</div>")
    return "".join(parts)
