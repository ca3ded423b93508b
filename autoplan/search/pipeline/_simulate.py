"""A layout of the pipeline search simulated: under each schedule the search weighs (GPipe,
1F1B, interleaved 1F1B on the layout cut into chunks, ZB-H1), with the stages' times, the
transfers between the placed submeshes and each stage's per-step work; the memory each stage
holds, and the memory levers of a layout that does not fit.

See :mod:`~autoplan.search.pipeline._pipeline` (step 6 of its docstring).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autoplan._errors import SearchError
from autoplan._memo import memo
from autoplan.plans._schedule import (
    SCHEDULE_CHOICES,
    SPLIT_KINDS,
    ScheduleStats,
    inflight_counts,
    schedule_events,
    schedule_summary,
)
from autoplan.search.pipeline._cost_table import _Table, _Terms
from autoplan.search.pipeline._layouts import Layout
from autoplan.search.pipeline._stage_dp import place_submeshes

__all__ = ["SCHEDULES", "INTERLEAVED_CHUNKS", "AUTO_SCHEDULES"]


#: The schedules the search accepts: the two classic ones, interleaved 1F1B, ZB-H1, and ``auto``
#: (every layout weighed under :data:`AUTO_SCHEDULES`, the best kept).
SCHEDULES = SCHEDULE_CHOICES

#: Chunks per mesh (virtual stages ``v``) ``schedule="interleaved"`` tries on each layout.
INTERLEAVED_CHUNKS = (2, 4)

#: ``(kind, v)`` pairs ``schedule="auto"`` simulates each layout under (GPipe is left out: at
#: equal stage times it takes 1F1B's step and holds all ``B`` micro-batches).
AUTO_SCHEDULES = (("1f1b", 1), ("zb-h1", 1)) + tuple(("interleaved", v) for v in INTERLEAVED_CHUNKS)


@dataclass
class _Eval:
    """A layout at ``B`` micro-batches, simulated.

    ``timing`` holds the simulation's arguments: the events are simulated again only for the
    plans made (:attr:`events`), the summary (``stats``) alone for every layout."""

    layout: Layout
    B: int
    stages: list[_Terms]
    placed: list[list[int]]
    comm_f: list[float]
    comm_b: list[float]
    timing: tuple[tuple, dict[str, Any]]
    stats: ScheduleStats
    memory: list[float]
    fits: bool
    dp_latency: float | None = None
    kind: str = "1f1b"
    virtual_stages: int = 1
    levers: tuple | None = None  # per stage, its StageLevers (:mod:`._levers`), when applied

    @property
    def meshes(self) -> int:
        """The pipeline's meshes (its stages, but for interleaved: ``S / v``)."""
        return len(self.layout) // self.virtual_stages

    @property
    def events(self) -> list:
        """The simulated schedule's events (:func:`~autoplan.plans._schedule.schedule_events`)."""
        return schedule_events(*self.timing[0], **self.timing[1])

    @property
    def step(self) -> float:
        return self.stats.step_time

    @property
    def key(self) -> tuple[bool, float, float]:
        """Ranking: fitting first, then the simulated step (to 9 significant digits: rounding
        aside, re-timed plans can tie), then the memory."""
        return (not self.fits, float(f"{self.step:.9g}"), max(self.memory))


def _schedule_kinds(schedule: str, layout: Layout) -> tuple[tuple[str, int], ...]:
    """The ``(kind, virtual stages)`` a layout is simulated under for the search's
    ``schedule``: one stage is gradient accumulation whatever the kind (recorded as 1F1B but
    for GPipe)."""
    if len(layout) == 1:
        return (("gpipe" if schedule == "gpipe" else "1f1b", 1),)
    if schedule == "auto":
        return AUTO_SCHEDULES
    if schedule == "interleaved":
        return tuple(("interleaved", v) for v in INTERLEAVED_CHUNKS)
    return ((schedule, 1),)


def _chunks(layout: Layout, v: int) -> Layout | None:
    """Interleaved 1F1B's ``P v`` chunks of a ``P``-stage layout (Megatron-LM): chunk
    ``i P + g`` runs on stage ``g``'s submesh and logical mesh, and stage ``g``'s layer count is
    split into ``v`` near-equal parts, one per chunk, so each mesh keeps as many layers as the
    layout gave it. The layers are then dealt to the chunks in chunk order. None for a layout
    that is not a chain of contiguous layers or whose stage has fewer than ``v`` layers."""
    flat = [li for members, _, _ in layout for li in members]
    if flat != list(range(flat[0], flat[0] + len(flat))) or any(
            len(members) < v for members, _, _ in layout):
        return None
    out, start = [], flat[0]
    for i in range(v):
        for members, k, c in layout:
            n = len(members) // v + (1 if i < len(members) % v else 0)
            out.append((tuple(range(start, start + n)), k, c))
            start += n
    return tuple(out)


def _evaluate(table: _Table, layout: Layout, ratio: float = 1.0, B: int | None = None,
              dp_latency: float | None = None) -> _Eval | None:
    """Simulate ``layout`` under each schedule the search weighs (:func:`_schedule_kinds`) and
    keep the best by :attr:`_Eval.key` (fitting, then the step, then the memory; the first on
    ties); None when none applies (see :func:`_evaluate_kind`). A requested interleaved schedule
    that applies to no chunk count falls back to 1F1B."""
    best = None
    kinds = _schedule_kinds(table.ctx.schedule, layout)
    for kind, v in kinds:
        ev = _evaluate_kind(table, layout, kind, v, ratio, B, dp_latency)
        if ev is not None and (best is None or ev.key < best.key):
            best = ev
    if best is None and all(kind == "interleaved" for kind, _ in kinds):
        best = _evaluate_kind(table, layout, "1f1b", 1, ratio, B, dp_latency)
    return best


def _evaluate_kind(table: _Table, layout: Layout, kind: str, v: int = 1, ratio: float = 1.0,
                   B: int | None = None, dp_latency: float | None = None,
                   levers: tuple | None = None) -> _Eval | None:
    """Simulate ``layout`` under schedule ``kind`` with ``v`` virtual stages (see
    :mod:`~autoplan.search.pipeline._pipeline`, step 6); None when a stage's plans do not divide
    the micro-batch, the submeshes cannot be placed, or an interleaved schedule does not apply
    (:func:`_chunks`, and ``B`` a multiple of the stages).

    How each kind is weighed, beyond its simulated step:

    * memory for in-flight activations: GPipe ``B``, 1F1B ``min(S - s, B)`` micro-batches on
      stage ``s``; ZB-H1 the simulated peak between a forward and its ``W`` (deferring ``W``
      holds its inputs: at most ``min(S, B)``; with rematerialised layers the saved
      activations are the checkpoints, and a deferred ``W`` either keeps what ``B`` recomputed
      or recomputes it, which this does not count); interleaved, per mesh, its chunks' resident
      bytes plus its simulated peak of chunk micro-batches times its largest chunk's
      activations;
    * ZB-H1's ``W`` of a stage is its layers' backward times their weight-gradient FLOP share
      (:meth:`~autoplan.search.pipeline._cost_table._Table.weight_share`), its ``B`` the rest;
    * interleaved pays a transfer between every pair of consecutive chunks (mesh ``P - 1``
      hands back to mesh 0) and a program launch per chunk task;
    * a layout that does not fit gets the memory levers its stages need
      (:func:`~autoplan.search.pipeline._levers.choose`: a ZeRO level, rematerialised layers)
      at the in-flight counts simulated, and is simulated again with them (``levers``: the
      chosen ones, per stage, with their stage terms).
    """
    ctx = table.ctx
    B = B or table.B
    if levers is None:  # (budget-free: kept across searches with the table's shared costs)
        timed = memo(table.shared, (_timed, layout, kind, v, ratio, B),
                     lambda: _timed(table, layout, kind, v, ratio, B))
    else:
        timed = _timed(table, layout, kind, v, ratio, B, levers)
    if timed is None:
        return None
    chunks, stages, placed, comm_f, comm_b, timing, stats, memory = timed
    P = len(layout)
    fits = max(memory) <= ctx.budget * (1 + 1e-9)
    if not fits and levers is None and ctx.levers:
        from autoplan.search.pipeline._levers import fit_layout  # noqa: PLC0415

        chosen = fit_layout(table, chunks, stages, kind, P, stats, ratio, B)
        if chosen is not None:
            again = _evaluate_kind(table, layout, kind, v, ratio, B, dp_latency, chosen)
            if again is not None and again.fits:
                return again
    return _Eval(chunks, B, stages, placed, comm_f, comm_b, timing, stats, memory, fits,
                 dp_latency, kind, v, None if levers is None else tuple(lv[0] for lv in levers))


def _timed(table: _Table, layout: Layout, kind: str, v: int, ratio: float, B: int,
           levers: tuple | None = None) -> tuple | None:
    """:func:`_evaluate_kind`'s simulation of ``layout`` before the memory check: ``(chunks,
    stage terms, placed devices, forward and backward transfers, the schedule's arguments, its
    statistics, memory per stage)``; None where it does not apply. It reads neither the memory
    budget nor the schedule asked for."""
    ctx = table.ctx
    P = len(layout)
    chunks = layout
    if v > 1:
        chunks = _chunks(layout, v)
        if chunks is None or B % P:
            return None
    S = len(chunks)
    stages = []
    for members, k, c in chunks:
        tt = table.stage(members, k, c, ratio, B)
        if tt is None:
            return None
        stages.append(tt)
    if levers is not None:
        stages = [lv[1] for lv in levers]
    try:
        on_mesh = place_submeshes([ctx.submeshes[k] for _, k, _ in layout], ctx.num_hosts,
                                  ctx.devices_per_host)
    except SearchError:
        return None
    placed = [on_mesh[s % P] for s in range(S)]
    stage_of = [0] * table.L
    for s, (members, _, _) in enumerate(chunks):
        for li in members:
            stage_of[li] = s
    fwd, bwd = table.boundary_bytes(stage_of, S)
    comm_f, comm_b = [], []
    for s in range(S - 1):
        cross = ctx.crosses_hosts(placed[s], placed[s + 1])
        comm_f.append(ctx.transfer(float(fwd[s]) * ratio, chunks[s + 1][1], cross,
                                   len(placed[s + 1]))[0])
        comm_b.append(ctx.transfer(float(bwd[s]) * ratio, chunks[s][1], cross, len(placed[s]))[0])
    # launching programs: one per step for gradient accumulation (a loop in one program), one
    # per task in a pipeline (each micro-batch's forward and backward, and the update)
    cl = ctx.cluster
    per_step = cl.step_overhead(math.ceil(len(ctx.full.inputs) / S))
    per_task = cl.step_overhead(0) if S > 1 else 0.0
    backward = [x.backward for x in stages]
    extra: dict[str, Any] = {}
    if kind in SPLIT_KINDS:
        weight = [sum(table.weight_share(li) * table.terms(li, k, c, ratio, B).backward
                      for li in members) for members, k, c in chunks]
        backward = [b - w for b, w in zip(backward, weight, strict=True)]
        extra["weight_times"] = [w + per_task for w in weight]
    if v > 1:
        extra["virtual_stages"] = v
    timing = ((kind, S, B, [x.forward + per_task for x in stages],
               [b + per_task for b in backward], comm_f or None),
              {"backward_comm_times": comm_b or None,
               "step_times": [x.step + per_step for x in stages], **extra})
    stats = schedule_summary(*timing[0], **timing[1])
    inflight = inflight_counts(kind, S, B, stats, P)
    if kind == "interleaved":
        mine = [range(g, S, P) for g in range(P)]
        per_mesh = [sum(stages[s].resident for s in mine[g]) + inflight[g]
                    * max(stages[s].activation for s in mine[g]) for g in range(P)]
        memory = [per_mesh[s % P] for s in range(S)]
    else:
        memory = [x.resident + inflight[s] * x.activation for s, x in enumerate(stages)]
    return chunks, stages, placed, comm_f, comm_b, timing, stats, memory
