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

from autoplan._gc import gc_paused
from autoplan._memo import per_owner
from autoplan.costs._mesh import COLLECTIVES
from autoplan.plans._plan import Plan, Stage

from .._errors import ArgumentError, ArgumentTypeError
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


def _stage_forms(s: Stage, plan: Plan, inputs: Sequence[Any]) -> list[tuple]:
    """The stage's shardings (its ops', and those of ``inputs``, the plan's inputs it holds)
    under every renaming of its mesh axes of more than one device to ``a0, a1, ...`` that keeps
    the axes' sizes (size-1 axes dropped: they split nothing)."""
    eff = [(a, n) for a, n in zip(s.axis_names, s.mesh_shape) if n > 1]
    forms = []
    for perm in itertools.permutations(range(len(eff))):
        if [eff[p][1] for p in perm] != sorted(n for _, n in eff):
            continue
        rename = {eff[p][0]: f"a{k}" for k, p in enumerate(perm)}
        seen: dict[Any, tuple] = {}  # (the specs of a stage repeat: each renamed once)

        def renamed(spec: Sequence[Any], rename: dict[str, str] = rename) -> tuple:
            return tuple(tuple(rename[a] for a in (e or ()) if a in rename) or None for e in spec)

        def canon(spec: Sequence[Any], renamed=renamed, seen: dict[Any, tuple] = seen) -> tuple:
            try:
                got = seen.get(spec)
            except TypeError:  # (a spec that is not hashable: renamed each time)
                return renamed(spec)
            if got is None:
                got = seen[spec] = renamed(spec)
            return got

        held = tuple(sorted((i.name, canon(i.spec)) for i in inputs))
        ops = tuple((o.op, tuple((t.role, canon(t.spec)) for t in o.tensors)) for o in s.ops)
        forms.append((tuple(sorted(n for _, n in eff)), tuple(sorted(s.device_ids)), held, ops))
    return forms


@per_owner
def _canonical(plan: Plan) -> tuple:
    """The plan's form up to renaming mesh axes (once per plan: plans are immutable, and the
    explorer groups its candidates at every selection)."""
    held: dict[int, list[Any]] = {s.index: [] for s in plan.stages}  # (one stage holds all)
    alone = plan.stages[0].index if len(plan.stages) == 1 else None
    for i in plan.inputs:
        held.setdefault(i.stage if alone is None else alone, []).append(i)
    stages = []
    for s in plan.stages:
        forms = _stage_forms(s, plan, held[s.index])
        stages.append(forms[0] if len(forms) == 1 else min(forms, key=repr))
    sch = plan.schedule
    return (tuple(stages), sch.kind, sch.microbatches)


def _same_prediction(a: Plan, b: Plan) -> bool:
    pa, pb = a.predicted, b.predicted
    return (math.isclose(pa.step_time, pb.step_time, rel_tol=1e-9, abs_tol=0.0)
            and math.isclose(pa.memory_per_device, pb.memory_per_device, rel_tol=1e-9, abs_tol=0.0))


@gc_paused
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
    v = _CompareView(plans, highlight, reference, merge)
    cols = 3 if v.ref is not None and v.hi is not None else 2
    widths = [0.44, 0.34, 0.22] if cols == 3 else [0.5, 0.5]
    titles = ["(a) step time vs memory per device", "(b) where the step time goes"]
    if cols == 3:
        titles.append(f"(c) #{v.hi} minus #{v.ref}")
    fig = make_subplots(rows=1, cols=cols, column_widths=widths, horizontal_spacing=0.08,
                        subplot_titles=titles)
    front, annotations = _scatter_panel(fig, v)
    order, names = _breakdown_panel(fig, v)
    if cols == 3:
        _difference_panel(fig, v, names)
    _compare_layout(fig, v, front, order, annotations)
    return fig


class _CompareView:
    """What the panels of :func:`compare_figure` share: the plans (a reference not among them
    added), the selected and reference indices, the groups of equivalent plans and their
    representatives, which plans fit the device's memory, each plan's place on panel (a)'s memory
    axis (those that do not fit in a band above it), and the time unit."""

    def __init__(self, plans: Any, highlight: Any, reference: Any, merge: bool):
        plans = as_plans(plans)
        hi = _match(highlight, plans)
        ref = None
        if reference is not None:
            ref = _match(reference, plans)
            if ref is None and isinstance(reference, Plan):
                plans = plans + [reference]
                ref = len(plans) - 1
        self.plans, self.hi, self.ref = plans, hi, ref
        self.groups = equivalent_groups(plans) if merge else [[i] for i in range(len(plans))]
        self.group_of = {i: g for g in self.groups for i in g}
        # the selected and reference plans stand for their groups
        self.reps = [next((i for i in g if i in (hi, ref)), g[0]) for g in self.groups]
        dev_mem = {p.cluster.device_memory for p in plans}
        cap = self.cap = next(iter(dev_mem)) if len(dev_mem) == 1 else None
        ok = self.ok = [i for i in self.reps if _finite(plans[i].predicted.step_time,
                                                        plans[i].predicted.memory_per_device)]
        fits = self.fits = [i for i in ok if cap is None or self.memory(i) <= cap]
        self.over = sorted((i for i in ok if i not in fits), key=self.memory)
        self.top_fit = max((self.memory(i) for i in fits), default=0.0)
        self.band = None
        if self.over:
            base = cap if cap is not None else self.top_fit
            self.band = (base * 1.06, base * 1.40)
        self.ypos: dict[int, float] = {i: self.memory(i) for i in fits}
        for k, i in enumerate(self.over):
            self.ypos[i] = self.band[0] + (self.band[1] - self.band[0]) * (k + 0.5) / len(self.over)
        # points sharing a place (equal predictions, different shardings) share a marker
        self.places: dict[tuple[float, float], list[int]] = {}
        for i in ok:
            self.places.setdefault((self.step(i), self.ypos[i]), []).append(i)
        self.unit = time_unit(max((self.step(i) for i in ok), default=0.0))

    def step(self, i: int) -> float:
        return self.plans[i].predicted.step_time

    def memory(self, i: int) -> float:
        return self.plans[i].predicted.memory_per_device

    def x(self, i: int) -> float:
        """Plan ``i``'s step time in the figure's unit."""
        return self.step(i) / self.unit[0]

    def at(self, i: int) -> list[int]:
        """The plans drawn at plan ``i``'s point."""
        return self.places[(self.step(i), self.ypos[i])]

    def number(self, i: int) -> str:
        return "=".join(f"#{j}" for j in self.group_of[i])

    def hover(self, i: int) -> str:
        out = []
        for j in self.group_of[i]:
            p = self.plans[j].predicted
            mem = fmt_bytes(p.memory_per_device)
            if self.cap is not None and p.memory_per_device > self.cap:
                mem += f" (<b>does not fit</b> in {fmt_bytes(self.cap)})"
            out.append(f"<b>#{j} {escape(self.plans[j].label)}</b>: "
                       f"{escape(self.plans[j].describe())}<br>"
                       f"step {fmt_in_unit(p.step_time, self.unit)}, {p.throughput:,.1f} "
                       f"samples/s, MFU {p.mfu * 100:.1f}%<br>memory/device {mem}")
        if len(self.group_of[i]) > 1:
            out.append("<i>equivalent plans: the same shardings up to swapping mesh axes</i>")
        return "<br>".join(out)


def _scatter_panel(fig: go.Figure, v: _CompareView) -> tuple[list[int], list[dict[str, Any]]]:
    """Panel (a): the Pareto front, one point per place, the reference's diamond and arrow, the
    device's memory and the band of plans that do not fit. Returns the front and the arrow."""
    front = [v.fits[k] for k in pareto_front([(v.step(i), v.memory(i)) for i in v.fits])]
    fig.add_trace(go.Scatter(
        x=[v.x(i) for i in front], y=[v.ypos[i] for i in front],
        mode="lines", line={"color": "#888888", "dash": "dash", "width": 1.5, "shape": "hv"},
        name="Pareto front", hoverinfo="skip", meta={"kind": "pareto", "plans": front}), 1, 1)
    shown = [ps[0] for ps in v.places.values()]
    positions = _label_positions([(v.step(i), v.ypos[i]) for i in shown])
    sel = {i for i in (v.hi,) if i is not None}
    picked = [bool(set(v.at(i)) & sel) for i in shown]
    fig.add_trace(go.Scatter(
        x=[v.x(i) for i in shown], y=[v.ypos[i] for i in shown],
        mode="markers+text", text=[", ".join(v.number(j) for j in v.at(i)) for i in shown],
        textposition=positions, textfont={"size": 11},
        marker={"size": [18 if p else 11 for p in picked],
                "symbol": ["star" if p else
                           ("circle" if any(j in front for j in v.at(i)) else "circle-open")
                           for i, p in zip(shown, picked)],
                "color": ["#d62728" if p else ("#4c78a8" if i not in v.over else "#999999")
                          for i, p in zip(shown, picked)],
                "line": {"width": 1.5, "color": ["#7f0000" if p else "#4c78a8" for p in picked]}},
        hovertext=["<br>".join(v.hover(j) for j in v.at(i)) for i in shown], hoverinfo="text",
        name="plans", customdata=[v.at(i) for i in shown],
        meta={"kind": "plans", "plans": shown, "groups": [v.group_of[i] for i in shown]}), 1, 1)
    annotations: list[dict[str, Any]] = []
    hi, ref = v.hi, v.ref
    if ref is not None and hi is not None and ref in v.ypos and hi in v.ypos and ref != hi:
        fig.add_trace(go.Scatter(
            x=[v.x(ref)], y=[v.ypos[ref]], mode="markers",
            marker={"size": 16, "symbol": "diamond-open", "color": "#111111",
                    "line": {"width": 2}},
            name=f"#{ref} (reference)", hovertext=[v.hover(ref)], hoverinfo="text",
            meta={"kind": "reference", "plan": ref}), 1, 1)
        annotations.append({"x": v.x(hi), "y": v.ypos[hi], "ax": v.x(ref), "ay": v.ypos[ref],
                            "xref": "x", "yref": "y", "axref": "x", "ayref": "y",
                            "showarrow": True, "arrowhead": 3, "arrowwidth": 1.5,
                            "arrowcolor": "#111111", "text": ""})
    cap, band = v.cap, v.band
    if cap is not None and (band is not None or v.top_fit >= 0.5 * cap):
        fig.add_hline(y=cap, line={"color": "#d62728", "dash": "dot", "width": 1}, row=1, col=1,
                      annotation_text=f"device memory {fmt_bytes(cap)}",
                      annotation_position="bottom right", annotation_font_size=10)
    if band is not None:
        fig.add_hrect(y0=band[0] * 0.98, y1=band[1] * 1.02, fillcolor="#d62728", opacity=0.07,
                      line_width=0, row=1, col=1, annotation_text="do not fit (hover for memory)",
                      annotation_position="top left", annotation_font_size=10)
    return front, annotations


def _breakdown_panel(fig: go.Figure, v: _CompareView) -> tuple[list[int], list[str]]:
    """Panel (b): one stacked bar per group, adding up to its step time (a diamond on top).
    Returns the bars' plans in order and the components' names."""
    plans, unit = v.plans, v.unit
    kinds: list[str] = []
    for i in v.reps:
        for k in plans[i].predicted.comm_time_by_kind:
            if k not in kinds:
                kinds.append(k)
    kinds.sort(key=lambda k: (COLLECTIVES.index(k) if k in COLLECTIVES else len(COLLECTIVES), k))
    order = sorted(v.reps)
    parts = {i: cost_parts(plans[i]) for i in order}
    names = ["compute", *kinds] + [n for n in ("overlap", "other") if any(
        abs(parts[i][n]) > 1e-9 * max(v.step(i), 1e-30) for i in order)] + ["bubble"]
    ticks = [f"{v.number(i)} {short_label(plans[i].label)}" for i in order]
    extra = iter(_EXTRA * 4)
    colors = {n: COMPONENT_COLORS.get(n) or next(extra) for n in names}
    # each bar adds up to its plan's step time: compute from 0, the collectives from where
    # compute ends less what overlaps it (the overlap drawn hatched over compute's top), then
    # the rest of the busiest stage's work and its wait (bubble)
    top = {i: 0.0 for i in order}
    for name in names:
        vals = [parts[i].get(name, 0.0) for i in order]
        if name == "overlap":
            base = [top[i] + x for i, x in zip(order, vals)]
            height = [-x for x in vals]
            marker = {"color": "rgba(255,255,255,0.35)", "line": {"color": colors[name], "width": 1},
                      "pattern": {"shape": "x", "fgcolor": colors[name], "size": 6}}
            label = "overlap (collectives during compute)"
        else:
            base = [top[i] for i in order]
            height = list(vals)
            marker = {"color": colors[name]}
            label = {"bubble": "bubble (busiest stage idle)",
                     "other": "other (busiest stage, not itemised)"}.get(name, name)
        for i, x in zip(order, vals):
            top[i] += x
        fig.add_trace(go.Bar(
            x=ticks, y=[h / unit[0] for h in height], base=[b / unit[0] for b in base],
            name=label, marker=marker,
            customdata=[[("\u2212" if x < 0 else "") + fmt_in_unit(abs(x), unit), plans[i].label]
                        for x, i in zip(vals, order)],
            hovertemplate=f"%{{x}} %{{customdata[1]}}: {label} %{{customdata[0]}}<extra></extra>",
            meta={"kind": "breakdown", "component": name, "plans": order, "seconds": vals}), 1, 2)
    fig.add_trace(go.Scatter(
        x=ticks, y=[v.x(i) for i in order], mode="markers",
        name="step time", marker={"symbol": "diamond", "size": 10, "color": "#222222"},
        customdata=[[fmt_in_unit(v.step(i), unit)] for i in order],
        hovertemplate="%{x}: predicted step %{customdata[0]}<extra></extra>",
        meta={"kind": "step_time"}), 1, 2)
    if v.hi is not None:  # the selected plan's tick: a red star and bold
        k = order.index(v.reps[v.groups.index(v.group_of[v.hi])])
        shown_ticks = [f"<b><span style='color:#d62728'>\u2605 {t}</span></b>" if j == k else t
                       for j, t in enumerate(ticks)]
        fig.update_xaxes(tickvals=ticks, ticktext=shown_ticks, row=1, col=2)
    return order, names


def _difference_panel(fig: go.Figure, v: _CompareView, names: list[str]) -> None:
    """Panel (c): per component and in total, the selected plan's time minus the reference's,
    and the difference in memory in the axis title."""
    plans, hi, ref, unit = v.plans, v.hi, v.ref, v.unit
    a, b = cost_parts(plans[hi]), cost_parts(plans[ref])
    comps = [n for n in names if a.get(n, 0.0) or b.get(n, 0.0)]
    diffs = [(a.get(n, 0.0) - b.get(n, 0.0)) for n in comps]
    total = v.step(hi) - v.step(ref)
    mem = v.memory(hi) - v.memory(ref)
    ys = [*comps, "step time"]
    vals = [*diffs, total]
    fig.add_trace(go.Bar(
        x=[x / unit[0] for x in vals], y=ys, orientation="h",
        marker={"color": ["#2ca02c" if x < 0 else "#d62728" for x in vals]},
        customdata=[[("+" if x >= 0 else "\u2212") + fmt_in_unit(abs(x), unit)] for x in vals],
        hovertemplate="%{y}: %{customdata[0]}<extra></extra>", showlegend=False,
        text=[("+" if x >= 0 else "\u2212") + fmt_in_unit(abs(x), unit) for x in vals],
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


def _compare_layout(fig: go.Figure, v: _CompareView, front: list[int], order: list[int],
                    annotations: list[dict[str, Any]]) -> None:
    """The title (what the figure shows and what it left out), the axes' ranges and ticks."""
    plans, hi, unit, band, cap = v.plans, v.hi, v.unit, v.band, v.cap
    merged = sum(len(g) - 1 for g in v.groups)
    sub = (f"{len(front)} of {len(v.fits)} fitting plans on the Pareto front (dashed)"
           + (f"; {len(v.over)} do not fit in device memory (shaded band)" if v.over else "")
           + (f"; {merged} equivalent plan{'s' if merged != 1 else ''} merged (#a=#b)"
              if merged else "")
           + (f"; \u2605 = #{hi} {escape(plans[hi].label)}" if hi is not None else ""))
    dropped = len(v.reps) - len(v.ok)
    if dropped:
        sub += f"; {dropped} without a finite prediction left out of (a)"
    fig.update_layout(
        template=TEMPLATE, barmode="stack", height=470, hovermode="closest",
        title={"text": f"Comparing {len(plans)} plans of {escape(plans[0].model)}<br><sup>{sub}</sup>",
               "x": 0.01, "xanchor": "left", "font": {"size": 14}},
        margin={"t": 110, "l": 70, "r": 20, "b": 70}, legend={"title": {"text": "cost"}},
        annotations=list(fig.layout.annotations) + annotations,
        meta={"kind": "compare", "unit": unit[1], "groups": v.groups, "highlight": hi,
              "reference": v.ref})
    xs = [v.x(i) for i in v.ok]
    if xs:
        pad = max(0.08 * (max(xs) - min(xs)), 0.04 * max(xs), 1e-12)
        xr = [max(0.0, min(xs) - pad), max(xs) + pad]
        fig.update_xaxes(range=xr, **axis_ticks(*xr), row=1, col=1)
    fig.update_xaxes(title_text=f"predicted step time ({unit[1]})", row=1, col=1)
    ymax = band[1] * 1.05 if band is not None else max(v.top_fit, 1e-30) * 1.2
    if cap is not None and band is None and v.top_fit >= 0.5 * cap:
        ymax = max(ymax, cap * 1.08)
    tickvals, ticktext, bunit = _byte_ticks(
        [v.ypos[i] for i in v.fits] + ([cap] if band else []),
        top=(cap if band is not None and cap else min(ymax, cap) if cap else ymax))
    fig.update_yaxes(title_text=f"memory per device ({bunit})", tickmode="array",
                     tickvals=tickvals, ticktext=ticktext, range=[0, ymax], row=1, col=1)
    tops = [v.x(i) for i in order if _finite(v.step(i))]
    yr = [0.0, max(tops, default=1.0) * 1.08]
    fig.update_yaxes(title_text=f"time per step ({unit[1]})", range=yr, **axis_ticks(*yr),
                     row=1, col=2)
    fig.update_xaxes(tickangle=-30 if len(order) > 4 else 0, tickfont={"size": 10}, row=1, col=2)
