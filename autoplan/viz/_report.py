"""A static, self-contained HTML report of one plan (or a chosen plan and its alternatives).

The report works offline and without a kernel: plotly.js is embedded once, inline, and every
figure after it is a ``<div>`` plus a small script that draws into it. It holds the plan summary,
the figures of :mod:`autoplan.viz` and a table of every input's PartitionSpec.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
import plotly.offline

from .._io import atomic_write_text
from .._plan import Plan, spec_str
from ._compare import as_plans, compare_figure
from ._graph import graph_figure
from ._pipeline import stage_figure, timeline_figure
from ._sharding import sharding_figure
from ._style import dtype_bytes, fmt_bytes, fmt_seconds, pspec_text

__all__ = ["report_html", "report_figures"]

_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 24px; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 4px; } h2 { font-size: 1.15em; margin-top: 28px; }
pre.summary { background: #f6f6f6; padding: 10px 14px; border-radius: 4px; overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 10px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; position: sticky; top: 0; } td.num { text-align: right; }
code { font-family: ui-monospace, 'SFMono-Regular', Menlo, monospace; }
.figure { margin: 8px 0 20px 0; } .muted { color: #777; }
"""


def report_figures(plans: Sequence[Plan], graph: Any = None, max_ops: int = 48) -> list[tuple[str, go.Figure]]:
    """The (heading, figure) pairs of a report: sharding, stages, timeline, comparison (with
    several plans) and the layer graph (when ``graph`` is given)."""
    chosen = plans[0]
    figs = [("Operator sharding", sharding_figure(chosen, max_ops=max_ops)),
            ("Stages on the cluster", stage_figure(chosen)),
            ("Pipeline timeline", timeline_figure(chosen))]
    if len(plans) > 1:
        figs.append(("Plans compared", compare_figure(plans, highlight=0)))
    if graph is not None:
        if isinstance(graph, go.Figure):
            figs.append(("Operator graph", graph))
        elif isinstance(graph, Mapping) and "layers" in graph and "name" not in graph:
            kwargs = dict(graph)
            if "edges" in kwargs:
                kwargs["layers"] = {"layers": kwargs["layers"], "edges": kwargs.pop("edges")}
            figs.append(("Operator graph", graph_figure(**kwargs)))
        else:
            figs.append(("Operator graph", graph_figure(graph)))
    return figs


def _input_rows(plan: Plan) -> str:
    stages = {s.index: s for s in plan.stages}
    rows = []
    for i in plan.inputs:
        st = stages.get(i.stage, plan.stages[0])
        shards = math.prod(n for n, a in zip(st.mesh_shape, st.axis_names)
                           if any(a in (e or ()) for e in i.spec))
        per = math.prod(i.shape) * dtype_bytes(i.dtype) / shards
        rows.append(
            f"<tr><td><code>{html.escape(i.name)}</code></td><td>{html.escape(i.kind)}</td>"
            f"<td>{'x'.join(map(str, i.shape)) or 'scalar'}</td><td>{html.escape(i.dtype)}</td>"
            f"<td><code>{html.escape(pspec_text(i.spec))}</code></td><td><code>"
            f"{html.escape(spec_str(i.spec))}</code></td><td class='num'>{i.stage}</td>"
            f"<td class='num'>{fmt_bytes(per)}</td></tr>")
    return "".join(rows)


def _plans_rows(plans: Sequence[Plan]) -> str:
    rows = []
    for k, p in enumerate(plans):
        q = p.predicted
        rows.append(
            f"<tr><td>{'&#9733; ' if k == 0 else ''}{html.escape(p.label)}</td>"
            f"<td>{html.escape(p.describe())}</td><td class='num'>{fmt_seconds(q.step_time)}</td>"
            f"<td class='num'>{q.throughput:.1f}</td><td class='num'>{fmt_bytes(q.memory_per_device)}</td>"
            f"<td class='num'>{q.bubble_fraction * 100:.1f}%</td><td class='num'>{q.mfu * 100:.1f}%</td></tr>")
    return "".join(rows)


def report_html(plan_or_plans: Any, path: str | None = None, title: str | None = None, *,
                graph: Any = None, max_ops: int = 48) -> str:
    """One self-contained HTML page describing a plan; works offline.

    plotly.js is embedded once, inline (no CDN, no external script); then the figures (operator
    sharding, stages, timeline, and with several plans the comparison), the plan summary, and a
    table of every input's PartitionSpec (parameters, optimizer state, batch).

    Args:
        plan_or_plans: a Plan, a list of Plans, or an object with ``.plans``; with several, the
            first is the chosen plan and the comparison includes all.
        path: when given, the HTML is written there too (UTF-8), atomically: a temporary file
            in the same folder renamed over ``path``, so a failed or interrupted write keeps the
            file that was there.
        title: the page title (default names the model and the chosen plan's label).
        graph: optionally the layer graph: ``graph_figure``'s keyword arguments as a mapping
            (``{"layers": ..., "segments": ..., "fold_ratio": ...}``), its ``layers`` argument,
            or a ready figure.
        max_ops: the most operators in the sharding figure.

    Returns:
        The HTML text.

    Raises:
        TypeError: ``plan_or_plans`` holds no Plans.
        OutputError: ``path`` cannot be written (the file that was there is kept).
    """
    plans = as_plans(plan_or_plans)
    chosen = plans[0]
    title = title or f"autoplan report: {chosen.model} [{chosen.label}]"
    config = {"displaylogo": False, "responsive": True}
    sections = []
    for k, (heading, fig) in enumerate(report_figures(plans, graph=graph, max_ops=max_ops)):
        div = fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False,
                          config=config, div_id=f"autoplan-figure-{k}", default_width="100%")
        sections.append(f"<h2>{html.escape(heading)}</h2><div class='figure'>{div}</div>")
    compared = ""
    if len(plans) > 1:
        compared = ("<h2>Plans</h2><p class='muted'>&#9733; = the chosen plan</p><table><tr><th>label</th>"
                    "<th>layout</th><th>step time</th><th>samples/s</th><th>memory/device</th>"
                    f"<th>bubble</th><th>MFU</th></tr>{_plans_rows(plans)}</table>")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in chosen.notes)
    n_params = sum(1 for i in chosen.inputs if i.kind == "parameter")
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="generator" content="autoplan.viz.report_html">
<title>{html.escape(title)}</title>
<style>{_CSS}</style>
<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>
</head>
<body>
<h1>{html.escape(title)}</h1>
<p class="muted">{html.escape(chosen.describe())}; cluster {html.escape(chosen.cluster.spec)}
({html.escape(chosen.cluster.device_kind)}); search level {html.escape(chosen.level)}, {chosen.search_seconds:.1f} s;
JAX {html.escape(chosen.jax_version or 'unknown')}.</p>
<p class="profile">Costed on the {html.escape(chosen.cluster.describe_profile())}.</p>
<h2>Summary</h2>
<pre class="summary">{html.escape(chosen.summary())}</pre>
{f"<ul>{notes}</ul>" if notes else ""}
{compared}
{"".join(sections)}
<h2>PartitionSpecs</h2>
<p class="muted">{len(chosen.inputs)} inputs, {n_params} parameters. Bytes per device on the
holding stage's mesh.</p>
<table><tr><th>input</th><th>kind</th><th>shape</th><th>dtype</th><th>PartitionSpec</th>
<th>Alpa notation</th><th>stage</th><th>bytes/device</th></tr>
{_input_rows(chosen)}
</table>
</body>
</html>
"""
    if path is not None:
        atomic_write_text(path, page)
    return page
