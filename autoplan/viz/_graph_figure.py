"""The mined subgraphs: the operator graph condensed by layers, boxes coloured by mined class.

Layers (or segments) whose structure the miner found to be the same (same class) share a
colour, so the repetition that folding exploits is visible (TAPAS); segment boundaries are dashed
lines, critical nodes (TePDist's cut points between segments) are marked, and the title states
the fold ratio and how many ILPs the search solved.

``graph_figure`` takes the layers directly, or a :class:`~autoplan.SearchResult` or
:class:`~autoplan.Plan` carrying the folding analysis the search records (``plan.analysis``,
kept in the plan file), or that record itself (:class:`autoplan._analysis.FoldingAnalysis`): the
segments in model order, their classes, the critical nodes, the fold ratio and the ILP count.
Whatever it is given, it draws :class:`~autoplan._analysis.SegmentSummary` records.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from autoplan._analysis import FoldingAnalysis, SegmentSummary
from autoplan._errors import ArgumentError
from autoplan.viz._style import TEMPLATE, class_color, escape, legend_swatch

__all__ = ["graph_figure"]


def _resolve(ref: Any, names: dict[str, int], n: int, what: str) -> int:
    if isinstance(ref, str):
        if ref not in names:
            raise ArgumentError(f"graph_figure: {what} should name a layer. Got {ref!r}; layers "
                                f"look like {next(iter(names), '<none>')!r}. Fix: pass a layer's name or index.")
        return names[ref]
    if isinstance(ref, bool) or not isinstance(ref, int) or not 0 <= ref < n:
        raise ArgumentError(f"graph_figure: {what} should be a layer index in [0, {n}) or a layer "
                            f"name. Got {ref!r}. Fix: pass a layer's name or index.")
    return ref


def _boundaries(segments: Sequence[Any], names: dict[str, int], n: int) -> list[int]:
    out: set[int] = set()
    for seg in segments:
        if isinstance(seg, Sequence) and not isinstance(seg, str):
            if len(seg) != 2:
                raise ArgumentError(f"graph_figure: a segment should be a start index or a (start, "
                                    f"end) pair. Got {seg!r}. Fix: e.g. segments=[0, (2, 4)].")
            lo = _resolve(seg[0], names, n, "segment start")
            hi = seg[1] if isinstance(seg[1], int) and seg[1] == n else _resolve(seg[1], names, n, "segment end")
            out.update((lo, hi))
        else:
            out.add(_resolve(seg, names, n, "segment boundary"))
    return sorted(b for b in out if 0 < b < n)


def _from_analysis(source: Any) -> tuple[FoldingAnalysis, str]:
    """``(analysis, model name)`` of a Plan or SearchResult (or of the record itself)."""
    if isinstance(source, FoldingAnalysis):
        if not source.segments:
            raise ArgumentError("graph_figure: the folding analysis has no segments. Got "
                                f"{source!r:.60}. Fix: pass the layers.")
        return source, ""
    plan = source
    if hasattr(source, "best") and hasattr(source, "plans"):  # a SearchResult
        plan = next((p for p in [source.best, *source.plans] if getattr(p, "analysis", None)),
                    source.best)
    analysis = getattr(plan, "analysis", None)
    if not isinstance(analysis, Mapping) or not analysis.get("layers"):
        raise ArgumentError(
            f"graph_figure: the {type(source).__name__} carries no folding analysis (a plan made "
            "by hand or read from a file an older autoplan wrote). Got analysis="
            f"{str(analysis)[:40]}. Fix: search again with autoplan.search, or pass the layers.")
    return FoldingAnalysis.from_dict(analysis), str(getattr(plan, "model", ""))


def _segment(lay: Any, i: int) -> SegmentSummary:
    """A layer given as a dict (``name`` and optionally ``flops``, ``ops``, ``class``,
    ``planned``) as the record the figure draws."""
    if isinstance(lay, SegmentSummary):
        return lay
    if not isinstance(lay, Mapping) or "name" not in lay:
        raise ArgumentError(f"graph_figure: each layer should be a dict with a 'name'. Got layer "
                            f"{i}: {lay!r}.")
    return SegmentSummary(name=str(lay["name"]), flops=float(lay.get("flops", 0.0) or 0.0),
                          ops=int(lay.get("ops", 0) or 0), cls=lay.get("class"),
                          planned=tuple(lay.get("planned") or ()))


def graph_figure(layers: Any,
                 classes: Sequence[int | None] | Mapping[Any, int | None] | None = None,
                 segments: Sequence[Any] | None = None, critical: Sequence[Any] | None = None,
                 fold_ratio: float | None = None, title: str | None = None) -> go.Figure:
    """The mined subgraphs: the operator graph condensed by layers.

    Args:
        layers: the layers in model order, each ``{"name": str, "flops": float, "ops": int,
            "class": int | None}``; or a mapping ``{"layers": [...], "edges": [(src, dst), ...]}``
            whose edges (layer indices or names) are drawn as arcs when they skip a layer; or a
            :class:`~autoplan.SearchResult` or :class:`~autoplan.Plan` carrying the
            search's folding analysis, or that record itself (``result.analysis``): its
            segments as the layers, their structural classes, the critical nodes, the fold
            ratio and the ILPs of the search that made the plan.
        classes: per-layer mined classes overriding the layers' ``"class"`` (a list, or a mapping
            from layer index or name to class).
        segments: segment boundaries: indices (or names) of the layers that start a segment, or
            ``(start, end)`` pairs; drawn as dashed lines.
        critical: indices or names of critical layers (the cut nodes); outlined in red and marked.
        fold_ratio: operators before folding / after; stated in the title.
        title: the title's first line (default names the layer count).

    Returns:
        A ``plotly.graph_objects.Figure``: one bar trace of the layers (``meta.kind == "layers"``,
        ``marker.color[i]`` the colour of layer ``i``'s class, ``customdata[i] = [name, flops,
        ops, class]``, ``meta.planned[i]`` the planned operator ids of layer ``i`` when known),
        the critical markers (``meta.kind == "critical"``), skip edges (``meta.kind ==
        "edges"``) and a legend entry per class.

    Raises:
        ArgumentError: a layer lacks a name, a reference names no layer, or a plan or search
            result carries no folding analysis.
    """
    layers, edges, critical, fold_ratio, title, ilps, level = _unpack(layers, critical, fold_ratio,
                                                                       title)
    segs = [_segment(lay, i) for i, lay in enumerate(layers)]
    n = len(segs)
    names = {s.name: i for i, s in enumerate(segs)}
    cls = _layer_classes(segs, classes, names)
    ops = [s.ops for s in segs]
    top = max((s.flops for s in segs), default=0.0)
    heights = [0.25 + 0.75 * math.sqrt(s.flops / top) if top > 0 else 1.0 for s in segs]
    crit = sorted({_resolve(c, names, n, "critical") for c in (critical or ())})
    bounds = _boundaries(segments or (), names, n)
    traces = _layer_traces(segs, cls, heights, crit)
    edge_trace = _edge_trace(edges, names, heights)
    n_skip = edge_trace["meta"]["count"] if edge_trace else 0
    if edge_trace:
        traces.append(edge_trace)
    counts: dict[int | None, int] = {}
    for c in cls:
        counts[c] = counts.get(c, 0) + 1
    for c in sorted(counts, key=lambda c: (c is None, c if c is not None else 0)):
        label = f"class {c} ({counts[c]} layers)" if c is not None else f"no class ({counts[c]})"
        traces.append(legend_swatch(label, class_color(c), group=f"class{c}", cls=c))
    n_cls = len([c for c in counts if c is not None])
    head = escape(title) if title else f"Operator graph by layer: {n} layers, {sum(ops)} ops"
    notes = [f"{n_cls} classes (same colour = same structure: solved once when folded)"]
    if bounds:
        notes.append(f"{len(bounds) + 1} segments (dashed boundaries)")
    if crit:
        notes.append(f"{len(crit)} end at a critical node (red: TePDist's cut points)")
    if fold_ratio is not None:
        head += f"; fold ratio {fold_ratio:.3g}x"
    if ilps is not None:
        head += f"; {ilps} ILP{'s' if ilps != 1 else ''}" + (f" ({escape(level)})" if level else "")
    title_text = f"{head}<br><sup>{'; '.join(notes)}; box height ~ sqrt(FLOPs)</sup>"
    return go.Figure(data=traces, layout=_layout(segs, bounds, title_text, n_skip))


def _unpack(layers: Any, critical: Sequence[Any] | None, fold_ratio: float | None,
            title: str | None) -> tuple[Any, Sequence[Any], Sequence[Any] | None, float | None,
                                        str | None, int | None, str | None]:
    """``graph_figure``'s input as ``(layers, edges, critical, fold_ratio, title, ilps, level)``:
    a plan, search result or folding analysis gives its segments, and the critical nodes, fold
    ratio and title the caller left out; a ``{"layers", "edges"}`` mapping gives both."""
    edges: Sequence[Any] = ()
    ilps = level = None
    if not isinstance(layers, Mapping | Sequence) or isinstance(layers, str):
        analysis, model = _from_analysis(layers)
        critical = list(analysis.critical) if critical is None else critical
        fold_ratio = analysis.fold_ratio if fold_ratio is None else fold_ratio
        ilps, level = analysis.ilps, analysis.level
        n_seg = len(analysis.segments)
        of = f"{model}: " if model else ""
        title = title or (f"Mined subgraphs of {of}{n_seg} segment{'s' if n_seg != 1 else ''} "
                          f"in {analysis.classes} class{'es' if analysis.classes != 1 else ''}")
        layers = analysis.segments
    if isinstance(layers, Mapping):
        edges = layers.get("edges", ()) or ()
        layers = layers["layers"]
    return layers, edges, critical, fold_ratio, title, ilps, level


def _layer_classes(segs: list[SegmentSummary],
                   classes: Sequence[int | None] | Mapping[Any, int | None] | None,
                   names: dict[str, int]) -> list[int | None]:
    """Each layer's class: its own, overridden by ``classes`` (a list, or a mapping from layer
    index or name)."""
    n = len(segs)
    cls: list[int | None] = [s.cls for s in segs]
    if classes is not None:
        if isinstance(classes, Mapping):
            for k, v in classes.items():
                cls[_resolve(k, names, n, "a key of classes")] = v
        else:
            if len(classes) != n:
                raise ArgumentError(f"graph_figure: classes should have one entry per layer ({n}). "
                                    f"Got {len(classes)}. Fix: one class (or None) per layer.")
            cls = list(classes)
    return cls


def _layer_traces(segs: list[SegmentSummary], cls: list[int | None], heights: list[float],
                  crit: list[int]) -> list[dict[str, Any]]:
    """The bar trace of the layers, and the markers of the critical ones (when there are)."""
    n = len(segs)
    traces: list[dict[str, Any]] = [{
        "type": "bar", "x": list(range(n)), "y": heights, "width": 0.86,
        "marker": {"color": [class_color(c) for c in cls],
                   "line": {"color": ["#d62728" if i in crit else "#555555" for i in range(n)],
                            "width": [3 if i in crit else 0.5 for i in range(n)]}},
        "customdata": [[s.name, s.flops, s.ops, "-" if cls[i] is None else cls[i]]
                       for i, s in enumerate(segs)],
        "hovertemplate": ("<b>%{customdata[0]}</b> (layer %{x})<br>%{customdata[1]:.3~s}FLOP, "
                          "%{customdata[2]} ops<br>class %{customdata[3]}<extra></extra>"),
        "showlegend": False, "name": "layers",
        "meta": {"kind": "layers", "classes": cls, "names": [s.name for s in segs],
                 "planned": [list(s.planned) for s in segs]},
    }]
    if crit:
        traces.append({
            "type": "scatter", "x": crit, "y": [heights[i] + 0.12 for i in crit], "mode": "markers",
            "marker": {"symbol": "triangle-down", "size": 11, "color": "#d62728"},
            "name": "critical node", "text": [escape(segs[i].name) for i in crit],
            "hovertemplate": "critical node %{text}<extra></extra>",
            "meta": {"kind": "critical", "layers": crit},
        })
    return traces


def _edge_trace(edges: Sequence[Any], names: dict[str, int],
                heights: list[float]) -> dict[str, Any] | None:
    """The arcs of the edges that skip a layer (``None`` when none does)."""
    n = len(heights)
    ex: list[float | None] = []
    ey: list[float | None] = []
    n_skip = 0
    for e in edges:
        a = _resolve(e[0], names, n, "edge source")
        b = _resolve(e[1], names, n, "edge target")
        if abs(b - a) <= 1:
            continue
        n_skip += 1
        lo, hi = sorted((a, b))
        base = max(heights[lo:hi + 1]) + 0.05
        for k in range(13):
            u = k / 12
            ex.append(lo + (hi - lo) * u)
            ey.append(base + 0.35 * math.sin(math.pi * u) * min(1.0, 0.3 + (hi - lo) / 8))
        ex.append(None)
        ey.append(None)
    if not n_skip:
        return None
    return {"type": "scatter", "x": ex, "y": ey, "mode": "lines",
            "line": {"color": "#777777", "width": 1}, "hoverinfo": "skip",
            "name": "skip edge", "meta": {"kind": "edges", "count": n_skip}}


def _layout(segs: list[SegmentSummary], bounds: list[int], title: str,
            n_skip: int) -> dict[str, Any]:
    """The figure's layout: the layer axis, the dashed segment boundaries and their labels."""
    n = len(segs)
    shapes = [{"type": "line", "x0": b - 0.5, "x1": b - 0.5, "yref": "paper", "y0": 0, "y1": 1,
               "line": {"color": "#333333", "dash": "dash", "width": 1.2}} for b in bounds]
    starts = [0] + bounds
    ends = bounds + [n]
    annotations = [] if not bounds else [
        {"x": (lo + hi - 1) / 2, "y": 1.0, "yref": "paper", "yanchor": "bottom", "showarrow": False,
         "text": f"segment {k}", "font": {"size": 10}}
        for k, (lo, hi) in enumerate(zip(starts, ends))]
    ticktext = [escape(s.name) for s in segs]
    return {
        "template": TEMPLATE, "bargap": 0.1, "hovermode": "closest",
        "title": {"text": title, "x": 0.01, "xanchor": "left"},
        "xaxis": {"tickvals": list(range(0, n, max(1, n // 40))),
                  "ticktext": ticktext[::max(1, n // 40)], "tickangle": -45 if n > 8 else 0,
                  "tickfont": {"size": 9}, "range": [-0.6, n - 0.4], "showgrid": False,
                  "title": {"text": "layer (model order)"}, "automargin": True},
        "yaxis": {"visible": False, "range": [0, 1.6 if n_skip else 1.3]},
        "shapes": shapes, "annotations": annotations, "height": 400,
        "margin": {"t": 100, "l": 30, "r": 20, "b": 60}, "legend": {"title": {"text": "class"}},
        "meta": {"kind": "graph"},
    }
