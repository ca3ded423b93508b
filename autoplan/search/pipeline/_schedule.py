"""Pipeline schedules (GPipe and 1F1B) as clock tables and as timed event lists.

Convention (Alpa): ``S`` stages on ``S`` meshes; mesh ``j`` runs the forward *and* the backward
of stage ``j`` (Alpa numbers the backward as stage ``2S - 1 - j``). A schedule is a table whose
rows are clock ticks and whose columns are meshes; each entry is a :class:`Task` or ``None``
(a bubble). With unit forward and backward times both schedules take ``2 (m + S - 1)`` clocks
for ``m`` micro-batches, so both have the bubble fraction ``(S - 1) / (m + S - 1)``; 1F1B keeps at
most ``S - j`` micro-batches alive on mesh ``j`` where GPipe keeps all ``m``.

A training step ends with per-step work on every mesh (the gradient synchronisation across the
stage's data-parallel devices and the optimizer update), which :func:`schedule_events` places
after the mesh's last backward (events of kind ``"update"``): the step ends when the last mesh's
update does.

Per-mesh orders:

* GPipe: ``F_0 .. F_{m-1}`` then ``B_0 .. B_{m-1}``.
* 1F1B: ``w = min(S - j - 1, m)`` warm-up forwards ``F_0 .. F_{w-1}``; then the steady phase
  alternates one forward and one backward, ``F_w B_0 F_{w+1} B_1 ...``, so the first backward
  comes after ``w + 1`` forwards (the "extra" forward is the first of the steady phase, not a
  warm-up one); then the cool-down backwards. The table is the earliest-start execution of
  these orders with unit times; this is what makes every dependency hold at every tick.

References:
    Huang et al., "GPipe", NeurIPS 2019. Narayanan et al., "PipeDream" (SOSP 2019) and
    "Efficient Large-Scale Language Model Training on GPU Clusters" (SC 2021) for 1F1B.
    Zheng et al., "Alpa", OSDI 2022, Section 6 (schedules as tables).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

from autoplan._errors import SearchError

__all__ = [
    "Task",
    "Event",
    "ScheduleStats",
    "gpipe_table",
    "one_f_one_b_table",
    "schedule_table",
    "schedule_events",
    "schedule_stats",
    "validate_table",
]

_KINDS = ("gpipe", "1f1b")


@dataclass(frozen=True)
class Task:
    """One unit of pipeline work.

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
            raise SearchError(
                f"{name} should be an integer >= 1. Got {val!r}. Fix: pass a positive count."
            )
    return int(num_stages), int(microbatches)


def _check_kind(kind: object) -> str:
    if kind not in _KINDS:
        raise SearchError(
            f"kind should be one of {_KINDS}. Got {kind!r}. Fix: use 'gpipe' or '1f1b'."
        )
    return kind  # type: ignore[return-value]


def _mesh_orders(kind: str, S: int, m: int) -> list[list[Task]]:
    orders: list[list[Task]] = []
    for j in range(S):
        fwd = [Task(b, j, "forward") for b in range(m)]
        bwd = [Task(b, j, "backward") for b in range(m)]
        if kind == "gpipe":
            orders.append(fwd + bwd)
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
        orders.append(order)
    return orders


def _simulate(orders: list[list[Task]], fwd: Sequence[float], bwd: Sequence[float],
              comm: Sequence[float], comm_bwd: Sequence[float] | None = None,
              step: Sequence[float] | None = None) -> list[Event]:
    S = len(orders)
    comm_b = comm if comm_bwd is None else comm_bwd
    done: dict[tuple[int, int, str], float] = {}
    pos = [0] * S
    free = [0.0] * S
    events: list[Event] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for j in range(S):
            while pos[j] < len(orders[j]):
                t = orders[j][pos[j]]
                s, b = t.stage, t.microbatch
                if t.kind == "forward":
                    dep = 0.0 if s == 0 else done.get((b, s - 1, "forward"))
                    if dep is not None and s > 0:
                        dep += comm[s - 1]
                    dur = fwd[s]
                elif s == S - 1:
                    dep = done.get((b, s, "forward"))
                    dur = bwd[s]
                else:
                    dep = done.get((b, s + 1, "backward"))
                    if dep is not None:
                        dep += comm_b[s]
                    dur = bwd[s]
                if dep is None:
                    break
                start = max(free[j], dep)
                end = start + dur
                done[(b, s, t.kind)] = end
                free[j] = end
                events.append(Event(start, end, j, b, s, t.kind))
                pos[j] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - the orders above never deadlock
            raise SearchError("the pipeline schedule deadlocked: a mesh order waits on itself.")
    if step is not None:
        for j in range(S):
            last = orders[j][-1]
            events.append(Event(free[j], free[j] + step[j], j, last.microbatch, j, "update"))
    events.sort(key=attrgetter("start", "mesh"))
    return events


def _table_from_orders(orders: list[list[Task]]) -> list[list[Task | None]]:
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
    (and never more than ``m``) are alive on it. Takes ``2 (m + S - 1)`` clocks like GPipe.

    Args:
        num_stages: ``S >= 1``.
        microbatches: ``m >= 1``.

    Returns:
        Rows = clock ticks, columns = meshes; ``None`` marks a bubble.
    """
    S, m = _check_sm(num_stages, microbatches)
    return _table_from_orders(_mesh_orders("1f1b", S, m))


def schedule_table(kind: str, num_stages: int, microbatches: int) -> list[list[Task | None]]:
    """The table of ``kind`` (``"gpipe"`` or ``"1f1b"``); see :func:`gpipe_table`."""
    kind = _check_kind(kind)
    return gpipe_table(num_stages, microbatches) if kind == "gpipe" else one_f_one_b_table(
        num_stages, microbatches)


def validate_table(table: Sequence[Sequence[Task | None]], num_stages: int, microbatches: int) -> None:
    """Check a schedule table.

    Every ``(micro-batch, stage, kind)`` appears exactly once, in the column of its stage; a
    forward of stage ``s > 0`` runs after the forward of stage ``s - 1`` of the same micro-batch;
    the backward of the last stage after its own forward; the backward of stage ``s < S - 1``
    after the backward of stage ``s + 1``.

    Raises:
        SearchError: naming the first violation.
    """
    S, m = _check_sm(num_stages, microbatches)
    when: dict[tuple[int, int, str], int] = {}
    for t, row in enumerate(table):
        if len(row) != S:
            raise SearchError(f"table row {t} should have {S} columns (one per mesh). Got {len(row)}.")
        for j, task in enumerate(row):
            if task is None:
                continue
            key = (task.microbatch, task.stage, task.kind)
            if task.kind not in ("forward", "backward") or not 0 <= task.microbatch < m:
                raise SearchError(f"table[{t}][{j}] is not a valid task. Got {task!r}.")
            if task.stage != j:
                raise SearchError(f"table[{t}][{j}] should hold a task of stage {j}. Got {task!r}.")
            if key in when:
                raise SearchError(f"task {task!r} appears twice: clocks {when[key]} and {t}.")
            when[key] = t
    for b in range(m):
        for s in range(S):
            for kind in ("forward", "backward"):
                if (b, s, kind) not in when:
                    raise SearchError(f"task {Task(b, s, kind)!r} is missing from the table.")
            tf, tb = when[(b, s, "forward")], when[(b, s, "backward")]
            if s > 0 and tf <= when[(b, s - 1, "forward")]:
                raise SearchError(f"forward of micro-batch {b} stage {s} at clock {tf} does not follow "
                                  f"stage {s - 1}'s forward (clock {when[(b, s - 1, 'forward')]}).")
            dep = when[(b, s, "forward")] if s == S - 1 else when[(b, s + 1, "backward")]
            if tb <= dep:
                raise SearchError(f"backward of micro-batch {b} stage {s} at clock {tb} runs before its "
                                  f"dependency (clock {dep}).")


def _check_times(name: str, vals: Sequence[float] | None, n: int) -> list[float]:
    if vals is None:
        return [0.0] * n
    try:
        out = [float(v) for v in vals]
    except (TypeError, ValueError) as err:
        raise SearchError(f"{name} should be a sequence of {n} numbers. Got {vals!r}.") from err
    if len(out) != n or any(not math.isfinite(v) or v < 0 for v in out):
        raise SearchError(
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
    kind = _check_kind(kind)
    S, m = _check_sm(num_stages, microbatches)
    fwd = _check_times("forward_times", forward_times, S)
    bwd = _check_times("backward_times", backward_times, S)
    comm = _check_times("comm_times", comm_times, S - 1)
    comm_b = None if backward_comm_times is None else _check_times(
        "backward_comm_times", backward_comm_times, S - 1)
    step = None if step_times is None else _check_times("step_times", step_times, S)
    return _simulate(_mesh_orders(kind, S, m), fwd, bwd, comm, comm_b, step)


def schedule_stats(events: Sequence[Event], num_stages: int) -> ScheduleStats:
    """Step time, bubble fraction, per-mesh busy time and peak in-flight micro-batches.

    ``bubble_fraction = 1 - sum(busy) / (S * step_time)`` (per-step ``"update"`` events count as
    busy). A micro-batch is in flight on a mesh
    from the start of its forward there to the end of its backward there.
    """
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
        raise SearchError(f"num_stages should be an integer >= 1. Got {num_stages!r}.")
    if not events:
        raise SearchError("events should not be empty. Got []. Fix: pass schedule_events(...).")
    S = num_stages
    t0 = min(e.start for e in events)
    step = max(e.end for e in events) - t0
    busy = [0.0] * S
    marks: list[list[tuple[float, int]]] = [[] for _ in range(S)]
    for e in events:
        if not 0 <= e.mesh < S:
            raise SearchError(f"event mesh should be in 0..{S - 1}. Got {e!r}.")
        busy[e.mesh] += e.end - e.start
        if e.kind == "forward":
            marks[e.mesh].append((e.start, 1))
        elif e.kind == "backward":
            marks[e.mesh].append((e.end, -1))
    peak = []
    for ms in marks:
        cur = best = 0
        for _, delta in sorted(ms):  # at equal times releases (-1) come first
            cur += delta
            best = max(best, cur)
        peak.append(best)
    bubble = 0.0 if step <= 0 else 1.0 - sum(busy) / (S * step)
    return ScheduleStats(step_time=step, bubble_fraction=bubble, busy=busy, peak_inflight=peak)
