"""Comparing plans: step time against memory with the Pareto front, cost breakdowns, what changed.

A plan ``p`` is dominated when another plan ``q`` is no worse in both predicted step time and
memory per device and better in one: ``t_q <= t_p``, ``m_q <= m_p``, ``(t_q, m_q) != (t_p, m_p)``.
The Pareto front is the set of plans nobody dominates.

Equivalent plans are shown once (:func:`equivalent_groups`): two plans are equivalent when they
predict the same step time and memory and shard every tensor alike up to a renaming of the
mesh axes of equal size (a plan on an ``8x1`` mesh splitting over ``x`` and one on ``1x8``
splitting over ``y`` are one plan), on the same devices.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .._cluster import COLLECTIVES
from .._errors import ArgumentError, ArgumentTypeError
from .._plan import Plan, Stage
from ._style import TEMPLATE, axis_ticks, escape, fmt_bytes, fmt_in_unit, time_unit

__all__ = ["compare_figure", "as_plans", "pareto_front", "equivalent_groups", "short_label",
           "cost_parts", "busiest_time", "COMPONENT_COLORS"]

COMPONENT_COLORS = {
    "compute": "#4c78a8", "all-reduce": "#e45756", "all-gather": "#f58518",
    "reduce-scatter": "#eeca3b", "all-to-all": "#b279a2", "send-recv": "#72b7b2",
    "bubble": "#bab0ac", "other": "#9d755d", "overlap": "#222222",
}
_EXTRA = ("#9d755d", "#ff9da6", "#54a24b", "#79706e")
_SHORT = (("baseline: Megatron TP x PP", "TPxPP"), ("baseline: Megatron TP", "TP"),
          ("baseline: data parallel", "DP"), ("autoplan-pipeline", "pipeline"),
          ("autoplan", "auto"))
_POSITIONS = ("top center", "bottom center", "middle right", "middle left", "top right",
              "bottom left", "top left", "bottom right")


def as_plans(plans: Any) -> list[Plan]:
    """A list of plans from a Plan, a sequence of Plans, or an object with ``.plans``.

    Raises:
        ArgumentTypeError: anything else, or an empty collection.
    """
    if isinstance(plans, Plan):
        return [plans]
    if hasattr(plans, "plans"):
        plans = plans.plans
    if isinstance(plans, Plan):
        return [plans]
    if not isinstance(plans, Iterable) or isinstance(plans, str | bytes):
        raise ArgumentTypeError(f"plans should be a Plan, a list of Plans or an object with a .plans "
                                f"attribute. Got {type(plans).__name__}. Fix: pass result.plans "
                                "or [plan_a, plan_b].")
    out = list(plans)
    bad = [type(p).__name__ for p in out if not isinstance(p, Plan)]
    if bad or not out:
        raise ArgumentTypeError(f"plans should hold at least one autoplan Plan. Got "
                                f"{'an empty collection' if not out else 'items of type ' + ', '.join(sorted(set(bad)))}. "
                                "Fix: pass plans from autoplan.search or Plan.from_json.")
    return out


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the non-dominated points (both coordinates minimised), sorted by the first.

    Examples:
        >>> pareto_front([(1, 5), (2, 2), (3, 3), (4, 1)])
        [0, 1, 3]
    """
    if (not isinstance(points, Sequence)
            or not all(isinstance(p, Sequence) and len(p) == 2 for p in points)):
        raise ArgumentError(f"pareto_front: points should be a list of (x, y) pairs. Got "
                            f"{points!r:.60}. Fix: pass e.g. [(1.0, 2.0), (2.0, 1.0)].")
    keep = []
    for i, (t, m) in enumerate(points):
        dominated = any(t2 <= t and m2 <= m and (t2, m2) != (t, m)
                        for j, (t2, m2) in enumerate(points) if j != i)
        if not dominated:
            keep.append(i)
    return sorted(keep, key=lambda i: (points[i][0], points[i][1], i))


def short_label(label: str) -> str:
    """A plan label in a few letters for axis ticks (``baseline: data parallel`` -> ``DP``)."""
    for long, short in _SHORT:
        if label == long:
            return short
    return label if len(label) <= 12 else label[:11] + "\u2026"


def _stage_forms(s: Stage, plan: Plan) -> list[tuple]:
    """The stage's shardings under every renaming of its mesh axes of more than one device to
    ``a0, a1, ...`` that keeps the axes' sizes (size-1 axes dropped: they split nothing)."""
    eff = [(a, n) for a, n in zip(s.axis_names, s.mesh_shape) if n > 1]
    forms = []
    for perm in itertools.permutations(range(len(eff))):
        if [eff[p][1] for p in perm] != sorted(n for _, n in eff):
            continue
        rename = {eff[p][0]: f"a{k}" for k, p in enumerate(perm)}

        def canon(spec: Sequence[Any], rename: dict[str, str] = rename) -> tuple:
            return tuple(tuple(rename[a] for a in (e or ()) if a in rename) or None for e in spec)

        inputs = tuple(sorted((i.name, canon(i.spec)) for i in plan.inputs
                              if len(plan.stages) == 1 or i.stage == s.index))
        ops = tuple((o.op, tuple((t.role, canon(t.spec)) for t in o.tensors)) for o in s.ops)
        forms.append((tuple(sorted(n for _, n in eff)), tuple(sorted(s.device_ids)), inputs, ops))
    return forms


def _canonical(plan: Plan) -> tuple:
    stages = tuple(min(_stage_forms(s, plan), key=repr) for s in plan.stages)
    sch = plan.schedule
    return (stages, sch.kind, sch.microbatches)


def _same_prediction(a: Plan, b: Plan) -> bool:
    pa, pb = a.predicted, b.predicted
    return (math.isclose(pa.step_time, pb.step_time, rel_tol=1e-9, abs_tol=0.0)
            and math.isclose(pa.memory_per_device, pb.memory_per_device, rel_tol=1e-9, abs_tol=0.0))


def equivalent_groups(plans: Sequence[Plan]) -> list[list[int]]:
    """Plans grouped by equivalence (see the module docstring), each group in the plans' order,
    groups ordered by their first plan.

    Examples:
        A plan and itself on the transposed mesh (``8x1`` over ``x``, ``1x8`` over ``y``)
        form one group; a plan with another prediction does not join it.
    """
    keys: list[tuple] = []
    groups: list[list[int]] = []
    for i, p in enumerate(plans):
        key = _canonical(p)
        for k, g in zip(keys, groups):
            if k == key and _same_prediction(plans[g[0]], p):
                g.append(i)
                break
        else:
            keys.append(key)
            groups.append([i])
    return groups


def _byte_ticks(values: Sequence[float], top: float | None = None
                ) -> tuple[list[float], list[str], str]:
    """Tick positions in bytes at round steps of one unit (GiB, MiB, KiB or B, chosen by the
    largest value), their labels (numbers of that unit, at most 3 significant digits) and the
    unit's name."""
    vals = [v for v in values if _finite(v)]
    if not vals:
        return [], [], "B"
    hi = top if top is not None else max(vals)
    unit, name = next(((2.0 ** p, n) for p, n in ((30, "GiB"), (20, "MiB"), (10, "KiB"))
                       if hi >= 2.0 ** p), (1.0, "B"))
    ticks = axis_ticks(0.0, hi / unit * 1.0001)
    return ([t * unit for t in ticks["tickvals"]], ticks["ticktext"], name)


def _finite(*xs: float) -> bool:
    return all(x is not None and math.isfinite(x) for x in xs)


def _match(target: Any, plans: Sequence[Plan]) -> int | None:
    if target is None:
        return None
    if isinstance(target, Plan):
        return next((i for i, p in enumerate(plans) if p is target), None) \
            if any(p is target for p in plans) else \
            next((i for i, p in enumerate(plans) if p == target), None)
    if isinstance(target, int) and not isinstance(target, bool):
        return target if 0 <= target < len(plans) else None
    return next((i for i, p in enumerate(plans) if p.label == target), None)


def busiest_time(plan: Plan) -> float:
    """Seconds the busiest mesh of a plan works per step: the longest sum of its schedule
    events' durations over the meshes, or, for a plan without events, the step time less the
    bubble (``(1 - bubble_fraction) * step_time``)."""
    q = plan.predicted
    events = plan.schedule.events or ()
    if not events:
        return (1.0 - q.bubble_fraction) * q.step_time
    busy: dict[int, float] = {}
    for e in events:
        busy[e[2]] = busy.get(e[2], 0.0) + (e[1] - e[0])
    return min(max(busy.values()), q.step_time)


def cost_parts(plan: Plan) -> dict[str, float]:
    """Where a plan's predicted step time goes, in parts that add up to it.

    The predictions' compute and collective times are those of the busiest stage (one stage
    for an intra-operator plan); that stage works :func:`busiest_time` per step:

    * ``compute`` and each collective kind: as predicted;
    * ``overlap`` (zero or negative): the collectives' time that runs while the stage computes
      (its work is shorter than compute plus collectives);
    * ``other`` (zero or positive): time on the stage's timeline that neither compute nor a
      collective itemises;
    * ``bubble``: the time the busiest stage waits (the step less its work).

    The parts sum to ``plan.predicted.step_time``.
    """
    q = plan.predicted
    out = {"compute": q.compute_time}
    for k, v in q.comm_time_by_kind.items():
        out[k] = v
    busy = busiest_time(plan)
    rest = busy - sum(out.values())
    out["overlap"] = min(rest, 0.0)
    out["other"] = max(rest, 0.0)
    out["bubble"] = q.step_time - busy
    return out


def _label_positions(xy: Sequence[tuple[float, float]]) -> list[str]:
    """A text position per point such that labels of points close together (within 5% of both
    axes' spans) do not take the same side."""
    if not xy:
        return []
    xs, ys = [p[0] for p in xy], [p[1] for p in xy]
    sx = (max(xs) - min(xs)) or 1.0
    sy = (max(ys) - min(ys)) or 1.0
    out: list[str] = []
    for i, (x, y) in enumerate(xy):
        near = {out[j] for j in range(i) if abs(xy[j][0] - x) <= 0.05 * sx
                and abs(xy[j][1] - y) <= 0.08 * sy}
        out.append(next((p for p in _POSITIONS if p not in near), _POSITIONS[i % len(_POSITIONS)]))
    return out


def compare_figure(plans: Any, highlight: Any = None, reference: Any = None,
                   merge: bool = True) -> go.Figure:
    """Compare plans: (a) predicted step time against memory per device, (b) cost breakdown,
    and with ``reference``, (c) what changed from it.

    Plans are numbered by their place in ``plans`` (``#k``, as the Explorer's candidate list);
    equivalent plans (:func:`equivalent_groups`) are one point and one bar labelled with every
    number (``#0=#1``); plans with equal predictions but different shardings share a point
    labelled with each number. Labels are numbers only, placed so close points do not collide;
    hovering a point gives every plan's label, layout, step time, throughput, memory and MFU.

    Panel (a) has one point per group at ``x = predicted.step_time`` (seconds), ``y =
    predicted.memory_per_device`` (bytes) (trace ``meta.kind == "plans"``, ``meta.plans`` the
    representatives' indices, ``meta.groups`` every group), and the Pareto front through the
    non-dominated plans in step-time order (``meta.kind == "pareto"``). Plans that do not fit
    in the device's memory are drawn in a shaded band above it (their ``y`` is their place in
    the band; the hover gives their memory), so one 1,000 GiB plan does not squash the rest.
    Panel (b) stacks, per group, the parts of :func:`cost_parts`, which add up to the predicted
    step time (a diamond at the top of each bar): the busiest stage's compute, its collectives
    by kind (``predicted.comm_time_by_kind``), starting where compute ends less the part that
    runs during compute (drawn hatched over compute: ``overlap``), time on that stage not
    itemised (``other``) and its idle time (``bubble``). Panel (c),
    with ``reference``: per component and in total, the selected plan's time minus the
    reference's.

    Args:
        plans: a list of Plans, or any object with a ``.plans`` attribute (a single Plan works).
        highlight: the selected plan (a plan, its index or its label), drawn as a red star and
            named in the title; ``None`` for none.
        reference: a plan to compare the selected one against (a plan not in ``plans`` is
            added, drawn as an open diamond with an arrow to the selected plan).
        merge: show equivalent plans once (default).

    Returns:
        A ``plotly.graph_objects.Figure``.

    Raises:
        ArgumentTypeError: ``plans`` holds no Plans.
    """
    plans = as_plans(plans)
    hi = _match(highlight, plans)
    ref = None
    if reference is not None:
        ref = _match(reference, plans)
        if ref is None and isinstance(reference, Plan):
            plans = plans + [reference]
            ref = len(plans) - 1
    groups = equivalent_groups(plans) if merge else [[i] for i in range(len(plans))]
    group_of = {i: g for g in groups for i in g}
    # the selected and reference plans stand for their groups
    reps = []
    for g in groups:
        rep = next((i for i in g if i in (hi, ref)), g[0])
        reps.append(rep)
    dev_mem = {p.cluster.device_memory for p in plans}
    cap = next(iter(dev_mem)) if len(dev_mem) == 1 else None
    ok = [i for i in reps if _finite(plans[i].predicted.step_time, plans[i].predicted.memory_per_device)]
    fits = [i for i in ok if cap is None or plans[i].predicted.memory_per_device <= cap]
    over = sorted((i for i in ok if i not in fits), key=lambda i: plans[i].predicted.memory_per_device)
    top_fit = max((plans[i].predicted.memory_per_device for i in fits), default=0.0)
    band = None
    if over:
        base = cap if cap is not None else top_fit
        band = (base * 1.06, base * 1.40)
    ypos: dict[int, float] = {i: plans[i].predicted.memory_per_device for i in fits}
    for k, i in enumerate(over):
        ypos[i] = band[0] + (band[1] - band[0]) * (k + 0.5) / len(over)
    # points sharing a place (equal predictions, different shardings) share a marker
    places: dict[tuple[float, float], list[int]] = {}
    for i in ok:
        places.setdefault((plans[i].predicted.step_time, ypos[i]), []).append(i)
    unit = time_unit(max((plans[i].predicted.step_time for i in ok), default=0.0))

    def number(i: int) -> str:
        return "=".join(f"#{j}" for j in group_of[i])

    def hover(i: int) -> str:
        out = []
        for j in group_of[i]:
            p = plans[j].predicted
            mem = fmt_bytes(p.memory_per_device)
            if cap is not None and p.memory_per_device > cap:
                mem += f" (<b>does not fit</b> in {fmt_bytes(cap)})"
            out.append(f"<b>#{j} {escape(plans[j].label)}</b>: {escape(plans[j].describe())}<br>"
                       f"step {fmt_in_unit(p.step_time, unit)}, {p.throughput:,.1f} samples/s, "
                       f"MFU {p.mfu * 100:.1f}%<br>memory/device {mem}")
        if len(group_of[i]) > 1:
            out.append("<i>equivalent plans: the same shardings up to swapping mesh axes</i>")
        return "<br>".join(out)

    cols = 3 if ref is not None and hi is not None else 2
    widths = [0.44, 0.34, 0.22] if cols == 3 else [0.5, 0.5]
    titles = ["(a) step time vs memory per device", "(b) where the step time goes"]
    if cols == 3:
        titles.append(f"(c) #{hi} minus #{ref}")
    fig = make_subplots(rows=1, cols=cols, column_widths=widths, horizontal_spacing=0.08,
                        subplot_titles=titles)
    pts = [(plans[i].predicted.step_time, plans[i].predicted.memory_per_device) for i in fits]
    front = [fits[k] for k in pareto_front(pts)]
    fig.add_trace(go.Scatter(
        x=[plans[i].predicted.step_time / unit[0] for i in front], y=[ypos[i] for i in front],
        mode="lines", line={"color": "#888888", "dash": "dash", "width": 1.5, "shape": "hv"},
        name="Pareto front", hoverinfo="skip", meta={"kind": "pareto", "plans": front}), 1, 1)
    shown = [ps[0] for ps in places.values()]
    positions = _label_positions([(plans[i].predicted.step_time, ypos[i]) for i in shown])
    sel = {i for i in (hi,) if i is not None}

    def at(i: int) -> list[int]:
        return places[(plans[i].predicted.step_time, ypos[i])]

    fig.add_trace(go.Scatter(
        x=[plans[i].predicted.step_time / unit[0] for i in shown], y=[ypos[i] for i in shown],
        mode="markers+text", text=[", ".join(number(j) for j in at(i)) for i in shown],
        textposition=positions, textfont={"size": 11},
        marker={"size": [18 if set(at(i)) & sel else 11 for i in shown],
                "symbol": ["star" if set(at(i)) & sel else
                           ("circle" if any(j in front for j in at(i)) else "circle-open")
                           for i in shown],
                "color": ["#d62728" if set(at(i)) & sel else
                          ("#4c78a8" if i not in over else "#999999") for i in shown],
                "line": {"width": 1.5, "color": ["#7f0000" if set(at(i)) & sel else "#4c78a8"
                                                 for i in shown]}},
        hovertext=["<br>".join(hover(j) for j in at(i)) for i in shown], hoverinfo="text",
        name="plans", customdata=[at(i) for i in shown],
        meta={"kind": "plans", "plans": shown, "groups": [group_of[i] for i in shown]}), 1, 1)
    annotations: list[dict[str, Any]] = []
    if ref is not None and hi is not None and ref in ypos and hi in ypos and ref != hi:
        fig.add_trace(go.Scatter(
            x=[plans[ref].predicted.step_time / unit[0]], y=[ypos[ref]], mode="markers",
            marker={"size": 16, "symbol": "diamond-open", "color": "#111111",
                    "line": {"width": 2}},
            name=f"#{ref} (reference)", hovertext=[hover(ref)], hoverinfo="text",
            meta={"kind": "reference", "plan": ref}), 1, 1)
        annotations.append({"x": plans[hi].predicted.step_time / unit[0], "y": ypos[hi],
                            "ax": plans[ref].predicted.step_time / unit[0], "ay": ypos[ref],
                            "xref": "x", "yref": "y", "axref": "x", "ayref": "y",
                            "showarrow": True, "arrowhead": 3, "arrowwidth": 1.5,
                            "arrowcolor": "#111111", "text": ""})
    if cap is not None and (band is not None or top_fit >= 0.5 * cap):
        fig.add_hline(y=cap, line={"color": "#d62728", "dash": "dot", "width": 1}, row=1, col=1,
                      annotation_text=f"device memory {fmt_bytes(cap)}",
                      annotation_position="bottom right", annotation_font_size=10)
    if band is not None:
        fig.add_hrect(y0=band[0] * 0.98, y1=band[1] * 1.02, fillcolor="#d62728", opacity=0.07,
                      line_width=0, row=1, col=1, annotation_text="do not fit (hover for memory)",
                      annotation_position="top left", annotation_font_size=10)

    kinds: list[str] = []
    for i in reps:
        for k in plans[i].predicted.comm_time_by_kind:
            if k not in kinds:
                kinds.append(k)
    kinds.sort(key=lambda k: (COLLECTIVES.index(k) if k in COLLECTIVES else len(COLLECTIVES), k))
    order = sorted(reps)
    parts = {i: cost_parts(plans[i]) for i in order}
    names = ["compute", *kinds] + [n for n in ("overlap", "other") if any(
        abs(parts[i][n]) > 1e-9 * max(plans[i].predicted.step_time, 1e-30) for i in order)
    ] + ["bubble"]
    ticks = [f"{number(i)} {short_label(plans[i].label)}" for i in order]
    extra = iter(_EXTRA * 4)
    colors = {n: COMPONENT_COLORS.get(n) or next(extra) for n in names}
    # each bar adds up to its plan's step time: compute from 0, the collectives from where
    # compute ends less what overlaps it (the overlap drawn hatched over compute's top), then
    # the rest of the busiest stage's work and its wait (bubble)
    top = {i: 0.0 for i in order}
    for name in names:
        vals = [parts[i].get(name, 0.0) for i in order]
        if name == "overlap":
            base = [top[i] + v for i, v in zip(order, vals)]
            height = [-v for v in vals]
            for i, v in zip(order, vals):
                top[i] += v
            marker = {"color": "rgba(255,255,255,0.35)", "line": {"color": colors[name], "width": 1},
                      "pattern": {"shape": "x", "fgcolor": colors[name], "size": 6}}
            label = "overlap (collectives during compute)"
        else:
            base = [top[i] for i in order]
            height = list(vals)
            for i, v in zip(order, vals):
                top[i] += v
            marker = {"color": colors[name]}
            label = {"bubble": "bubble (busiest stage idle)",
                     "other": "other (busiest stage, not itemised)"}.get(name, name)
        fig.add_trace(go.Bar(
            x=ticks, y=[h / unit[0] for h in height], base=[b / unit[0] for b in base],
            name=label, marker=marker,
            customdata=[[("\u2212" if v < 0 else "") + fmt_in_unit(abs(v), unit), plans[i].label]
                        for v, i in zip(vals, order)],
            hovertemplate=f"%{{x}} %{{customdata[1]}}: {label} %{{customdata[0]}}<extra></extra>",
            meta={"kind": "breakdown", "component": name, "plans": order, "seconds": vals}), 1, 2)
    fig.add_trace(go.Scatter(
        x=ticks, y=[plans[i].predicted.step_time / unit[0] for i in order], mode="markers",
        name="step time", marker={"symbol": "diamond", "size": 10, "color": "#222222"},
        customdata=[[fmt_in_unit(plans[i].predicted.step_time, unit)] for i in order],
        hovertemplate="%{x}: predicted step %{customdata[0]}<extra></extra>",
        meta={"kind": "step_time"}), 1, 2)
    if hi is not None:  # the selected plan's tick: a red star and bold
        k = order.index(reps[groups.index(group_of[hi])])
        shown_ticks = [f"<b><span style='color:#d62728'>\u2605 {t}</span></b>" if j == k else t
                       for j, t in enumerate(ticks)]
        fig.update_xaxes(tickvals=ticks, ticktext=shown_ticks, row=1, col=2)
    if cols == 3:
        a, b = cost_parts(plans[hi]), cost_parts(plans[ref])
        comps = [n for n in names if a.get(n, 0.0) or b.get(n, 0.0)]
        diffs = [(a.get(n, 0.0) - b.get(n, 0.0)) for n in comps]
        total = plans[hi].predicted.step_time - plans[ref].predicted.step_time
        mem = plans[hi].predicted.memory_per_device - plans[ref].predicted.memory_per_device
        ys = [*comps, "step time"]
        vals = [*diffs, total]
        fig.add_trace(go.Bar(
            x=[v / unit[0] for v in vals], y=ys, orientation="h",
            marker={"color": ["#2ca02c" if v < 0 else "#d62728" for v in vals]},
            customdata=[[("+" if v >= 0 else "\u2212") + fmt_in_unit(abs(v), unit)] for v in vals],
            hovertemplate="%{y}: %{customdata[0]}<extra></extra>", showlegend=False,
            text=[("+" if v >= 0 else "\u2212") + fmt_in_unit(abs(v), unit) for v in vals],
            textposition="auto", name="difference",
            meta={"kind": "difference", "plan": hi, "reference": ref, "components": ys,
                  "seconds": vals, "memory": mem}), 1, 3)
        fig.update_yaxes(autorange="reversed", row=1, col=3)
        sign = "+" if mem >= 0 else "\u2212"
        d_lo, d_hi = min(0.0, *vals) / unit[0], max(0.0, *vals) / unit[0]
        pad = 0.15 * ((d_hi - d_lo) or 1.0)
        dr = [d_lo - pad if d_lo < 0 else 0.0, d_hi + pad if d_hi > 0 else 0.0]
        fig.update_xaxes(title_text=f"time ({unit[1]}); memory {sign}{fmt_bytes(abs(mem))}",
                         zeroline=True, range=dr, **axis_ticks(*dr, count=4), row=1, col=3)
    merged = sum(len(g) - 1 for g in groups)
    sub = (f"{len(front)} of {len(fits)} fitting plans on the Pareto front (dashed)"
           + (f"; {len(over)} do not fit in device memory (shaded band)" if over else "")
           + (f"; {merged} equivalent plan{'s' if merged != 1 else ''} merged (#a=#b)" if merged else "")
           + (f"; \u2605 = #{hi} {escape(plans[hi].label)}" if hi is not None else ""))
    dropped = len(reps) - len(ok)
    if dropped:
        sub += f"; {dropped} without a finite prediction left out of (a)"
    fig.update_layout(
        template=TEMPLATE, barmode="stack", height=470, hovermode="closest",
        title={"text": f"Comparing {len(plans)} plans of {escape(plans[0].model)}<br><sup>{sub}</sup>",
               "x": 0.01, "xanchor": "left", "font": {"size": 14}},
        margin={"t": 110, "l": 70, "r": 20, "b": 70}, legend={"title": {"text": "cost"}},
        annotations=list(fig.layout.annotations) + annotations,
        meta={"kind": "compare", "unit": unit[1], "groups": groups, "highlight": hi,
              "reference": ref})
    xs = [plans[i].predicted.step_time / unit[0] for i in ok]
    if xs:
        pad = max(0.08 * (max(xs) - min(xs)), 0.04 * max(xs), 1e-12)
        xr = [max(0.0, min(xs) - pad), max(xs) + pad]
        fig.update_xaxes(range=xr, **axis_ticks(*xr), row=1, col=1)
    fig.update_xaxes(title_text=f"predicted step time ({unit[1]})", row=1, col=1)
    ymax = band[1] * 1.05 if band is not None else max(top_fit, 1e-30) * 1.2
    if cap is not None and band is None and top_fit >= 0.5 * cap:
        ymax = max(ymax, cap * 1.08)
    tickvals, ticktext, bunit = _byte_ticks(
        [ypos[i] for i in fits] + ([cap] if band else []),
        top=(cap if band is not None and cap else min(ymax, cap) if cap else ymax))
    fig.update_yaxes(title_text=f"memory per device ({bunit})", tickmode="array",
                     tickvals=tickvals, ticktext=ticktext, range=[0, ymax], row=1, col=1)
    tops = [plans[i].predicted.step_time / unit[0] for i in order if _finite(plans[i].predicted.step_time)]
    yr = [0.0, max(tops, default=1.0) * 1.08]
    fig.update_yaxes(title_text=f"time per step ({unit[1]})", range=yr, **axis_ticks(*yr),
                     row=1, col=2)
    fig.update_xaxes(tickangle=-30 if len(order) > 4 else 0, tickfont={"size": 10}, row=1, col=2)
    return fig
