"""Pipeline figures: which devices each stage uses, and the schedule's timeline.

``stage_figure`` draws the cluster as a ``hosts x devices`` grid coloured by stage (Alpa's
stage-to-submesh assignment); ``timeline_figure`` draws ``plan.schedule.events`` as bars on one
row per mesh, forward in a light and backward in a dark shade of the stage's colour, so the
pipeline bubbles show as gaps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from .._plan import Plan, Stage
from ._style import (
    IDLE_COLOR,
    TEMPLATE,
    UNUSED_COLOR,
    escape,
    fmt_bytes,
    fmt_seconds,
    legend_swatch,
    shade,
    stage_color,
    tint,
)

__all__ = ["stage_figure", "timeline_figure", "timeline_events", "kind_color"]

Event = tuple[float, float, int, int, int, str]


def _layer_text(stage: Stage) -> str:
    lo, hi = stage.layer_range
    names = stage.layers
    if not names:
        return f"layers [{lo}, {hi})"
    if len(names) == 1:
        return f"layer {lo} ({escape(names[0])})"
    return f"layers {lo}-{hi - 1} ({escape(names[0])} .. {escape(names[-1])})"


def _mesh_text(stage: Stage) -> str:
    return "x".join(map(str, stage.mesh_shape)) + " (" + ", ".join(stage.axis_names) + ")"


def stage_figure(plan: Plan) -> go.Figure:
    """The cluster's devices (rows = hosts, columns = devices of a host) coloured by stage.

    Each stage is annotated with its layer range and logical mesh; devices that no stage uses are
    left blank. Every device cell is its own trace with ``meta = {"kind": "device", "device",
    "host", "slot", "stage" (None when unused), "stages"}``.

    Args:
        plan: the plan to draw.

    Returns:
        A ``plotly.graph_objects.Figure``.
    """
    cl = plan.cluster
    hosts, per = cl.nodes, cl.devices_per_node
    owner: dict[int, list[int]] = {}
    for s in plan.stages:
        for d in s.device_ids:
            owner.setdefault(d, []).append(s.index)
    by_index = {s.index: s for s in plan.stages}
    traces: list[dict[str, Any]] = []
    label_x, label_y, label_t = [], [], []
    for d in range(hosts * per):
        h, j = divmod(d, per)
        stages = owner.get(d, [])
        st = stages[0] if stages else None
        color = stage_color(st) if st is not None else UNUSED_COLOR
        if st is None:
            text = f"device {d} (host {h}, slot {j})<br>unused"
        else:
            s = by_index[st]
            text = (f"device {d} (host {h}, slot {j})<br>stage {st}: {_layer_text(s)}<br>"
                    f"submesh {s.submesh[0]}x{s.submesh[1]}, logical mesh {_mesh_text(s)}<br>"
                    f"mesh position {s.device_ids.index(d)}; memory {fmt_bytes(s.memory)}")
            if len(stages) > 1:
                text += f"<br>also stages {', '.join(map(str, stages[1:]))}"
        traces.append({
            "type": "scatter", "x": [j, j + 1, j + 1, j, j], "y": [h, h, h + 1, h + 1, h],
            "mode": "lines", "fill": "toself", "fillcolor": color,
            "line": {"color": "#555555", "width": 1}, "hoveron": "fills", "hoverinfo": "text",
            "text": text, "showlegend": False, "name": f"device {d}",
            "meta": {"kind": "device", "device": d, "host": h, "slot": j, "stage": st,
                     "stages": stages},
        })
        label_x.append(j + 0.5)
        label_y.append(h + 0.82)
        label_t.append(str(d))
    traces.append({"type": "scatter", "x": label_x, "y": label_y, "text": label_t, "mode": "text",
                   "textfont": {"size": 10, "color": "#222222"}, "hoverinfo": "skip",
                   "showlegend": False, "meta": {"kind": "labels"}})
    annotations = []
    for s in plan.stages:
        if not s.device_ids:
            continue
        xs = [d % per + 0.5 for d in s.device_ids]
        ys = [d // per + 0.5 for d in s.device_ids]
        annotations.append({
            "x": sum(xs) / len(xs), "y": sum(ys) / len(ys), "showarrow": False,
            "text": f"<b>stage {s.index}</b><br>{_layer_text(s)}<br>mesh {_mesh_text(s)}",
            "font": {"size": 10, "color": "#111111"}, "bgcolor": "rgba(255,255,255,0.7)"})
        traces.append(legend_swatch(f"stage {s.index}: {_layer_text(s)}, mesh {_mesh_text(s)}",
                                    stage_color(s.index), group=f"stage{s.index}", stage=s.index))
    if len(owner) < hosts * per:
        traces.append(legend_swatch("unused", UNUSED_COLOR, group="unused"))
    used = len(owner)
    layout = {
        "template": TEMPLATE,
        "title": {"text": f"Stages on the cluster {escape(cl.spec)} ({hosts} hosts x {per} devices): "
                          f"{len(plan.stages)} stage{'s' if len(plan.stages) != 1 else ''} on "
                          f"{used} of {hosts * per} devices<br><sup>colour = pipeline stage; each "
                          "stage's layers and logical mesh written on it; blank = unused</sup>",
                  "x": 0.01, "xanchor": "left"},
        "xaxis": {"tickvals": [j + 0.5 for j in range(per)], "ticktext": [f"dev {j}" for j in range(per)],
                  "range": [-0.05, per + 0.05], "showgrid": False, "zeroline": False, "side": "top"},
        "yaxis": {"tickvals": [h + 0.5 for h in range(hosts)],
                  "ticktext": [f"host {h}" for h in range(hosts)], "range": [hosts + 0.05, -0.05],
                  "showgrid": False, "zeroline": False},
        "annotations": annotations, "height": 200 + 90 * hosts,
        "margin": {"t": 120, "l": 70, "r": 20, "b": 20}, "hovermode": "closest",
    }
    return go.Figure(data=traces, layout=layout)


def kind_color(stage: int, kind: str) -> str:
    """Bar colour on the timeline: a light tint of the stage colour for forward, a dark shade for
    backward, a mid tone for anything else."""
    base = stage_color(stage)
    if kind == "forward":
        return tint(base, 0.45)
    if kind == "backward":
        return shade(base, 0.25)
    return tint(base, 0.15)


def timeline_events(plan: Plan) -> tuple[list[Event], str]:
    """The events the timeline draws and their time unit.

    ``plan.schedule.events`` when recorded (unit ``"s"``); otherwise the schedule's table with one
    clock tick per row (unit ``"tick"``); otherwise, for a plan with no schedule, the forward then
    backward of each micro-batch of each stage run back to back from the stages' predicted times.
    """
    sch = plan.schedule
    if sch.events:
        return [tuple(e) for e in sch.events], "s"  # type: ignore[misc]
    if sch.table:
        out = []
        for t, row in enumerate(sch.table):
            for mesh, e in enumerate(row):
                if e is not None:
                    out.append((float(t), float(t + 1), mesh, int(e[0]), int(e[1]), str(e[2])))
        return out, "tick"
    out, t = [], 0.0
    for mb in range(max(1, sch.microbatches)):
        for s in plan.stages:
            out.append((t, t + s.forward_time, s.index, mb, s.index, "forward"))
            t += s.forward_time
        for s in reversed(plan.stages):
            out.append((t, t + s.backward_time, s.index, mb, s.index, "backward"))
            t += s.backward_time
    return out, "s"


def _idle(events: Sequence[Event], meshes: int, end: float) -> list[tuple[int, float, float]]:
    gaps = []
    for m in range(meshes):
        t = 0.0
        for s, e, *_ in sorted(ev for ev in events if ev[2] == m):
            if s > t + 1e-12 * max(1.0, end):
                gaps.append((m, t, s))
            t = max(t, e)
        if end > t + 1e-12 * max(1.0, end):
            gaps.append((m, t, end))
    return gaps


def timeline_figure(plan: Plan) -> go.Figure:
    """The pipeline timeline: one row per mesh, one bar per event of ``plan.schedule.events``.

    A bar spans ``[start, end]`` of its event on its mesh's row and is labelled with the
    micro-batch number; forward bars are a light and backward bars a dark shade of the stage's
    colour; idle gaps are light grey bars (``meta.kind == "idle"``). Bars are grouped in one
    horizontal bar trace per (stage, kind) with ``base`` = starts, ``x`` = durations, ``y`` =
    mesh and ``customdata`` rows ``[start, end, mesh, microbatch, stage, kind]``, and ``meta =
    {"kind": "events", "stage", "event_kind"}``. Works for GPipe, 1F1B and single-stage plans
    (see :func:`timeline_events`).

    Args:
        plan: the plan to draw.

    Returns:
        A ``plotly.graph_objects.Figure``.
    """
    events, unit = timeline_events(plan)
    sch = plan.schedule
    meshes = max([e[2] for e in events] + [len(plan.stages) - 1, 0]) + 1
    end = max([e[1] for e in events], default=0.0)
    groups: dict[tuple[int, str], list[Event]] = {}
    for e in events:
        groups.setdefault((e[4], e[5]), []).append(e)
    kind_rank = {"forward": 0, "backward": 1}
    traces: list[dict[str, Any]] = []
    gaps = _idle(events, meshes, end)
    if gaps:
        traces.append({
            "type": "bar", "orientation": "h", "y": [g[0] for g in gaps],
            "base": [g[1] for g in gaps], "x": [g[2] - g[1] for g in gaps],
            "marker": {"color": IDLE_COLOR, "line": {"width": 0}}, "width": 0.8,
            "name": "idle (bubble)", "legendgroup": "idle",
            "customdata": [[g[1], g[2], g[0]] for g in gaps],
            "hovertemplate": ("idle on mesh %{customdata[2]}<br>%{customdata[0]:.4~g} to "
                              f"%{{customdata[1]:.4~g}} {unit}<extra></extra>"),
            "meta": {"kind": "idle"},
        })
    for (st, kind) in sorted(groups, key=lambda k: (k[0], kind_rank.get(k[1], 2), k[1])):
        evs = groups[(st, kind)]
        traces.append({
            "type": "bar", "orientation": "h", "y": [e[2] for e in evs], "base": [e[0] for e in evs],
            "x": [e[1] - e[0] for e in evs], "width": 0.8,
            "text": [str(e[3]) for e in evs], "textposition": "inside", "insidetextanchor": "middle",
            "textangle": 0, "constraintext": "inside",
            "marker": {"color": kind_color(st, kind), "line": {"color": "white", "width": 0.5}},
            "name": f"stage {st} {kind}", "legendgroup": f"stage{st}",
            "customdata": [list(e) for e in evs],
            "hovertemplate": (f"stage {st} {kind} of micro-batch %{{customdata[3]}}<br>mesh "
                              "%{customdata[2]}: %{customdata[0]:.4~g} to %{customdata[1]:.4~g} "
                              f"{unit}<extra></extra>"),
            "meta": {"kind": "events", "stage": st, "event_kind": kind},
        })
    busy = sum(e[1] - e[0] for e in events)
    bubble = 1 - busy / (meshes * end) if end > 0 else 0.0
    row_names = []
    for m in range(meshes):
        s = next((x for x in plan.stages if x.index == m), None)
        row_names.append(f"mesh {m}" + (f" ({'x'.join(map(str, s.mesh_shape))})" if s else ""))
    kind = sch.kind if sch.kind and sch.kind != "none" else "single stage"
    mb = max(sch.microbatches, len({e[3] for e in events}))
    span = fmt_seconds(end) if unit == "s" else f"{end:g} clock ticks"
    title = (f"Pipeline timeline of {escape(plan.model)} [{escape(plan.label)}]: {escape(kind)}, "
             f"{len(plan.stages)} stage{'s' if len(plan.stages) != 1 else ''}, {mb} micro-batch"
             f"{'es' if mb != 1 else ''}, {span}, idle {bubble * 100:.1f}%"
             "<br><sup>bars = forward (light) and backward (dark) of each micro-batch, labelled with "
             "its number; grey = idle</sup>")
    xaxis: dict[str, Any] = {"title": {"text": "time" if unit == "s" else "clock tick"},
                             "zeroline": False, "range": [0, end * 1.01 if end > 0 else 1]}
    if unit == "s":
        xaxis.update({"tickformat": "~s", "ticksuffix": "s"})
    layout = {
        "template": TEMPLATE, "barmode": "overlay", "bargap": 0.2,
        "title": {"text": title, "x": 0.01, "xanchor": "left"},
        "xaxis": xaxis,
        "yaxis": {"tickvals": list(range(meshes)), "ticktext": row_names,
                  "range": [meshes - 0.5, -0.5], "zeroline": False},
        "height": 200 + 45 * meshes, "margin": {"t": 100, "l": 100, "r": 20, "b": 50},
        "uniformtext": {"minsize": 7, "mode": "hide"}, "hovermode": "closest",
    }
    return go.Figure(data=traces, layout=layout)
