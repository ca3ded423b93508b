"""Optimisation levels of the intra-operator search: auto, exhaustive, hierarchical, folded.

* ``"auto"`` (default) — picks one of the others per graph (:func:`choose_level`): the
  exhaustive ILP for graphs small enough that it is the fast path (and for graphs with little
  repetition), the folded search for large graphs of many instances of few classes, bounded in
  the ILPs it may solve before the exhaustive search replaces it.
* ``"exhaustive"`` — one ILP over the whole graph (Alpa; TePDist's O3).
* ``"hierarchical"`` — TePDist's O2: the graph is cut into segments between critical nodes
  (:func:`~autoplan.search.fold._cones.segments`, one per repeated layer plus the embedding and the
  head); an ILP per segment for each pair of boundary strategies, then a dynamic program along the
  chain of segments picks the boundary strategies:

      C(i, b) = min over a of  C(i-1, a) + c_i(a, b),    plan cost = min over b of C(K, b)

  where ``c_i(a, b)`` is segment i's ILP optimum with its incoming boundary tensors fixed to spec
  state ``a`` and its outgoing ones to ``b``.
* ``"folded"`` — TAPAS: the same, but segments with the same structure (a mined
  repeated layer) form a class whose ``c(a, b)`` is solved once and reused by every instance.
  The chain DP still chooses each instance's boundary strategies, so repeated layers are *not*
  forced into one boundary layout (forcing it is how PyTorch AutoParallel's folding loses 11-14%).

Boundary states. The state of a boundary is the spec of its main tensors (the largest tensors
crossing it: the residual-stream activation going forward and its gradient coming back). First
every segment (or class) is solved with free boundaries; each such optimum is a lower bound of its
``c_i``, so when neighbouring segments agree on the specs of their shared boundary the stitched
plan is optimal for the decomposition and no pair ILP is needed. Where they disagree, the
candidate states of that boundary are (TAPAS's pruning to valid, promising patterns: every
candidate passed the ILP's symbolic shape checks):

* the specs the left segment chose, those the right one chose, and every tensor replicated;
* each tensor with the spec its producer chose (the left side's for the activation going
  forward, the right side's for its gradient coming back): a free consumer side often ties;
* for each tensor, that producer spec given to every boundary tensor of its shape (an activation
  and its gradient are best sharded alike; on Wide-ResNet this candidate took the folded plan
  from 13% above the exhaustive ILP to 1.5%);
* each spec of the chain's vocabulary (every spec a free solve gave a boundary tensor it
  produces, anywhere along the chain) given to every boundary tensor it fits: a run of segments
  that each prefer one layout alone may be best kept in the layout of the segments around it, to
  save the two transitions (Wide-ResNet's 14x14 stage: each layer alone prefers batch on one mesh
  axis and channels on the other, the whole graph keeps the batch split on both; this candidate
  took hierarchical and folded from 1.4% above the exhaustive ILP to equal).

The DP needs ``c_i(a, b)`` only along its optimal path, so the pairs are solved lazily: the DP
runs on lower bounds (the free solve, and the one-sided ``c_i(a, free)``, ``c_i(free, b)`` once
solved; fixing more boundary tensors never lowers an optimum), and the pairs of its optimal path
that are bounds only are solved (their one-sided bounds first), until that path is exact: then no
other path can be cheaper, and the result is the full DP's.

A boundary tensor fixed to spec ``a`` is charged, in the segment producing it, the resharding
from its producer's spec to ``a`` once per use in the other segments (``fixed_uses`` of
:func:`~autoplan.search.intra._ilp_problem.build_problem`), and each consumer there ``a`` -> its own spec: the
stitched plan is costed per consumer (producer's spec -> consumer's), so when the consumers read
``a`` (or the producer makes ``a``) the segments' objectives sum to exactly the stitched plan's.
Charged once, a Wide-ResNet activation read by a convolution, a residual add and a shortcut
convolution was gathered once in the DP and three times in the stitched plan (the DP's value was
0.94 ms below its own plan's cost). A folded instance whose boundary tensors have other use
counts than its class representative's (a last layer read by the head) is charged the
difference on top of the representative's value, so the DP's value stays the stitched plan's
cost (tested on Wide-ResNet, GPT and MoE).

Long-range tensors (read by a segment that is not next to their producer's: a tower's output
read by the head of a two-tower model, and its gradient coming back) are not boundary state.
Each is fixed to one spec in its producer's segment and in its consumers', so the segments'
objectives still sum to the stitched plan's cost; the chain DP is run once per assignment (the
producers' free specs, and each spec of the chain's vocabulary given to every long-range tensor
it fits) and the cheapest kept. On two-tower (2x4) this took the folded plan from 8.4% above
the exhaustive ILP to 1.1% (size ``large``) and from 10.5% to 5.9% (``base``), for twice the
ILPs. The assignment is one spec for all long-range tensors, not one per tensor.

The chosen per-segment strategies are stitched into one plan of the whole graph and costed as
chosen by :func:`~autoplan.search.intra._ilp_cost.cost_strategies`: every operator with its segment's
strategy, every operand charged the resharding from its producer's spec to the spec its consumer
needs (tensors that cross more than one boundary included), with the same cost terms as the
exhaustive ILP's objective (an exhaustive plan costed this way gets exactly its ILP objective).
A stitched plan can cost slightly *less* than the exhaustive one: the whole-graph ILP merges each
follower operator (elementwise, reshape, ...) into the operator it follows (Alpa's merging, which
keeps the ILP small), while a segment's ILP sees a boundary tensor as a variable of its own, so a
follower just past a boundary may read a resharded operand that the merged model cannot express.

References:
    TePDist (Alibaba PAI): hierarchical SPMD search over cones and segments, O2/O3.
    Liu et al., "TAPAS: Fast and Automatic Derivation of Tensor Parallel Strategies for Large
    Neural Networks", 2023: folding repeated substructures.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import compress
from typing import Any

import numpy as np

from autoplan._analysis import FoldingAnalysis
from autoplan._errors import InfeasiblePlanError, SearchError
from autoplan._gc import gc_paused
from autoplan._memo import per_owner
from autoplan._options import check_memory_budget, require_graph, require_instance
from autoplan.costs._cluster import Cluster
from autoplan.plans._plan import Plan
from autoplan.search.fold._chain import segment_facts_of, segment_index_of, segments_of
from autoplan.search.fold._layers import layer_order, op_layer_names
from autoplan.search.fold._mine import mining_of
from autoplan.search.fold._summary import analysis_of
from autoplan.search.intra._ilp_cost import cost_strategies
from autoplan.search.intra._ilp_problem import least_memory_bound
from autoplan.search.intra._ilp_solve import ILPSolution, solve_ilp
from autoplan.search.intra._intra import intra_op_search, make_logical_mesh, plan_from_solution
from autoplan.search.intra._pins import pin_specs, pins_key, renamed_pin, resolve_pins
from autoplan.search.intra._reshard import reshard
from autoplan.search.intra._spec_space import enumerate_specs, pruned_by_shape_check, tiles
from autoplan.tracing._graph import OpGraph
from autoplan.tracing._operands import operand_arrays

__all__ = ["LevelResult", "level_search", "choose_level"]


@dataclass
class LevelResult:
    plan: Plan
    stats: dict[str, Any]
    analysis: FoldingAnalysis | None = None
    solution: ILPSolution | None = field(default=None, repr=False)


#: ``level="auto"``: graphs of at most this many operators get the whole-graph ILP, which is then
#: the fast path (about a second on this project's 2-core machine; a folded search has a fixed
#: cost of its free, one-sided and pair solves) and exact
AUTO_EXHAUSTIVE_OPS = 4000
#: ``level="auto"``: larger graphs are folded when mining makes them at least this much smaller
#: (operators / operators of one instance per class plus the rest: TAPAS's fold ratio). GPT's
#: 12 layers fold 8.5x and solve 23 ILPs; Wide-ResNet 250M folds 2.2x, needs 164 pair ILPs and
#: takes 7x its exhaustive ILP's time
AUTO_FOLD_RATIO = 3.0
#: ``level="auto"``: a folded search solves at most ``max(AUTO_MIN_ILPS, AUTO_ILPS_PER_CLASS x
#: unique segment classes)`` ILPs before the exhaustive search replaces it (GPT and MoE fold in
#: 23-25 ILPs; a chain whose boundaries all disagree needs many pair ILPs)
AUTO_MIN_ILPS = 64
AUTO_ILPS_PER_CLASS = 8


class _ILPBoundReached(Exception):
    """Raised inside a folded or hierarchical search when it reaches its ILP bound, or (with an
    automatic bound) when its boundaries already have more one-sided states left to solve than
    the bound leaves (``foreseen``: ``(those states, disagreeing boundaries, boundaries, the
    bound)``)."""

    def __init__(self, solves: int, foreseen: tuple[int, int, int, int] | None = None):
        super().__init__(solves)
        self.solves = solves
        self.foreseen = foreseen


def choose_level(graph: OpGraph) -> tuple[str, str]:
    """The level ``level="auto"`` runs on ``graph``, and why.

    * ``"exhaustive"`` when the graph has at most :data:`AUTO_EXHAUSTIVE_OPS` operators (the
      whole-graph ILP is the fast path), or when folding does not pay (mining's fold ratio below
      :data:`AUTO_FOLD_RATIO`: few repeated blocks);
    * ``"folded"`` otherwise (many instances of few classes), with the ILP bound of
      :func:`level_search`.
    """
    n = len(graph.ops)
    if n <= AUTO_EXHAUSTIVE_OPS:
        return "exhaustive", (f"auto: {n:,} operators (at most {AUTO_EXHAUSTIVE_OPS:,}): the "
                              "whole-graph ILP is the fast path")
    mining = mining_of(graph)
    ratio = mining.fold_ratio
    if ratio < AUTO_FOLD_RATIO:
        return "exhaustive", (f"auto: {n:,} operators but fold ratio {ratio:.2f} (below "
                              f"{AUTO_FOLD_RATIO}): folding does not pay")
    counts = sorted((len(c.instances) for c in mining.classes), reverse=True)
    return "folded", (f"auto: {n:,} operators, fold ratio {ratio:.2f} ({len(counts)} repeated "
                      f"class(es) of {', '.join(map(str, counts[:4]))} instances): folded")


def _exhaustive(graph: OpGraph, cluster: Cluster, mesh_shape, *, memory_budget, pins, time_limit,
                label, config, reason: str | None) -> LevelResult:
    res = intra_op_search(graph, cluster, mesh_shape, memory_budget=memory_budget, pins=pins,
                          time_limit=time_limit, label=label, level="exhaustive", config=config)
    stats = dict(res.stats)
    stats.update({"ilps_solved": 1, "ilp_variables": res.solution.vars_after_merging,
                  "solve_seconds": res.solution.solve_seconds, "level": "exhaustive"})
    plan = res.plan
    if reason:
        stats["level_reason"] = reason
        plan = plan.with_(notes=plan.notes + (reason,))
    return LevelResult(plan, stats, None, res.solution)


@gc_paused
def level_search(graph: OpGraph, cluster: Cluster, mesh_shape: Sequence[int] | None = None, *,
                 level: str = "auto", memory_budget: float | None = None,
                 pins: Mapping[Any, Any] | None = None, time_limit: float = 60.0,
                 config: Mapping[str, Any] | None = None, label: str = "autoplan",
                 max_ilps: int | None = None, pin: Mapping[Any, Any] | None = None
                 ) -> LevelResult:
    """The intra-operator plan of ``graph`` on ``mesh_shape`` at an optimisation level.

    ``level="auto"`` picks the level by :func:`choose_level`; a folded search it picks solves
    at most ``max(AUTO_MIN_ILPS, AUTO_ILPS_PER_CLASS x unique classes)`` ILPs (``max_ilps``
    overrides), after which the exhaustive search replaces it; with this automatic bound it is
    replaced as soon as a run of its chain DP starts with more one-sided boundary states left to
    solve than the bound leaves (:meth:`_ChainSearch._foresee`: a forecast, not a count of what
    the DP would solve). ``stats["level"]`` is the level that ran and ``stats["level_reason"]``
    why (also in the plan's notes).

    A memory budget is enforced exactly by the whole-graph ILP: when a hierarchical or folded plan
    does not fit it, the exhaustive search with the budget is used instead (said in the plan's
    notes).

    The plan's operators name their layers as every view does
    (:func:`~autoplan.search.fold._layers.op_layer_names`): the pipeline search's layers.

    ``pins`` fixes some inputs' specs (:mod:`autoplan.search.intra._pins`); ``pin`` is its old
    name (deprecated: a :class:`DeprecationWarning`).
    """
    pins = renamed_pin("level_search", pins, pin)
    if pins is not None and not isinstance(pins, Mapping):
        raise SearchError(f"level_search: pins should be a dict {{regex over input names: "
                          f"PartitionSpec}}. Got {type(pins).__name__}: {pins!r:.40}. Fix: e.g. "
                          "pins={'^embed': PartitionSpec(None, 'y')}.")
    memory_budget = check_memory_budget("level_search", memory_budget)
    require_graph("level_search", graph)
    require_instance("level_search", "cluster", cluster, Cluster, "pass Cluster.parse('cpu:8')")
    res = _level_search(graph, cluster, mesh_shape, level=level, memory_budget=memory_budget,
                        pins=pins, time_limit=time_limit, config=config, label=label,
                        max_ilps=max_ilps)
    names = op_layer_names(graph)
    stages = tuple(replace(st, ops=tuple(o if o.layer == names[o.op] else replace(o, layer=names[o.op])
                                         for o in st.ops))
                   for st in res.plan.stages)
    order = layer_order(graph)
    stages = tuple(replace(st, layers=order, layer_range=(0, len(order))) for st in stages)
    res.plan = res.plan.with_(stages=stages)
    return res


def _level_search(graph: OpGraph, cluster: Cluster, mesh_shape: Sequence[int] | None, *,
                  level: str, memory_budget: float | None, pins: Mapping[str, Any] | None,
                  time_limit: float, config: Mapping[str, Any] | None, label: str,
                  max_ilps: int | None) -> LevelResult:
    reason = None
    bound_auto = False
    if level == "auto":
        level, reason = choose_level(graph)
        bound_auto = max_ilps is None
    kw = dict(memory_budget=memory_budget, pins=pins, time_limit=time_limit, label=label,
              config=config)
    if level == "exhaustive":
        return _exhaustive(graph, cluster, mesh_shape, reason=reason, **kw)
    try:
        res = _hierarchical(graph, cluster, mesh_shape, level=level, max_ilps=max_ilps,
                            bound_auto=bound_auto, **kw)
    except _ILPBoundReached as stop:
        if stop.foreseen is None:
            why = (f"the {level} search reached its bound of {stop.solves} ILPs before finishing "
                   "(boundaries whose sides disagree need pair ILPs): the exhaustive search was "
                   "used")
        else:
            states, disagree, boundaries, bound = stop.foreseen
            why = (f"the {level} search had {states} one-sided boundary states left to solve "
                   f"after {stop.solves} ILPs ({disagree} of its {boundaries} boundaries "
                   f"disagree), more than its bound of {bound} ILPs leaves: the exhaustive "
                   "search was used")
        return _exhaustive(graph, cluster, mesh_shape,
                           reason=f"{reason}; {why}" if reason else why, **kw)
    res.stats["level"] = level
    if reason:
        res.stats["level_reason"] = reason
        res.plan = res.plan.with_(notes=res.plan.notes + (reason,))
    return res


def _hierarchical(graph: OpGraph, cluster: Cluster, mesh_shape: Sequence[int] | None, *,
                  level: str, memory_budget: float | None, pins: Mapping[str, Any] | None,
                  time_limit: float, config: Mapping[str, Any] | None, label: str,
                  max_ilps: int | None, bound_auto: bool) -> LevelResult:
    """The hierarchical and folded levels (see the module docstring)."""
    t0 = time.perf_counter()
    mesh = make_logical_mesh(cluster, mesh_shape)
    mining = mining_of(graph)
    pk = pins_key(pins)  # (in order: a later pin overrides an earlier one; None: unhashable)
    key = (cluster, None if mesh_shape is None else tuple(mesh_shape), level, pk, time_limit,
           max_ilps, bound_auto)
    stitched = None if pk is None else _stitched_of(graph).get(key)
    reused = stitched is not None
    if stitched is None:
        try:
            stitched = _stitch(graph, mesh, level=level, pins=pins, time_limit=time_limit,
                               max_ilps=max_ilps, bound_auto=bound_auto, t0=t0)
        except _ILPBoundReached as stop:
            stitched = stop  # (kept too: a search with this key stops at once)
        if pk is not None:
            _stitched_of(graph)[key] = stitched
    if isinstance(stitched, _ILPBoundReached):  # (this search, or an earlier one, stopped)
        raise stitched
    search, run, mismatches, seg_class, sol, (t_mine, t_seg, t_dp, t_stitch, total) = stitched
    K, agree = search.K, run.agree
    if memory_budget is not None and sol.memory_per_device > memory_budget * (1 + 1e-9):
        _refuse_by_bound(graph, mesh, memory_budget)
        res = intra_op_search(graph, cluster, mesh_shape, memory_budget=memory_budget, pins=pins,
                              time_limit=time_limit, label=label, level=level, config=config)
        plan = res.plan.with_(notes=res.plan.notes + (
            f"the {level} plan needed {sol.memory_per_device:.4g} bytes per device, over the "
            "budget; the exhaustive search with the memory constraint was used",))
        sol = res.solution
    else:
        plan = plan_from_solution(graph, mesh, sol, label=label, level=level, config=config,
                                  search_seconds=total)
        n_unique = len(set(seg_class))
        plan = plan.with_(notes=(
            f"{level}: {K} segments, {n_unique} solved ({search.solves} ILPs, "
            f"{search.variables} variables); {sum(1 for x in agree if not x)} boundaries needed "
            f"pair ILPs; fold ratio {mining.fold_ratio:.2f}",))
    analysis = analysis_of(graph)
    stats = {
        "operators": len(graph), "graphnodes": len(mining.graphnodes.nodes)
        if hasattr(mining.graphnodes, "nodes") else 0,
        "segments": K, "unique_classes": len(set(seg_class)), "mined_classes": len(mining.classes),
        "fold_ratio": mining.fold_ratio, "ilps_solved": search.solves,
        # (the segments' ILPs above were solved by an earlier search of this graph, with the
        # same cluster, mesh, level, pins and limits: none was solved again; the seconds are
        # that search's)
        "stitched_plan_reused": reused,
        "ilp_variables": search.variables,
        "boundaries_needing_pairs": sum(1 for x in agree if not x), "stitch_mismatches": mismatches,
        "specs_pruned_by_shape_check": search.specs_pruned(seg_class),
        "mine_seconds": t_mine, "segment_seconds": t_seg, "solve_seconds": search.t_solve,
        "dp_seconds": t_dp, "stitch_seconds": t_stitch, "total_seconds": total,
        "objective": sol.objective, "dp_value": run.dp_value,
    }
    return LevelResult(plan, stats, analysis, sol)


#: how far above the budget :func:`least_memory_bound` must be to refuse a mesh by it alone (far
#: above float rounding: a bound within it goes to the exact test)
BOUND_MARGIN = 1e-6


def _refuse_by_bound(graph: OpGraph, mesh, memory_budget: float) -> None:
    """Raise where no plan of ``graph`` on ``mesh`` can fit ``memory_budget`` by
    :func:`~autoplan.search.intra._ilp_problem.least_memory_bound` alone: the exhaustive search
    with the budget would refuse it too, after building every node of the whole step to learn
    the exact least (a large step's whole-graph nodes take a second per mesh; the Explorer's
    memory-budget change on GPT 39B refused its four meshes this way).

    Raises:
        InfeasiblePlanError: the bound is over the budget (``least_memory`` None: the bound is
            not the least itself).
    """
    bound = least_memory_bound(graph, mesh)
    if bound > memory_budget * (1 + BOUND_MARGIN):
        raise InfeasiblePlanError(
            f"no plan fits memory_budget={memory_budget:.4g} bytes per device on mesh "
            f"{mesh.shape}: any plan needs at least {bound:.4g} bytes (the parameters, optimizer "
            f"state, batch and saved activations spread over all {mesh.size} devices). Fix: "
            "raise the budget, use more devices, or enable pipelining/rematerialisation.")


@per_owner
def _stitched_of(graph: OpGraph) -> dict[tuple, tuple]:
    """The stitched plans of the hierarchical and folded searches of ``graph`` (:func:`_stitch`),
    by the cluster, mesh, level, pins, time limit and ILP bound (or the :class:`_ILPBoundReached`
    that stopped one): a stitched plan does not read the memory budget (a plan over it is
    replaced by the exhaustive search with the budget), so a search that changes only the budget
    (the Explorer's) solves no segment again."""
    return {}


def _stitch(graph: OpGraph, mesh: Any, *, level: str, pins: Mapping[str, Any] | None,
            time_limit: float, max_ilps: int | None, bound_auto: bool, t0: float) -> tuple:
    """The hierarchical or folded search up to its stitched solution: ``(the chain search, the
    chosen chain run, stitch mismatches, segment classes, the solution, (mine, segment, DP,
    stitch and total seconds))``."""
    t_mine = time.perf_counter() - t0
    t1 = time.perf_counter()
    search = _ChainSearch(graph, mesh, level=level, pins=pins, time_limit=time_limit,
                          max_ilps=max_ilps, bound_auto=bound_auto)
    t_seg = time.perf_counter() - t1

    # 1. free solves (nothing fixed), and the assignments of the long-range and shared tensors
    unfixed_solves = [search.solve_segment(i, None, None) for i in range(search.K)]
    assigns = search.assignments(unfixed_solves)
    t2 = time.perf_counter()
    runs = [search.run_chain(a, unfixed_solves) for a in assigns]
    t_dp = time.perf_counter() - t2
    t3 = time.perf_counter()
    run, bd, mismatches = search.stitch_best(runs)
    seg_class = search.segment_classes()
    t_stitch = time.perf_counter() - t3
    total = time.perf_counter() - t0
    sol = search.stitched_solution(bd)
    return search, run, mismatches, seg_class, sol, (t_mine, t_seg, t_dp, t_stitch, total)


@dataclass
class _ChainRun:
    """The chain DP's result for one assignment of the long-range and shared tensors."""

    dp_value: float  # the DP's optimum: the sum of the chosen solves' objectives
    path: list[tuple[tuple | None, tuple | None]]  # per segment, its (incoming, outgoing) states
    free: list  # per segment, its free solve under this assignment: (objective, _SegmentView)
    fixed_specs: list[dict[int, Any]]  # per segment, the specs the assignment fixed in it
    cands: list[list[tuple]]  # per boundary, its candidate states
    agree: list[bool]  # per boundary, whether its sides' free solves agree (no pair ILPs)


class _ChainSearch:
    """One hierarchical or folded search of a graph cut into a chain of segments (see the module
    docstring): the segments' ILPs, solved once per class key and boundary states and counted
    against the ILP bound, the chain DP over boundary states, and the stitching of the chosen
    solves into one plan of the whole graph."""

    def __init__(self, graph: OpGraph, mesh, *, level: str, pins: Mapping[str, Any] | None,
                 time_limit: float, max_ilps: int | None, bound_auto: bool):
        self.graph, self.mesh, self.level = graph, mesh, level
        self.pins, self.time_limit = pins, time_limit
        self.segs = segments_of(graph)
        self.seg_of, position = segment_index_of(graph)
        self.K = K = len(self.segs)
        self.pinned = resolve_pins(graph, pins)  # {input tensor: PartitionSpec}
        # (the same for every search of this graph's segments: the baselines share them)
        (self.boundaries, self.long_range, self.shared, self.pair_out, self.outside_uses,
         self.sig) = segment_facts_of(graph)
        # each segment's pinned operands (operator position, operand index, spec): instances of a
        # class pinned alike share its solves
        self.pin_key = (_pin_keys(graph, self.seg_of, position, self.pinned, K) if self.pinned
                        else [])
        self.max_ilps = (max(AUTO_MIN_ILPS, AUTO_ILPS_PER_CLASS * len(set(self.sig)))
                         if bound_auto else max_ilps)
        self.bound_auto = bound_auto  # (then a bound foreseen is a bound reached: _foresee)
        self.solves = 0  # ILPs solved
        self.variables = 0  # their variables after merging
        self.t_solve = 0.0  # seconds spent solving them
        # (class key, incoming state, outgoing state) -> (objective, strategies, specs)
        self.cache: dict[tuple, tuple[float, dict[int, Any], dict[int, Any]]] = {}
        # per segment, the specs fixed on the tensors it shares with segments it does not border
        # (long-range tensors, graph inputs read by several segments): {tensor: spec}, set per
        # assignment tried by run_chain
        self.fixed_specs: list[dict[int, Any]] = [{} for _ in range(K)]
        self.rep_of: dict[str, int] = {}  # class key -> its representative (first) segment
        self.view_cache: dict[tuple, Any] = {}  # what the segments' views share (see _SegmentView)
        self.act_least: dict[str, float] = {}  # class key -> least saved-activation memory
        self.unknown: set[str] = set()
        self.long_range_tensors = list(dict.fromkeys(t for lst in self.long_range for t in lst))
        self.adjacent = {t for bt in self.boundaries for t in bt}
        self._valid: dict[tuple[int, ...], set] = {}  # shape -> its valid specs

    # -- the segments' solves ----------------------------------------------------------------

    def class_key(self, i: int) -> str:
        """Segments with equal keys are solved once when folding."""
        graph, seg_fixed = self.graph, self.fixed_specs[i]
        key = self.sig[i]
        if self.pinned:  # the pinned operands' positions and specs (equal pins, one solve)
            key += "|" + self.pin_key[i]
        if seg_fixed:
            pos = {o: p for p, o in enumerate(self.segs[i].ops)}
            key += "|" + repr(sorted(
                [(pos[c], graph.ops[c].inputs.index(t), spec)
                 for t, spec in seg_fixed.items() for c in graph.consumers[t] if c in pos]
                + [(pos[p], -1 - graph.ops[p].outputs.index(t), spec)
                   for t, spec in seg_fixed.items()
                   if (p := graph.tensors[t].producer) in pos]))
        return key if self.level == "folded" else f"{key}#{i}"

    def solve_segment(self, i: int, a: tuple | None, b: tuple | None):
        """c_i(a, b) with the strategies and specs of segment i (mapped from its class's
        representative when folding)."""
        ck = self.class_key(i)
        rep = self.rep_of.setdefault(ck, i)
        key = (ck, a, b)
        if key not in self.cache:
            self.cache[key] = self._solve(rep, ck, a, b)
        obj, strats, specs = self.cache[key]
        if i != rep and self.outside_uses[i] != self.outside_uses[rep]:
            obj += self.extra_uses(i, rep, a, b, specs)
        return obj, _SegmentView(self.graph, self.segs[rep].ops, self.segs[i].ops, strats, specs,
                                 self.view_cache)

    def _solve(self, rep: int, ck: str, a: tuple | None, b: tuple | None
               ) -> tuple[float, dict[int, Any], dict[int, Any]]:
        """The ILP of segment ``rep`` (a class representative) with its incoming boundary fixed
        to ``a`` and its outgoing one to ``b`` (None: free), counted against the ILP bound."""
        if self.max_ilps is not None and self.solves >= self.max_ilps:
            raise _ILPBoundReached(self.solves)
        fixed = dict(self.fixed_specs[rep])
        if a is not None and rep > 0:
            fixed.update(dict(zip(self.boundaries[rep - 1], a)))
        if b is not None and rep < self.K - 1:
            fixed.update(dict(zip(self.boundaries[rep], b)))
        ts = time.perf_counter()
        sol = solve_ilp(self.graph, self.mesh, ops=self.segs[rep].ops, fixed=fixed or None,
                        pins=self.pins, time_limit=self.time_limit)
        self.t_solve += time.perf_counter() - ts
        self.solves += 1
        self.variables += sol.vars_after_merging
        self.unknown.update(sol.unknown_primitives)
        if a is None and b is None and sol.problem is not None:
            self.act_least[ck] = float(sum(n.memory.min() for n in sol.problem.nodes
                                           if n.kind == "op"))
        return sol.objective, sol.strategies, sol.specs

    def extra_uses(self, i: int, rep: int, a: tuple | None, b: tuple | None, specs) -> float:
        """What segment i's fixed boundaries cost beyond its class representative's solve: a
        boundary tensor made inside and fixed to a spec is charged the resharding to it once per
        use outside, and the representative's solve counted its own uses (the last GPT layer's
        output, say, is read by the final norm, not by a next layer)."""
        K, boundaries, outside_uses = self.K, self.boundaries, self.outside_uses
        if len(outside_uses[i]) != len(outside_uses[rep]):
            return 0.0
        extra, k = 0.0, 0
        for fixed, bi, br in ((a, i - 1, rep - 1), (b, i, rep)):
            if not 0 <= bi < K - 1:
                continue
            for m in range(len(boundaries[bi])):
                ui, ur = outside_uses[i][k], outside_uses[rep][k]
                k += 1
                if fixed is None or ui == ur or min(ui, ur) < 0 or not 0 <= br < K - 1:
                    continue
                t = boundaries[br][m]
                src = specs.get(t)
                if src is not None and src != fixed[m]:
                    ten = self.graph.tensors[t]
                    extra += (ui - ur) * reshard(src, fixed[m], ten.shape, ten.dtype, self.mesh)[0]
        return extra

    # -- boundary specs ------------------------------------------------------------------------

    def vocabulary(self, free: list) -> list:
        """The chain's spec vocabulary: every spec a free solve gave a boundary tensor it
        makes."""
        graph, seg_of = self.graph, self.seg_of
        return list(dict.fromkeys(
            sp for bt in self.boundaries for t in bt
            if (sp := free[seg_of[graph.tensors[t].producer]][1].spec(t)) is not None))

    def fits(self, spec, shape: tuple[int, ...]) -> bool:
        """Whether ``spec`` is a valid spec of a tensor of ``shape`` on the mesh."""
        if shape not in self._valid:
            self._valid[shape] = set(enumerate_specs(shape, self.mesh))
        return spec in self._valid[shape]

    def assignments(self, unfixed_solves: list) -> list[dict[int, Any]]:
        """The assignments of specs to the long-range and shared tensors that the chain DP is run
        for. A tensor that skips segments (long-range) is fixed to one spec in its producer's
        segment and in its consumers' (so the segments' objectives still sum to the stitched
        plan's cost): its producer's free spec, or one spec of the chain's vocabulary given to
        every long-range tensor it fits. A graph input read by several segments takes one spec in
        all of them: its first reader's free choice, or replicated (pinned inputs keep their
        pin)."""
        graph = self.graph
        if self.long_range_tensors:  # their producers' specs in the unfixed solves
            producer_specs = {t: unfixed_solves[self.seg_of[graph.tensors[t].producer]][1].spec(t)
                              for t in self.long_range_tensors}
            producer_specs = {t: sp for t, sp in producer_specs.items() if sp is not None}
            unfixed_vocab = self.vocabulary(unfixed_solves)
            unfixed_vocab += [sp for sp in producer_specs.values() if sp not in unfixed_vocab]
            assigns = [producer_specs] + [
                {t: v if self.fits(v, graph.tensors[t].shape) else sp
                 for t, sp in producer_specs.items()} for v in unfixed_vocab]
            assigns = list({repr(sorted(a.items())): a for a in assigns}.values())
        else:
            assigns = [{}]
        if self.shared:
            own = {t: unfixed_solves[r[0]][1].spec(t) for t, r in self.shared.items()}
            own = {t: sp for t, sp in own.items() if sp is not None}
            replicated_inputs = {t: (None,) * len(graph.tensors[t].shape) for t in own
                                 if t not in self.pinned}
            assigns = ([{**a, **own} for a in assigns]
                       + [{**assigns[0], **own, **replicated_inputs}])
            assigns = list({repr(sorted(a.items())): a for a in assigns}.values())
        return assigns

    def _fix(self, assign: dict[int, Any]) -> None:
        """Sets each segment's fixed specs from an assignment of the long-range and shared
        tensors."""
        graph, fixed_specs = self.graph, self.fixed_specs
        for i in range(self.K):
            fixed_specs[i] = {t: assign[t] for t in self.long_range[i] if t in assign}
        for t, spec in assign.items():
            if t in self.shared:  # a graph input: fixed wherever it is read, and its update's result
                for r in self.shared[t]:
                    fixed_specs[r][t] = spec
                for o, p in self.pair_out.get(t, ()):
                    fixed_specs[p][o] = spec
            elif t not in self.adjacent:
                fixed_specs[self.seg_of[graph.tensors[t].producer]][t] = spec

    def boundary_candidates(self, free: list) -> list[list[tuple]]:
        """2. Per boundary, its candidate states where the free solves disagree (one state, the
        agreed one, where they agree; see the module docstring)."""
        graph = self.graph
        vocab = self.vocabulary(free)
        cands: list[list[tuple]] = []
        for i in range(self.K - 1):
            bt = self.boundaries[i]
            shapes = [graph.tensors[t].shape for t in bt]
            replicated = tuple((None,) * len(sh) for sh in shapes)
            left = tuple(free[i][1].spec(t) for t in bt)
            right = tuple(free[i + 1][1].spec(t) for t in bt)
            # a side whose ILP does not decide a tensor's spec (it reads it only in operators
            # that are not decided, or not at all) takes the other side's, or replicated
            left, right = (tuple(x if x is not None else y if y is not None else r
                                 for x, y, r in zip(p, q, replicated))
                           for p, q in ((left, right), (right, left)))
            opts = [left]
            if left != right:
                prod = tuple(free[self.seg_of[graph.tensors[t].producer]][1].spec(t) or x
                             for t, x in zip(bt, left))
                opts += [right, replicated, prod] + [
                    tuple(sj if shapes[m] == shapes[j] else prod[m] for m in range(len(bt)))
                    for j, sj in enumerate(prod)]
                opts += [tuple(v if self.fits(v, shapes[m]) else prod[m] for m in range(len(bt)))
                         for v in vocab]
            cands.append(list(dict.fromkeys(o for o in opts if all(x is not None for x in o))))
        return cands

    # -- the chain DP ----------------------------------------------------------------------------

    def run_chain(self, assign: dict[int, Any], unfixed_solves: list) -> _ChainRun:
        """The chain DP for one assignment of the long-range and shared tensors."""
        self._fix(assign)
        free = [self.solve_segment(i, None, None) if self.fixed_specs[i] else unfixed_solves[i]
                for i in range(self.K)]
        cands = self.boundary_candidates(free)
        dp_value, path, agree = self.chain_dp(free, cands)
        return _ChainRun(dp_value, path, free, [dict(x) for x in self.fixed_specs], cands, agree)

    def chain_dp(self, free: list, cands: list[list[tuple]]):
        """3. The chain DP over boundary states (state None: free, where both sides agree), run
        on lower bounds and tightened along its optimal path until that path is exact:
        ``(value, path, agree)``."""
        agree = [len(c) == 1 for c in cands]  # (left == right: the options hold both else)
        options = [[None] if agree[i] else list(cands[i]) for i in range(self.K - 1)]
        ckey = [self.class_key(i) for i in range(self.K)]  # fixed from here on (fixed_specs is)
        if self.bound_auto:
            self._foresee(cands, agree, ckey)
        while True:
            dp_value, path = self._dp_over_bounds(free, options, ckey)
            todo = [(i, a, b) for i, (a, b) in enumerate(path) if not self._solved(ckey, i, a, b)]
            if not todo:  # the optimum over bounds is made of exact values: it is the optimum
                return dp_value, path, agree
            for i, a, b in todo:  # tighten: one-sided solves first, then the pair itself
                if self._solved(ckey, i, a, None) and self._solved(ckey, i, None, b):
                    self._exact(free, i, a, b)
                else:
                    self._exact(free, i, a, None)
                    self._exact(free, i, None, b)

    def _foresee(self, cands: list[list[tuple]], agree: list[bool], ckey: list[str]) -> None:
        """Raise :class:`_ILPBoundReached` at the start of a run of the chain DP when the
        one-sided states of the disagreeing boundaries not solved yet (``c_i(free, b)`` and
        ``c_i(a, free)`` of each candidate, once per class key) outnumber what the automatic
        bound leaves.

        A forecast, not a count: the lazy DP tightens its path with one-sided solves drawn from
        these (only those on its best path), and on the zoo's chains that finished it met most
        of them (GPT: 20 of 20, MoE: 17 of 20); a chain whose boundaries all disagree
        (Wide-ResNet 13B: 34 of 34, 84-176 such states for a bound of 80) reached the bound on
        every mesh after 70 solves, and its plan was then the exhaustive search's. Where the DP
        would have finished within the bound, the exhaustive ILP's plan (the optimum of the
        whole graph) is used instead, at its cost in time."""
        states = self.one_sided_left(cands, agree, ckey)
        if self.solves + len(states) > self.max_ilps:
            raise _ILPBoundReached(self.solves, (len(states), agree.count(False), self.K - 1,
                                                 self.max_ilps))

    def one_sided_left(self, cands: list[list[tuple]], agree: list[bool], ckey: list[str]
                       ) -> set[tuple]:
        """The one-sided ILPs of the disagreeing boundaries not solved yet: each candidate state
        ``s`` of boundary ``i`` as segment ``i``'s outgoing side and segment ``i + 1``'s
        incoming one, keyed as :meth:`solve_segment` caches them."""
        return {key for i in range(self.K - 1) if not agree[i] for s in cands[i]
                for key in ((ckey[i], None, s), (ckey[i + 1], s, None)) if key not in self.cache}

    def _dp_over_bounds(self, free: list, options: list[list[tuple | None]], ckey: list[str]
                        ) -> tuple[float, list[tuple[tuple | None, tuple | None]]]:
        """One pass of C(i, b) = min over a of C(i-1, a) + c_i(a, b) with each c_i its best bound
        so far: the optimum and its path."""
        K = self.K
        best: dict[Any, tuple[float, list]] = {}
        for b in (options[0] if K > 1 else [None]):
            best[b] = (self._bound(free, ckey, 0, None, b), [(None, b)])
        for i in range(1, K):
            nxt: dict[Any, tuple[float, list]] = {}
            outs = options[i] if i < K - 1 else [None]
            for a, (acc, path) in best.items():
                for b in outs:
                    v = acc + self._bound(free, ckey, i, a, b)
                    if b not in nxt or v < nxt[b][0]:
                        nxt[b] = (v, path + [(a, b)])
            best = nxt
        return min(best.values(), key=lambda x: x[0])

    def _solved(self, ckey: list[str], i: int, a: tuple | None, b: tuple | None) -> bool:
        return (a is None and b is None) or (ckey[i], a, b) in self.cache

    def _exact(self, free: list, i: int, a: tuple | None, b: tuple | None) -> float:
        return free[i][0] if a is None and b is None else self.solve_segment(i, a, b)[0]

    def _bound(self, free: list, ckey: list[str], i: int, a: tuple | None, b: tuple | None
               ) -> float:
        """c_i(a, b) when solved, else its best lower bound solved so far (fixing more boundary
        tensors never lowers a segment's optimum: c_i(a, b) >= c_i(a, free), c_i(free, b)).
        An instance valued from its representative with other use counts (see extra_uses)
        takes its representative's one-sided optima as bounds only where it has at least as
        many uses as the representative (it then pays at least as much for any plan), else
        its free solve alone."""
        if a is None or b is None or self._solved(ckey, i, a, b):
            return self._exact(free, i, a, b)
        ui, ur = self.outside_uses[i], self.outside_uses[self.rep_of[ckey[i]]]
        one_sided_states = ((a, None), (None, b))
        if ui == ur:
            one_sided = [self._exact(free, i, x, y) for x, y in one_sided_states
                         if self._solved(ckey, i, x, y)]
        elif len(ui) == len(ur) and all(u >= v for u, v in zip(ui, ur) if min(u, v) >= 0):
            one_sided = [self.cache[(ckey[i], x, y)][0] for x, y in one_sided_states
                         if self._solved(ckey, i, x, y)]
        else:
            one_sided = []
        return max([free[i][0]] + one_sided)

    # -- the stitched plan -----------------------------------------------------------------------

    def stitch(self, run: _ChainRun) -> tuple[Any, int]:
        """4. A run's segment strategies stitched and costed as chosen on the whole graph:
        ``(breakdown, mismatches)`` of :func:`~autoplan.search.intra._ilp.cost_strategies`."""
        for i in range(self.K):
            self.fixed_specs[i] = run.fixed_specs[i]
        op_strat: dict[int, Any] = {}
        in_spec: dict[int, Any] = {}
        for i, (a, b) in enumerate(run.path):
            view = run.free[i][1] if a is None and b is None else self.solve_segment(i, a, b)[1]
            op_strat.update(view.strategies())
            for t, sp in view.input_specs():
                in_spec.setdefault(t, sp)
        return cost_strategies(self.graph, self.mesh, op_strat, in_spec, pins=self.pins)

    def stitch_best(self, runs: list[_ChainRun]) -> tuple[_ChainRun, Any, int]:
        """The run whose stitched plan is cheapest (ties: the lower DP value, then the first),
        with its breakdown and mismatches; the segments' fixed specs are left as that run's."""
        if len(runs) == 1:
            k_best, (bd, mismatches) = 0, self.stitch(runs[0])
        else:
            stitched = [self.stitch(r) for r in runs]
            k_best = min(range(len(runs)),
                         key=lambda k: (stitched[k][0].objective, runs[k].dp_value))
            bd, mismatches = stitched[k_best]
        run = runs[k_best]
        for i in range(self.K):
            self.fixed_specs[i] = run.fixed_specs[i]
        return run, bd, mismatches

    def segment_classes(self) -> list[int]:
        """Per segment, the index of its class among the classes solved (-1: none)."""
        keys = [self.class_key(i) for i in range(self.K)]
        return [list(self.rep_of).index(k) if k in self.rep_of else -1 for k in keys]

    def specs_pruned(self, seg_class: list[int]) -> int:
        """The specs the shape check pruned from the outputs of the solved representatives."""
        graph = self.graph
        return pruned_by_shape_check(
            [graph.tensors[t].shape for s in self.segs if seg_class[s.id] >= 0
             and self.rep_of.get(self.class_key(s.id)) == s.id
             for o in s.ops for t in graph.ops[o].outputs],
            self.mesh)

    def stitched_solution(self, bd) -> ILPSolution:
        """The stitched plan's breakdown as the solution of the whole graph."""
        n_ops = len(bd.op_strategy)
        least = (sum(self.act_least[self.class_key(i)] for i in range(self.K))
                 + _least_input_memory(self.graph, self.mesh, self.pins))
        return ILPSolution(
            choice={}, strategies=bd.op_strategy,
            specs=bd.specs, objective=bd.objective, compute_time=bd.compute, comm_time=bd.comm,
            penalty=bd.penalty, memory_per_device=bd.memory, least_memory=least,
            comms=tuple(bd.comms), vars_before_merging=0, vars_after_merging=self.variables,
            num_binaries=0, num_edge_vars=0, num_constraints=0, num_nodes=n_ops,
            num_ops=n_ops, build_seconds=0.0, solve_seconds=self.t_solve,
            status="optimal", solver="HiGHS", unknown_primitives=tuple(sorted(self.unknown)),
            reshard_readers=bd.reshard_readers)


def _pin_keys(graph: OpGraph, seg_of: list[int], position: list[int],
              pinned: Mapping[int, Any], K: int) -> list[str]:
    """Per segment, its pinned operands as ``position.operand=spec``, joined by commas in the
    order of its operators and their operands (instances of a class pinned alike get equal
    keys); the pinned operands are found over the flat operand arrays."""
    arr = operand_arrays(graph)
    keys = np.fromiter(pinned, np.int64, len(pinned))
    where = np.flatnonzero(np.isin(arr.tensor, keys))  # the pinned operands, in operator order
    readers = arr.reader[where]
    operand = (where - arr.start[readers]).tolist()
    tensors = arr.tensor[where].tolist()
    text = {t: str(sp) for t, sp in pinned.items()}
    parts: list[list[tuple[int, int, str]]] = [[] for _ in range(K)]
    for o, k, t in zip(readers.tolist(), operand, tensors):
        i = seg_of[o]
        if i >= 0:
            parts[i].append((position[o], k, text[t]))
    return [",".join(f"{p}.{k}={x}" for p, k, x in sorted(ps)) for ps in parts]


def _least_input_memory(graph: OpGraph, mesh, pins: Mapping[str, Any] | None) -> float:
    """Bytes per device of the graph's inputs, each sharded as much as its shape allows (or as
    pinned)."""
    pinned = pin_specs(graph, mesh, pins)
    most: dict[tuple[int, ...], int] = {}  # shape -> most tiles a spec of it gives
    n_tiles: dict[Any, int] = {}  # pinned spec -> its tiles (a baseline pins every input)
    total = 0.0
    for gi in graph.inputs:
        ten = graph.tensors[gi.tensor]
        sp = pinned.get(gi.tensor)
        if sp is not None:
            n = n_tiles.get(sp)
            if n is None:
                n = n_tiles[sp] = tiles(sp, mesh)
            total += ten.nbytes / n
            continue
        n = most.get(ten.shape)
        if n is None:
            n = most[ten.shape] = max(tiles(sp, mesh) for sp in enumerate_specs(ten.shape, mesh))
        total += ten.nbytes / n
    return total


class _SegmentView:
    """A segment's solved strategies and specs, taken from its class representative's solve
    through the position-by-position correspondence of the two (equal) operator lists; mapped on
    use, since the chain DP needs only the objectives and the boundaries only a few specs."""

    def __init__(self, graph: OpGraph, rep_ops: Sequence[int], ops: Sequence[int],
                 strats: Mapping[int, Any], specs: Mapping[int, Any],
                 shared: dict[tuple, Any] | None = None):
        self.graph, self.rep_ops, self.ops = graph, rep_ops, ops
        self.strats, self.specs = strats, specs
        self.same = rep_ops is ops or tuple(rep_ops) == tuple(ops)
        # what views of one search share, by the identity of objects the search keeps alive
        # (segments' operator lists, solves' specs): positions, and a solve's graph inputs
        self._shared = {} if shared is None else shared

    def _positions(self, ops: Sequence[int]) -> dict[int, int]:
        key = ("position", id(ops))
        pos = self._shared.get(key)
        if pos is None:
            pos = self._shared[key] = ({o: k for k, o in enumerate(ops)}, ops)
        return pos[0]

    @property
    def _position(self) -> dict[int, int]:
        """Each operator's position in the segment."""
        return self._positions(self.ops)

    @property
    def _rep_position(self) -> dict[int, int]:
        """Each representative operator's position in its segment (read by both
        :meth:`strategies` and :meth:`input_specs` when stitching)."""
        return self._positions(self.rep_ops)

    def strategies(self) -> dict[int, Any]:
        """``{operator id: strategy}`` of this segment's operators."""
        if self.same:
            return dict(self.strats)
        # the positions of the solve's operators in the representative, once per solve
        key = ("strategy positions", id(self.strats), id(self.rep_ops))
        found = self._shared.get(key)
        if found is None:
            rep_pos = self._rep_position
            kept = [o in rep_pos for o in self.strats]
            found = self._shared[key] = (
                [rep_pos[o] for o in self.strats if o in rep_pos], kept, self.strats, self.rep_ops)
        positions, kept = found[0], found[1]
        values = self.strats.values()
        if not all(kept):
            values = compress(values, kept)
        return dict(zip(map(self.ops.__getitem__, positions), values))

    def spec(self, t: int):
        """The spec the solve gave tensor ``t`` (made or read by this segment), or None."""
        if self.same:
            return self.specs.get(t)
        ops = self.graph.ops
        pos = self._position
        p = self.graph.tensors[t].producer
        if p in pos:
            return self.specs.get(ops[self.rep_ops[pos[p]]].outputs[ops[p].outputs.index(t)])
        for c in self.graph.consumers[t]:
            if c in pos:
                return self.specs.get(ops[self.rep_ops[pos[c]]].inputs[ops[c].inputs.index(t)])
        return None

    def input_specs(self) -> list[tuple[int, Any]]:
        """``(graph input tensor, spec)`` for the graph inputs this segment reads."""
        tensors, ops = self.graph.tensors, self.graph.ops
        key = ("inputs", id(self.specs))
        found = self._shared.get(key)
        if found is None:
            found = self._shared[key] = (
                [(t, s) for t, s in self.specs.items() if tensors[t].producer < 0], self.specs)
        ins = found[0]
        if self.same:
            return ins
        # where the representative first reads each of them (position, operand), once per solve
        key = ("input reads", id(self.specs), id(self.rep_ops))
        reads = self._shared.get(key)
        if reads is None:
            rep_pos = self._rep_position
            first = []
            for t, s in ins:
                r = next((c for c in self.graph.consumers[t] if c in rep_pos), None)
                if r is not None:
                    first.append((rep_pos[r], ops[r].inputs.index(t), s))
            reads = self._shared[key] = (first, self.specs, self.rep_ops)
        out = []
        for p, k, s in reads[0]:
            u = ops[self.ops[p]].inputs[k]
            if u is not None and tensors[u].producer < 0:
                out.append((u, s))
        return out
