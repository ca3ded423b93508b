"""A plan as text: its one-line description, its summary table and its notebook HTML.

Functions of a :class:`~autoplan.Plan` (read through its fields only); ``Plan.describe``,
``Plan.summary`` (and ``str(plan)``) and ``Plan._repr_html_`` call them.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from autoplan.tracing._batchflow import MIXING_NOTE, RANDOM_NOTE

__all__ = ["describe", "summary", "plan_html", "stage_levers", "levers_text"]

#: inputs listed in a plan's HTML table; the rest are counted
HTML_INPUTS = 200
#: notes the summary shows: what running the plan changes about the step
_CAVEATS = (RANDOM_NOTE, MIXING_NOTE, "memory levers:")

#: the summary's line on the schedules beyond GPipe and 1F1B
_SCHEDULE_NOTES = {
    "interleaved": "{v} virtual stages per mesh (stage s runs on mesh s mod {P})",
    "zb-h1": "each backward split into B (input gradient) and W (weight gradient, deferred)",
}


def describe(plan: Any) -> str:
    """A one-line description: stages and their logical meshes."""
    if not plan.is_pipeline:
        desc = f"intra-op on mesh {'x'.join(map(str, plan.mesh_shape))}"
        if plan.schedule.microbatches > 1:
            desc += f", {plan.schedule.microbatches} mb accumulated"
        return desc
    meshes = " | ".join(f"{len(s.layers)}L@{'x'.join(map(str, s.mesh_shape))}" for s in plan.stages)
    sch = plan.schedule
    if sch.virtual_stages > 1:  # interleaved: stage s runs on mesh s mod P
        return (f"{len(plan.stages)} stages on {sch.num_meshes} meshes ({sch.kind}, "
                f"v={sch.virtual_stages}, {sch.microbatches} mb): {meshes}")
    return f"{len(plan.stages)} stages ({sch.kind}, {sch.microbatches} mb): {meshes}"


_BYTE_UNITS = ((2.0 ** 40, "TiB"), (2.0 ** 30, "GiB"), (2.0 ** 20, "MiB"), (2.0 ** 10, "KiB"))


def _byte_unit(n: float) -> tuple[float, str]:
    """The unit to write ``n`` bytes in: the largest binary unit it reaches."""
    return next(((u, name) for u, name in _BYTE_UNITS if abs(n) >= u), (1.0, "B"))


def _bytes(n: float) -> str:
    """``n`` bytes in the unit its size calls for, 3 significant digits: ``21.0 KiB``."""
    u, name = _byte_unit(n)
    return f"{n / u:.3g} {name}" if name != "B" else f"{n:.0f} B"


def summary(plan: Any) -> str:
    """A summary table of the plan: its predictions, then one row per stage."""
    p = plan.predicted
    lines = [
        f"plan [{plan.label}] for {plan.model} on {plan.cluster.spec} "
        f"({plan.num_devices} devices, level {plan.level})",
        f"  costed on       : {plan.cluster.describe_profile()}",
        f"  layout          : {describe(plan)}",
        f"  step time       : {p.step_time * 1e3:.3f} ms   throughput {p.throughput:.1f} samples/s"
        f"   MFU {p.mfu * 100:.1f}%",
        f"  memory / device : {_bytes(p.memory_per_device)} "
        f"(device has {_bytes(plan.cluster.device_memory)})",
        f"  compute / comm  : {p.compute_time * 1e3:.3f} ms / {p.comm_time * 1e3:.3f} ms"
        f"   bubble {p.bubble_fraction * 100:.1f}%",
        "  communication   : " + (", ".join(f"{k} {_bytes(v)}" for k, v in
                                         sorted(p.comm_bytes.items()) if v) or "none"),
    ]
    if plan.is_pipeline and plan.schedule.kind in _SCHEDULE_NOTES:
        lines.append(f"  schedule        : {plan.schedule.kind}, "
                     + _SCHEDULE_NOTES[plan.schedule.kind].format(v=plan.schedule.virtual_stages,
                                                                  P=plan.schedule.num_meshes))
    # the stages' memory in one unit, the one their largest calls for
    mem_u, mem_name = _byte_unit(max((s.memory for s in plan.stages), default=0.0))
    lines.append("  stage  layers                        submesh  mesh     devices  fwd ms   bwd ms   "
                 f"mem {mem_name}")
    for s in plan.stages:
        rng = _layer_span(s.layers)
        lines.append(f"  {s.index:>5}  {rng:<28}  {s.submesh_shape[0]}x{s.submesh_shape[1]:<5}  "
                     f"{'x'.join(map(str, s.mesh_shape)):<7}  {s.num_devices:>7}  "
                     f"{s.forward_time * 1e3:>7.3f}  {s.backward_time * 1e3:>7.3f}  "
                     f"{s.memory / mem_u:>7.3g}")
    lines += [f"  stage {s.index} levers : {stage_levers(s)}" for s in plan.stages if s.levers]
    params = [i for i in plan.inputs if i.kind == "parameter"]
    sharded = sum(1 for i in params if any(i.spec))
    lines.append(f"  parameters      : {len(params)} leaves, {sharded} sharded")
    lines += [f"  note            : {n}" for n in plan.notes if n.startswith(_CAVEATS)]
    return "\n".join(lines)


#: what each ZeRO level shards
ZERO_SHARDS = {1: "optimizer state", 2: "optimizer state and gradients",
               3: "optimizer state, gradients and parameters"}


def stage_levers(stage: Any) -> str:
    """A stage's memory levers in words: ``ZeRO-2 (optimizer state and gradients sharded over
    x); remat layers_0, layers_1``; ``none`` without any."""
    return levers_text(stage.zero, stage.zero_axes, stage.remat_layers)


def levers_text(zero: int, zero_axes: Sequence[str], remat_layers: Sequence[str]) -> str:
    """:func:`stage_levers` of a ZeRO level, its axes and the rematerialised layers."""
    parts = []
    if zero:
        parts.append(f"ZeRO-{zero} ({ZERO_SHARDS[zero]} sharded over {', '.join(zero_axes)})")
    if remat_layers:
        parts.append("remat " + ", ".join(remat_layers))
    return "; ".join(parts) or "none"


def plan_html(plan: Any) -> str:
    """The plan for a notebook: its :func:`summary`, then a table of the inputs' specs (the
    first :data:`HTML_INPUTS`) as PartitionSpecs."""
    rows = "".join(
        f"<tr><td><code>{html.escape(i.name)}</code></td><td>{i.kind}</td>"
        f"<td>{'x'.join(map(str, i.shape))}</td><td><code>{html.escape(str(i.spec.to_pspec()))}"
        f"</code></td><td>{i.stage}</td></tr>"
        for i in plan.inputs[:HTML_INPUTS])
    more = (f"<p>... {len(plan.inputs) - HTML_INPUTS} more inputs</p>"
            if len(plan.inputs) > HTML_INPUTS else "")
    return (f"<div class='autoplan-plan'><pre>{html.escape(summary(plan))}</pre>"
            "<details><summary>PartitionSpecs</summary><table><tr><th>input</th><th>kind</th>"
            f"<th>shape</th><th>PartitionSpec</th><th>stage</th></tr>{rows}</table>{more}"
            "</details></div>")


def _layer_span(layers: Sequence[str]) -> str:
    if not layers:
        return "-"
    if len(layers) == 1:
        return layers[0]
    return f"{layers[0]} .. {layers[-1]} ({len(layers)})"
