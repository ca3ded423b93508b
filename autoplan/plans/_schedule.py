"""Pipeline schedules (GPipe, 1F1B, interleaved 1F1B and ZB-H1): per-mesh task orders, their
clock tables, their timed simulation, a plan's table read back into an order, and the makespan of
an order. The one schedule module of autoplan: the pipeline search, the executor, the figures,
the tests and the benchmarks all use it; it depends on nothing but the error classes.

Convention (Alpa): ``S`` stages on ``P`` meshes; mesh ``j`` runs the forward *and* the backward
of its stages. For GPipe, 1F1B and ZB-H1 ``P = S`` and stage ``j`` runs on mesh ``j``; for
interleaved 1F1B each mesh holds ``v`` *virtual stages* (model chunks), ``S = P v``, and stage
``s`` runs on mesh ``s mod P`` (mesh ``j`` holds stages ``j, j + P, .., j + (v - 1) P``). A task
is ``(micro-batch, stage, kind)`` (:class:`StagePass`, a named tuple) with ``kind`` ``"forward"``,
``"backward"`` or ``"weight"``. The dependencies are those of a chain of stages:

* ``F(i, s)`` needs ``F(i, s - 1)`` (the previous stage's activations);
* ``B(i, s)`` needs ``F(i, s)`` (its own saved activations) and ``B(i, s + 1)`` (the gradient
  of its output);
* ``W(i, s)`` (ZB-H1 only) needs ``B(i, s)``: the schedule splits each backward into ``B``, the
  gradient with respect to the stage's input (what the previous stage waits for), and ``W``, the
  gradient with respect to its weights (what only the optimizer reads, so it can be deferred).

Per-mesh orders, ``m`` micro-batches:

* GPipe: ``F_0 .. F_{m-1}`` then ``B_0 .. B_{m-1}``.
* 1F1B: ``w = min(S - j - 1, m)`` warm-up forwards ``F_0 .. F_{w-1}``; then the steady phase
  alternates one forward and one backward, ``F_w B_0 F_{w+1} B_1 ...``, so the first backward
  comes after ``w + 1`` forwards (the "extra" forward is the first of the steady phase, not a
  warm-up one); then the cool-down backwards. Mesh ``j`` holds at most ``S - j`` micro-batches'
  activations where GPipe holds all ``m``.
* Interleaved 1F1B (Narayanan et al., SC 2021, Section 2.2; ``m`` a multiple of ``P``): mesh
  ``j`` runs ``m v`` virtual forwards ``k = 0 .. m v - 1``, forward ``k`` being micro-batch
  ``(k // (P v)) P + k mod P`` on its chunk ``(k // P) mod v``, i.e. groups of ``P``
  micro-batches pass through chunk 0, then chunk 1, ...; virtual backward ``k`` is the same
  micro-batch on chunk ``v - 1 - (k // P) mod v``. It starts with ``min(2 (P - j - 1) + (v - 1) P,
  m v)`` warm-up forwards, then alternates one forward and one backward, then drains. Each chunk
  is ``1 / v`` of the stage, so the fill and drain shrink ``v``-fold: with per-chunk times
  ``t_f / v`` and ``t_b / v`` the idle time over the busy time, the bubble ratio, is
  ``(P - 1) / (v m)`` (1F1B's is ``(P - 1) / m``), at the cost of ``v`` times more transfers.
* ZB-H1 (Qi et al., ICLR 2024, Section 3.1): mesh ``j`` holds at most ``min(S - j, m)``
  micro-batches between the start of a forward and the end of its ``B`` (1F1B's bound) and at
  most ``min(S, m)`` between a forward and its ``W`` (1F1B's first mesh's), so the peak
  activation memory over the meshes is 1F1B's. At each clock it runs its next forward when
  both bounds allow, else its ready ``B``, else its oldest deferred ``W``. The deferred ``W``
  fill what 1F1B leaves idle while it waits for gradients: with ``t_F = t_B = t_W`` the step is
  ``(3 m + S - 1) t_F`` for ``m >= S`` (1F1B, whose backward is ``B`` then ``W``:
  ``3 (m + S - 1) t_F``; with fewer micro-batches one micro-batch's ``2 S + 1`` clocks bound it), the
  bubble ``(S - 1)(t_F + t_B - t_W)`` of the paper, a third of 1F1B's
  ``(S - 1)(t_F + t_B + t_W)``.

A schedule table has clock ticks as rows and meshes as columns; each entry is a :class:`StagePass` or
``None`` (a bubble). It is the earliest-start execution of these orders with unit times (each
task at the first tick after its dependencies): GPipe and 1F1B take ``2 (m + S - 1)`` ticks, so
both have the bubble fraction ``(S - 1) / (m + S - 1)``. :func:`schedule_table` derives the table
of every kind from ``(kind, stages, micro-batches, virtual stages)`` alone.

A training step ends with per-step work on every mesh (the gradient synchronisation across the
stage's data-parallel devices and the optimizer update), which :func:`schedule_events` places
after the mesh's last task (events of kind ``"update"``, one per stage): the step ends when the
last mesh's update does.

References:
    Huang et al., "GPipe", NeurIPS 2019. Narayanan et al., "PipeDream" (SOSP 2019) and
    "Efficient Large-Scale Language Model Training on GPU Clusters" (SC 2021) for 1F1B and its
    interleaved schedule. Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024 (ZB-H1).
    Zheng et al., "Alpa", OSDI 2022, Section 6 (schedules as tables).
"""

from __future__ import annotations

import functools
import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np

from autoplan._errors import ScheduleError, SearchError

__all__ = ["KINDS", "SPLIT_KINDS", "StagePass", "Event", "ScheduleStats", "task_deps", "num_meshes",
           "gpipe_table", "one_f_one_b_table", "interleaved_table", "zb_h1_table",
           "schedule_table", "schedule_order", "schedule_events", "schedule_stats",
           "schedule_summary", "validate_table", "order_from_table", "ideal_makespan",
           "check_schedule", "inflight_counts", "SCHEDULE_CHOICES", "check_schedule_choice"]

#: the schedule kinds with a generated table
KINDS = ("gpipe", "1f1b", "interleaved", "zb-h1")
#: the schedules a search (and the Explorer) can be asked for: a kind, or ``"auto"`` to weigh
#: all but GPipe
SCHEDULE_CHOICES = ("1f1b", "gpipe", "interleaved", "zb-h1", "auto")
#: the kinds that split each backward into ``B`` (input gradient) and ``W`` (weight gradient)
SPLIT_KINDS = ("zb-h1",)

_KIND_NAMES = {"forward": "forward", "f": "forward", "fwd": "forward",
               "backward": "backward", "b": "backward", "bwd": "backward",
               "weight": "weight", "w": "weight", "wgrad": "weight"}
_CODE = {"forward": 0, "backward": 1, "weight": 2}


class StagePass(NamedTuple):
    """One pass of a micro-batch through a stage: its forward, backward or weight-gradient work
    (a tuple: ``StagePass(0, 1, "forward") == (0, 1, "forward")``).

    Attributes:
        microbatch: micro-batch index ``0 .. m - 1``.
        stage: stage index ``0 .. S - 1`` (it runs on mesh ``stage mod P``).
        kind: ``"forward"``, ``"backward"`` (the whole backward, or in ZB-H1 its input-gradient
            part ``B``) or ``"weight"`` (ZB-H1's weight-gradient part ``W``).
    """

    microbatch: int
    stage: int
    kind: str

@dataclass(frozen=True)
class Event:
    """A task placed in time by :func:`schedule_events`.

    Attributes:
        start: start time.
        end: end time.
        mesh: the mesh that runs it (``stage mod P``; the stage itself but for interleaved).
        microbatch: micro-batch index.
        stage: stage index.
        kind: ``"forward"``, ``"backward"``, ``"weight"``, or ``"update"`` (a stage's per-step
            work after its mesh's last task; its ``microbatch`` is the last one's).
    """

    start: float
    end: float
    mesh: int
    microbatch: int
    stage: int
    kind: str


@dataclass(frozen=True)
class ScheduleStats:
    """Summary of a timed schedule.

    Attributes:
        step_time: from the first start to the last end.
        bubble_fraction: ``1 - sum(busy) / (P * step_time)``, ``P`` meshes.
        busy: busy time of each mesh.
        peak_inflight: per mesh, the most (micro-batch, stage) pairs alive at once, from the start
            of the forward to the end of the backward (ZB-H1: of ``W``, counted whole although
            ``B`` frees the part only it reads): their activations are held. An interleaved
            mesh counts each of its chunks (``1 / v`` of a stage).
        peak_deferred: per mesh, the most ``W`` passes waiting at once (between the end of
            ``B`` and the end of ``W``: the weight-gradient inputs are held); zeros for the
            kinds that do not split the backward.
    """

    step_time: float
    bubble_fraction: float
    busy: list[float]
    peak_inflight: list[int]
    peak_deferred: list[int] = field(default_factory=list)


def _check_sm(num_stages: object, microbatches: object) -> tuple[int, int]:
    for name, val in (("num_stages", num_stages), ("microbatches", microbatches)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ScheduleError(
                f"{name} should be an integer >= 1. Got {val!r}. Fix: pass a positive count."
            )
    return int(num_stages), int(microbatches)


def _check_kind(kind: object) -> str:
    if kind not in KINDS:
        raise ScheduleError(f"schedule kind should be one of {', '.join(map(repr, KINDS))}. Got "
                            f"{kind!r}. Fix: use one of them (in the plan's Schedule too).")
    return kind  # type: ignore[return-value]


def check_schedule(kind: object, num_stages: object, microbatches: object,
                   virtual_stages: object = 1) -> tuple[str, int, int, int]:
    """Check a schedule's ``(kind, stages, micro-batches, virtual stages)``.

    Returns:
        ``(kind, S, m, v)``.

    Raises:
        ScheduleError: an unknown kind; a count below one; ``v > 1`` for a kind other than
            ``"interleaved"``; ``S`` not a multiple of ``v``; or an interleaved schedule with
            ``v > 1`` whose ``m`` is not a multiple of its ``P = S / v`` meshes (Megatron-LM's
            condition: micro-batches pass through each chunk in groups of ``P``).
    """
    kind = _check_kind(kind)
    S, m = _check_sm(num_stages, microbatches)
    v = virtual_stages
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ScheduleError(f"virtual_stages should be an integer >= 1. Got {v!r}. Fix: pass the "
                            "number of model chunks per mesh (1 but for 'interleaved').")
    if v > 1 and kind != "interleaved":
        raise ScheduleError(f"virtual_stages should be 1 for a {kind!r} schedule. Got {v}. Fix: "
                            "use kind 'interleaved' for virtual stages.")
    if S % v:
        raise ScheduleError(f"num_stages should be a multiple of virtual_stages ({v}: the stages "
                            f"are v model chunks on each of S / v meshes). Got {S}.")
    if v > 1 and m % (S // v):
        raise ScheduleError(f"microbatches should be a multiple of the {S // v} meshes of an "
                            f"interleaved schedule (micro-batches pass each chunk in groups of "
                            f"one per mesh). Got {m}. Fix: pick a multiple of {S // v}.")
    return kind, S, m, v


def num_meshes(num_stages: int, virtual_stages: int = 1) -> int:
    """The meshes (the table's columns) of ``num_stages`` stages, ``virtual_stages`` per mesh.

    Examples:
        >>> num_meshes(8, 2)
        4
    """
    return num_stages // virtual_stages


def task_deps(task: tuple[int, int, str], num_stages: int) -> list[StagePass]:
    """The tasks ``task`` reads from (see the module docstring).

    Examples:
        >>> task_deps((3, 1, "backward"), 3)
        [StagePass(microbatch=3, stage=1, kind='forward'), StagePass(microbatch=3, stage=2, kind='backward')]
        >>> task_deps((3, 1, "weight"), 3)
        [StagePass(microbatch=3, stage=1, kind='backward')]
    """
    i, j, kind = task
    if kind == "forward":
        return [StagePass(i, j - 1, "forward")] if j > 0 else []
    if kind == "weight":
        return [StagePass(i, j, "backward")]
    deps = [StagePass(i, j, "forward")]
    if j < num_stages - 1:
        deps.append(StagePass(i, j + 1, "backward"))
    return deps


@functools.lru_cache(maxsize=32)
def _mesh_orders(kind: str, S: int, m: int, v: int = 1) -> tuple[tuple[StagePass, ...], ...]:
    """Each mesh's tasks in the order it runs them (kept for the last few ``(kind, S, m, v)``:
    a search simulates many layouts of the same stage and micro-batch counts)."""
    if kind == "zb-h1":
        return _zb_h1_orders(S, m)
    if kind == "interleaved" and v > 1:
        return _interleaved_orders(S // v, v, m)
    orders: list[tuple[StagePass, ...]] = []
    for j in range(S):
        fwd = [StagePass(b, j, "forward") for b in range(m)]
        bwd = [StagePass(b, j, "backward") for b in range(m)]
        if kind == "gpipe":
            orders.append(tuple(fwd + bwd))
            continue
        w = min(S - j - 1, m)
        order = fwd[:w]
        f, b = w, 0
        while f < m:  # steady state: one forward, one backward
            order.append(fwd[f])
            order.append(bwd[b])
            f += 1
            b += 1
        order.extend(bwd[b:])
        orders.append(tuple(order))
    return tuple(orders)


def _interleaved_orders(P: int, v: int, m: int) -> tuple[tuple[StagePass, ...], ...]:
    """Megatron-LM's interleaved 1F1B orders (module docstring), ``m`` a multiple of ``P``."""
    n = m * v

    def microbatch(k: int) -> int:
        return (k // (P * v)) * P + k % P

    orders = []
    for j in range(P):
        fwd = [StagePass(microbatch(k), ((k // P) % v) * P + j, "forward") for k in range(n)]
        bwd = [StagePass(microbatch(k), (v - 1 - (k // P) % v) * P + j, "backward") for k in range(n)]
        w = min(2 * (P - j - 1) + (v - 1) * P, n)
        order = fwd[:w]
        for k in range(n - w):
            order += [fwd[w + k], bwd[k]]
        order += bwd[n - w:]
        orders.append(tuple(order))
    return tuple(orders)


def _zb_h1_orders(S: int, m: int) -> tuple[tuple[StagePass, ...], ...]:
    """ZB-H1's orders (module docstring), made by running its rule clock by clock with unit
    times: at each clock mesh ``j`` runs its next forward when it is ready, fewer than
    ``min(S - j, m)`` of the mesh's micro-batches are between forward and ``B`` and fewer than
    ``min(S, m)`` between forward and ``W``; else its ready ``B``; else its oldest deferred
    ``W``."""
    never = 3 * S * m + 1  # the clock of a task not run yet
    fdone = [[never] * m for _ in range(S)]  # clock of forward (stage, micro-batch)
    bdone = [[never] * m for _ in range(S)]
    nf, nb, nw = [0] * S, [0] * S, [0] * S
    orders: list[list[StagePass]] = [[] for _ in range(S)]
    left, t = 3 * S * m, 0
    while left:
        for j in range(S):
            f, b, w = nf[j], nb[j], nw[j]
            if (f < m and f - b < min(S - j, m) and f - w < min(S, m)
                    and (j == 0 or fdone[j - 1][f] < t)):
                orders[j].append(StagePass(f, j, "forward"))
                fdone[j][f], nf[j] = t, f + 1
            elif b < m and fdone[j][b] < t and (j == S - 1 or bdone[j + 1][b] < t):
                orders[j].append(StagePass(b, j, "backward"))
                bdone[j][b], nb[j] = t, b + 1
            elif w < b and bdone[j][w] < t:
                orders[j].append(StagePass(w, j, "weight"))
                nw[j] = w + 1
            else:
                continue
            left -= 1
        t += 1
    return tuple(tuple(o) for o in orders)


#: a timed task as a plain tuple: ``(start, end, mesh, microbatch, stage, kind)`` (an Event's fields)
_Row = tuple[float, float, int, int, int, str]


def _simulate(orders: Sequence[Sequence[StagePass]], S: int, fwd: Sequence[float],
              bwd: Sequence[float], comm: Sequence[float], comm_bwd: Sequence[float] | None = None,
              step: Sequence[float] | None = None, wgt: Sequence[float] | None = None
              ) -> list[Event]:
    return [Event(*r) for r in _simulate_rows(orders, S, fwd, bwd, comm, comm_bwd, step, wgt)]


def _simulate_rows(orders: Sequence[Sequence[StagePass]], S: int, fwd: Sequence[float],
                   bwd: Sequence[float], comm: Sequence[float],
                   comm_bwd: Sequence[float] | None = None, step: Sequence[float] | None = None,
                   wgt: Sequence[float] | None = None) -> list[_Row]:
    """The timed tasks of ``orders`` (one per mesh: each mesh's tasks run in turn, each when its
    dependency has ended), sorted by start, then mesh; ``S`` stages in all."""
    P = len(orders)
    comm_b = comm if comm_bwd is None else comm_bwd
    # end times by stage, then micro-batch
    fdone: list[dict[int, float]] = [{} for _ in range(S)]
    bdone: list[dict[int, float]] = [{} for _ in range(S)]
    pos = [0] * P
    free = [0.0] * P
    events: list[_Row] = []
    append = events.append
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for j in range(P):
            order, p, ran = orders[j], pos[j], 0
            while p < len(order):
                t = order[p]
                b, s, kind = t
                if kind == "forward":
                    if s == 0:
                        dep = 0.0
                    else:
                        dep = fdone[s - 1].get(b)
                        if dep is None:
                            break
                        dep += comm[s - 1]
                    dur = fwd[s]
                elif kind == "weight":
                    dep = bdone[s].get(b)
                    if dep is None:
                        break
                    dur = wgt[s] if wgt is not None else 0.0
                elif s == S - 1:
                    dep = fdone[s].get(b)
                    if dep is None:
                        break
                    dur = bwd[s]
                else:
                    dep = bdone[s + 1].get(b)
                    if dep is None or b not in fdone[s]:  # its own forward ran on this mesh
                        break
                    dep += comm_b[s]
                    dur = bwd[s]
                start = max(free[j], dep)
                end = start + dur
                if kind == "forward":
                    fdone[s][b] = end
                elif kind == "backward":
                    bdone[s][b] = end
                free[j] = end
                append((start, end, j, b, s, kind))
                p += 1
                ran += 1
            if ran:
                pos[j] = p
                remaining -= ran
                progressed = True
        if not progressed:
            raise ScheduleError("the order's dependencies cannot be met: each mesh runs its tasks "
                                "in turn, and a task should not wait on one that never runs or "
                                "runs after it. Fix: pass an order in which every task follows its "
                                "dependencies.")
    if step is not None:
        for j in range(P):
            last = orders[j][-1]
            for s in range(j, S, P):
                events.append((free[j], free[j] + step[s], j, last.microbatch, s, "update"))
                free[j] += step[s]
    events.sort(key=itemgetter(0, 2))
    return events


def _table_from_orders(orders: Sequence[Sequence[StagePass]], S: int) -> list[list[StagePass | None]]:
    P = len(orders)
    events = _simulate(orders, S, [1.0] * S, [1.0] * S, [0.0] * max(S - 1, 0), wgt=[1.0] * S)
    n_rows = int(max(e.end for e in events))
    table: list[list[StagePass | None]] = [[None] * P for _ in range(n_rows)]
    for e in events:
        table[int(e.start)][e.mesh] = StagePass(e.microbatch, e.stage, e.kind)
    return table


def gpipe_table(num_stages: int, microbatches: int) -> list[list[StagePass | None]]:
    """GPipe: every forward first, then every backward.

    Mesh ``j`` runs forward ``b`` at clock ``j + b`` and backward ``b`` at clock
    ``(m + S - 1) + (S - 1 - j) + b``; ``2 (m + S - 1)`` clocks in all.

    Args:
        num_stages: ``S >= 1``.
        microbatches: ``m >= 1``.

    Returns:
        Rows = clock ticks, columns = meshes; ``None`` marks a bubble.
    """
    S, m = _check_sm(num_stages, microbatches)
    return _table_from_orders(_mesh_orders("gpipe", S, m), S)


def one_f_one_b_table(num_stages: int, microbatches: int) -> list[list[StagePass | None]]:
    """1F1B (PipeDream-flush): warm-up forwards, alternate one forward and one backward, drain.

    Mesh ``j`` starts with ``min(S - j - 1, m)`` warm-up forwards, so at most ``S - j`` micro-batches
    (and never more than ``m``) are alive on it. Takes ``2 (m + S - 1)`` clocks like GPipe; the
    arguments and the table are those of :func:`gpipe_table`.
    """
    S, m = _check_sm(num_stages, microbatches)
    return _table_from_orders(_mesh_orders("1f1b", S, m), S)


def interleaved_table(num_meshes: int, virtual_stages: int, microbatches: int
                      ) -> list[list[StagePass | None]]:
    """Interleaved 1F1B (Megatron-LM): ``v`` model chunks per mesh, stage ``s`` on mesh
    ``s mod P``.

    The fill and drain of 1F1B pass ``v`` times as many, ``v`` times shorter, tasks: with chunk
    times ``t_f / v`` and ``t_b / v`` the bubble ratio (idle over busy time) is
    ``(P - 1) / (v m)``. The table has ``P`` columns and ``2 P v m`` tasks, each one clock.

    Args:
        num_meshes: ``P >= 1`` (pipeline device groups).
        virtual_stages: ``v >= 1`` chunks per mesh (``S = P v`` stages).
        microbatches: ``m``, a multiple of ``P`` when ``v > 1``.

    Examples:
        >>> [f"{t.kind[0].upper()}{t.microbatch}s{t.stage}" for t in
        ...  (row[0] for row in interleaved_table(2, 2, 2)) if t][:6]
        ['F0s0', 'F1s0', 'F0s2', 'F1s2', 'B0s2', 'B1s2']
    """
    P, _ = _check_sm(num_meshes, microbatches)
    _, S, m, v = check_schedule("interleaved", P * virtual_stages if isinstance(
        virtual_stages, int) else P, microbatches, virtual_stages)
    return _table_from_orders(_mesh_orders("interleaved", S, m, v), S)


def zb_h1_table(num_stages: int, microbatches: int) -> list[list[StagePass | None]]:
    """ZB-H1 (Qi et al., ICLR 2024): the backward split into ``B`` and ``W``, the ``W`` deferred
    into 1F1B's idle clocks under 1F1B's bound on in-flight micro-batches.

    With one clock per ``F``, ``B`` and ``W`` it takes ``3 m + S - 1`` clocks for ``m >= S``
    (1F1B, whose backward is ``B`` + ``W``: ``3 (m + S - 1)``), so the bubble is
    ``(S - 1)(t_F + t_B - t_W)``, a third of 1F1B's ``(S - 1)(t_F + t_B + t_W)``.

    Returns:
        Rows = clock ticks, columns = meshes; ``3 S m`` tasks.
    """
    S, m = _check_sm(num_stages, microbatches)
    return _table_from_orders(_mesh_orders("zb-h1", S, m), S)


def schedule_table(kind: str, num_stages: int, microbatches: int, virtual_stages: int = 1
                   ) -> list[list[StagePass | None]]:
    """The clock table of any kind, from ``(kind, stages, micro-batches, virtual stages)``
    alone, in the layout of ``Schedule.table``: rows are clock ticks, columns are meshes (stage
    ``s`` runs on mesh ``s mod P``, ``P = S / v``); entries are ``(micro-batch, stage, kind)``
    tasks or None (a bubble). See :func:`gpipe_table`, :func:`one_f_one_b_table`,
    :func:`interleaved_table` and :func:`zb_h1_table`.

    Args:
        kind: ``"gpipe"``, ``"1f1b"``, ``"interleaved"`` or ``"zb-h1"``.
        num_stages: stages ``S`` (``P v`` for interleaved).
        microbatches: micro-batches ``m``.
        virtual_stages: ``v``, stages per mesh (1 but for interleaved).

    Returns:
        The rows: ``2 (m + S - 1)`` holding ``2 S m`` tasks for GPipe and 1F1B; ``2 S m`` tasks
        on ``P`` columns for interleaved; ``3 S m`` tasks for ZB-H1.

    Raises:
        ScheduleError: see :func:`check_schedule`.

    Examples:
        >>> [[tuple(t) if t else None for t in row] for row in schedule_table("gpipe", 2, 2)[:3]]
        [[(0, 0, 'forward'), None], [(1, 0, 'forward'), (0, 1, 'forward')], [None, (1, 1, 'forward')]]
    """
    kind, S, m, v = check_schedule(kind, num_stages, microbatches, virtual_stages)
    return _table_from_orders(_mesh_orders(kind, S, m, v), S)


def schedule_order(kind: str, num_stages: int, microbatches: int, virtual_stages: int = 1
                   ) -> list[StagePass]:
    """:func:`schedule_table` read tick by tick, mesh by mesh: a valid task order.

    Examples:
        >>> [f"{k[0].upper()}{m}s{j}" for m, j, k in schedule_order("1f1b", 2, 2)]
        ['F0s0', 'F1s0', 'F0s1', 'B0s1', 'B0s0', 'F1s1', 'B1s1', 'B1s0']
    """
    return [t for row in schedule_table(kind, num_stages, microbatches, virtual_stages)
            for t in row if t is not None]


def validate_table(table: Sequence[Sequence[StagePass | None]], num_stages: int, microbatches: int,
                   virtual_stages: int = 1) -> None:
    """Check a schedule table: rows are clock ticks, column ``j`` is mesh ``j``, which runs the
    stages ``s`` with ``s mod P = j`` (``P = S / v``).

    Every ``(micro-batch, stage, kind)`` appears exactly once, in the column of its stage's mesh,
    and each task runs at a later clock than every task it depends on (:func:`task_deps`): a
    forward of stage ``s > 0`` after the forward of stage ``s - 1`` of the same micro-batch; the
    backward of the last stage after its own forward; the backward of stage ``s < S - 1`` after
    the backward of stage ``s + 1``; a ``W`` after its ``B``. A table holds ``W`` tasks for all
    or none. Tasks of one row run at the same time, so a dependency in the same row is a
    violation too (which :func:`order_from_table`, reading rows in column order, allows).

    Raises:
        ScheduleError: naming the first violation.
    """
    S, m = _check_sm(num_stages, microbatches)
    P = _meshes(S, virtual_stages)
    for t, row in enumerate(table):
        if len(row) != P:
            raise ScheduleError(f"table row {t} should have {P} columns (one per mesh). Got {len(row)}.")
        for j, task in enumerate(row):
            if task is not None and len(task) == 3 and task[1] % P != j:
                which = f"stage {j}" if P == S else f"a stage s with s mod {P} = {j}"
                raise ScheduleError(f"table[{t}][{j}] should hold a task of {which}. Got {task!r}.")
    clock = {task: t for task, t in _read_entries(table, S, m)}
    for task, t in clock.items():
        for dep in task_deps(task, S):
            if clock[dep] >= t:
                i, j, kind = task
                raise ScheduleError(
                    f"{kind} of micro-batch {i} stage {j} at clock {t} does not follow its "
                    f"dependency, the {dep.kind} of stage {dep.stage} (clock {clock[dep]}).")


def _meshes(S: int, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1 or S % v:
        raise ScheduleError(f"virtual_stages should be an integer >= 1 dividing the {S} stages. "
                            f"Got {v!r}.")
    return S // v


def order_from_table(table: Sequence[Sequence[Any]], num_stages: int, microbatches: int) -> list[StagePass]:
    """A ``Schedule.table`` (rows of ``[micro-batch, stage, kind]`` entries or None) read tick by
    tick into a task order, checked to hold every task once and to respect every dependency.

    Args:
        table: the plan's table (kinds may be spelled ``forward``/``f``/``fwd``,
            ``backward``/``b``/``bwd`` and ``weight``/``w``/``wgrad``).
        num_stages: stages ``S``.
        microbatches: micro-batches ``m``.

    Returns:
        The order.

    Raises:
        ScheduleError: an entry of another shape or kind, a missing or repeated task, or a task
            placed before one it depends on (the message names it).
    """
    order = [task for task, _ in _read_entries(table, num_stages, microbatches)]
    seen: set[StagePass] = set()
    for t in order:
        missing = [d for d in task_deps(t, num_stages) if d not in seen]
        if missing:
            i, j, kind = t
            raise ScheduleError(
                f"the schedule order runs the {kind} of micro-batch {i} on stage {j} before the "
                f"{missing[0][2]} of stage {missing[0][1]} that produces its operand. Fix: use a "
                "schedule table whose order respects the dependencies.")
        seen.add(t)
    return order


def _read_entries(table: Sequence[Sequence[Any]], S: int, m: int) -> list[tuple[StagePass, int]]:
    """The table's tasks with their clock ticks, row by row and in column order within a row,
    checked to be well formed and to hold each of the ``2 S m`` tasks (``3 S m`` with ``W``
    tasks) exactly once."""
    out: list[tuple[StagePass, int]] = []
    where: dict[StagePass, int] = {}
    for t, row in enumerate(table):
        for e in row:
            if e is None:
                continue
            try:
                mb, st, kind = int(e[0]), int(e[1]), _KIND_NAMES.get(str(e[2]).lower())
            except (TypeError, ValueError, IndexError):
                kind = None
            if kind is None or not (0 <= mb < m and 0 <= st < S):
                raise ScheduleError(f"schedule table entry {e!r} should be [micro-batch, stage, "
                                    f"'forward', 'backward' or 'weight'] with a micro-batch below "
                                    f"{m} and a stage below {S}. Fix: re-create the plan's "
                                    "schedule.")
            task = StagePass(mb, st, kind)
            if task in where:
                raise ScheduleError(
                    f"the schedule table should hold each (micro-batch, stage, kind) task once "
                    f"for {m} micro-batches and {S} stages. Got {task!r} twice (clocks "
                    f"{where[task]} and {t}). Fix: re-create the plan's schedule.")
            where[task] = t
            out.append((task, t))
    kinds = ("forward", "backward", "weight") if any(k == "weight" for _, _, k in where) else (
        "forward", "backward")
    n = len(kinds) * S * m
    if len(out) != n:
        first = next(StagePass(i, j, k) for i in range(m) for j in range(S) for k in kinds
                     if StagePass(i, j, k) not in where)
        raise ScheduleError(
            f"the schedule table should hold each of the {n} (micro-batch, stage, "
            f"{'/'.join(kinds)}) tasks once for {m} micro-batches and {S} stages. Got {len(out)} "
            f"entries: {first!r} is missing. Fix: re-create the plan's schedule.")
    return out


def _check_times(name: str, vals: Sequence[float] | None, n: int) -> list[float]:
    if vals is None:
        return [0.0] * n
    try:
        out = [float(v) for v in vals]
    except (TypeError, ValueError) as err:
        raise ScheduleError(f"{name} should be a sequence of {n} numbers. Got {vals!r}.") from err
    if len(out) != n or any(not math.isfinite(v) or v < 0 for v in out):
        raise ScheduleError(
            f"{name} should hold {n} finite times >= 0. Got {vals!r}. Fix: give one value per "
            + ("stage boundary (S - 1 values)." if name.endswith("comm_times") else "stage.")
        )
    return out


def schedule_events(
    kind: str,
    num_stages: int,
    microbatches: int,
    forward_times: Sequence[float],
    backward_times: Sequence[float],
    comm_times: Sequence[float] | None = None,
    *,
    backward_comm_times: Sequence[float] | None = None,
    step_times: Sequence[float] | None = None,
    weight_times: Sequence[float] | None = None,
    virtual_stages: int = 1,
) -> list[Event]:
    """Simulate a schedule with real durations.

    Each mesh runs its tasks in the order of ``kind``'s table. A task starts when its mesh is
    free and its dependency has ended: the forward of stage ``s - 1`` (same micro-batch) plus
    ``comm_times[s - 1]``; for a backward, the backward of stage ``s + 1`` plus
    ``backward_comm_times[s]``, or for the last stage its own forward; for a ``W``, its ``B``.
    Transfers do not occupy a mesh (they overlap with its other tasks). With ``step_times``, each
    mesh then runs its stages' per-step work (``"update"`` events) right after its last task.

    Args:
        kind: ``"gpipe"``, ``"1f1b"``, ``"interleaved"`` or ``"zb-h1"``.
        num_stages: ``S`` (``P v`` for interleaved).
        microbatches: ``m``.
        forward_times: per stage, one micro-batch's forward time.
        backward_times: per stage, one micro-batch's backward time (ZB-H1: its ``B`` part).
        comm_times: per stage boundary (``S - 1`` values), the transfer time of the activations
            from stage ``s`` to ``s + 1``; default 0.
        backward_comm_times: per boundary, the transfer time of the gradients from stage
            ``s + 1`` back to ``s``; default ``comm_times``.
        step_times: per stage, the work run once per step after its mesh's last task (gradient
            synchronisation, optimizer update); default none.
        weight_times: ZB-H1 only (and required there): per stage, one micro-batch's ``W``.
        virtual_stages: ``v`` stages per mesh (interleaved).

    Returns:
        The events sorted by start time, then mesh.
    """
    return [Event(*r) for r in _timed_rows(kind, num_stages, microbatches, forward_times,
                                           backward_times, comm_times, backward_comm_times,
                                           step_times, weight_times, virtual_stages)]


def _timed_rows(kind: str, num_stages: int, microbatches: int, forward_times: Sequence[float],
                backward_times: Sequence[float], comm_times: Sequence[float] | None,
                backward_comm_times: Sequence[float] | None,
                step_times: Sequence[float] | None, weight_times: Sequence[float] | None = None,
                virtual_stages: int = 1) -> list[_Row]:
    """:func:`schedule_events`'s events as plain tuples (arguments checked)."""
    kind, S, m, v, fwd, bwd, wgt, comm, comm_b, step = _checked(
        kind, num_stages, microbatches, forward_times, backward_times, comm_times,
        backward_comm_times, step_times, weight_times, virtual_stages)
    return _simulate_rows(_mesh_orders(kind, S, m, v), S, fwd, bwd, comm, comm_b, step, wgt)


def _checked(kind: str, num_stages: int, microbatches: int, forward_times: Sequence[float],
             backward_times: Sequence[float], comm_times: Sequence[float] | None,
             backward_comm_times: Sequence[float] | None, step_times: Sequence[float] | None,
             weight_times: Sequence[float] | None = None, virtual_stages: int = 1
             ) -> tuple[str, int, int, int, list[float], list[float], list[float] | None,
                        list[float], list[float] | None, list[float] | None]:
    """The simulation's arguments checked: ``(kind, S, m, v, fwd, bwd, wgt, comm, comm_b,
    step)``, ``wgt`` None but for ZB-H1, the last two None when not given."""
    kind, S, m, v = check_schedule(kind, num_stages, microbatches, virtual_stages)
    fwd = _check_times("forward_times", forward_times, S)
    bwd = _check_times("backward_times", backward_times, S)
    if kind in SPLIT_KINDS:
        if weight_times is None:
            raise ScheduleError(f"weight_times should be given for a {kind!r} schedule (it splits "
                                "each backward into B and W). Got None. Fix: pass the W time of "
                                "each stage, and the B time as backward_times.")
        wgt: list[float] | None = _check_times("weight_times", weight_times, S)
    elif weight_times is not None:
        raise ScheduleError(f"weight_times should be None for a {kind!r} schedule (its backward "
                            f"is one task). Got {weight_times!r}. Fix: add them to backward_times.")
    else:
        wgt = None
    comm = _check_times("comm_times", comm_times, S - 1)
    comm_b = None if backward_comm_times is None else _check_times(
        "backward_comm_times", backward_comm_times, S - 1)
    step = None if step_times is None else _check_times("step_times", step_times, S)
    return kind, S, m, v, fwd, bwd, wgt, comm, comm_b, step


def schedule_summary(
    kind: str,
    num_stages: int,
    microbatches: int,
    forward_times: Sequence[float],
    backward_times: Sequence[float],
    comm_times: Sequence[float] | None = None,
    *,
    backward_comm_times: Sequence[float] | None = None,
    step_times: Sequence[float] | None = None,
    weight_times: Sequence[float] | None = None,
    virtual_stages: int = 1,
) -> ScheduleStats:
    """``schedule_stats(schedule_events(...), P)`` without making the events (the pipeline
    search times many layouts and keeps the events of a few): the same arguments, the same
    numbers."""
    kind, S, m, v, fwd, bwd, wgt, comm, comm_b, step = _checked(
        kind, num_stages, microbatches, forward_times, backward_times, comm_times,
        backward_comm_times, step_times, weight_times, virtual_stages)
    comm_b = comm if comm_b is None else comm_b
    P = S // v
    sw = _sweep(kind, S, m, v)
    # the simulation of _simulate_rows in its own sweep order: each task starts when its mesh is
    # free and the task it waits for has ended (plus the transfer between their stages), its
    # duration and that transfer read from per-task codes; what the summary reads (each mesh's
    # durations summed in its own order, as the sorted events sum them, the in-flight marks,
    # the first start and the last end) is then taken from the start and end times at once
    durs = np.array(fwd + bwd + (wgt if wgt is not None else [0.0] * S))
    adds = np.array([0.0] + comm + comm_b)
    n = len(sw.meshes)
    start = [0.0] * n
    end = [0.0] * (n + 1)  # (the last: "ended" at 0 for a first stage's forward)
    free = [0.0] * P
    for i, j, d, dur, add in zip(range(n), sw.meshes, sw.deps, durs[sw.dur_code].tolist(),
                                 adds[sw.add_code].tolist()):
        dep = end[d] + add
        f = free[j]
        s0 = f if f >= dep else dep
        start[i] = s0
        end[i] = free[j] = s0 + dur
    starts = np.array(start)
    ends = np.array(end[:n])
    sums = np.zeros(P)
    np.add.at(sums, sw.mesh_arr, ends - starts)  # (in the task order: each mesh's own order)
    busy = sums.tolist()
    first = [start[i] for i in sw.first]
    if step is not None:
        for j in range(P):
            for s in range(j, S, P):
                f = free[j]
                free[j] = f + step[s]
                busy[j] += free[j] - f
    times = np.concatenate([starts, ends])
    return _stats_from(max(free) - min(first), busy, _peaks(times, *sw.marks, P),
                       _peaks(times, *sw.wmarks, P), P)


def _peaks(times: np.ndarray, task: np.ndarray, delta: np.ndarray, mesh: np.ndarray,
           P: int) -> list[int]:
    """:func:`_peak` of each mesh's marks, all meshes at once: mark ``i`` is ``(times[task[i]],
    delta[i])`` on mesh ``mesh[i]``; sorted by time, releases first at equal times, its running
    sum's largest value (at least 0)."""
    if not len(task):
        return [0] * P
    t = times[task]
    order = np.lexsort((delta, t, mesh))
    run = np.cumsum(delta[order], dtype=np.int64)
    counts = np.bincount(mesh, minlength=P)
    ends = np.cumsum(counts)
    firsts = ends - counts
    before = np.where(firsts > 0, run[np.maximum(firsts - 1, 0)], 0)
    has = counts > 0
    peak = np.zeros(P, dtype=np.int64)
    peak[has] = np.maximum.reduceat(run, firsts[has]) - before[has]
    return np.maximum(peak, 0).tolist()


_Order = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]


@dataclass(frozen=True, eq=False)
class _Sweep:
    """The tasks in an order where each comes after its mesh's previous one and after the task it
    waits for (:func:`_potential_sweep`, or the sweep of :func:`_make_sweep_order`), as
    :func:`schedule_summary` reads them.

    Attributes:
        meshes: each task's mesh, in that order.
        deps: the position of the task it waits for; ``len(meshes)`` for none (a first stage's
            forward).
        dur_code: its duration's index among the forward, backward and W times (``kind * S +
            stage``).
        add_code: the transfer added to the end of the task it waits for: 0 none, ``s`` a
            forward's from stage ``s - 1`` (the ``s - 1``-th forward transfer), ``S + s`` a
            backward's from stage ``s + 1``.
        mesh_arr: ``meshes`` as an array.
        first: each mesh's first task.
        marks, wmarks: the in-flight and deferred-W marks, ``(task, delta, mesh)``: task ``i <
            n`` marks its start, ``n + i`` its end.
    """

    meshes: tuple[int, ...]
    deps: tuple[int, ...]
    dur_code: np.ndarray
    add_code: np.ndarray
    mesh_arr: np.ndarray
    first: tuple[int, ...]
    marks: tuple[np.ndarray, np.ndarray, np.ndarray]
    wmarks: tuple[np.ndarray, np.ndarray, np.ndarray]


def _swept(order: _Order | tuple[np.ndarray, ...], S: int, P: int) -> _Sweep:
    """The :class:`_Sweep` of an order (``S`` stages on ``P`` meshes) given as four sequences,
    tuples or arrays: each task's mesh, stage, kind and the position of the task it waits for
    (-1 for none), as :func:`_make_sweep_order` makes them."""
    mesh = np.asarray(order[0], dtype=np.int32)
    stage, kind, dep = (np.asarray(x, dtype=np.int64) for x in order[1:])
    meshes = tuple(mesh.tolist())
    n = len(meshes)
    fwd, bwd, wgt = kind == 0, kind == 1, kind == 2
    add = np.zeros(n, dtype=np.int32)
    add[fwd & (dep >= 0)] = stage[fwd & (dep >= 0)]
    waits = bwd & (stage < S - 1)
    add[waits] = S + stage[waits]
    first = [-1] * P
    for i in range(n - 1, -1, -1):
        first[meshes[i]] = i
    idx = np.arange(n, dtype=np.int64)
    split = bool(wgt.any())

    def marks(*parts: tuple[np.ndarray, np.ndarray, int]) -> tuple[np.ndarray, ...]:
        task = np.concatenate([t[sel] for sel, t, _ in parts])
        delta = np.concatenate([np.full(int(sel.sum()), dl, dtype=np.int8) for sel, _, dl in parts])
        on = np.concatenate([mesh[sel] for sel, _, _ in parts])
        return task, delta, on

    ends = idx + n
    if split:
        mk = marks((fwd, idx, 1), (wgt, ends, -1))
        wmk = marks((bwd, ends, 1), (wgt, ends, -1))
    else:
        mk = marks((fwd, idx, 1), (bwd, ends, -1))
        wmk = marks((wgt, ends, -1))
    return _Sweep(meshes, tuple(np.where(dep < 0, n, dep).tolist()),
                  (kind * S + stage).astype(np.int32), add, mesh, tuple(first), mk, wmk)


#: the sweep orders kept (:func:`_sweep`), least recently used first, and the tasks they
#: hold in all: a search times layouts of some fifty (stages, micro-batches) pairs, and the
#: Explorer's next search (a memory budget changed) times most of them again
_SWEEPS: OrderedDict[tuple, _Sweep] = OrderedDict()
_SWEEP_TASKS = [0]
_SWEEP_LOCK = threading.Lock()
#: tasks the kept sweep orders may hold (about 80 bytes each: two tuple slots and the integer
#: a task waits for, three arrays' entries and one or two marks)
SWEEP_CACHE_TASKS = 500_000


def _sweep(kind: str, S: int, m: int, v: int = 1) -> _Sweep:
    """The tasks of :func:`_mesh_orders` in the order :func:`_simulate_rows` times them (every
    task after its mesh's previous one and after its dependency; :func:`_make_sweep_order`), as
    :func:`schedule_summary` reads them (:class:`_Sweep`). Kept for the most recent orders, up
    to :data:`SWEEP_CACHE_TASKS` tasks in all."""
    key = (kind, S, m, v)
    with _SWEEP_LOCK:
        hit = _SWEEPS.get(key)
        if hit is not None:
            _SWEEPS.move_to_end(key)
            return hit
    out = _make_sweep(kind, S, m, v)
    with _SWEEP_LOCK:
        if key not in _SWEEPS:
            _SWEEPS[key] = out
            _SWEEP_TASKS[0] += len(out.meshes)
        while _SWEEP_TASKS[0] > SWEEP_CACHE_TASKS and len(_SWEEPS) > 1:
            _SWEEP_TASKS[0] -= len(_SWEEPS.popitem(last=False)[1].meshes)
    return out


def _make_sweep(kind: str, S: int, m: int, v: int) -> _Sweep:
    """:func:`_sweep`, made: GPipe's and 1F1B's from a potential, the others' by
    :func:`_make_sweep_order`."""
    if kind == "gpipe" or (kind != "zb-h1" and v == 1):
        return _potential_sweep(kind == "gpipe", S, m)
    return _swept(_make_sweep_order(kind, S, m, v), S, S // v)


def _potential_sweep(gpipe: bool, S: int, m: int) -> _Sweep:
    """GPipe's or 1F1B's tasks (:func:`_mesh_orders`) in an order where every task comes after
    its mesh's previous one and after the task it waits for, made at once: sorted by a
    potential that grows along both (then by mesh). Timing the tasks in any such order gives
    the same times as the sweep order, and each mesh's tasks are in its own order.

    The potential, for micro-batch ``b`` on stage ``s``: a forward ``b + s``; a backward
    ``m + 2S - 1 - s + b`` under GPipe (every forward first) and ``2S - 1 - s + 2b`` under 1F1B,
    whose forwards after the ``w = min(S - 1 - s, m)`` of its warm-up each come just before a
    backward, at ``s + 2b`` (one less than that backward's). Along a mesh's order and from each
    forward to the next stage's, and from each backward to the previous stage's, it grows by at
    least 1 (for 1F1B: the last warm-up forward, ``w - 1 + s <= S - 2``, is below the first
    other forward, ``2S - 2 - s``, where ``w = S - 1 - s``, and below the first backward where
    ``w = m``; a forward after the warm-up at ``s + 2b`` follows the previous stage's at ``s - 1
    + 2b`` or, where that one is a warm-up forward, at ``b + s - 1``)."""
    b = np.tile(np.arange(m, dtype=np.int64), S)
    stage = np.repeat(np.arange(S, dtype=np.int64), m)
    if gpipe:
        fpot = b + stage
        bpot = m + 2 * S - 1 - stage + b
    else:
        warm = b < np.minimum(S - 1 - stage, m)
        fpot = np.where(warm, b + stage, stage + 2 * b)
        bpot = 2 * S - 1 - stage + 2 * b
    n = 2 * S * m  # tasks: forwards, then backwards, stage-major
    pot = np.concatenate([fpot, bpot])
    mesh = np.concatenate([stage, stage])
    order = np.lexsort((mesh, pot))
    where = np.empty(n, dtype=np.int64)
    where[order] = np.arange(n)
    fid = stage * m + b  # a forward's task id; its backward's is n // 2 more
    dep = np.concatenate([np.where(stage > 0, fid - m, -1),  # the previous stage's forward
                          np.where(stage < S - 1, n // 2 + fid + m, fid)])
    dep = np.where(dep < 0, -1, where[np.maximum(dep, 0)])[order]
    kinds = np.repeat(np.arange(2), n // 2)[order]
    return _swept((mesh[order], np.concatenate([stage, stage])[order], kinds, dep), S, S)


def _make_sweep_order(kind: str, S: int, m: int, v: int) -> _Order:
    """The sweep order of :func:`_sweep`, as four tuples: each task's mesh, stage, kind (0
    forward, 1 backward, 2 weight) and the position in this order of the task it waits for (a
    forward: the previous stage's forward, -1 on the first stage; a backward: the next stage's
    backward, or on the last stage its own forward; a W: its B)."""
    orders = _mesh_orders(kind, S, m, v)
    P = len(orders)
    fpos = [[-1] * m for _ in range(S)]  # position of forward (stage, micro-batch), -1 not yet
    bpos = [[-1] * m for _ in range(S)]
    meshes: list[int] = []
    stages: list[int] = []
    kinds: list[int] = []
    deps: list[int] = []
    pos = [0] * P
    remaining = sum(len(o) for o in orders)
    while remaining:
        for j in range(P):
            order, p = orders[j], pos[j]
            while p < len(order):
                b, s, kind_ = order[p]
                if kind_ == "forward":
                    code = -1 if s == 0 else fpos[s - 1][b]
                    if s > 0 and code < 0:
                        break
                    fpos[s][b] = len(meshes)
                elif kind_ == "backward":
                    code = fpos[s][b] if s == S - 1 else bpos[s + 1][b]
                    if code < 0:
                        break
                    bpos[s][b] = len(meshes)
                else:
                    code = bpos[s][b]
                    if code < 0:
                        break
                meshes.append(j)
                stages.append(s)
                kinds.append(_CODE[kind_])
                deps.append(code)
                p += 1
            remaining -= p - pos[j]
            pos[j] = p
    return tuple(meshes), tuple(stages), tuple(kinds), tuple(deps)


def schedule_stats(events: Sequence[Event], num_stages: int) -> ScheduleStats:
    """Step time, bubble fraction, per-mesh busy time and peak in-flight micro-batches.

    ``bubble_fraction = 1 - sum(busy) / (P * step_time)`` (per-step ``"update"`` events count as
    busy). A micro-batch is in flight on a mesh from the start of its forward there to the end
    of its backward (ZB-H1: its ``B``) there; a ``W`` is deferred from the end of its ``B`` to
    its own end.

    Args:
        events: what :func:`schedule_events` returned.
        num_stages: the meshes ``P`` (the stages but for interleaved, ``S / v``).
    """
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
        raise ScheduleError(f"num_stages should be an integer >= 1. Got {num_stages!r}.")
    if not events:
        raise ScheduleError("events should not be empty. Got []. Fix: pass schedule_events(...).")
    for e in events:
        if not 0 <= e.mesh < num_stages:
            raise ScheduleError(f"event mesh should be in 0..{num_stages - 1}. Got {e!r}.")
    return _stats([(e.start, e.end, e.mesh, e.microbatch, e.stage, e.kind) for e in events],
                  num_stages)


def _stats(rows: Sequence[_Row], P: int) -> ScheduleStats:
    """:func:`schedule_stats` of events given as tuples (meshes checked)."""
    t0 = min(r[0] for r in rows)
    step = max(r[1] for r in rows) - t0
    busy = [0.0] * P
    marks: list[list[tuple[float, int]]] = [[] for _ in range(P)]
    wmarks: list[list[tuple[float, int]]] = [[] for _ in range(P)]
    split = any(r[5] == "weight" for r in rows)
    for start, end, mesh, _, _, kind in rows:
        busy[mesh] += end - start
        if kind == "forward":
            marks[mesh].append((start, 1))
        elif kind == "backward":
            if split:
                wmarks[mesh].append((end, 1))
            else:
                marks[mesh].append((end, -1))
        elif kind == "weight":
            marks[mesh].append((end, -1))
            wmarks[mesh].append((end, -1))
    return _stats_of(step, busy, marks, P, wmarks)


def _peak(ms: list[tuple[float, int]]) -> int:
    cur = best = 0
    for _, delta in sorted(ms):  # at equal times releases (-1) come first
        cur += delta
        best = max(best, cur)
    return best


def _stats_of(step: float, busy: list[float], marks: Sequence[list[tuple[float, int]]], P: int,
              wmarks: Sequence[list[tuple[float, int]]] | None = None) -> ScheduleStats:
    """The statistics from the step time, each mesh's busy time and its in-flight marks
    (``(time, +1)`` at a forward's start, ``(time, -1)`` at a backward's end) and deferred-W
    marks."""
    return _stats_from(step, busy, [_peak(ms) for ms in marks],
                       [_peak(ms) for ms in (wmarks or [[] for _ in range(P)])], P)


def _stats_from(step: float, busy: list[float], peak_inflight: list[int],
                peak_deferred: list[int], P: int) -> ScheduleStats:
    """The statistics from the step time, each mesh's busy time and its peaks."""
    bubble = 0.0 if step <= 0 else 1.0 - sum(busy) / (P * step)
    return ScheduleStats(step_time=step, bubble_fraction=bubble, busy=busy,
                         peak_inflight=peak_inflight, peak_deferred=peak_deferred)


def ideal_makespan(order: Sequence[StagePass], forward: Sequence[float],
                   backward: Sequence[float], weight: Sequence[float] | None = None,
                   virtual_stages: int = 1) -> float:
    """The time of an order with the given per-stage task times and free communication: each
    mesh runs its tasks in ``order``'s order, each as soon as its dependencies are done and its
    mesh is free.

    Args:
        order: the tasks; the order of each mesh's tasks is kept.
        forward, backward: seconds of one micro-batch's forward and backward (ZB-H1: ``B``) on
            each stage.
        weight: seconds of one micro-batch's ``W`` on each stage (orders with ``W`` tasks).
        virtual_stages: stages per mesh (stage ``s`` on mesh ``s mod (S / v)``).

    Returns:
        The makespan ``max end(t)`` with ``end(t) = max(end(prev on mesh), end(deps)) + time(t)``.

    Raises:
        ScheduleError: the order's dependencies cannot be met.

    Examples:
        >>> ideal_makespan(schedule_order("gpipe", 2, 2), [1.0, 1.0], [2.0, 2.0])
        9.0
    """
    S = len(forward)
    P = _meshes(S, virtual_stages)
    orders = [[StagePass(*t) for t in order if t[1] % P == j] for j in range(P)]
    events = _simulate(orders, S, forward, backward, [0.0] * max(S - 1, 0), wgt=weight)
    return max((e.end for e in events), default=0.0)


def inflight_counts(kind: str, num_stages: int, microbatches: int, stats: ScheduleStats,
                    meshes: int) -> list[int]:
    """The micro-batches whose activations a stage holds at its peak under schedule ``kind``:
    per stage, ``B`` for GPipe, ``min(S - s, B)`` for 1F1B and the simulated peak for the split
    kinds (ZB-H1); per mesh (its chunks together) for interleaved 1F1B, the simulated peak."""
    S, B = num_stages, microbatches
    if kind == "interleaved":
        return [stats.peak_inflight[g] for g in range(meshes)]
    if kind in SPLIT_KINDS:
        return [stats.peak_inflight[s] for s in range(S)]
    return [B if kind == "gpipe" else min(S - s, B) for s in range(S)]


def check_schedule_choice(value: Any, where: str = "search") -> None:
    """Raise :class:`SearchError` (its message starting with ``where``) unless ``value`` is one
    of :data:`SCHEDULE_CHOICES`."""
    if value not in SCHEDULE_CHOICES:
        raise SearchError(f"{where}: schedule should be one of "
                          f"{', '.join(map(repr, SCHEDULE_CHOICES))}. Got {value!r}. Fix: '1f1b' "
                          "(default), 'gpipe', 'interleaved', 'zb-h1', or 'auto' to weigh all but "
                          "GPipe.")
