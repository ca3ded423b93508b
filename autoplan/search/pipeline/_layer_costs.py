"""One layer's plan in the pipeline search: the layer ILPs (the fastest plan and the memory-lean
variant, :func:`layer_plans`, run on the search's worker processes) with their per-step terms
weighted by ``1 / B`` (:func:`per_step_weighted`), and each plan split into per-micro-batch and
per-step work (:class:`LayerCost`, :func:`layer_cost`).

See :mod:`~autoplan.search.pipeline._pipeline` (steps 2 and 3 of its docstring).
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from autoplan._errors import SearchError
from autoplan._memo import per_owner
from autoplan.costs._cluster import Cluster
from autoplan.costs._mesh import LogicalMesh
from autoplan.plans._plan import Comm, Plan
from autoplan.plans._spec import tile_count
from autoplan.search.intra._ilp_problem import ILPProblem, aligned_nodes, build_problem
from autoplan.search.intra._ilp_solve import ILPSolution, mapped_solution, solve_ilp
from autoplan.search.intra._intra import IntraOpResult, intra_op_result, make_logical_mesh
from autoplan.search.intra._reshard import reshard
from autoplan.search.intra._spec_space import replicated, tiles
from autoplan.search.intra._strategies import HEAVY, combined_latency
from autoplan.tracing._graph import OpGraph
from autoplan.tracing._primitives import STOP_REDUCTIONS

__all__ = ["LayerCost", "LayerPlans", "layer_cost", "layer_plans", "layer_family_plans",
           "gradient_ops",
           "per_step_weighted", "LAYER_MIP_GAP", "LAYER_TIME_LIMIT", "LEAN_MIP_GAP"]


#: Relative optimality gap of the per-layer ILPs (certified by the LP bound or the MIP's dual
#: bound). Memory-budgeted layer ILPs have integrality gaps of a few tenths of a percent that
#: branch-and-cut needs seconds to close; the stage DP's choices differ by more than this.
LAYER_MIP_GAP = 5e-3

#: Seconds a layer ILP of the pipeline search may take (at most ``time_limit``): the search
#: solves hundreds; at the limit the best plan found is used (counted in the stats). Square
#: logical meshes of MoE layers can keep branch-and-cut from certifying the gap for a minute.
LAYER_TIME_LIMIT = 10.0

#: The gap of the memory-lean variants' Lagrangian solves (:func:`_lean_plan`): they aim at a
#: memory target, not at the optimum, and their weighted objectives make branch-and-cut slow.
LEAN_MIP_GAP = 2e-2


@per_owner
def gradient_ops(graph: OpGraph) -> frozenset[int]:
    """The backward operators that make parameter gradients: their result reaches the optimizer
    update through operators that do not combine it with anything batch-sized (movement,
    elementwise, a reduction over size-1 dimensions only). Their collectives are the gradient
    synchronisation, run once per step after the micro-batches' gradients are accumulated: a
    weight gradient's partial sums, and a bias or norm-scale gradient's reduction over the
    batch (whose result is reshaped and summed over a broadcast size-1 dimension before the
    update). Once per graph."""
    ops, consumers = graph.ops, graph.consumers
    marks = [op.role == "update" for op in ops]  # the result reaches the update unchanged
    out = set()
    for op in reversed(ops):
        if op.role == "update" or not any(marks[c] for t in op.outputs for c in consumers[t]):
            continue
        if op.role == "backward":
            out.add(op.id)
        trivial = op.primitive in STOP_REDUCTIONS and all(
            op.in_shapes[0][a] == 1 for a in op.params.get("axes", ()))
        if op.primitive not in HEAVY and (op.primitive not in STOP_REDUCTIONS or trivial):
            marks[op.id] = True
    return frozenset(out)


def per_step_weighted(problem: ILPProblem, weight: float) -> ILPProblem:
    """The intra-operator ILP of a layer with its per-step terms weighted by ``weight``.

    In a step of ``B`` micro-batches the forward and backward run ``B`` times and the gradient
    synchronisation and the update once, so the layer's plan should minimise
    ``per-micro-batch + per-step / B``. The strategy costs of the update operators (compute and
    collectives) and the collectives of gradient-producing backward operators
    (:func:`gradient_ops`, and the ones the ILP tags ``grad-sync``) are scaled by ``weight``; the resharding edges into update operators keep
    their full weight. The ILP's reported objective is computed from the strategies, so it
    stays the unweighted one-micro-batch step.

    Returns:
        ``problem`` itself when ``weight >= 1``, else a shallow copy with new node costs.
    """
    if weight >= 1:
        return problem
    graph = problem.graph
    grads = gradient_ops(graph) | problem.grad_ops
    parts = [None] * len(problem.nodes)
    for i, member in problem.members.items():
        op = graph.ops[i]
        if op.role == "update":
            per = np.array([s.cost for s in member.strats])
        elif i in grads:
            per = np.array([s.comm_time for s in member.strats])
        else:
            continue
        v = per[member.idx]
        parts[member.node] = v if parts[member.node] is None else parts[member.node] + v
    out = copy.copy(problem)
    out.nodes = [n if part is None else replace(n, cost=n.cost - (1.0 - weight) * part)
                 for n, part in zip(problem.nodes, parts)]
    return out


@dataclass(frozen=True)
class LayerCost:
    """A layer's intra-operator plan on one submesh and logical mesh, split by how often each
    part runs.

    Attributes:
        forward_compute, backward_compute: seconds of computation per micro-batch.
        step_compute: seconds of computation once per step (the optimizer update).
        forward_comms, backward_comms: collectives per micro-batch (the operators' own and the
            resharding of their operands), by the role of the operator that needs them.
        step_comms: collectives once per step: the gradient synchronisation (the collectives of
            :func:`gradient_ops`, which include those the ILP tags ``"grad-sync"``), the update's, the resharding of updated inputs back to their specs,
            and the all-gathers of parameters read in a spec other than their own (once each per
            step: the gathered copy is then resident).
        resident: bytes per device not multiplied by the micro-batches in flight: parameters
            and optimizer state as sharded, a gradient accumulation buffer per parameter (split
            only over the axes its gradient is not synchronised over), gathered parameter copies, and the inputs the backward and the update receive from other layers (the
            gradient of the layer's output, the update's scalars), which one micro-batch at a
            time holds.
        activation: bytes per device of one micro-batch in flight: its forward inputs and the
            activations saved for the backward.
        batch_splits: ``(full-batch size of a batch dimension, devices it is split over)`` for
            every batch dimension the plan splits: a re-timed plan is valid for ``B``
            micro-batches only if each such size divided by ``B`` still divides.
        repeated_gathers: seconds the ILP charged for resharding a tensor to a spec a second
            time (another reader of the same spec): XLA converts it once and the copy serves
            every reader (a gathered parameter once per step), so this is not charged.
        combined_latency: seconds of latency the collectives XLA combines (the gradient
            synchronisation's all-reduces) pay once per step beyond their strategies' shares
            (:func:`~autoplan.search.intra._strategies.combined_latency`); part of :attr:`step`.
    """

    forward_compute: float
    backward_compute: float
    step_compute: float
    forward_comms: tuple[Comm, ...]
    backward_comms: tuple[Comm, ...]
    step_comms: tuple[Comm, ...]
    resident: float
    activation: float
    batch_splits: tuple[tuple[int, int], ...] = ()
    repeated_gathers: float = 0.0
    combined_latency: float = 0.0

    @property
    def forward(self) -> float:
        """Seconds per micro-batch of the forward."""
        return self.forward_compute + sum(c.time for c in self.forward_comms)

    @property
    def backward(self) -> float:
        """Seconds per micro-batch of the backward."""
        return self.backward_compute + sum(c.time for c in self.backward_comms)

    @property
    def step(self) -> float:
        """Seconds once per step (gradient synchronisation, update, parameter gathers)."""
        return self.step_compute + sum(c.time for c in self.step_comms) + self.combined_latency

    @property
    def grad_sync(self) -> float:
        """Seconds of the gradient synchronisation (part of :attr:`step`; its collectives have
        ``where == "grad-sync"``)."""
        return sum(c.time for c in self.step_comms if c.where == "grad-sync")

    def feasible(self, microbatches: int) -> bool:
        """Whether the plan's batch splits still divide at ``microbatches`` micro-batches."""
        return all(full % microbatches == 0 and (full // microbatches) % k == 0
                   for full, k in self.batch_splits)

    def rescaled(self, ratio: float, mesh: LogicalMesh) -> tuple[float, float, float]:
        """``(forward, backward, activation)`` of the same plan for micro-batches ``ratio``
        times as large: compute and collective bytes scale, each collective's alpha-beta time
        is recomputed on ``mesh``."""
        return (self.forward_compute * ratio + _retimed(self.forward_comms, ratio, mesh, False),
                self.backward_compute * ratio + _retimed(self.backward_comms, ratio, mesh, True),
                self.activation * ratio)


def _retimed(comms: Sequence[Comm], ratio: float, mesh: LogicalMesh, backward: bool) -> float:
    """Seconds of ``comms`` with their bytes scaled by ``ratio`` (a backward operator's own
    collectives discounted by gamma, as the strategies time them; resharding is not). Each
    collective keeps the latency its strategy charged (a share of one combined collective's, for
    those XLA combines): only the change of its time with the bytes is added."""
    if ratio == 1.0:
        return sum(c.time for c in comms)
    names = mesh.axis_names
    total = 0.0
    for c in comms:
        axes, disc = [names.index(a) for a in c.axes], backward and c.where != "reshard"
        total += max(0.0, c.time + mesh.collective_time(c.kind, c.bytes * ratio, axes, disc)
                     - mesh.collective_time(c.kind, c.bytes, axes, disc))
    return total


def _stage_memory(plan: Plan, sync_axes: frozenset[str] = frozenset()) -> tuple[float, float]:
    """(resident bytes, activation bytes) per device of a one-micro-batch plan: resident = the
    parameters and the optimizer state as sharded, and a gradient buffer per parameter;
    activations = the rest of the plan's live memory (the micro-batch, boundary activations,
    values saved for backward).

    Gradients accumulate unsynchronised over the micro-batches, so a parameter's buffer is split
    only over the mesh axes of its spec that the gradient synchronisation does not run over
    (``sync_axes``): a parameter sharded over the data-parallel axis (its update sharded, the
    gradient reduce-scattered once per step) still accumulates a whole local gradient."""
    state = grads = 0.0
    mesh = dict(zip(plan.axis_names, plan.mesh_shape))
    unsynced = {a: 1 if a in sync_axes else n for a, n in mesh.items()}
    for i in plan.inputs:
        if i.kind not in ("parameter", "optimizer_state"):
            continue
        nbytes = math.prod(i.shape) * np.dtype(i.dtype).itemsize
        state += nbytes / tile_count(i.spec, mesh)
        if i.kind == "parameter":
            grads += nbytes / tile_count(i.spec, unsynced)
    act = max(0.0, plan.predicted.memory_per_device - state)
    return state + grads, act


def layer_cost(result: Any, sub: OpGraph, mesh: LogicalMesh,
               batch_dims: Callable[[int], Sequence[tuple[int, int]]] | None = None,
               transient: frozenset[int] = frozenset()) -> LayerCost:
    """Split a layer's intra-operator plan (an :class:`~autoplan.search.intra._intra.IntraOpResult`
    of the training step at micro-batch size, solved on ``sub``) into per-micro-batch and
    per-step work (see :class:`LayerCost`, and :mod:`~autoplan.search.pipeline._pipeline`, step
    3).

    The operators' collectives come from the ILP solution (by the operator's role; those of
    :func:`gradient_ops` and those tagged ``"grad-sync"`` per step); the resharding of every operand is recomputed as
    the ILP charges it (from its producer's or input's spec to the spec its consumer needs), so
    that a parameter read in another spec can be charged once per step instead of once per
    consumer. Every term of the ILP's communication is in exactly one place, and ``forward +
    backward + step`` plus the executable's launch (:meth:`~autoplan.Cluster.step_overhead`,
    charged per task by the simulation) is the plan's one-micro-batch step time.

    Args:
        result: the layer's intra-op result.
        sub: the graph it was solved on.
        mesh: its logical mesh.
        batch_dims: ``tensor id -> ((dimension, full-batch size), ...)`` for the dimensions that
            scale with the batch (to record :attr:`LayerCost.batch_splits`); None to skip.
        transient: the ids of ``sub``'s inputs made by backward or update operators of other
            layers (counted in :attr:`LayerCost.resident`, once, not per micro-batch in flight).
    """
    sol = result.solution
    ops, tensors = sub.ops, sub.tensors
    compute = {"forward": 0.0, "backward": 0.0, "update": 0.0}
    for i, st in sol.strategies.items():
        compute[ops[i].role] = compute.get(ops[i].role, 0.0) + st.compute_time
    fwd: list[Comm] = []
    bwd: list[Comm] = []
    step: list[Comm] = []
    grads = gradient_ops(sub)
    for i, c in sol.comms:
        if c.where == "reshard" and i is not None:
            continue  # operand resharding: recomputed below, per operand
        if c.where == "grad-sync" or i is None or ops[i].role == "update":
            step.append(c)
        elif i in grads:
            step.append(replace(c, where="grad-sync"))
        elif ops[i].role == "forward":
            fwd.append(c)
        else:
            bwd.append(c)
    inputs = sub.input_of_tensor
    # the tensors with a spec while the ILP charges resharding: inputs and the results of the
    # operators it chose strategies for (free tensors, made from constants, are never resharded)
    sourced = set(inputs)
    for i in sol.strategies:
        sourced.update(ops[i].outputs)
    gathered: dict[int, float] = {}
    seen: set[tuple[int, tuple, tuple]] = set()
    repeated = 0.0
    for i in sorted(sol.strategies):  # operator order, as ``shared_reshards`` finds repeats
        op, st = ops[i], sol.strategies[i]
        for t, dst in zip(op.inputs, st.in_specs):
            if t is None or t not in sourced:
                continue
            src = sol.specs[t]
            if src is dst:
                continue
            ten = tensors[t]
            if dst is None:
                dst = replicated(len(ten.shape))
            if dst == src or not ten.shape:
                continue
            seconds, cs = reshard(src, dst, ten.shape, ten.dtype, mesh)
            if (t, src, dst) in seen:  # XLA converts a tensor once for every reader of that spec
                repeated += seconds
                continue
            seen.add((t, src, dst))
            gi = inputs.get(t)
            if gi is not None and gi.kind in ("parameter", "optimizer_state") and op.role != "update":
                step.extend(cs)
                extra = ten.nbytes / tiles(dst, mesh) - ten.nbytes / tiles(src, mesh)
                gathered[t] = max(gathered.get(t, 0.0), extra)
            elif op.role == "update":
                step.extend(cs)
            elif op.role == "forward":
                fwd.extend(cs)
            else:
                bwd.extend(cs)
    sync_axes = frozenset(a for c in step if c.where == "grad-sync" for a in c.axes)
    resident, act = _stage_memory(result.plan, sync_axes)
    if transient:
        once = sum(tensors[t].nbytes / tiles(sol.specs[t], mesh) for t in transient
                   if t in sol.specs)
        resident, act = resident + once, max(0.0, act - once)
    splits: set[tuple[int, int]] = set()
    if batch_dims is not None:
        sizes = dict(zip(mesh.axis_names, mesh.shape))

        def note(t: int | None, spec) -> None:
            if t is None or spec is None:
                return
            for d, full in batch_dims(t):
                e = spec[d] if d < len(spec) else None
                if e:
                    splits.add((full, math.prod(sizes[a] for a in e)))

        for t, spec in sol.specs.items():
            note(t, spec)
        for i, st in sol.strategies.items():
            for t, spec in zip(ops[i].inputs, st.in_specs):
                note(t, spec)
            for t, spec in zip(ops[i].outputs, st.out_specs):
                note(t, spec)
    combined = sum(combined_latency(sub, mesh, sol.comms).values())
    return LayerCost(compute["forward"], compute["backward"], compute["update"], tuple(fwd),
                     tuple(bwd), tuple(step), resident + sum(gathered.values()), act,
                     tuple(sorted(splits)), repeated, combined)


def _lean_plan(fast, run, steps: int = 5):
    """The memory-lean variant of a layer's plan: the fastest plan found whose live memory is at
    most halfway between the least memory and the fastest plan's.

    Instead of a memory-budgeted ILP (whose knapsack row makes the LP relaxation fractional and
    branch-and-cut slow), this solves the Lagrangian ``min time + w * memory`` (``run(w)``), whose
    every solution is the fastest plan for its own memory: ``w`` starts where the whole memory
    range is worth the fastest plan's time, grows 4x until the memory target is met, then
    bisects (geometrically) for the fastest plan that meets it. ``steps`` bounds the solves.
    """
    least = fast.solution.least_memory
    fast_mem = fast.solution.memory_per_device
    target = 0.5 * (least + fast_mem)
    w = fast.solution.objective / max(fast_mem - least, 1.0)
    lo, hi = 0.0, None
    best = leanest = None
    for _ in range(steps):
        res = run(w)
        mem = res.solution.memory_per_device
        if leanest is None or mem < leanest.solution.memory_per_device:
            leanest = res
        if mem <= target * (1 + 1e-9):
            if best is None or res.solution.objective < best.solution.objective:
                best = res
            hi = w
        else:
            lo = w
        if hi is None:
            w *= 4.0
        elif lo == 0.0:
            w = hi / 4.0
        else:
            w = math.sqrt(lo * hi)
        if best is not None and best.solution.memory_per_device >= 0.75 * target:
            break
    return best if best is not None else leanest


@dataclass
class LayerPlans:
    """A layer kind's plans on one submesh and logical mesh (what :func:`layer_plans` gives).

    Attributes:
        fast: the fastest plan (None where the pins cannot hold on the mesh).
        lean: the memory-lean variant (:func:`_lean_plan`; ``fast`` itself when the fastest plan
            is already within 20% of the least memory; None until solved or without ``fast``).
        lean_solved: whether ``lean`` was asked for.
        solves: ILP solves it took; timed_out: how many of them stopped at the time limit.
        mapped: plans taken from another layer kind's ILP, the same up to a constant
            (:func:`layer_family_plans`).
    """

    fast: Any
    lean: Any = None
    lean_solved: bool = False
    solves: int = 0
    timed_out: int = 0
    mapped: int = 0

    def again(self) -> LayerPlans:
        """A copy that further solves add to (the counts start again)."""
        return LayerPlans(self.fast, self.lean, self.lean_solved)


def layer_plans(sub: OpGraph, view: Cluster, shape: tuple[int, ...], *, B: int,
                pins: Mapping[str, Any] | None, time_limit: float, lean: bool,
                fast: LayerPlans | None = None) -> LayerPlans:
    """Solve a layer's intra-operator ILP on submesh ``view`` with logical mesh ``shape``, its
    per-step terms weighted by ``1 / B`` (:func:`per_step_weighted`): the fastest plan, and with
    ``lean`` the memory-lean variant (one ILP build serves both). A module-level function, so
    that the pipeline search can run it in worker processes.

    Args:
        sub: the layer's subgraph (of the step traced at micro-batch size).
        view: the submesh as a cluster.
        shape: the logical mesh.
        B: the number of micro-batches.
        pins: ``{regex over input names: PartitionSpec}``; on a mesh where a pinned spec does not
            divide, no plan (``fast`` None).
        time_limit: seconds per ILP solve.
        lean: solve the memory-lean variant too.
        fast: what an earlier call gave without the lean variant (its fastest plan is reused).
    """
    return layer_family_plans(sub, view, shape, B=B, pins=pins, time_limit=time_limit,
                              lean=lean, fast=fast)[0]


def layer_family_plans(sub: OpGraph, view: Cluster, shape: tuple[int, ...], *, B: int,
                       pins: Mapping[str, Any] | None, time_limit: float, lean: bool,
                       fast: LayerPlans | None = None,
                       members: Sequence[tuple[OpGraph, LayerPlans | None]] = ()
                       ) -> list[LayerPlans]:
    """:func:`layer_plans` of a layer kind (``sub``, with ``fast`` as there), and of each of
    ``members`` (other kinds' subgraphs of the same loose signature, each with what an earlier
    call gave it): a member whose ILP on this mesh is the kind's up to a constant
    (:func:`~autoplan.search.intra._ilp_problem.aligned_nodes`, checked on the built problems)
    takes the kind's plans node by node, costed on its own subgraph
    (:func:`~autoplan.search.intra._ilp_solve.mapped_solution`); any other is solved. Returns
    ``[the kind's, then each member's]``.

    A member's memory-lean variant is the kind's mapped too, where the two take the same
    branch (the fastest plan as its own lean variant, or not); else it is solved.
    """
    head, todo = _resumed(fast, lean)
    if not todo and not members:
        return [head]
    mesh = make_logical_mesh(view, shape)
    prob = _weighted_problem(sub, mesh, pins, B)
    if prob is None:  # a pinned spec does not divide on this mesh: no plan here
        head.lean_solved = True
        return [head] + [_solved_plans(msub, mesh, None, mfast, time_limit, lean)
                         for msub, mfast in members]
    if todo:
        _solve_plans(head, sub, mesh, prob, time_limit, lean)
    out = [head]
    for msub, mfast in members:
        mine, left = _resumed(mfast, lean)
        if not left:
            out.append(mine)
            continue
        mprob = _weighted_problem(msub, mesh, pins, B)
        align = None if head.fast is None or mprob is None else aligned_nodes(
            prob, mprob, 1e-9 * abs(head.fast.solution.objective))
        if align is None:
            out.append(_solved_plans(msub, mesh, mprob, mfast, time_limit, lean))
            continue
        if mine.fast is None:
            mine.fast = _mapped(head.fast, prob, msub, mesh, mprob, align)
            mine.mapped += 1
        if lean:
            if _lean_already(mine.fast):
                mine.lean = mine.fast
            elif head.lean is not head.fast:
                mine.lean = _mapped(head.lean, prob, msub, mesh, mprob, align)
                mine.mapped += 1
            else:  # (the kind's fastest plan is its own lean variant, this one's is not)
                _solve_plans(mine, msub, mesh, mprob, time_limit, True)
            mine.lean_solved = True
        out.append(mine)
    return out


def _lean_already(fast: IntraOpResult) -> bool:
    """Whether the fastest plan is its own memory-lean variant: within 20% of the least memory
    (:attr:`LayerPlans.lean`)."""
    return sum(_stage_memory(fast.plan)) <= 1.2 * fast.solution.least_memory


def _resumed(fast: LayerPlans | None, lean: bool) -> tuple[LayerPlans, bool]:
    """A copy of what an earlier call gave (``fast``; an empty one without it) for this call to
    add to, and whether anything is left to solve: the fastest plan, or the lean variant asked
    for and not solved yet."""
    out = LayerPlans(None) if fast is None else fast.again()
    return out, not out.lean_solved and (fast is None or lean)


def _mapped(res: IntraOpResult, prob: ILPProblem, sub: OpGraph, mesh: LogicalMesh,
            mprob: ILPProblem, align: np.ndarray) -> IntraOpResult:
    """The plan of ``res`` (solved on ``prob``) taken node by node onto ``sub``'s problem
    ``mprob`` (``align``: :func:`~autoplan.search.intra._ilp_problem.aligned_nodes`)."""
    return intra_op_result(sub, mesh, mapped_solution(mprob, align, res.solution, prob), 0.0,
                           level="exhaustive")


def _weighted_problem(sub: OpGraph, mesh: LogicalMesh, pins: Mapping[str, Any] | None,
                      B: int) -> ILPProblem | None:
    """``sub``'s ILP on ``mesh`` with its per-step terms weighted by ``1 / B``; None where a
    pinned spec does not divide on the mesh."""
    try:
        return per_step_weighted(build_problem(sub, mesh, pins=pins, count_unmerged=False),
                                 1.0 / B)
    except SearchError:
        if pins is None:
            raise
        return None


def _solved_plans(sub: OpGraph, mesh: LogicalMesh, prob: ILPProblem | None,
                  fast: LayerPlans | None, time_limit: float, lean: bool) -> LayerPlans:
    """:func:`layer_plans` on a problem built already (None: no plan on this mesh)."""
    out, left = _resumed(fast, lean)
    if not left:
        return out
    if prob is None:
        out.lean_solved = True
        return out
    _solve_plans(out, sub, mesh, prob, time_limit, lean)
    return out


def _solve_plans(out: LayerPlans, sub: OpGraph, mesh: LogicalMesh, prob: ILPProblem,
                 time_limit: float, lean: bool) -> None:
    """Solve the fastest plan into ``out`` where it has none, and with ``lean`` the memory-lean
    variant (:func:`layer_plans`, on ``sub``'s weighted problem ``prob``)."""

    def solve(memory_weight: float, mip_gap: float) -> _Solved:
        out.solves += 1
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sol = solve_ilp(sub, mesh, time_limit=time_limit, problem=prob, mip_gap=mip_gap,
                            memory_weight=memory_weight)
        # (without the problem it was solved on: that is most of what a worker would send back)
        sol = replace(sol, problem=None)
        if sol.status in ("feasible", "timeout-greedy"):
            out.timed_out += 1
        return _Solved(sol, time.perf_counter() - t0)

    def result(got: _Solved) -> IntraOpResult:
        """The plan of a kept solve (the lean search's other solves make none)."""
        return intra_op_result(sub, mesh, got.solution, got.seconds, level="exhaustive")

    if out.fast is None:
        out.fast = result(solve(0.0, LAYER_MIP_GAP))
    if lean:
        f = out.fast
        if _lean_already(f):
            out.lean = f
        else:
            out.lean = result(_lean_plan(f, lambda w: solve(w, LEAN_MIP_GAP)))
        out.lean_solved = True


@dataclass(frozen=True)
class _Solved:
    """One layer ILP solved: its solution and the seconds it took."""

    solution: ILPSolution
    seconds: float
