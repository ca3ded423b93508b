"""Solving the intra-operator ILP: :func:`solve_ilp` and its :class:`ILPSolution`.

The problem (:mod:`autoplan.search.intra._ilp_problem`) is reduced
(:mod:`autoplan.search.intra._ilp_reduce`), written as a sparse matrix model (one-hot strategy
columns per node, edge columns tied to both ends' strategies, the memory row under a budget) and
solved by :func:`~autoplan.search.intra._solver.solve_assignment`; the solution's breakdown comes
from :mod:`autoplan.search.intra._ilp_cost`. The formulation is in
:mod:`autoplan.search.intra._ilp`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from autoplan._errors import InfeasiblePlanError
from autoplan._memo import per_owner
from autoplan._options import check_memory_budget, require_graph, require_instance
from autoplan.costs._mesh import LogicalMesh
from autoplan.plans._plan import Comm
from autoplan.plans._spec import Spec
from autoplan.search.intra._ilp_cost import _breakdown
from autoplan.search.intra._ilp_problem import ILPProblem, problem_edges, problem_nodes
from autoplan.search.intra._ilp_reduce import _fold_separable_edges, _reduce, _Reducer
from autoplan.search.intra._pins import pins_key
from autoplan.search.intra._reshard import mesh_id
from autoplan.search.intra._solver import MatrixModel, SolverTimeoutWarning, solve_assignment
from autoplan.search.intra._strategies import Strategy
from autoplan.tracing._graph import OpGraph

__all__ = ["ILPSolution", "UnsupportedPrimitiveWarning", "mapped_solution", "solve_ilp"]


_SCALE = 1e6  # objective in microseconds inside the solver (better conditioned)


class UnsupportedPrimitiveWarning(UserWarning):
    """Some primitives have no sharding rule; they run replicated."""


@dataclass(frozen=True)
class ILPSolution:
    """The intra-operator plan found by :func:`solve_ilp`.

    Attributes:
        choice: ``{node key: strategy index}`` of every decision node (empty for a plan stitched
            from segments, which is no single problem's assignment).
        strategies: ``{op id: Strategy}`` for every operator (followers resolved); free
            operators (built from constants) are absent.
        specs: ``{tensor id: spec}`` for every tensor the problem touches.
        objective: seconds (compute + communication + the small parameter penalty).
        compute_time, comm_time, penalty: its parts.
        memory_per_device: live bytes per device (inputs + activations saved for backward).
        least_memory: the least such memory of any plan (exact; see the module docstring). For a
            plan stitched from segments: the inputs each sharded as much as its shape allows
            plus each segment's least saved activations (a lower bound).
        comms: ``(op id or None, Comm)`` of every collective (operators' own, tagged ``"op"`` or
            ``"grad-sync"``, and ``"reshard"``).
        vars_before_merging: binaries of Alpa's unmerged ILP.
        vars_after_merging: variables of the ILP solved (strategy binaries + edge variables).
        num_binaries, num_edge_vars, num_constraints, num_nodes, num_ops: sizes.
        build_seconds, solve_seconds: wall-clock times.
        status: ``"optimal"``, ``"feasible"`` (time limit, incumbent), ``"timeout-greedy"``
            (time limit without incumbent: a greedy assignment), or ``"trivial"`` (nothing to
            choose).
        solver: the solver's name.
        unknown_primitives: primitives run replicated for lack of a rule.
        solver_objective: the objective as the solver's (compressed) model computes it, in
            seconds; equals ``objective`` up to rounding (a check of the model's assembly).
        lower_bound: seconds no plan can beat (the LP relaxation's or the MIP's dual bound).
        gap: ``(objective - lower_bound) / objective`` as the solver certified it (at most
            ``mip_gap`` when optimal; 0 when the LP relaxation was integral).
        dives: LP re-solves spent rounding a fractional relaxation (see
            :func:`~autoplan.search.intra._solver.solve_assignment`).
        mip: whether branch-and-cut was needed.
        reshard_readers: the operators that can read an operand in another spec than the
            tensor's: those charged a resharding, and the readers of the free tensors (built
            from constants), which take the spec their first reader needs (None: any operator).
            :func:`shared_reshards` compares only their operands.
    """

    choice: dict[int | str, int]
    strategies: dict[int, Strategy]
    specs: dict[int, Spec]
    objective: float
    compute_time: float
    comm_time: float
    penalty: float
    memory_per_device: float
    least_memory: float
    comms: tuple[tuple[int | None, Comm], ...]
    vars_before_merging: int
    vars_after_merging: int
    num_binaries: int
    num_edge_vars: int
    num_constraints: int
    num_nodes: int
    num_ops: int
    build_seconds: float
    solve_seconds: float
    status: str
    solver: str
    unknown_primitives: tuple[str, ...] = ()
    solver_objective: float | None = None
    lower_bound: float | None = None
    gap: float | None = 0.0
    dives: int = 0
    mip: bool = False
    problem: ILPProblem | None = field(default=None, repr=False, compare=False)
    reshard_readers: frozenset[int] | None = field(default=None, repr=False, compare=False)


def solve_ilp(graph: OpGraph, mesh: LogicalMesh, *, ops: Sequence[int] | None = None,
              fixed: Mapping[int, Any] | None = None, memory_budget: float | None = None,
              pins: Mapping[str, Any] | None = None, time_limit: float = 60.0,
              problem: ILPProblem | None = None, reduce: bool = True,
              relax_first: bool = True, mip_gap: float = 1e-6,
              memory_weight: float = 0.0) -> ILPSolution:
    """Solve the intra-operator ILP of ``graph`` (or a segment of it) on ``mesh``.

    Args:
        graph: the operator graph (a traced training step).
        mesh: the logical mesh (``cluster.logical_mesh(shape)``).
        ops: operator ids of a sub-graph to solve alone (default: the whole graph). Tensors they
            read from outside become boundary variables.
        fixed: ``{tensor id: spec tuple or PartitionSpec}``: a tensor read from outside the
            segment (or a graph input) gets exactly this spec; a tensor produced inside is charged
            the resharding to it once per use outside the segment (at least once).
        memory_budget: bytes per device for live memory (inputs and saved activations).
        pins: ``{regex over input names, or input tensor id: PartitionSpec}`` fixing inputs'
            specs.
        time_limit: solver seconds; at the limit the incumbent is used (SolverTimeoutWarning).
        problem: a prebuilt :func:`build_problem` result to reuse.
        reduce: eliminate nodes with at most two neighbours before solving (exact; skipped with
            a memory budget).
        relax_first: solve the LP relaxation first and keep it when integral (then it is the
            ILP's optimum), dive to an integral solution when fractional, and run the MIP only
            when the dive is not within ``mip_gap`` of the LP bound; if False, run the MIP.
        memory_weight: seconds charged per byte of live memory per device: the ILP minimises
            ``time + memory_weight * memory`` (a Lagrangian of the memory budget: every
            solution is the fastest plan for its own memory). The reported objective is the
            time alone.
        mip_gap: relative optimality gap accepted (``(objective - bound) / objective``); the
            default is exact up to rounding. The pipeline search's layer ILPs use 0.5%.

    Returns:
        The :class:`ILPSolution`.

    Raises:
        InfeasiblePlanError: the memory budget is below the least memory any plan needs
            (``least_memory``, exact).
        SearchError: invalid pins, fixed specs or operator ids.
    """
    memory_budget = check_memory_budget("solve_ilp", memory_budget)
    require_graph("solve_ilp", graph)
    require_instance("solve_ilp", "mesh", mesh, LogicalMesh, "pass cluster.logical_mesh((2, 4))")
    if problem is not None:
        prob = problem
        least = _check_least(prob.unknown, _least_memory(prob), mesh, memory_budget)
    else:
        # the whole step's least memory is kept per graph, mesh and pins: a budget below it is
        # refused again without building anything (the Explorer's budget changes)
        kept, key = None, None
        if ops is None and not fixed and (pk := pins_key(pins)) is not None:
            kept, key = _least_memories(graph), (mesh_id(mesh), pk)
        hit = kept.get(key) if kept is not None else None
        if hit is not None and _over_budget(hit[1], memory_budget):
            _check_least(*hit, mesh, memory_budget)  # (warns as a build would, then refuses)
        # the least memory is the nodes' (a budget below it is refused before the edges are
        # built: most of a large problem's building)
        prob = problem_nodes(graph, mesh, ops=ops, fixed=fixed, pins=pins)
        least = _least_memory(prob)
        if kept is not None:
            kept[key] = (frozenset(prob.unknown), least)
        _check_least(prob.unknown, least, mesh, memory_budget)
        problem_edges(prob, ops=ops, fixed=fixed, pins=pins)
    t0 = time.perf_counter()
    reducer, costs, edges, active = _reduce(prob, reduce and memory_budget is None, memory_weight)
    present = [np.isfinite(c) if active[v] and len(c) > 1 else None for v, c in enumerate(costs)]
    kept_edges = _fold_separable_edges(edges, costs, present)
    model = _build_model(prob, costs, active, present, kept_edges, memory_budget)
    build_lp = time.perf_counter() - t0

    t1 = time.perf_counter()
    out = _solve_model(prob, mesh, model, reducer, least, memory_budget=memory_budget,
                       time_limit=time_limit, mip_gap=mip_gap, relax_first=relax_first,
                       memory_weight=memory_weight)
    vec = out.vec
    if reducer is not None:
        reducer.recover(vec)
    solve_s = time.perf_counter() - t1
    bd = _breakdown(prob, vec)
    choice = {n.key: vec[nid] for nid, n in enumerate(prob.nodes)}
    return ILPSolution(
        choice=choice, strategies=bd.op_strategy, specs=bd.specs, objective=bd.objective,
        compute_time=bd.compute, comm_time=bd.comm, penalty=bd.penalty,
        memory_per_device=bd.memory, least_memory=least, comms=tuple(bd.comms),
        vars_before_merging=prob.vars_before_merging,
        vars_after_merging=model.n_bin + model.n_edge, num_binaries=model.n_bin,
        num_edge_vars=model.n_edge, num_constraints=model.n_con,
        num_nodes=len(prob.nodes), num_ops=len(prob.ops),
        build_seconds=prob.build_seconds + build_lp, solve_seconds=solve_s, status=out.status,
        solver=out.solver, unknown_primitives=tuple(sorted(prob.unknown)),
        solver_objective=out.solver_objective, lower_bound=out.lower_bound, gap=out.gap,
        dives=out.dives, mip=out.mip, problem=prob, reshard_readers=bd.reshard_readers)


def mapped_solution(prob: ILPProblem, align: np.ndarray, like: ILPSolution,
                    like_prob: ILPProblem) -> ILPSolution:
    """The solution of ``prob`` that gives each node the strategy ``like`` (a solution of
    ``like_prob``) gave its aligned node (its only one where it has none; ``align``, from
    :func:`~autoplan.search.intra._ilp_problem.aligned_nodes`: the two problems are one ILP up to
    a constant, so it is as close to ``prob``'s optimum as ``like`` was to ``like_prob``'s).

    Everything the plan is made of (strategies, specs, collectives, times, memory) is ``prob``'s
    own; the solver's figures are ``like``'s, its objective and bound moved by the constant
    between the two problems at this solution, and no seconds are spent solving.
    """
    chosen = [like.choice[key] for key in like_prob.node_keys]
    vec = [chosen[i] if i >= 0 else 0 for i in align.tolist()]  # (-1: one strategy)
    bd = _breakdown(prob, vec)
    shift = (sum(float(n.cost[v]) for n, v in zip(prob.nodes, vec))
             - sum(float(n.cost[v]) for n, v in zip(like_prob.nodes, chosen)))
    return replace(
        like, choice={n.key: vec[nid] for nid, n in enumerate(prob.nodes)},
        strategies=bd.op_strategy, specs=bd.specs, objective=bd.objective,
        compute_time=bd.compute, comm_time=bd.comm, penalty=bd.penalty,
        memory_per_device=bd.memory, least_memory=_least_memory(prob), comms=tuple(bd.comms),
        vars_before_merging=prob.vars_before_merging, num_nodes=len(prob.nodes),
        num_ops=len(prob.ops), build_seconds=prob.build_seconds, solve_seconds=0.0,
        unknown_primitives=tuple(sorted(prob.unknown)),
        solver_objective=None if like.solver_objective is None else like.solver_objective + shift,
        lower_bound=None if like.lower_bound is None else like.lower_bound + shift,
        problem=None, reshard_readers=bd.reshard_readers)


@per_owner
def _least_memories(graph: OpGraph) -> dict[tuple, tuple[frozenset[str], float]]:
    """``{(mesh_id, pins_key): (the primitives without a sharding rule, the least memory)}`` of
    the whole step's ILP on ``graph``, filled by :func:`solve_ilp` (neither depends on the
    memory budget)."""
    return {}


def _least_memory(prob: ILPProblem) -> float:
    """The least live memory of any plan of ``prob``: each node's least (its nodes suffice)."""
    return float(sum(n.memory.min() for n in prob.nodes))


def _over_budget(least: float, memory_budget: float | None) -> bool:
    """Whether no plan of least memory ``least`` fits ``memory_budget`` (None: no budget)."""
    return memory_budget is not None and least > memory_budget * (1 + 1e-9)


def _check_least(unknown: Iterable[str], least: float, mesh: LogicalMesh,
                 memory_budget: float | None) -> float:
    """Warn of primitives without a sharding rule (``unknown``); return ``least``, the least
    memory of any plan, raising when it exceeds ``memory_budget``."""
    unknown = frozenset(unknown)
    if unknown:
        warnings.warn(
            f"intra-op search: no sharding rule for primitive(s) {', '.join(sorted(unknown))}; "
            "they run replicated (every operand gathered). Fix: none needed unless they are heavy; "
            "report the primitive to extend autoplan's strategy table.",
            UnsupportedPrimitiveWarning, stacklevel=3)
    if _over_budget(least, memory_budget):
        raise InfeasiblePlanError(
            f"no plan fits memory_budget={memory_budget:.4g} bytes per device on mesh "
            f"{mesh.shape}: the least live memory of any plan (parameters, optimizer state, batch "
            f"and saved activations, each sharded as much as possible) is {least:.4g} bytes. Fix: "
            "raise the budget, use more devices, or enable pipelining/rematerialisation.",
            least_memory=least)
    return least


@dataclass
class _Model:
    """The solver's matrix model with each node's strategy columns (``None``: no choice) and
    its sizes."""

    mm: MatrixModel
    scols: list[np.ndarray | None]
    n_bin: int
    n_edge: int
    n_con: int


def _build_model(prob: ILPProblem, costs: Sequence[np.ndarray], active: Sequence[bool],
                 present: Sequence[np.ndarray | None], kept_edges: Sequence[tuple],
                 memory_budget: float | None) -> _Model:
    """The matrix model: one-hot strategy columns per node, edge columns tied to both ends'
    strategies, and the memory row when there is a budget.

    Columns: each choosing node's present strategies (cost less the node's least), in node
    order, then each edge's ``e[a, b]`` at ``a * nw + b`` (cost less the edge's least). Rows:
    each choosing node's one-hot row, then per edge ``sum_b e[a, b] = sum of u's strategies in
    group a`` (one row per group ``a`` of ``u``) and likewise for ``w``. The columns and rows of
    all nodes, and of all edges, are made in one pass of array operations each (a layer ILP has
    tens of edges and is solved several times).
    """
    mm = MatrixModel()
    scols: list[np.ndarray | None] = [None] * len(prob.nodes)
    const = 0.0
    chosen = []  # (node, its present strategies, their costs)
    for nid, n in enumerate(prob.nodes):
        if len(n.strategies) == 1:
            const += float(costs[nid][0])
        elif active[nid]:
            pres = present[nid]
            cost = costs[nid][pres]
            base = float(cost.min())
            const += base
            chosen.append((nid, pres, (cost - base) * _SCALE))
    n_bin = n_edge = n_con = 0
    if chosen:
        sizes = [len(c) for _, _, c in chosen]
        cols = mm.add_cols(np.concatenate([c for _, _, c in chosen]), integer=True)
        off = 0
        for (nid, pres, _), size in zip(chosen, sizes):
            idx = np.full(len(pres), -1, dtype=np.int64)
            idx[pres] = cols[off:off + size]
            scols[nid] = idx
            off += size
        n_bin, n_con = off, len(chosen)
        mm.add_rows(np.repeat(np.arange(len(chosen)), sizes), cols, 1.0, 1.0, 1.0, len(chosen))
    if kept_edges:
        rows, cols, vals, count, ecost, bases = _edge_rows(kept_edges, scols, mm.num_cols)
        for base in bases.tolist():  # in edge order, after the nodes' (as they were summed)
            const += base
        mm.add_cols(ecost)
        mm.add_rows(rows, cols, vals, 0.0, 0.0, count)
        n_edge, n_con = len(ecost), n_con + count
    if memory_budget is not None and _add_memory_row(prob, mm, scols, memory_budget):
        n_con += 1
    mm.offset = const * _SCALE
    return _Model(mm, scols, n_bin, n_edge, n_con)


def _edge_rows(kept_edges: Sequence[tuple], scols: Sequence[np.ndarray | None], first_col: int):
    """The edges' columns and rows for :func:`_build_model`, over all edges at once.

    Returns ``(rows, cols, vals, count, costs, bases)``: triplets of ``count`` rows (numbered
    from 0) over the edge columns (numbered from ``first_col``) and the node strategy columns
    ``scols``; the edge columns' costs; each edge's least cost. Within every row the entries
    are in the order of a row-by-row construction (the edge columns by position, then the
    node's strategies), so the model's sparse rows are the same.
    """
    ms = [e[4] for e in kept_edges]
    nu = np.array([m.shape[0] for m in ms], dtype=np.int64)
    nw = np.array([m.shape[1] for m in ms], dtype=np.int64)
    size = nu * nw
    flat = np.concatenate([m.ravel() for m in ms])
    cstart = np.zeros(len(ms), dtype=np.int64)
    np.cumsum(size[:-1], out=cstart[1:])
    bases = np.minimum.reduceat(flat, cstart)
    costs = (flat - np.repeat(bases, size)) * _SCALE
    rstart = np.zeros(len(ms), dtype=np.int64)  # each edge's first row (u's groups, then w's)
    np.cumsum((nu + nw)[:-1], out=rstart[1:])
    q = np.arange(len(flat), dtype=np.int64)
    local = q - np.repeat(cstart, size)
    nwq = np.repeat(nw, size)
    a = local // nwq
    ru = np.repeat(rstart, size) + a
    rw = np.repeat(rstart + nu, size) + (local - a * nwq)

    def ends(side: int, first_row: np.ndarray):
        g = np.concatenate([e[2 + side] for e in kept_edges])
        s = np.concatenate([scols[e[side]] for e in kept_edges])  # type: ignore[misc]
        keep = (s >= 0) & (g >= 0)
        lens = np.array([len(e[2 + side]) for e in kept_edges], dtype=np.int64)
        return (np.repeat(first_row, lens) + g)[keep], s[keep]

    nru, ncu = ends(0, rstart)
    nrw, ncw = ends(1, rstart + nu)
    ecol = first_col + q
    rows = np.concatenate([ru, rw, nru, nrw])
    cols = np.concatenate([ecol, ecol, ncu, ncw])
    vals = np.concatenate([np.ones(2 * len(flat)), -np.ones(len(nru) + len(nrw))])
    return rows, cols, vals, int((nu + nw).sum()), costs, bases


def _add_memory_row(prob: ILPProblem, mm: MatrixModel, scols: Sequence[np.ndarray | None],
                    memory_budget: float) -> bool:
    """Add ``sum of the chosen strategies' memory <= memory_budget``; whether a row was added
    (none when no strategy choice changes the memory)."""
    mcols, mvals = [], []
    mconst = 0.0
    for nid, n in enumerate(prob.nodes):
        idx = scols[nid]
        if idx is None:
            mconst += float(n.memory[0])
        else:
            keep = (idx >= 0) & (np.asarray(n.memory) != 0)
            mcols.append(idx[keep])
            mvals.append(np.asarray(n.memory, dtype=float)[keep])
    if not (mcols and sum(len(c) for c in mcols)):
        return False
    mc = np.concatenate(mcols)
    mm.add_rows(np.zeros(len(mc), dtype=np.int64), mc, np.concatenate(mvals), -np.inf,
                memory_budget - mconst, 1)
    return True


@dataclass
class _SolverOutcome:
    """Each node's chosen strategy index (before the reducer's recovery) and how the solver got
    there (the :class:`ILPSolution` fields of the same names)."""

    vec: list[int]
    status: str
    solver: str = "none"
    solver_objective: float | None = None
    lower_bound: float | None = None
    gap: float | None = 0.0
    dives: int = 0
    mip: bool = False


def _solve_model(prob: ILPProblem, mesh: LogicalMesh, model: _Model, reducer: _Reducer | None,
                 least: float, *, memory_budget: float | None, time_limit: float, mip_gap: float,
                 relax_first: bool, memory_weight: float) -> _SolverOutcome:
    """Solve the model (LP relaxation, dive, MIP: :func:`solve_assignment`) and read each node's
    strategy off the solution; a greedy assignment when the time limit passes without one."""
    t1 = time.perf_counter()
    scols = model.scols
    if model.n_bin == 0:
        status = "trivial" if reducer is None or not reducer.eliminated else "optimal"
        return _SolverOutcome([0] * len(prob.nodes), status)
    groups = [idx[idx >= 0] for idx in scols if idx is not None]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = solve_assignment(model.mm, groups, time_limit=time_limit, mip_gap=mip_gap,
                               relax_first=relax_first)
    for w in caught:
        warnings.warn(w.message, w.category, stacklevel=3)
    out = _SolverOutcome([], "", res.result.solver, None,
                  None if res.bound is None else res.bound / _SCALE, res.gap, res.dives, res.mip)
    if res.x is None:
        timed_out = time.perf_counter() - t1 >= 0.95 * time_limit
        if not timed_out:
            raise InfeasiblePlanError(
                f"the intra-op ILP is infeasible on mesh {mesh.shape} (memory_budget="
                f"{memory_budget}). Fix: raise the budget or relax pins.", least_memory=least)
        warnings.warn(
            f"ILP solver stopped at its time limit ({time_limit} s) without a feasible plan; a "
            "greedy plan (each node's cheapest strategy) is used. Fix: raise time_limit.",
            SolverTimeoutWarning, stacklevel=3)
        out.status = "timeout-greedy"
        out.vec = _greedy(prob, memory_budget)
        return out
    out.status = res.result.status
    obj = res.result.objective
    out.solver_objective = None if obj is None or out.status != "optimal" or memory_weight \
        else obj / _SCALE
    if memory_weight:
        out.lower_bound = None  # a bound on time + weight * memory, not on the time
    out.vec = [0 if idx is None else int(np.argmax(np.where(idx >= 0, res.x[idx], -1.0)))
               for idx in scols]
    return out


def _greedy(prob: ILPProblem, memory_budget: float | None) -> list[int]:
    if memory_budget is not None:
        return [int(np.argmin(n.memory)) for n in prob.nodes]
    return [int(np.argmin(n.cost)) for n in prob.nodes]
