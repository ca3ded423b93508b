"""Comparing plans: step time against memory with the Pareto front, and cost breakdowns.

A plan ``p`` is dominated when another plan ``q`` is no worse in both predicted step time and
memory per device and better in one: ``t_q <= t_p``, ``m_q <= m_p``, ``(t_q, m_q) != (t_p, m_p)``.
The Pareto front is the set of plans nobody dominates.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .._cluster import COLLECTIVES
from .._plan import Plan
from ._style import TEMPLATE, escape, fmt_bytes, fmt_seconds

__all__ = ["compare_figure", "as_plans", "pareto_front", "COMPONENT_COLORS"]

COMPONENT_COLORS = {
    "compute": "#4c78a8", "all-reduce": "#e45756", "all-gather": "#f58518",
    "reduce-scatter": "#eeca3b", "all-to-all": "#b279a2", "send-recv": "#72b7b2",
    "bubble": "#bab0ac",
}
_EXTRA = ("#9d755d", "#ff9da6", "#54a24b", "#79706e")


def as_plans(plans: Any) -> list[Plan]:
    """A list of plans from a Plan, a sequence of Plans, or an object with ``.plans``.

    Raises:
        TypeError: anything else, or an empty collection.
    """
    if isinstance(plans, Plan):
        return [plans]
    if hasattr(plans, "plans"):
        plans = plans.plans
    if isinstance(plans, Plan):
        return [plans]
    if not isinstance(plans, Iterable) or isinstance(plans, str | bytes):
        raise TypeError(f"plans should be a Plan, a list of Plans or an object with a .plans "
                        f"attribute. Got {type(plans).__name__}.")
    out = list(plans)
    bad = [type(p).__name__ for p in out if not isinstance(p, Plan)]
    if bad or not out:
        raise TypeError(f"plans should hold at least one autoplan Plan. Got "
                        f"{'an empty collection' if not out else 'items of type ' + ', '.join(sorted(set(bad)))}.")
    return out


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the non-dominated points (both coordinates minimised), sorted by the first.

    Examples:
        >>> pareto_front([(1, 5), (2, 2), (3, 3), (4, 1)])
        [0, 1, 3]
    """
    keep = []
    for i, (t, m) in enumerate(points):
        dominated = any(t2 <= t and m2 <= m and (t2, m2) != (t, m)
                        for j, (t2, m2) in enumerate(points) if j != i)
        if not dominated:
            keep.append(i)
    return sorted(keep, key=lambda i: (points[i][0], points[i][1], i))


def _gib_ticks(values: Sequence[float]) -> tuple[list[float], list[str]]:
    """Tick positions in bytes at round multiples of a GiB (or MiB) step, and their labels."""
    vals = [v for v in values if _finite(v)]
    if not vals:
        return [], []
    hi = max(vals)
    unit, name = (2**30, "GiB") if hi >= 2**30 else (2**20, "MiB")
    lo_u, hi_u = min(vals) / unit, hi / unit
    span = max(hi_u - lo_u, hi_u * 0.2, 1e-9)
    raw = span / 5
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo_u / step) - 1
    last = math.ceil(hi_u / step) + 1
    ticks = [k * step for k in range(max(first, 0), last + 1)]
    return [t * unit for t in ticks], [f"{t:g} {name}" for t in ticks]


def _unique_labels(plans: Sequence[Plan]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for p in plans:
        n = seen.get(p.label, 0)
        seen[p.label] = n + 1
        out.append(p.label if n == 0 else f"{p.label} #{n + 1}")
    return out


def _finite(*xs: float) -> bool:
    return all(x is not None and math.isfinite(x) for x in xs)


def _match_highlight(highlight: Any, plans: Sequence[Plan], labels: Sequence[str]) -> int | None:
    if highlight is None:
        return None
    if isinstance(highlight, Plan):
        return next((i for i, p in enumerate(plans) if p is highlight or p == highlight), None)
    if isinstance(highlight, int) and not isinstance(highlight, bool):
        return highlight if 0 <= highlight < len(plans) else None
    return next((i for i, lab in enumerate(labels) if lab == highlight), None)


def compare_figure(plans: Any, highlight: Any = None) -> go.Figure:
    """Compare plans: (a) predicted step time against memory per device, (b) cost breakdown.

    Panel (a) has one point per plan at ``x = predicted.step_time`` (seconds), ``y =
    predicted.memory_per_device`` (bytes), labelled with the plan's label (trace ``meta.kind ==
    "plans"``), and the Pareto front as a line through the non-dominated plans in step-time order
    (``meta.kind == "pareto"``). Panel (b) stacks, per plan, compute time, the time of each
    collective kind in ``predicted.comm_time_by_kind`` and the bubble
    (``bubble_fraction * step_time``), with the predicted step time as a diamond (the parts
    overlap, so their sum can exceed it).

    Args:
        plans: a list of Plans, or any object with a ``.plans`` attribute (a single Plan works).
        highlight: a plan, its index or its label, drawn as a star; ``None`` for none.

    Returns:
        A ``plotly.graph_objects.Figure``.

    Raises:
        TypeError: ``plans`` holds no Plans.
    """
    plans = as_plans(plans)
    labels = _unique_labels(plans)
    hi = _match_highlight(highlight, plans, labels)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5], horizontal_spacing=0.1,
                        subplot_titles=("(a) step time vs memory per device",
                                        "(b) where the step time goes"))
    ok = [i for i, p in enumerate(plans)
          if _finite(p.predicted.step_time, p.predicted.memory_per_device)]
    pts = [(plans[i].predicted.step_time, plans[i].predicted.memory_per_device) for i in ok]
    front = [ok[k] for k in pareto_front(pts)]

    def hover(i: int) -> str:
        p = plans[i].predicted
        return (f"<b>{escape(labels[i])}</b><br>{escape(plans[i].describe())}<br>step "
                f"{fmt_seconds(p.step_time)}, {p.throughput:.1f} samples/s<br>memory/device "
                f"{fmt_bytes(p.memory_per_device)}<br>MFU {p.mfu * 100:.1f}%")

    fig.add_trace(go.Scatter(
        x=[plans[i].predicted.step_time for i in front],
        y=[plans[i].predicted.memory_per_device for i in front],
        mode="lines", line={"color": "#888888", "dash": "dash", "width": 1.5, "shape": "hv"},
        name="Pareto front", hoverinfo="skip", meta={"kind": "pareto", "plans": front}), 1, 1)
    fig.add_trace(go.Scatter(
        x=[plans[i].predicted.step_time for i in ok], y=[plans[i].predicted.memory_per_device for i in ok],
        mode="markers+text", text=[escape(labels[i]) for i in ok], textposition="top center",
        marker={"size": [18 if i == hi else 11 for i in ok],
                "symbol": ["star" if i == hi else ("circle" if i in front else "circle-open")
                           for i in ok],
                "color": ["#d62728" if i == hi else "#4c78a8" for i in ok],
                "line": {"width": 1.5, "color": "#4c78a8"}},
        hovertext=[hover(i) for i in ok], hoverinfo="text", name="plans",
        meta={"kind": "plans", "plans": ok}), 1, 1)
    mem = {p.cluster.device_memory for p in plans}
    top = max((p[1] for p in pts), default=0.0)
    if len(mem) == 1 and top >= 0.5 * next(iter(mem)):
        dm = next(iter(mem))
        fig.add_hline(y=dm, line={"color": "#d62728", "dash": "dot", "width": 1}, row=1, col=1,
                      annotation_text=f"device memory {fmt_bytes(dm)}",
                      annotation_position="top left")

    kinds: list[str] = []
    for p in plans:
        for k in p.predicted.comm_time_by_kind:
            if k not in kinds:
                kinds.append(k)
    kinds.sort(key=lambda k: (COLLECTIVES.index(k) if k in COLLECTIVES else len(COLLECTIVES), k))
    parts = [("compute", [p.predicted.compute_time for p in plans])]
    parts += [(k, [p.predicted.comm_time_by_kind.get(k, 0.0) for p in plans]) for k in kinds]
    parts.append(("bubble", [p.predicted.bubble_fraction * p.predicted.step_time for p in plans]))
    extra = iter(_EXTRA * 4)
    for name, vals in parts:
        color = COMPONENT_COLORS.get(name) or next(extra)
        fig.add_trace(go.Bar(
            x=labels, y=vals, name=name, marker={"color": color},
            customdata=[[fmt_seconds(v)] for v in vals],
            hovertemplate=f"%{{x}}: {name} %{{customdata[0]}}<extra></extra>",
            meta={"kind": "breakdown", "component": name}), 1, 2)
    fig.add_trace(go.Scatter(
        x=labels, y=[p.predicted.step_time for p in plans], mode="markers", name="step time",
        marker={"symbol": "diamond", "size": 10, "color": "#222222"},
        customdata=[[fmt_seconds(p.predicted.step_time)] for p in plans],
        hovertemplate="%{x}: predicted step %{customdata[0]}<extra></extra>",
        meta={"kind": "step_time"}), 1, 2)
    dropped = len(plans) - len(ok)
    sub = (f"{len(front)} of {len(ok)} plans on the Pareto front (dashed)"
           + (f"; {dropped} plan(s) without a finite prediction left out of (a)" if dropped else "")
           + (f"; star = {escape(labels[hi])}" if hi is not None else ""))
    fig.update_layout(
        template=TEMPLATE, barmode="stack", height=480, hovermode="closest",
        title={"text": f"Comparing {len(plans)} plans of {escape(plans[0].model)}<br><sup>{sub}</sup>",
               "x": 0.01, "xanchor": "left"},
        margin={"t": 110, "l": 70, "r": 20, "b": 60}, legend={"title": {"text": "cost"}})
    fig.update_xaxes(title_text="predicted step time", tickformat="~s", ticksuffix="s", row=1, col=1)
    tickvals, ticktext = _gib_ticks([p[1] for p in pts])
    fig.update_yaxes(title_text="memory per device", tickvals=tickvals, ticktext=ticktext, row=1, col=1)
    fig.update_yaxes(title_text="time per step", tickformat="~s", ticksuffix="s", row=1, col=2)
    return fig
