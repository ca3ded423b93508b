"""Pipeline figures: which devices each stage uses, the schedule's timeline, and memory per device.

``stage_figure`` draws the cluster as a ``hosts x devices`` grid coloured by stage (Alpa's
stage-to-submesh assignment), one image however many devices (1,024 devices are one trace);
``timeline_figure`` draws ``plan.schedule.events`` as bars on one row per mesh, forward in a light
and backward in a dark shade of the stage's colour (ZB-H1's weight-gradient passes hatched; an
interleaved schedule's chunks each in their own colour on their mesh's row), so the pipeline
bubbles show as gaps; with
many micro-batches the steady state is drawn as one bar per mesh with its counts, and buttons
zoom to the ramp-up and the ramp-down. ``memory_figure`` stacks, per stage, what each of its
devices holds (parameters, optimizer state, batch, and the rest of the predicted memory:
activations in flight) against the device's capacity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from autoplan._dtype import dtype_bytes
from autoplan.plans._plan import Plan, Schedule, Stage, require_plan
from autoplan.plans._plan_text import stage_levers
from autoplan.plans._spec import ZERO_SHARDED
from autoplan.viz._style import (
    IDLE_COLOR,
    TEMPLATE,
    UNUSED_COLOR,
    axis_ticks,
    escape,
    fmt_bytes,
    fmt_in_unit,
    id_span,
    legend_swatch,
    shade,
    stage_color,
    time_unit,
    tint,
)

__all__ = ["stage_figure", "timeline_figure", "timeline_events", "kind_color", "memory_figure",
           "memory_breakdown", "GROUP_EVENTS"]

Event = tuple[float, float, int, int, int, str]
#: a timeline of more events than this draws each mesh's steady state as one bar
GROUP_EVENTS = 160


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



def _rgb(color: str) -> list[int]:
    c = color.lstrip("#")
    return [int(c[k:k + 2], 16) for k in (0, 2, 4)]


#: a host with more devices than this is drawn as several rows of this many
ROW_DEVICES = 16


def stage_figure(plan: Plan) -> go.Figure:
    """The cluster's devices (rows = hosts, columns = devices of a host) coloured by stage.

    One RGB image (``meta.kind == "devices"``): device ``d`` of host ``h = d // per_host`` is at
    row ``h * rows_per_host + (d % per_host) // width`` and column ``(d % per_host) % width``,
    where ``width = min(per_host, 16)`` (a host of 64 devices is 4 rows of 16), coloured by the
    stage using it (white when unused); hovering a cell names the device, its stage, the
    stage's layers and logical mesh. Each stage is labelled on its devices (``stage k`` where its
    cells are wide enough, ``k`` otherwise) and described in full in the legend. Device numbers
    are written on the cells up to 64 devices.

    Args:
        plan: the plan to draw.

    Returns:
        A ``plotly.graph_objects.Figure``; ``layout.meta = {"kind": "stage", "owner": [stage of
        each device or None], "per_host", "width", "rows_per_host"}``.
    """
    plan = require_plan(plan, "stage_figure")
    cl = plan.cluster
    hosts, per = cl.nodes, cl.devices_per_node
    width = min(per, ROW_DEVICES)
    rows_per_host = -(-per // width)
    n = hosts * per

    def cell(d: int) -> tuple[int, int]:
        h, j = divmod(d, per)
        return h * rows_per_host + j // width, j % width

    owner: dict[int, list[int]] = {}
    for s in plan.stages:
        for d in s.device_ids:
            owner.setdefault(d, []).append(s.index)
    by_index = {s.index: s for s in plan.stages}
    z = [[_rgb(UNUSED_COLOR) for _ in range(width)] for _ in range(hosts * rows_per_host)]
    hover = [["" for _ in range(width)] for _ in range(hosts * rows_per_host)]
    for d in range(n):
        h, j = divmod(d, per)
        r, c = cell(d)
        stages = owner.get(d, [])
        st = stages[0] if stages else None
        z[r][c] = _rgb(stage_color(st) if st is not None else UNUSED_COLOR)
        if st is None:
            hover[r][c] = f"device {d} (host {h}, slot {j})<br>unused"
            continue
        s = by_index[st]
        text = (f"device {d} (host {h}, slot {j})<br>stage {st}: {_layer_text(s)}<br>"
                f"submesh {s.submesh_shape[0]}x{s.submesh_shape[1]}, logical mesh {_mesh_text(s)}<br>"
                f"mesh position {s.device_ids.index(d)}; memory {fmt_bytes(s.memory)} per device")
        if s.levers:
            text += f"<br>memory levers: {escape(stage_levers(s))}"
        if len(stages) > 1:
            text += f"<br>also stages {', '.join(map(str, stages[1:]))}"
        hover[r][c] = text
    traces: list[dict[str, Any]] = [{
        "type": "image", "z": z, "hovertext": hover, "hoverinfo": "text", "name": "devices",
        "meta": {"kind": "devices", "per_host": per, "width": width,
                 "rows_per_host": rows_per_host}}]
    if n <= 64:
        cells = [cell(d) for d in range(n)]
        traces.append({"type": "scatter", "x": [c for _, c in cells], "y": [r - 0.3 for r, _ in cells],
                       "text": [str(d) for d in range(n)], "mode": "text",
                       "textfont": {"size": 9, "color": "#222222"}, "hoverinfo": "skip",
                       "showlegend": False, "meta": {"kind": "labels"}})
    # cell width in pixels, roughly, at the page's usual ~900 px plot width
    cell_px = 900 / max(width, 1)
    annotations = []
    for s in plan.stages:
        if not s.device_ids:
            continue
        cells = [cell(d) for d in s.device_ids]
        xs, ys = [c for _, c in cells], [r for r, _ in cells]
        wide = (max(xs) - min(xs) + 1) * cell_px
        text = f"<b>stage {s.index}</b>" if wide >= 70 else f"<b>{s.index}</b>"
        if wide >= 160 and len(set(ys)) <= 2:
            text += f"<br>mesh {'x'.join(map(str, s.mesh_shape))}"
        annotations.append({"x": (min(xs) + max(xs)) / 2, "y": (min(ys) + max(ys)) / 2 + 0.08,
                            "showarrow": False, "text": text,
                            "font": {"size": 10 if wide >= 70 else 9, "color": "#111111"},
                            "bgcolor": "rgba(255,255,255,0.75)"})
        traces.append(legend_swatch(f"stage {s.index}: {_layer_text(s)}, mesh {_mesh_text(s)}, "
                                    f"devices {id_span(s.device_ids)}",
                                    stage_color(s.index), group=f"stage{s.index}", stage=s.index))
    if len(owner) < n:
        traces.append(legend_swatch("unused", UNUSED_COLOR, group="unused"))
    used = len(owner)
    rows = hosts * rows_per_host
    tick_every = max(1, hosts // 16)
    grid = []  # white lines between the cells, up to 64 rows of cells
    if rows <= 64:
        line = {"color": "white", "width": 1}
        grid += [{"type": "line", "x0": j - 0.5, "x1": j - 0.5, "y0": -0.5, "y1": rows - 0.5,
                  "line": line, "layer": "above"} for j in range(1, width)]
        grid += [{"type": "line", "x0": -0.5, "x1": width - 0.5, "y0": r - 0.5, "y1": r - 0.5,
                  "line": {**line, "width": 3 if r % rows_per_host == 0 else 1}, "layer": "above"}
                 for r in range(1, rows)]
    layout = {
        "template": TEMPLATE,
        "title": {"text": f"Stages on the cluster {escape(cl.spec)} ({hosts} host{'s' if hosts != 1 else ''} "
                          f"x {per} devices): {len(plan.stages)} stage{'s' if len(plan.stages) != 1 else ''} "
                          f"on {used} of {n} devices<br><sup>colour = pipeline stage (legend: its "
                          "layers, logical mesh and devices); white = unused"
                          + (f"; each host in rows of {width}" if rows_per_host > 1 else "")
                          + "</sup>",
                  "x": 0.01, "xanchor": "left", "font": {"size": 14}},
        "xaxis": {"tickvals": list(range(width)) if width <= 32 else None,
                  "ticktext": ([f"dev {j}" for j in range(width)] if rows_per_host == 1
                               else [f"+{j}" for j in range(width)]) if width <= 32 else None,
                  "showgrid": False, "zeroline": False, "side": "top", "constrain": "domain"},
        "yaxis": {"tickvals": [h * rows_per_host for h in range(0, hosts, tick_every)],
                  "ticktext": [f"host {h}" for h in range(0, hosts, tick_every)],
                  "showgrid": False, "zeroline": False},
        "annotations": annotations, "shapes": grid,
        "height": int(min(900, 190 + max(60, 34 * rows) + 18 * min(len(plan.stages), 12))),
        "margin": {"t": 95, "l": 70, "r": 20, "b": 20}, "hovermode": "closest",
        "legend": {"orientation": "h", "yanchor": "top", "y": -0.02, "x": 0, "font": {"size": 10}},
        "meta": {"kind": "stage", "per_host": per, "width": width, "rows_per_host": rows_per_host,
                 "owner": [owner.get(d, [None])[0] for d in range(n)]},
    }
    return go.Figure(data=traces, layout=layout)


def kind_color(stage: int, kind: str) -> str:
    """Bar colour on the timeline: a light tint of the stage colour for forward, a dark shade for
    backward (ZB-H1: its input-gradient pass ``B``), a mid tone for anything else (ZB-H1's
    weight-gradient pass ``W``, drawn hatched, and the per-step update)."""
    base = stage_color(stage)
    if kind == "forward":
        return tint(base, 0.45)
    if kind == "backward":
        return shade(base, 0.25)
    return tint(base, 0.15)


#: how the timeline names the passes of the schedules that split the backward
_KIND_NAMES = {"zb-h1": {"backward": "B (input gradient)", "weight": "W (weight gradient)"}}
#: what the timeline's subtitle adds for the schedules beyond GPipe and 1F1B
_KIND_NOTES = {"zb-h1": "; the backward split into B (dark) and W (hatched, deferred into the "
                        "bubble)",
               "interleaved": "; each stage (model chunk) in its own colour, v chunks per mesh"}


def timeline_events(plan: Plan) -> tuple[list[Event], str]:
    """The events the timeline draws and their time unit.

    ``plan.schedule.events`` when recorded (unit ``"s"``); otherwise the schedule's table with one
    clock tick per row (unit ``"tick"``); otherwise, for a plan with no schedule, the forward then
    backward of each micro-batch of each stage run back to back from the stages' predicted times.
    """
    plan = require_plan(plan, "timeline_events")
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


def _split_steady(events: Sequence[Event], meshes: int, keep: int
                  ) -> tuple[list[Event], list[tuple[int, list[Event]]]]:
    """Per mesh, its first and last ``keep`` events (ramp-up, ramp-down) and the events between
    them (the steady state)."""
    shown: list[Event] = []
    steady: list[tuple[int, list[Event]]] = []
    for m in range(meshes):
        evs = sorted(e for e in events if e[2] == m)
        if len(evs) <= 2 * keep + 1:
            shown += evs
            continue
        shown += evs[:keep] + evs[-keep:]
        steady.append((m, evs[keep:-keep]))
    return shown, steady


def timeline_figure(plan: Plan, group: bool | None = None) -> go.Figure:
    """The pipeline timeline: one row per mesh, one bar per event of ``plan.schedule.events``.

    A bar spans ``[start, end]`` of its event on its mesh's row and is labelled with the
    micro-batch number (where it fits); forward bars are a light and backward bars a dark shade
    of the stage's colour; idle gaps are light grey bars (``meta.kind == "idle"``). Bars are
    grouped in one horizontal bar trace per (stage, kind) with ``base`` = starts, ``x`` =
    durations, ``y`` = mesh and ``customdata`` rows ``[start, end, mesh, microbatch, stage, kind]``
    in seconds, and ``meta = {"kind": "events", "stage", "event_kind"}``; the axis and the hover
    text use one unit (s, ms or µs: ``layout.meta["unit"]``), so ``base`` and ``x`` are in it.

    With more than :data:`GROUP_EVENTS` events (or ``group=True``), each mesh keeps its first and
    last ``2 x stages + 2`` events (the ramp-up and ramp-down) and draws the events between them
    as one bar (``meta.kind == "steady"``) labelled with the micro-batches and counts it holds;
    buttons zoom to the whole step, the ramp-up and the ramp-down.

    Args:
        plan: the plan to draw.
        group: draw the steady state grouped (default: when there are many events).

    Returns:
        A ``plotly.graph_objects.Figure``.
    """
    plan = require_plan(plan, "timeline_figure")
    events, unit = timeline_events(plan)
    sch = plan.schedule
    # an interleaved schedule runs v stages (chunks) per mesh: one row per mesh, not per stage
    P = sch.num_meshes if sch.virtual_stages > 1 else len(plan.stages)
    meshes = max([e[2] for e in events] + [P - 1, 0]) + 1
    end = max([e[1] for e in events], default=0.0)
    scale, uname = time_unit(end) if unit == "s" else (1.0, "tick")
    u = (scale, uname)
    keep = 2 * len(plan.stages) + 2
    grouped = (len(events) > GROUP_EVENTS) if group is None else bool(group)
    shown, steady = _split_steady(events, meshes, keep) if grouped else (list(events), [])
    traces: list[dict[str, Any]] = []
    gaps = _idle(events, meshes, end) if not grouped else _idle(
        shown + [(min(s[0] for s in evs), max(s[1] for s in evs), m, -1, -1, "steady")
                 for m, evs in steady], meshes, end)
    if gaps:
        traces.append(_idle_trace(gaps, u))
    traces += _event_traces(shown, sch, P, u)
    if steady:
        traces.append(_steady_trace(steady, sch, u))
    xaxis, updatemenus = _time_axis(end, unit, u, steady)
    layout = {
        "template": TEMPLATE, "barmode": "overlay", "bargap": 0.2,
        "title": {"text": _title(plan, events, meshes, end, unit, u, bool(steady)), "x": 0.01,
                  "xanchor": "left", "font": {"size": 14}},
        "xaxis": xaxis,
        "yaxis": {"tickvals": list(range(meshes)), "ticktext": _row_names(plan, meshes, P),
                  "range": [meshes - 0.5, -0.5], "zeroline": False},
        "height": int(min(900, 220 + 40 * meshes)),
        "margin": {"t": 100, "l": 100, "r": 20, "b": 50},
        "uniformtext": {"minsize": 7, "mode": "hide"}, "hovermode": "closest",
        "updatemenus": updatemenus,
        "meta": {"kind": "timeline", "unit": uname, "grouped": bool(steady)},
    }
    return go.Figure(data=traces, layout=layout)


def _idle_trace(gaps: list[tuple[int, float, float]], u: tuple[float, str]) -> dict[str, Any]:
    """The light grey bars of the meshes' idle gaps ``(mesh, start, end)``."""
    scale = u[0]
    return {
        "type": "bar", "orientation": "h", "y": [g[0] for g in gaps],
        "base": [g[1] / scale for g in gaps], "x": [(g[2] - g[1]) / scale for g in gaps],
        "marker": {"color": IDLE_COLOR, "line": {"width": 0}}, "width": 0.8,
        "name": "idle (bubble)", "legendgroup": "idle",
        "customdata": [[fmt_in_unit(g[1], u), fmt_in_unit(g[2], u), g[0]] for g in gaps],
        "hovertemplate": ("idle on mesh %{customdata[2]}<br>%{customdata[0]} to "
                          "%{customdata[1]}<extra></extra>"),
        "meta": {"kind": "idle"},
    }


def _event_traces(shown: list[Event], sch: Schedule, P: int,
                  u: tuple[float, str]) -> list[dict[str, Any]]:
    """One horizontal bar trace per (stage, kind) of the events drawn one by one, by stage and
    then forward, backward and the other kinds."""
    scale = u[0]
    names = _KIND_NAMES.get(sch.kind, {})
    groups: dict[tuple[int, str], list[Event]] = {}
    for e in shown:
        groups.setdefault((e[4], e[5]), []).append(e)
    kind_rank = {"forward": 0, "backward": 1}
    traces: list[dict[str, Any]] = []
    for (st, kind) in sorted(groups, key=lambda k: (k[0], kind_rank.get(k[1], 2), k[1])):
        evs = groups[(st, kind)]
        what = names.get(kind, kind)
        where = f" (chunk {st // P} of mesh {st % P})" if sch.virtual_stages > 1 else ""
        marker: dict[str, Any] = {"color": kind_color(st, kind),
                                  "line": {"color": "white", "width": 0.5}}
        if kind == "weight":
            marker["pattern"] = {"shape": "/", "fgcolor": shade(stage_color(st), 0.25),
                                 "size": 5, "solidity": 0.3}
        traces.append({
            "type": "bar", "orientation": "h", "y": [e[2] for e in evs],
            "base": [e[0] / scale for e in evs], "x": [(e[1] - e[0]) / scale for e in evs],
            "width": 0.8, "text": [str(e[3]) for e in evs], "textposition": "inside",
            "insidetextanchor": "middle", "textangle": 0, "constraintext": "inside",
            "marker": marker,
            "name": f"stage {st} {what}", "legendgroup": f"stage{st}",
            "customdata": [list(e) + [fmt_in_unit(e[0], u), fmt_in_unit(e[1], u)] for e in evs],
            "hovertemplate": (f"stage {st}{where} {what} of micro-batch %{{customdata[3]}}<br>mesh "
                              "%{customdata[2]}: %{customdata[6]} to %{customdata[7]}<extra></extra>"),
            "meta": {"kind": "events", "stage": st, "event_kind": kind},
        })
    return traces


def _steady_trace(steady: list[tuple[int, list[Event]]], sch: Schedule,
                  u: tuple[float, str]) -> dict[str, Any]:
    """One bar per mesh for the events of its steady state, labelled with the micro-batches and
    the counts it holds."""
    scale = u[0]
    xs, bases, ys, texts, cds, colors = [], [], [], [], [], []
    for m, evs in steady:
        a, b = min(e[0] for e in evs), max(e[1] for e in evs)
        mbs = sorted({e[3] for e in evs})
        nf = sum(1 for e in evs if e[5] == "forward")
        nw = sum(1 for e in evs if e[5] == "weight")
        busy = sum(e[1] - e[0] for e in evs)
        st = evs[0][4]
        xs.append((b - a) / scale)
        bases.append(a / scale)
        ys.append(m)
        texts.append(f"micro-batches {mbs[0]}-{mbs[-1]}: {nf} F + {len(evs) - nf - nw} B"
                     + (f" + {nw} W" if nw else "")
                     + (f" over {len({e[4] for e in evs})} chunks" if sch.virtual_stages > 1
                        else ""))
        cds.append([a, b, m, len(mbs), st, "steady", fmt_in_unit(a, u), fmt_in_unit(b, u),
                    nf, len(evs) - nf, f"{(1 - busy / (b - a)) * 100:.1f}%" if b > a else "0%",
                    mbs[0], mbs[-1]])
        colors.append(tint(stage_color(st), 0.25))
    return {
        "type": "bar", "orientation": "h", "y": ys, "base": bases, "x": xs, "width": 0.8,
        "text": texts, "textposition": "inside", "insidetextanchor": "middle", "textangle": 0,
        "marker": {"color": colors, "line": {"color": "white", "width": 0.5}},
        "name": "steady state (grouped)", "customdata": cds,
        "hovertemplate": ("steady state on mesh %{customdata[2]}: micro-batches "
                          "%{customdata[11]}-%{customdata[12]}<br>%{customdata[8]} forward + "
                          "%{customdata[9]} backward, idle %{customdata[10]}<br>"
                          "%{customdata[6]} to %{customdata[7]}<extra></extra>"),
        "meta": {"kind": "steady"},
    }


def _row_names(plan: Plan, meshes: int, P: int) -> list[str]:
    """Each mesh row's label: its mesh shape and, interleaved, the stages (chunks) it runs."""
    sch = plan.schedule
    row_names = []
    for m in range(meshes):
        s = next((x for x in plan.stages if x.index == m), None)
        row_names.append(f"mesh {m}" + (f" ({'x'.join(map(str, s.mesh_shape))})" if s else "")
                         + (f"<br>stages {', '.join(str(c) for c in range(m, len(plan.stages), P))}"
                            if sch.virtual_stages > 1 else ""))
    return row_names


def _title(plan: Plan, events: list[Event], meshes: int, end: float, unit: str,
           u: tuple[float, str], grouped: bool) -> str:
    """The title: the schedule, stages, micro-batches, the step's span and the meshes' idle
    share."""
    sch = plan.schedule
    busy = sum(e[1] - e[0] for e in events)
    bubble = 1 - busy / (meshes * end) if end > 0 else 0.0
    per_mesh = [sum(e[1] - e[0] for e in events if e[2] == m) for m in range(meshes)]
    kind = sch.kind if sch.kind and sch.kind != "none" else "single stage"
    if sch.virtual_stages > 1:
        kind += f" (v={sch.virtual_stages} stages per mesh on {meshes} meshes)"
    mb = max(sch.microbatches, len({e[3] for e in events}))
    span = fmt_in_unit(end, u) if unit == "s" else f"{end:g} clock ticks"
    return (f"Pipeline timeline of {escape(plan.model)} [{escape(plan.label)}]: {escape(kind)}, "
            f"{len(plan.stages)} stage{'s' if len(plan.stages) != 1 else ''}, {mb} micro-batch"
            f"{'es' if mb != 1 else ''}, {span}, idle {bubble * 100:.1f}% of the meshes' time"
            + (f" (the busiest mesh waits {fmt_in_unit(end - max(per_mesh), u)})"
               if unit == "s" and per_mesh and meshes > 1 else "")
            + "<br><sup>bars = forward (light) and backward (dark) of each micro-batch, labelled with "
            "its number" + _KIND_NOTES.get(sch.kind, "") + "; grey = idle"
            + ("; the steady state of each mesh is one bar "
               "(hover for its counts)" if grouped else "") + "</sup>")


def _time_axis(end: float, unit: str, u: tuple[float, str],
               steady: list[tuple[int, list[Event]]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The time axis, and with a grouped steady state the buttons that zoom to the whole step,
    the ramp-up and the ramp-down."""
    scale, uname = u

    def view(lo: float, hi: float) -> dict[str, Any]:  # a range of the time axis and its ticks
        return {"range": [lo, hi], **axis_ticks(lo, hi)}

    xaxis: dict[str, Any] = {"title": {"text": f"time ({uname})" if unit == "s" else "clock tick"},
                             "zeroline": False, **view(0, end / scale * 1.01 if end > 0 else 1)}
    updatemenus = []
    if steady:
        up_to = max(min(e[0] for e in evs) for _, evs in steady)
        down_from = min(max(e[1] for e in evs) for _, evs in steady)
        pad = 0.02 * end
        updatemenus = [{
            "type": "buttons", "direction": "right", "x": 1.0, "xanchor": "right", "y": 1.02,
            "yanchor": "bottom", "showactive": True, "pad": {"r": 2, "t": 2},
            "font": {"size": 10},
            "buttons": [
                {"label": label, "method": "relayout",
                 "args": [{f"xaxis.{k}": v for k, v in view(lo, hi).items()}]}
                for label, lo, hi in (("whole step", 0, end / scale * 1.01),
                                      ("ramp-up", 0, (up_to + pad) / scale),
                                      ("ramp-down", (down_from - pad) / scale, end / scale * 1.01))
            ]}]
    return xaxis, updatemenus


def memory_breakdown(plan: Plan) -> list[dict[str, Any]]:
    """What each device of each stage holds, in bytes (the same on every device of a stage: every
    spec splits its tensor evenly over the mesh axes it names).

    Returns:
        One dict per stage: ``stage``, ``devices``, ``parameters``, ``optimizer_state``,
        ``batch`` (batch and other inputs), ``activations`` (the rest of the stage's predicted
        memory: activations saved for the backward pass, for the micro-batches in flight in a
        pipeline, and gradient buffers; never negative), ``total`` (the stage's predicted memory
        per device, or the inputs' bytes when larger), ``capacity`` (the device's memory),
        ``zero`` (the stage's ZeRO level: its optimizer state, from level 1, and parameters, at
        level 3, are counted as sharded over its ``zero_axes``) and ``remat_layers`` (its
        rematerialised layers, whose saved activations are in ``activations`` no more).
    """
    plan = require_plan(plan, "memory_breakdown")
    out = []
    for s in plan.stages:
        parts = {"parameter": 0.0, "optimizer_state": 0.0, "batch": 0.0}
        sizes = dict(zip(s.axis_names, s.mesh_shape))
        for i in plan.inputs:
            if len(plan.stages) > 1 and i.stage != s.index:
                continue
            nbytes = math.prod(i.shape) * dtype_bytes(i.dtype) / i.spec.tiles(s.mesh_shape, s.axis_names)
            if i.kind in ZERO_SHARDED[s.zero]:
                used = {a for e in i.spec if e for a in e}
                nbytes /= math.prod(sizes[a] for a in s.zero_axes if a not in used)
            parts[i.kind if i.kind in parts else "batch"] += nbytes
        held = sum(parts.values())
        total = max(s.memory if len(plan.stages) > 1 else plan.predicted.memory_per_device, held)
        out.append({"stage": s.index, "devices": list(s.device_ids),
                    "parameters": parts["parameter"], "optimizer_state": parts["optimizer_state"],
                    "batch": parts["batch"], "activations": max(0.0, total - held),
                    "total": total, "capacity": plan.cluster.device_memory, "zero": s.zero,
                    "remat_layers": list(s.remat_layers)})
    return out


_MEMORY_PARTS = (("parameters", "parameters", "#4c78a8"),
                 ("optimizer_state", "optimizer state", "#f58518"),
                 ("batch", "batch and inputs", "#54a24b"),
                 ("activations", "activations in flight (the rest)", "#b279a2"))


def _levers_text(row: dict[str, Any]) -> str:
    """A stage's memory levers over its bar: ``ZeRO-2 · remat 3 layers`` (empty without)."""
    parts = ([f"ZeRO-{row['zero']}"] if row["zero"] else []) + (
        [f"remat {len(row['remat_layers'])} layer{'s' if len(row['remat_layers']) > 1 else ''}"]
        if row["remat_layers"] else [])
    return " · ".join(parts)


def memory_figure(plan: Plan) -> go.Figure:
    """Memory per device of each stage, stacked by what it holds, against the device's capacity.

    One bar per stage (its devices all hold the same: every spec splits evenly), stacked as
    :func:`memory_breakdown` says, with a dotted line at the device's memory; a stage over it
    is marked "does not fit". A stage with memory levers has them written above its bar
    (an annotation named ``levers of stage <s>``: ``ZeRO-2 · remat 3 layers``; the subtitle
    says the memory includes them). The axis is in one unit (GiB, MiB or KiB,
    chosen by the largest bar or the capacity when they are close).

    Args:
        plan: the plan to draw.

    Returns:
        A ``plotly.graph_objects.Figure``; one bar trace per part (``meta.kind == "memory"``,
        ``meta.part``), values in ``layout.meta["unit"]``.
    """
    plan = require_plan(plan, "memory_figure")
    rows = memory_breakdown(plan)
    cap = plan.cluster.device_memory
    top = max((r["total"] for r in rows), default=0.0)
    show_cap = top >= 0.25 * cap
    ref = max(top, cap if show_cap else 0.0)
    scale, uname = next(((2.0 ** p, n) for p, n in ((30, "GiB"), (20, "MiB"), (10, "KiB"))
                         if ref >= 2.0 ** p), (1.0, "B"))
    labels = [f"stage {r['stage']}<br>devices {id_span(r['devices'])}" for r in rows]
    traces = []
    for key, name, color in _MEMORY_PARTS:
        traces.append({
            "type": "bar", "x": labels, "y": [r[key] / scale for r in rows], "name": name,
            "marker": {"color": color},
            "customdata": [[fmt_bytes(r[key]), fmt_bytes(r["total"]), len(r["devices"])] for r in rows],
            "hovertemplate": (f"%{{x}}<br>{name}: %{{customdata[0]}} per device<br>total "
                              "%{customdata[1]} on each of its %{customdata[2]} devices<extra></extra>"),
            "meta": {"kind": "memory", "part": key}})
    shapes, annotations = [], []
    if show_cap:
        shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": cap / scale,
                       "y1": cap / scale, "line": {"color": "#d62728", "dash": "dot", "width": 1.5}})
        annotations.append({"xref": "paper", "x": 1, "y": cap / scale, "xanchor": "right",
                            "yanchor": "bottom", "showarrow": False, "font": {"size": 10},
                            "text": f"device memory {fmt_bytes(cap)}"})
    for r, lab in zip(rows, labels):  # the stage's memory levers, above its bar
        said = _levers_text(r)
        if said:
            annotations.append({"x": lab, "y": r["total"] / scale, "yanchor": "bottom",
                                "yshift": 14 if r["total"] > cap else 0, "showarrow": False,
                                "text": said, "font": {"size": 9},
                                "name": f"levers of stage {r['stage']}"})
    over = [r for r in rows if r["total"] > cap]
    for r, lab in zip(rows, labels):
        if r["total"] > cap:
            annotations.append({"x": lab, "y": r["total"] / scale, "yanchor": "bottom",
                                "showarrow": False, "text": "<b>does not fit</b>",
                                "font": {"color": "#d62728", "size": 10}})
    if any(_levers_text(r) for r in rows):
        sub_levers = "; with the stages' memory levers (ZeRO, remat)"
    else:
        sub_levers = ""
    sub = (f"per device of each stage; device memory {fmt_bytes(cap)}"
           + (f"; {len(over)} stage(s) over it" if over else
              ("" if show_cap else f" (largest stage uses {top / cap * 100:.2g}% of it)"))
           + sub_levers)
    layout = {
        "template": TEMPLATE, "barmode": "stack",
        "title": {"text": f"Memory per device of {escape(plan.model)} [{escape(plan.label)}]"
                          f"<br><sup>{sub}</sup>", "x": 0.01, "xanchor": "left", "font": {"size": 14}},
        "yaxis": {"title": {"text": f"memory per device ({uname})"},
                  "range": [0, max(ref, 1e-30) / scale * 1.15],
                  **axis_ticks(0, max(ref, 1e-30) / scale * 1.15)},
        "xaxis": {"tickfont": {"size": 10}},
        "shapes": shapes, "annotations": annotations,
        "height": 360, "margin": {"t": 80, "l": 70, "r": 20, "b": 60},
        "legend": {"orientation": "h", "y": -0.25, "x": 0, "font": {"size": 10}},
        "hovermode": "closest", "meta": {"kind": "memory", "unit": uname},
    }
    return go.Figure(data=traces, layout=layout)
