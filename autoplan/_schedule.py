"""Pipeline schedules as task orders: the clock tables of GPipe and 1F1B, the dependencies
between their tasks, a plan table read back into an order, and the makespan of an order.

A task is ``(micro-batch, stage, kind)`` with ``kind`` ``"forward"`` or ``"backward"``; stage
``j`` runs on mesh ``j`` and does both the forward and the backward of its layers. The
dependencies are those of a chain of stages:

* ``F(i, j)`` needs ``F(i, j - 1)`` (the previous stage's activations);
* ``B(i, j)`` needs ``F(i, j)`` (its own saved activations) and ``B(i, j + 1)`` (the gradient
  of its output).

Per-mesh orders (Huang et al., GPipe, 2019; Narayanan et al., PipeDream and Megatron-LM 1F1B,
2019/2021):

* GPipe: ``F_0 .. F_{m-1}`` then ``B_0 .. B_{m-1}``;
* 1F1B: ``w = min(S - j - 1, m)`` warm-up forwards, then one forward and one backward in
  turn, then the cool-down backwards; mesh ``j`` holds at most ``S - j`` micro-batches'
  activations where GPipe holds all ``m``.

:func:`schedule_table` places those orders on a clock with unit task times (each task at the first
tick after its dependencies): both take ``2 (m + S - 1)`` ticks, so both have the bubble fraction
``(S - 1) / (m + S - 1)``.

This module is shared by the executor and the tools that read plan files; it depends on nothing
but the error classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autoplan._errors import ExecutionError

__all__ = ["KINDS", "task_deps", "schedule_table", "schedule_order", "order_from_table",
           "ideal_makespan"]

#: the schedule kinds with a generated table
KINDS = ("gpipe", "1f1b")

_KIND_NAMES = {"forward": "forward", "f": "forward", "fwd": "forward",
               "backward": "backward", "b": "backward", "bwd": "backward"}

Task = tuple[int, int, str]


def task_deps(task: Task, num_stages: int) -> list[Task]:
    """The tasks ``task`` reads from (see the module docstring).

    Examples:
        >>> task_deps((3, 1, "backward"), 3)
        [(3, 1, 'forward'), (3, 2, 'backward')]
    """
    i, j, kind = task
    if kind == "forward":
        return [(i, j - 1, "forward")] if j > 0 else []
    deps = [(i, j, "forward")]
    if j < num_stages - 1:
        deps.append((i, j + 1, "backward"))
    return deps


def _mesh_orders(kind: str, S: int, m: int) -> list[list[Task]]:
    orders: list[list[Task]] = []
    for j in range(S):
        if kind == "1f1b":
            w = min(S - j - 1, m)
            seq: list[Task] = [(i, j, "forward") for i in range(w)]
            f, b = w, 0
            while f < m or b < m:
                if f < m:
                    seq.append((f, j, "forward"))
                    f += 1
                if b < m and b < f:
                    seq.append((b, j, "backward"))
                    b += 1
            orders.append(seq)
        else:
            orders.append([(i, j, "forward") for i in range(m)] +
                          [(i, j, "backward") for i in range(m)])
    return orders


def schedule_table(kind: str, num_stages: int, microbatches: int) -> list[list[Task | None]]:
    """A GPipe or 1F1B clock table in the layout of ``Schedule.table``: rows are clock ticks,
    columns are meshes (stage ``j`` runs on mesh ``j``); entries are ``(micro-batch, stage,
    kind)`` tasks or None (a bubble).

    Args:
        kind: ``"gpipe"`` or ``"1f1b"``.
        num_stages: stages ``S``.
        microbatches: micro-batches ``m``.

    Returns:
        ``2 (m + S - 1)`` rows holding ``2 S m`` tasks.

    Raises:
        ExecutionError: an unknown kind, or a count below one.

    Examples:
        >>> schedule_table("gpipe", 2, 2)[:3]
        [[(0, 0, 'forward'), None], [(1, 0, 'forward'), (0, 1, 'forward')], [None, (1, 1, 'forward')]]
    """
    if kind not in KINDS:
        raise ExecutionError(f"schedule kind should be 'gpipe' or '1f1b'. Got {kind!r}. Fix: use "
                             "one of them in the plan's Schedule.")
    for name, v in (("num_stages", num_stages), ("microbatches", microbatches)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ExecutionError(f"{name} should be an integer >= 1. Got {v!r}. Fix: pass a "
                                 "positive count.")
    S, m = num_stages, microbatches
    orders = _mesh_orders(kind, S, m)
    done: dict[Task, int] = {}
    pos = [0] * S
    rows: list[list[Task | None]] = []
    tick = 0
    while any(pos[j] < len(orders[j]) for j in range(S)):
        ready = [orders[j][pos[j]] for j in range(S) if pos[j] < len(orders[j])
                 and all(d in done and done[d] < tick for d in task_deps(orders[j][pos[j]], S))]
        if not ready:  # pragma: no cover - the per-mesh orders above are always feasible
            raise ExecutionError(f"schedule_table: the {kind} order deadlocked")
        cols: list[Task | None] = [None] * S
        for t in ready:
            done[t] = tick
            pos[t[1]] += 1
            cols[t[1]] = t
        rows.append(cols)
        tick += 1
    return rows


def schedule_order(kind: str, num_stages: int, microbatches: int) -> list[Task]:
    """:func:`schedule_table` read tick by tick, mesh by mesh: a valid task order.

    Examples:
        >>> [f"{k[0].upper()}{m}s{j}" for m, j, k in schedule_order("1f1b", 2, 2)]
        ['F0s0', 'F1s0', 'F0s1', 'B0s1', 'B0s0', 'F1s1', 'B1s1', 'B1s0']
    """
    return [t for row in schedule_table(kind, num_stages, microbatches) for t in row if t is not None]


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
        ExecutionError: an entry of another shape or kind, a missing or repeated task, or a task
            placed before one it depends on (the message names it).
    """
    S, m = num_stages, microbatches
    order: list[Task] = []
    for row in table:
        for e in row:
            if e is None:
                continue
            try:
                mb, st, kind = int(e[0]), int(e[1]), _KIND_NAMES.get(str(e[2]).lower())
            except (TypeError, ValueError, IndexError):
                kind = None
            if kind is None:
                raise ExecutionError(f"schedule table entry {e!r} should be [micro-batch, stage, "
                                     "'forward' or 'backward']. Fix: re-create the plan's schedule.")
            order.append((mb, st, kind))
    want = {(i, j, k) for i in range(m) for j in range(S) for k in ("forward", "backward")}
    if len(order) != len(want) or set(order) != want:
        raise ExecutionError(
            f"the plan's schedule table should hold each of the {len(want)} (micro-batch, stage, "
            f"forward/backward) tasks once for {m} micro-batches and {S} stages. Got {len(order)} "
            "entries. Fix: re-create the plan's schedule.")
    seen: set[Task] = set()
    for t in order:
        missing = [d for d in task_deps(t, S) if d not in seen]
        if missing:
            i, j, kind = t
            raise ExecutionError(
                f"the schedule order runs the {kind} of micro-batch {i} on stage {j} before the "
                f"{missing[0][2]} of stage {missing[0][1]} that produces its operand. Fix: use a "
                "schedule table whose order respects the dependencies.")
        seen.add(t)
    return order


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
        ExecutionError: the order's dependencies cannot be met.

    Examples:
        >>> ideal_makespan(schedule_order("gpipe", 2, 2), [1.0, 1.0], [2.0, 2.0])
        9.0
    """
    S = len(forward)
    end: dict[Task, float] = {}
    free = [0.0] * S
    pending = list(order)
    while pending:
        progressed = False
        rest: list[Task] = []
        for t in pending:
            deps = task_deps(t, S)
            if all(d in end for d in deps) and all(r[1] != t[1] for r in rest):
                start = max([free[t[1]]] + [end[d] for d in deps])
                end[t] = start + (forward[t[1]] if t[2] == "forward" else backward[t[1]])
                free[t[1]] = end[t]
                progressed = True
            else:
                rest.append(t)
        if not progressed:
            raise ExecutionError("ideal_makespan: the order's dependencies cannot be met. Fix: "
                                 "pass an order in which every task follows its dependencies.")
        pending = rest
    return max(end.values(), default=0.0)
