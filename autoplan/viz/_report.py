"""A static, self-contained HTML report of a search or a plan (and its alternatives).

The report works offline and without a kernel: plotly.js is embedded once, inline, and every
figure after it is a ``<div>`` plus a small script that draws into it. It holds the chosen plan's
summary, every plan's row (equivalent plans marked) and their comparison, the figures of
:mod:`autoplan.viz` (operator sharding, stages, memory per device, the mined subgraphs, the
pipeline timeline), the plan as code (``plan.to_code()``, with a copy button) and a table of
every input's PartitionSpec.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
import plotly.offline

from autoplan.plans._plan import Plan
from autoplan.viz._graph_figure import graph_figure
from autoplan.viz._timeline import memory_figure, stage_figure, timeline_figure

from .._dtype import dtype_bytes
from .._io import atomic_write_text
from ._compare import as_plans, compare_figure, equivalent_groups
from ._sharding import sharding_figure
from ._style import fmt_bytes, fmt_seconds

__all__ = ["report_html", "report_figures"]

_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 24px; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 4px; } h2 { font-size: 1.15em; margin-top: 28px; }
pre.summary { background: #f6f6f6; padding: 10px 14px; border-radius: 4px; overflow-x: auto; }
pre.code { background: #f6f6f6; padding: 10px 14px; border-radius: 4px; overflow: auto;
           max-height: 480px; font-size: 0.85em; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 10px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; position: sticky; top: 0; } td.num { text-align: right; }
tr.chosen td { font-weight: 600; } tr.nofit td { color: #a33; }
code { font-family: ui-monospace, 'SFMono-Regular', Menlo, monospace; }
.figure { margin: 8px 0 20px 0; } .muted { color: #777; }
button.copy { font-size: 0.85em; padding: 2px 10px; }
"""

_COPY_JS = """
function autoplanCopy(id, button) {
  var text = document.getElementById(id).textContent;
  var done = function () { button.textContent = 'copied'; };
  if (navigator.clipboard && navigator.clipboard.writeText) {
    navigator.clipboard.writeText(text).then(done, function () { select(id); });
  } else { select(id); }
  function select(id) {
    var r = document.createRange(); r.selectNodeContents(document.getElementById(id));
    var s = window.getSelection(); s.removeAllRanges(); s.addRange(r);
    button.textContent = 'selected: press Ctrl+C';
  }
}
"""


def _graph_section(chosen: Plan, graph: Any) -> go.Figure | None:
    if graph is None:
        return graph_figure(chosen) if chosen.analysis else None
    if isinstance(graph, go.Figure):
        return graph
    if isinstance(graph, Mapping) and "layers" in graph and "name" not in graph:
        kwargs = dict(graph)
        if "edges" in kwargs:
            kwargs["layers"] = {"layers": kwargs["layers"], "edges": kwargs.pop("edges")}
        return graph_figure(**kwargs)
    return graph_figure(graph)


def report_figures(plans: Sequence[Plan], graph: Any = None, max_columns: int = 40,
                   chosen: int = 0) -> list[tuple[str, go.Figure]]:
    """The (heading, figure) pairs of a report: the comparison (with several plans), then the
    chosen plan's operator sharding, stages, memory per device, mined subgraphs (from its
    folding analysis, or ``graph``) and pipeline timeline."""
    plan = plans[chosen]
    figs = []
    if len(plans) > 1:
        figs.append(("Plans compared", compare_figure(plans, highlight=chosen)))
    figs += [("Operator sharding", sharding_figure(plan, max_columns=max_columns)),
             ("Stages on the cluster", stage_figure(plan)),
             ("Memory per device", memory_figure(plan))]
    g = _graph_section(plan, graph)
    if g is not None:
        figs.append(("Mined subgraphs", g))
    figs.append(("Pipeline timeline", timeline_figure(plan)))
    return figs


def _input_rows(plan: Plan) -> str:
    stages = {s.index: s for s in plan.stages}
    rows = []
    for i in plan.inputs:
        st = stages.get(i.stage, plan.stages[0])
        per = math.prod(i.shape) * dtype_bytes(i.dtype) / i.spec.tiles(st.mesh_shape, st.axis_names)
        rows.append(
            f"<tr><td><code>{html.escape(i.name)}</code></td><td>{html.escape(i.kind)}</td>"
            f"<td>{'x'.join(map(str, i.shape)) or 'scalar'}</td><td>{html.escape(i.dtype)}</td>"
            f"<td><code>{html.escape(i.spec.pspec_text())}</code></td><td><code>"
            f"{html.escape(str(i.spec))}</code></td><td class='num'>{i.stage}</td>"
            f"<td class='num'>{fmt_bytes(per)}</td></tr>")
    return "".join(rows)


def _plans_rows(plans: Sequence[Plan], chosen: int) -> str:
    groups = equivalent_groups(plans)
    group_of = {i: g for g in groups for i in g}
    rows = []
    for k, p in enumerate(plans):
        q = p.predicted
        fits = q.memory_per_device <= p.cluster.device_memory
        same = [j for j in group_of[k] if j != k]
        cls = " ".join(c for c, on in (("chosen", k == chosen), ("nofit", not fits)) if on)
        rows.append(
            f"<tr class='{cls}'><td class='num'>{k}</td><td>{'&#9733; ' if k == chosen else ''}"
            f"{html.escape(p.label)}</td><td>{html.escape(p.describe())}</td>"
            f"<td class='num'>{fmt_seconds(q.step_time)}</td>"
            f"<td class='num'>{q.throughput:,.1f}</td><td class='num'>{fmt_bytes(q.memory_per_device)}</td>"
            f"<td>{'yes' if fits else 'no'}</td>"
            f"<td class='num'>{q.bubble_fraction * 100:.1f}%</td><td class='num'>{q.mfu * 100:.1f}%</td>"
            f"<td>{', '.join(f'#{j}' for j in same) if same else ''}</td></tr>")
    return "".join(rows)


def report_html(plan_or_plans: Any, path: str | None = None, title: str | None = None, *,
                graph: Any = None, max_columns: int = 40) -> str:
    """One self-contained HTML page describing a search or a plan; works offline.

    plotly.js is embedded once, inline (no CDN, no external script); then the chosen plan's
    summary, every plan's row (number, label, layout, predicted step time, throughput, memory per
    device, whether it fits, bubble, MFU, equivalent plans) and their comparison, the chosen
    plan's figures (operator sharding, stages, memory per device, mined subgraphs, timeline),
    its code (:meth:`autoplan.Plan.to_code`) and a table of every input's PartitionSpec.

    Args:
        plan_or_plans: a :class:`~autoplan.SearchResult` (every ranked plan; its best is
            the chosen one), a Plan, a list of Plans (the first is the chosen one), or an object
            with ``.plans``.
        path: when given, the HTML is written there too (UTF-8), atomically: a temporary file
            in the same folder renamed over ``path``, so a failed or interrupted write keeps the
            file that was there.
        title: the page title (default names the model and the chosen plan's label).
        graph: the mined-subgraph figure's input when the plan carries no folding analysis:
            ``graph_figure``'s keyword arguments as a mapping (``{"layers": ..., "segments":
            ..., "fold_ratio": ...}``), its ``layers`` argument, or a ready figure.
        max_columns: the most columns in the sharding figure.

    Returns:
        The HTML text.

    Raises:
        TypeError: ``plan_or_plans`` holds no Plans.
        OutputError: ``path`` cannot be written (the file that was there is kept).
    """
    plans = as_plans(plan_or_plans)
    best = getattr(plan_or_plans, "best", None)
    chosen_i = next((k for k, p in enumerate(plans) if p is best), 0) if best is not None else 0
    chosen = plans[chosen_i]
    title = title or f"autoplan report: {chosen.model} [{chosen.label}]"
    config = {"displaylogo": False, "responsive": True}
    sections = []
    for k, (heading, fig) in enumerate(report_figures(plans, graph=graph, max_columns=max_columns,
                                                      chosen=chosen_i)):
        div = fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False,
                          config=config, div_id=f"autoplan-figure-{k}", default_width="100%")
        sections.append(f"<h2>{html.escape(heading)}</h2><div class='figure'>{div}</div>")
    compared = ""
    if len(plans) > 1:
        compared = ("<h2>Plans</h2><p class='muted'>&#9733; = the chosen plan; numbers as in the "
                    "comparison; plans that do not fit in the device's memory in red; equivalent "
                    "= the same shardings up to swapping mesh axes, with the same prediction</p>"
                    "<table><tr><th>#</th><th>label</th><th>layout</th><th>step time</th>"
                    "<th>samples/s</th><th>memory/device</th><th>fits</th><th>bubble</th>"
                    f"<th>MFU</th><th>equivalent</th></tr>{_plans_rows(plans, chosen_i)}</table>")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in chosen.notes)
    n_params = sum(1 for i in chosen.inputs if i.kind == "parameter")
    code = html.escape(chosen.to_code())
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="generator" content="autoplan.viz.report_html">
<title>{html.escape(title)}</title>
<style>{_CSS}</style>
<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>
<script type="text/javascript">{_COPY_JS}</script>
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
<h2>Code</h2>
<p class="muted">The chosen plan's mesh and <code>NamedSharding</code> pytrees for a training
script: <code>shardings_for(args)</code> mirrors the step's arguments.
<button class="copy" onclick="autoplanCopy('autoplan-code', this)">copy code</button></p>
<pre class="code" id="autoplan-code">{code}</pre>
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
