"""Pipeline schedules (GPipe and 1F1B): per-mesh task orders, their clock tables, their timed
simulation, a plan's table read back into an order, and the makespan of an order. The one
schedule module of autoplan: the pipeline search, the executor, the figures, the tests and the
benchmarks all use it; it depends on nothing but the error classes.

Convention (Alpa): ``S`` stages on ``S`` meshes; mesh ``j`` runs the forward *and* the backward
of stage ``j`` (Alpa numbers the backward as stage ``2S - 1 - j``). A task is ``(micro-batch,
stage, kind)`` (:class:`Task`, a named tuple) with ``kind`` ``"forward"`` or ``"backward"``. The
dependencies are those of a chain of stages:

* ``F(i, j)`` needs ``F(i, j - 1)`` (the previous stage's activations);
* ``B(i, j)`` needs ``F(i, j)`` (its own saved activations) and ``B(i, j + 1)`` (the gradient
  of its output).

Per-mesh orders:

* GPipe: ``F_0 .. F_{m-1}`` then ``B_0 .. B_{m-1}``.
* 1F1B: ``w = min(S - j - 1, m)`` warm-up forwards ``F_0 .. F_{w-1}``; then the steady phase
  alternates one forward and one backward, ``F_w B_0 F_{w+1} B_1 ...``, so the first backward
  comes after ``w + 1`` forwards (the "extra" forward is the first of the steady phase, not a
  warm-up one); then the cool-down backwards. Mesh ``j`` holds at most ``S - j`` micro-batches'
  activations where GPipe holds all ``m``.

A schedule table has clock ticks as rows and meshes as columns; each entry is a :class:`Task` or
``None`` (a bubble). It is the earliest-start execution of these orders with unit times (each
task at the first tick after its dependencies): both take ``2 (m + S - 1)`` ticks, so both have
the bubble fraction ``(S - 1) / (m + S - 1)``.

A training step ends with per-step work on every mesh (the gradient synchronisation across the
stage's data-parallel devices and the optimizer update), which :func:`schedule_events` places
after the mesh's last backward (events of kind ``"update"``): the step ends when the last mesh's
update does.

References:
    Huang et al., "GPipe", NeurIPS 2019. Narayanan et al., "PipeDream" (SOSP 2019) and
    "Efficient Large-Scale Language Model Training on GPU Clusters" (SC 2021) for 1F1B.
    Zheng et al., "Alpa", OSDI 2022, Section 6 (schedules as tables).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, NamedTuple

from autoplan._errors import ScheduleError

__all__ = ["KINDS", "Task", "Event", "ScheduleStats", "task_deps", "gpipe_table",
           "one_f_one_b_table", "schedule_table", "schedule_order", "schedule_events",
           "schedule_stats", "schedule_summary", "validate_table", "order_from_table", "ideal_makespan"]

#: the schedule kinds with a generated table
KINDS = ("gpipe", "1f1b")

_KIND_NAMES = {"forward": "forward", "f": "forward", "fwd": "forward",
               "backward": "backward", "b": "backward", "bwd": "backward"}


class Task(NamedTuple):
    """One unit of pipeline work (a tuple: ``Task(0, 1, "forward") == (0, 1, "forward")``).

    Attributes:
        microbatch: micro-batch index ``0 .. m - 1``.
        stage: stage index ``0 .. S - 1`` (also the mesh that runs it).
        kind: ``"forward"`` or ``"backward"``.
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
        mesh: the mesh that runs it (equal to ``stage``).
        microbatch: micro-batch index.
        stage: stage index.
        kind: ``"forward"``, ``"backward"``, or ``"update"`` (the per-step work after the mesh's
            last backward; its ``microbatch`` is that backward's, the last one).
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
        bubble_fraction: ``1 - sum(busy) / (S * step_time)``.
        busy: busy time of each mesh.
        peak_inflight: per mesh, the most micro-batches alive at once (from the start of a
            micro-batch's forward to the end of its backward: their activations are held).
    """

    step_time: float
    bubble_fraction: float
    busy: list[float]
    peak_inflight: list[int]


def _check_sm(num_stages: object, microbatches: object) -> tuple[int, int]:
    for name, val in (("num_stages", num_stages), ("microbatches", microbatches)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ScheduleError(
                f"{name} should be an integer >= 1. Got {val!r}. Fix: pass a positive count."
            )
    return int(num_stages), int(microbatches)


def _check_kind(kind: object) -> str:
    if kind not in KINDS:
        raise ScheduleError(f"schedule kind should be 'gpipe' or '1f1b'. Got {kind!r}. Fix: use one "
                            "of them (in the plan's Schedule too).")
    return kind  # type: ignore[return-value]


def task_deps(task: tuple[int, int, str], num_stages: int) -> list[Task]:
    """The tasks ``task`` reads from (see the module docstring).

    Examples:
        >>> task_deps((3, 1, "backward"), 3)
        [Task(microbatch=3, stage=1, kind='forward'), Task(microbatch=3, stage=2, kind='backward')]
    """
    i, j, kind = task
    if kind == "forward":
        return [Task(i, j - 1, "forward")] if j > 0 else []
    deps = [Task(i, j, "forward")]
    if j < num_stages - 1:
        deps.append(Task(i, j + 1, "backward"))
    return deps


@functools.lru_cache(maxsize=16)
def _mesh_orders(kind: str, S: int, m: int) -> tuple[tuple[Task, ...], ...]:
    """Each mesh's tasks in the order it runs them (kept for the last few ``(kind, S, m)``: a
    search simulates many layouts of the same stage and micro-batch counts)."""
    orders: list[tuple[Task, ...]] = []
    for j in range(S):
        fwd = [Task(b, j, "forward") for b in range(m)]
        bwd = [Task(b, j, "backward") for b in range(m)]
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


#: a timed task as a plain tuple: ``(start, end, mesh, microbatch, stage, kind)`` (an Event's fields)
_Row = tuple[float, float, int, int, int, str]


def _simulate(orders: Sequence[Sequence[Task]], fwd: Sequence[float], bwd: Sequence[float],
              comm: Sequence[float], comm_bwd: Sequence[float] | None = None,
              step: Sequence[float] | None = None) -> list[Event]:
    return [Event(*r) for r in _simulate_rows(orders, fwd, bwd, comm, comm_bwd, step)]


def _simulate_rows(orders: Sequence[Sequence[Task]], fwd: Sequence[float], bwd: Sequence[float],
                   comm: Sequence[float], comm_bwd: Sequence[float] | None = None,
                   step: Sequence[float] | None = None) -> list[_Row]:
    """The timed tasks of ``orders`` (each mesh's tasks run in turn, each when its dependency
    has ended), sorted by start, then mesh."""
    S = len(orders)
    comm_b = comm if comm_bwd is None else comm_bwd
    # end times by stage, then micro-batch (every task's stage is its mesh's, 0 .. S - 1)
    fdone: list[dict[int, float]] = [{} for _ in range(S)]
    bdone: list[dict[int, float]] = [{} for _ in range(S)]
    pos = [0] * S
    free = [0.0] * S
    events: list[_Row] = []
    append = events.append
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for j in range(S):
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
                elif s == S - 1:
                    dep = fdone[s].get(b)
                    if dep is None:
                        break
                    dur = bwd[s]
                else:
                    dep = bdone[s + 1].get(b)
                    if dep is None:
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
        for j in range(S):
            last = orders[j][-1]
            events.append((free[j], free[j] + step[j], j, last.microbatch, j, "update"))
    events.sort(key=itemgetter(0, 2))
    return events


def _table_from_orders(orders: Sequence[Sequence[Task]]) -> list[list[Task | None]]:
    S = len(orders)
    events = _simulate(orders, [1.0] * S, [1.0] * S, [0.0] * max(S - 1, 0))
    n_rows = int(max(e.end for e in events))
    table: list[list[Task | None]] = [[None] * S for _ in range(n_rows)]
    for e in events:
        table[int(e.start)][e.mesh] = Task(e.microbatch, e.stage, e.kind)
    return table


def gpipe_table(num_stages: int, microbatches: int) -> list[list[Task | None]]:
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
    return _table_from_orders(_mesh_orders("gpipe", S, m))


def one_f_one_b_table(num_stages: int, microbatches: int) -> list[list[Task | None]]:
    """1F1B (PipeDream-flush): warm-up forwards, alternate one forward and one backward, drain.

    Mesh ``j`` starts with ``min(S - j - 1, m)`` warm-up forwards, so at most ``S - j`` micro-batches
    (and never more than ``m``) are alive on it. Takes ``2 (m + S - 1)`` clocks like GPipe; the
    arguments and the table are those of :func:`gpipe_table`.
    """
    S, m = _check_sm(num_stages, microbatches)
    return _table_from_orders(_mesh_orders("1f1b", S, m))


def schedule_table(kind: str, num_stages: int, microbatches: int) -> list[list[Task | None]]:
    """A GPipe or 1F1B clock table in the layout of ``Schedule.table``: rows are clock ticks,
    columns are meshes (stage ``j`` runs on mesh ``j``); entries are ``(micro-batch, stage,
    kind)`` tasks or None (a bubble). See :func:`gpipe_table` and :func:`one_f_one_b_table`.

    Args:
        kind: ``"gpipe"`` or ``"1f1b"``.
        num_stages: stages ``S``.
        microbatches: micro-batches ``m``.

    Returns:
        ``2 (m + S - 1)`` rows holding ``2 S m`` tasks.

    Raises:
        ScheduleError: an unknown kind, or a count below one.

    Examples:
        >>> [[tuple(t) if t else None for t in row] for row in schedule_table("gpipe", 2, 2)[:3]]
        [[(0, 0, 'forward'), None], [(1, 0, 'forward'), (0, 1, 'forward')], [None, (1, 1, 'forward')]]
    """
    kind = _check_kind(kind)
    return gpipe_table(num_stages, microbatches) if kind == "gpipe" else one_f_one_b_table(
        num_stages, microbatches)


def schedule_order(kind: str, num_stages: int, microbatches: int) -> list[Task]:
    """:func:`schedule_table` read tick by tick, mesh by mesh: a valid task order.

    Examples:
        >>> [f"{k[0].upper()}{m}s{j}" for m, j, k in schedule_order("1f1b", 2, 2)]
        ['F0s0', 'F1s0', 'F0s1', 'B0s1', 'B0s0', 'F1s1', 'B1s1', 'B1s0']
    """
    return [t for row in schedule_table(kind, num_stages, microbatches) for t in row if t is not None]


def validate_table(table: Sequence[Sequence[Task | None]], num_stages: int, microbatches: int) -> None:
    """Check a schedule table: rows are clock ticks, column ``j`` is the mesh of stage ``j``.

    Every ``(micro-batch, stage, kind)`` appears exactly once, in the column of its stage, and
    each task runs at a later clock than every task it depends on (:func:`task_deps`): a forward
    of stage ``s > 0`` after the forward of stage ``s - 1`` of the same micro-batch; the backward
    of the last stage after its own forward; the backward of stage ``s < S - 1`` after the
    backward of stage ``s + 1``. Tasks of one row run at the same time, so a dependency in the
    same row is a violation too (which :func:`order_from_table`, reading rows in column order,
    allows).

    Raises:
        ScheduleError: naming the first violation.
    """
    S, m = _check_sm(num_stages, microbatches)
    for t, row in enumerate(table):
        if len(row) != S:
            raise ScheduleError(f"table row {t} should have {S} columns (one per mesh). Got {len(row)}.")
        for j, task in enumerate(row):
            if task is not None and len(task) == 3 and task[1] != j:
                raise ScheduleError(f"table[{t}][{j}] should hold a task of stage {j}. Got {task!r}.")
    clock = {task: t for task, t in _read_entries(table, S, m)}
    for task, t in clock.items():
        for dep in task_deps(task, S):
            if clock[dep] >= t:
                i, j, kind = task
                raise ScheduleError(
                    f"{kind} of micro-batch {i} stage {j} at clock {t} does not follow its "
                    f"dependency, the {dep.kind} of stage {dep.stage} (clock {clock[dep]}).")


def order_from_table(table: Sequence[Sequence[Any]], num_stages: int, microbatches: int) -> list[Task]:
    """A ``Schedule.table`` (rows of ``[micro-batch, stage, kind]`` entries or None) read tick by
    tick into a task order, checked to hold every task once and to respect every dependency.

    Args:
        table: the plan's table (kinds may be spelled ``forward``/``f``/``fwd`` and
            ``backward``/``b``/``bwd``).
        num_stages: stages ``S``.
        microbatches: micro-batches ``m``.

    Returns:
        The order.

    Raises:
        ScheduleError: an entry of another shape or kind, a missing or repeated task, or a task
            placed before one it depends on (the message names it).
    """
    order = [task for task, _ in _read_entries(table, num_stages, microbatches)]
    seen: set[Task] = set()
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


def _read_entries(table: Sequence[Sequence[Any]], S: int, m: int) -> list[tuple[Task, int]]:
    """The table's tasks with their clock ticks, row by row and in column order within a row,
    checked to be well formed and to hold each of the ``2 S m`` tasks exactly once."""
    out: list[tuple[Task, int]] = []
    where: dict[Task, int] = {}
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
                                    f"'forward' or 'backward'] with a micro-batch below {m} and a "
                                    f"stage below {S}. Fix: re-create the plan's schedule.")
            task = Task(mb, st, kind)
            if task in where:
                raise ScheduleError(
                    f"the schedule table should hold each of the {2 * S * m} (micro-batch, stage, "
                    f"forward/backward) tasks once for {m} micro-batches and {S} stages. Got "
                    f"{task!r} twice (clocks {where[task]} and {t}). Fix: re-create the plan's "
                    "schedule.")
            where[task] = t
            out.append((task, t))
    if len(out) != 2 * S * m:
        first = next(Task(i, j, k) for i in range(m) for j in range(S) for k in ("forward", "backward")
                     if Task(i, j, k) not in where)
        raise ScheduleError(
            f"the schedule table should hold each of the {2 * S * m} (micro-batch, stage, "
            f"forward/backward) tasks once for {m} micro-batches and {S} stages. Got {len(out)} "
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
) -> list[Event]:
    """Simulate a schedule with real durations.

    Each mesh runs its tasks in the order of ``kind``'s table. A task starts when its mesh is
    free and its dependency has ended: the forward of stage ``s - 1`` (same micro-batch) plus
    ``comm_times[s - 1]``; for a backward, the backward of stage ``s + 1`` plus
    ``backward_comm_times[s]``, or for the last stage its own forward. Transfers do not occupy a
    mesh (they overlap with its other tasks). With ``step_times``, each mesh then runs its
    per-step work (an ``"update"`` event) right after its last backward.

    Args:
        kind: ``"gpipe"`` or ``"1f1b"``.
        num_stages: ``S``.
        microbatches: ``m``.
        forward_times: per stage, one micro-batch's forward time.
        backward_times: per stage, one micro-batch's backward time.
        comm_times: per stage boundary (``S - 1`` values), the transfer time of the activations
            from stage ``s`` to ``s + 1``; default 0.
        backward_comm_times: per boundary, the transfer time of the gradients from stage
            ``s + 1`` back to ``s``; default ``comm_times``.
        step_times: per stage, the work run once per step after its last backward (gradient
            synchronisation, optimizer update); default none.

    Returns:
        The events sorted by start time, then mesh.
    """
    return [Event(*r) for r in _timed_rows(kind, num_stages, microbatches, forward_times,
                                           backward_times, comm_times, backward_comm_times,
                                           step_times)]


def _timed_rows(kind: str, num_stages: int, microbatches: int, forward_times: Sequence[float],
                backward_times: Sequence[float], comm_times: Sequence[float] | None,
                backward_comm_times: Sequence[float] | None,
                step_times: Sequence[float] | None) -> list[_Row]:
    """:func:`schedule_events`'s events as plain tuples (arguments checked)."""
    kind, S, m, fwd, bwd, comm, comm_b, step = _checked(
        kind, num_stages, microbatches, forward_times, backward_times, comm_times,
        backward_comm_times, step_times)
    return _simulate_rows(_mesh_orders(kind, S, m), fwd, bwd, comm, comm_b, step)


def _checked(kind: str, num_stages: int, microbatches: int, forward_times: Sequence[float],
             backward_times: Sequence[float], comm_times: Sequence[float] | None,
             backward_comm_times: Sequence[float] | None, step_times: Sequence[float] | None
             ) -> tuple[str, int, int, list[float], list[float], list[float],
                        list[float] | None, list[float] | None]:
    """The simulation's arguments checked: ``(kind, S, m, fwd, bwd, comm, comm_b, step)``, the
    last two None when not given."""
    kind = _check_kind(kind)
    S, m = _check_sm(num_stages, microbatches)
    fwd = _check_times("forward_times", forward_times, S)
    bwd = _check_times("backward_times", backward_times, S)
    comm = _check_times("comm_times", comm_times, S - 1)
    comm_b = None if backward_comm_times is None else _check_times(
        "backward_comm_times", backward_comm_times, S - 1)
    step = None if step_times is None else _check_times("step_times", step_times, S)
    return kind, S, m, fwd, bwd, comm, comm_b, step


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
) -> ScheduleStats:
    """``schedule_stats(schedule_events(...), num_stages)`` without making the events (the
    pipeline search times many layouts and keeps the events of a few): the same arguments, the
    same numbers."""
    kind, S, m, fwd, bwd, comm, comm_b, step = _checked(
        kind, num_stages, microbatches, forward_times, backward_times, comm_times,
        backward_comm_times, step_times)
    comm_b = comm if comm_b is None else comm_b
    meshes, deps = _sweep_order(kind, S, m)
    # the simulation of _simulate_rows in its own sweep order, keeping only what the summary
    # reads: each mesh's durations summed in its own order (as the sorted events sum them), the
    # in-flight marks, the first start and the last end
    end = [0.0] * len(meshes)
    free = [0.0] * S
    busy = [0.0] * S
    first = [-1.0] * S
    marks: list[list[tuple[float, int]]] = [[] for _ in range(S)]
    last = S - 1
    for i, j in enumerate(meshes):
        d = deps[i]
        if d >= 0:  # a backward: its own forward (the last stage) or the next stage's backward
            dep = end[d] if j == last else end[d] + comm_b[j]
            dur = bwd[j]
        elif d == -1:  # a forward of the first stage
            dep, dur = 0.0, fwd[j]
        else:  # a forward: the previous stage's forward, index -2 - d
            dep, dur = end[-2 - d] + comm[j - 1], fwd[j]
        f = free[j]
        start = f if f >= dep else dep
        e = start + dur
        end[i] = free[j] = e
        busy[j] += e - start
        if first[j] < 0.0:
            first[j] = start
        if d >= 0:
            marks[j].append((e, -1))
        else:
            marks[j].append((start, 1))
    if step is not None:
        for j in range(S):
            f = free[j]
            free[j] = f + step[j]
            busy[j] += free[j] - f
    return _stats_of(max(free) - min(first), busy, marks, S)


@functools.lru_cache(maxsize=16)
def _sweep_order(kind: str, S: int, m: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The tasks of :func:`_mesh_orders` in the order :func:`_simulate_rows` times them (every
    task after its mesh's previous one and after its dependency), as two tuples: each task's
    mesh, and its dependency's position in this order (a backward: ``>= 0``; a forward:
    ``-1`` on the first stage, else ``-2 - position``)."""
    orders = _mesh_orders(kind, S, m)
    fpos = [[-1] * m for _ in range(S)]  # position of forward (stage, micro-batch), -1 not yet
    bpos = [[-1] * m for _ in range(S)]
    meshes: list[int] = []
    deps: list[int] = []
    pos = [0] * S
    remaining = sum(len(o) for o in orders)
    while remaining:
        for j in range(S):
            order, p = orders[j], pos[j]
            while p < len(order):
                b, _, kind_ = order[p]
                if kind_ == "forward":
                    if j == 0:
                        code = -1
                    else:
                        d = fpos[j - 1][b]
                        if d < 0:
                            break
                        code = -2 - d
                    fpos[j][b] = len(meshes)
                else:
                    code = fpos[j][b] if j == S - 1 else bpos[j + 1][b]
                    if code < 0:
                        break
                    bpos[j][b] = len(meshes)
                meshes.append(j)
                deps.append(code)
                p += 1
            remaining -= p - pos[j]
            pos[j] = p
    return tuple(meshes), tuple(deps)


def schedule_stats(events: Sequence[Event], num_stages: int) -> ScheduleStats:
    """Step time, bubble fraction, per-mesh busy time and peak in-flight micro-batches.

    ``bubble_fraction = 1 - sum(busy) / (S * step_time)`` (per-step ``"update"`` events count as
    busy). A micro-batch is in flight on a mesh
    from the start of its forward there to the end of its backward there.
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


def _stats(rows: Sequence[_Row], S: int) -> ScheduleStats:
    """:func:`schedule_stats` of events given as tuples (meshes checked)."""
    t0 = min(r[0] for r in rows)
    step = max(r[1] for r in rows) - t0
    busy = [0.0] * S
    marks: list[list[tuple[float, int]]] = [[] for _ in range(S)]
    for start, end, mesh, _, _, kind in rows:
        busy[mesh] += end - start
        if kind == "forward":
            marks[mesh].append((start, 1))
        elif kind == "backward":
            marks[mesh].append((end, -1))
    return _stats_of(step, busy, marks, S)


def _stats_of(step: float, busy: list[float], marks: Sequence[list[tuple[float, int]]], S: int
              ) -> ScheduleStats:
    """The statistics from the step time, each mesh's busy time and its in-flight marks
    (``(time, +1)`` at a forward's start, ``(time, -1)`` at a backward's end)."""
    peak = []
    for ms in marks:
        cur = best = 0
        for _, delta in sorted(ms):  # at equal times releases (-1) come first
            cur += delta
            best = max(best, cur)
        peak.append(best)
    bubble = 0.0 if step <= 0 else 1.0 - sum(busy) / (S * step)
    return ScheduleStats(step_time=step, bubble_fraction=bubble, busy=busy, peak_inflight=peak)


def ideal_makespan(order: Sequence[Task], forward: Sequence[float],
                   backward: Sequence[float]) -> float:
    """The time of an order with the given per-stage task times and free communication: each
    mesh runs its tasks in ``order``'s order, each as soon as its dependencies are done and its
    mesh is free.

    Args:
        order: the tasks; the order of each mesh's tasks is kept.
        forward, backward: seconds of one micro-batch's forward and backward on each stage.

    Returns:
        The makespan ``max end(t)`` with ``end(t) = max(end(prev on mesh), end(deps)) + time(t)``.

    Raises:
        ScheduleError: the order's dependencies cannot be met.

    Examples:
        >>> ideal_makespan(schedule_order("gpipe", 2, 2), [1.0, 1.0], [2.0, 2.0])
        9.0
    """
    S = len(forward)
    orders = [[Task(*t) for t in order if t[1] == j] for j in range(S)]
    events = _simulate(orders, forward, backward, [0.0] * max(S - 1, 0))
    return max((e.end for e in events), default=0.0)
