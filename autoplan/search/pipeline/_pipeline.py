"""The inter-operator (pipeline) search: layers -> stage costs -> stage DP or DAG ILP -> Plan.

Steps (Alpa's inter-operator pass, with TAPAS's folding and TePDist's DAG stage ILP):

1. **Micro-batch graph.** The global batch is the leading dimension of the step's batch arguments
   (the graph inputs of kind ``batch``). The step is traced at micro-batch size (that dimension
   divided by the number of micro-batches ``B``) and its operators are grouped into layers
   (:func:`~autoplan.search.fold._layers.group_layers`).
2. **Layer plans.** For every layer, submesh shape ``(n, m)`` (Alpa's (1,1), (1,2) ... (1,M),
   (2,M) ... (N,M) on ``N`` hosts of ``M`` devices) and logical mesh of that submesh, the
   intra-operator ILP is solved on the layer's subgraph, once per layer kind (folding: a
   96-layer GPT solves three kinds). Each cell has two variants: the fastest plan and a
   memory-lean one (:func:`_lean_plan`). These solves are independent: one task per layer
   kind, submesh and logical mesh (:func:`layer_plans`) on the search's worker processes
   (``workers=``), each kind's subgraph sent to a worker once.
3. **Per-micro-batch and per-step work** (:class:`LayerCost`). The forward and the backward
   (their compute, their collectives, the resharding of activations) run once per micro-batch.
   The gradient synchronisation across a stage's data-parallel devices (the collectives the ILP
   tags ``grad-sync``), the optimizer update, the resharding of updated parameters back to their
   specs and the all-gathers of parameters a plan keeps sharded run once per step: gradients
   accumulate over the micro-batches (Alpa's apply-gradient stage). A stage of ``B``
   micro-batches costs ``B x per-micro-batch + per-step``. Its gradient synchronisation follows
   the last micro-batch's backward and overlaps with it as the cluster's ``gamma`` says (the ILP's
   gradient collectives are already discounted by it). The layer ILPs weight the per-step terms
   by ``1 / B`` (:func:`per_step_weighted`), so each layer's plan is chosen for the step as it
   runs.
4. **Stage costs.** ``t(i..j, submesh, logical mesh)``, per micro-batch, is its layers' forward
   and backward, plus the resharding between two layers of the stage whose plans disagree on
   the specs of the tensors one passes to the other (from the producer's spec to the one the
   consumer's ILP assumed, per tensor), plus the time to receive its input activations and its
   output gradients (send/recv, or Alpa's send of 1/n slices and all-gather on the receiving
   mesh). Memory by Alpa's Eq. 5: parameters, gradient buffers, optimizer state and parameters
   gathered for the step held once, plus the activations of the micro-batches in flight
   (``min(S - s, B)`` on the s-th stage in 1F1B, ``B`` in GPipe).
5. **Stages.** Alpa's stage DP (:func:`~autoplan.search.pipeline._stage_dp.stage_dp`, with the
   first stage's per-step work) picks stages, submeshes and logical meshes within the memory
   limit. Side tensors (a skip edge of at most :data:`SIDE_TENSOR_FRACTION` of the layers'
   median activation, like a loss term carried from layer to layer) do not make the layer graph a
   non-chain. For a true DAG (U-Net skips, two towers) TePDist's stage ILP
   (:func:`~autoplan.search.pipeline._stage_ilp.stage_ilp`) assigns layers to ``S`` stages for
   each stage count, and the same DP over those fixed stages picks their submeshes (Alpa's
   shapes) and logical meshes within the same memory limit. Stages that do not fit may use a
   ZeRO level and rematerialised layers (:mod:`~autoplan.search.pipeline._levers`: a separate DP
   run sees them as extra configurations; the simulation chooses each stage's).
6. **Ranking by simulation.** The DP's best few layouts (each ``t_max`` optimum it met, under
   several caps on the number of stages) are simulated under the schedule asked for
   (:func:`~autoplan.plans._schedule.schedule_events`: GPipe, 1F1B, interleaved 1F1B on the layout's
   layers cut into ``v`` chunks per mesh, ZB-H1 with each backward split into its input- and
   weight-gradient parts; ``"auto"`` weighs each layout under all but GPipe and keeps the best,
   see :func:`_evaluate_kind`), with the stages' forward and
   backward times, the cross-stage transfers between the placed submeshes, and each stage's
   per-step work after its last backward; the simulated step time ranks them. The DP's latency
   equals the simulation when the stages are balanced and transfers free; otherwise the
   simulation decides. The one-stage layout (gradient accumulation over ``B`` micro-batches) is
   always a candidate, and so is the best layout of each of :data:`STAGE_COUNTS` stages.
7. **Micro-batches.** With ``microbatches=None`` the count is searched among the divisors of the
   batch within :data:`MICROBATCH_WINDOW` of the default (2 beyond :data:`AUTO_ALL_HOSTS`
   hosts), in two rounds: the default's power-of-two multiples and fractions, then the divisors
   between the best of those and its neighbours (:func:`finer_counts`). The default's layer
   plans are re-timed at
   every other count (per-micro-batch compute, collective bytes and activations scaled with the
   micro-batch size, alpha-beta times recomputed, plans whose splits no longer divide the
   micro-batch dropped); the DP and the simulation rank each count; the best
   :data:`EXACT_MICROBATCH_COUNTS` (when they beat the default by more than
   :data:`SCREEN_MARGIN`) are then costed exactly (traced at their micro-batch size, their
   layouts' layer ILPs solved there). The default is always costed exactly, so the result is
   never worse than it.
"""

from __future__ import annotations

import copy
import math
import re
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import jax
import numpy as np

from autoplan._errors import InfeasiblePlanError, SearchError, TraceError
from autoplan._memo import memo
from autoplan._options import check_memory_budget, require_workload
from autoplan.costs._cluster import Cluster, LogicalMesh, send_recv_time
from autoplan.plans._plan import Comm, InputSpec, Plan, Predicted, Schedule, Stage
from autoplan.plans._schedule import (
    SPLIT_KINDS,
    ScheduleStats,
    schedule_events,
    schedule_summary,
    schedule_table,
)
from autoplan.plans._spec import tile_count
from autoplan.search._parallel import Task, check_workers, resolve_workers, run_tasks
from autoplan.search.fold._layers import LayerGroup, group_layers, op_layer_names
from autoplan.search.intra._ilp_problem import ILPProblem, build_problem
from autoplan.search.intra._ilp_solve import ILPSolution, solve_ilp
from autoplan.search.intra._intra import (
    IntraOpResult,
    _comm_by_axis,
    intra_op_result,
    make_logical_mesh,
    mesh_shapes_for,
)
from autoplan.search.intra._pins import renamed_pin
from autoplan.search.intra._reshard import reshard
from autoplan.search.intra._spec_space import replicated, tiles
from autoplan.search.intra._strategies import HEAVY, combined_latency
from autoplan.search.pipeline._stage_dp import place_submeshes, range_sums, stage_dp, submesh_shapes
from autoplan.tracing._graph import OpGraph
from autoplan.tracing._primitives import STOP_REDUCTIONS
from autoplan.tracing._trace import trace
from autoplan.tracing._workload import Workload, as_workload

__all__ = ["PipelineResult", "LayerCost", "pipeline_search", "microbatch_workload_args",
           "layer_dag", "batch_size", "layer_cost", "per_step_weighted"]

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

#: Up to this many hosts the pipeline search uses Alpa's full submesh set; beyond it, multi-host
#: submeshes of a power-of-two number of hosts (plus all hosts): 11 shapes instead of 131 on 128
#: DGX nodes.
AUTO_ALL_HOSTS = 16

#: A forward edge that skips layers and carries at most this fraction of the median bytes passed
#: between adjacent layers is a side tensor (a scalar loss term, a small statistic): it does not
#: make the layer graph a non-chain.
SIDE_TENSOR_FRACTION = 0.01

#: The searched micro-batch counts: the divisors of the batch, from the default / this
#: factor to the default x this factor (2 on clusters of more than :data:`AUTO_ALL_HOSTS`
#: hosts, where every count's stage DP is large).
MICROBATCH_WINDOW = 8

#: Besides the default, how many searched micro-batch counts are costed exactly (the best
#: screened ones predicted faster than the default's best by more than :data:`SCREEN_MARGIN`).
EXACT_MICROBATCH_COUNTS = 1

#: A screened count is costed exactly only when its re-timed step beats the default's by more
#: than this fraction (the layer ILPs' own gap, :data:`LAYER_MIP_GAP`, is of the same order).
SCREEN_MARGIN = 5e-3

#: Layouts of each stage-DP run simulated (its best ``t_max`` optima).
DP_ALTERNATIVES = 6

#: Layouts of a screened micro-batch count costed exactly.
EXACT_LAYOUTS = 4

#: Besides the best over any number of stages and the one-stage layout, the stage DP gives the
#: best layouts of each of these stage counts (so every count is a ranked candidate).
STAGE_COUNTS = (2, 4, 8, 16)

#: The schedules the search accepts: the two classic ones, interleaved 1F1B, ZB-H1, and ``auto``
#: (every layout weighed under :data:`AUTO_SCHEDULES`, the best kept).
SCHEDULES = ("1f1b", "gpipe", "interleaved", "zb-h1", "auto")

#: Chunks per mesh (virtual stages ``v``) ``schedule="interleaved"`` tries on each layout.
INTERLEAVED_CHUNKS = (2, 4)

#: ``(kind, v)`` pairs ``schedule="auto"`` simulates each layout under (GPipe is left out: at
#: equal stage times it takes 1F1B's step and holds all ``B`` micro-batches).
AUTO_SCHEDULES = (("1f1b", 1), ("zb-h1", 1)) + tuple(("interleaved", v) for v in INTERLEAVED_CHUNKS)


@dataclass
class PipelineResult:
    """What :func:`pipeline_search` found: ``plans`` best first, ``stats`` (see
    :func:`pipeline_search`)."""

    plans: list[Plan]
    stats: dict[str, Any]


# ---------------------------------------------------------------------------------------------
# the batch and the micro-batch graph
# ---------------------------------------------------------------------------------------------


def batch_size(graph: OpGraph) -> int:
    """The global batch of a traced step: the leading dimension its batch inputs (graph inputs of
    kind ``batch``) share (their greatest common divisor; 1 when it has none)."""
    dims = [graph.tensors[gi.tensor].shape[0] for gi in graph.inputs
            if gi.kind == "batch" and graph.tensors[gi.tensor].shape]
    return math.gcd(*dims) if dims else 1


def microbatch_workload_args(args: tuple, arg_kinds: tuple[str, ...], microbatches: int) -> tuple:
    """The step's arguments with every batch leaf's leading dimension divided by ``microbatches``."""
    out = []
    for a, kind in zip(args, arg_kinds):
        if kind != "batch":
            out.append(a)
            continue

        def shrink(x):
            shape = tuple(x.shape)
            if not shape or shape[0] % microbatches:
                raise SearchError(
                    f"pipeline: a batch leaf of shape {shape} cannot be split into {microbatches} "
                    "micro-batches along its leading dimension. Fix: choose microbatches dividing "
                    f"{shape[0] if shape else 1}.")
            return jax.ShapeDtypeStruct((shape[0] // microbatches,) + shape[1:], x.dtype)

        out.append(jax.tree.map(shrink, a))
    return tuple(out)


def traced(workload: Workload) -> OpGraph:
    """``trace(workload)``, once per workload object (the search, its baselines and the pipeline
    search share it)."""
    return memo(workload, ("search", "trace"), lambda: trace(workload))


def _traces(workload: Workload, microbatches: int) -> tuple[OpGraph, OpGraph]:
    """The full-batch and micro-batch graphs of a workload (once per workload object: the
    pipeline search and the Megatron TP x PP baseline use the same ones)."""
    full = traced(workload)
    if microbatches == 1:
        return full, full

    def make() -> OpGraph:
        args = microbatch_workload_args(workload.args, workload.arg_kinds, microbatches)
        return trace(workload.fn, *args, arg_kinds=workload.arg_kinds, name=full.name)

    return full, memo(workload, ("search", "microbatch trace", microbatches), make)


def _aligned(a: OpGraph, b: OpGraph) -> bool:
    """Whether two traces of one step at different batch sizes have the same operators and
    tensors in the same order (so ids carry over)."""
    return (len(a.ops) == len(b.ops) and len(a.tensors) == len(b.tensors)
            and all(x.primitive == y.primitive for x, y in zip(a.ops, b.ops)))


def _default_microbatches(batch: int, max_stages: int) -> int:
    """Enough micro-batches to keep the bubble small and the activations of the in-flight
    micro-batches modest: the largest power of two <= min(128, batch / 4) that divides the batch
    (at least 2 when the batch allows: for an odd batch its smallest divisor above 1 that is not
    the batch itself, 3 for a batch of 9).

    Examples:
        >>> [_default_microbatches(b, 8) for b in (1024, 1536, 6, 9, 7)]
        [128, 128, 2, 3, 1]
    """
    cap = max(1, min(128, batch // 4))
    b = 1
    while b * 2 <= cap and batch % (b * 2) == 0:
        b *= 2
    if b == 1:
        b = next((d for d in range(2, math.isqrt(batch) + 1) if batch % d == 0), 1)
    return b


def microbatch_counts(batch: int, default: int, window: int = MICROBATCH_WINDOW) -> list[int]:
    """The searched micro-batch counts: every divisor of ``batch`` within ``window`` of
    ``default``, ascending (``default`` among them).

    Examples:
        >>> microbatch_counts(1536, 128)  # Alpa's 24 for Wide-ResNet among them
        [16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768]
        >>> microbatch_counts(9, 1), microbatch_counts(1024, 128, 2)
        ([1, 3], [64, 128, 256])
    """
    lo, hi = -(-default // window), min(batch, default * window)
    out = {default}
    d = 1
    while d * d <= batch:  # the divisors in pairs (d, batch / d)
        if batch % d == 0:
            out.update(b for b in (d, batch // d) if lo <= b <= hi)
        d += 1
    return sorted(out)


def finer_counts(counts: Sequence[int], coarse: Sequence[int], lead: int) -> list[int]:
    """The second screening round: the ``counts`` strictly between the ``coarse`` counts on
    either side of ``lead`` (the best of the first round), not screened yet.

    Examples:
        >>> finer_counts([16, 24, 32, 48, 64, 96, 128], [16, 32, 64, 128], 32)
        [24, 48]
        >>> finer_counts([1, 3], [1], 1)
        [3]
    """
    i = list(coarse).index(lead)
    lo = coarse[i - 1] if i > 0 else 0
    hi = coarse[i + 1] if i + 1 < len(coarse) else math.inf
    return [B for B in counts if lo < B < hi and B not in coarse]


# ---------------------------------------------------------------------------------------------
# the layer graph
# ---------------------------------------------------------------------------------------------


def layer_dag(graph: OpGraph, layers: list[LayerGroup]):
    """The layers' forward data-flow DAG (networkx): node ``i`` has ``flops``; an edge carries the
    ``bytes`` of forward tensors from layer i to layer j, and ``side`` (True for an edge that
    skips layers carrying at most :data:`SIDE_TENSOR_FRACTION` of the median bytes between
    adjacent layers)."""
    import networkx as nx  # noqa: PLC0415

    of = {o: ly.index for ly in layers for o in ly.forward}
    g = nx.DiGraph()
    for ly in layers:
        g.add_node(ly.index, flops=ly.flops)
    for ly in layers:
        for o in ly.forward:
            for t in graph.ops[o].outputs:
                for c in set(graph.consumers[t]):
                    j = of.get(c)
                    if j is not None and j != ly.index:
                        a, b = (ly.index, j) if ly.index < j else (j, ly.index)
                        w = graph.tensors[t].nbytes
                        if g.has_edge(a, b):
                            g.edges[a, b]["bytes"] += w
                        else:
                            g.add_edge(a, b, bytes=float(w))
    adjacent = [d["bytes"] for a, b, d in g.edges(data=True) if b == a + 1]
    ref = float(np.median(adjacent)) if adjacent else 0.0
    for a, b, d in g.edges(data=True):
        d["side"] = b != a + 1 and d["bytes"] <= SIDE_TENSOR_FRACTION * ref
    return g


def _is_chain(dag) -> bool:
    """Every edge joins adjacent layers, or is a side tensor."""
    return all(b == a + 1 or d.get("side", False) for a, b, d in dag.edges(data=True))


def check_submesh_hosts(value: Any) -> None:
    """Raise :class:`SearchError` unless ``value`` is a ``submesh_hosts`` choice."""
    if value not in ("auto", "all", "pow2"):
        raise SearchError(f"search: submesh_hosts should be 'auto', 'all' or 'pow2'. Got "
                          f"{value!r}. Fix: 'all' is Alpa's full set of multi-host submeshes, "
                          "'pow2' keeps 2, 4, 8, ... hosts, 'auto' picks by cluster size.")


def check_microbatches(value: Any) -> None:
    """Raise :class:`SearchError` unless ``value`` is None, ``"auto"`` or a positive integer."""
    if value is None or value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise SearchError(f"search: microbatches should be a positive integer, 'auto' or None. "
                          f"Got {value!r}. Fix: microbatches='auto' searches the count, an "
                          "integer fixes it (it must divide the batch).")


# ---------------------------------------------------------------------------------------------
# one layer's plan: per micro-batch and per step
# ---------------------------------------------------------------------------------------------


def gradient_ops(graph: OpGraph) -> frozenset[int]:
    """The backward operators that make parameter gradients: their result reaches the optimizer
    update through operators that do not combine it with anything batch-sized (movement,
    elementwise, a reduction over size-1 dimensions only). Their collectives are the gradient
    synchronisation, run once per step after the micro-batches' gradients are accumulated: a
    weight gradient's partial sums, and a bias or norm-scale gradient's reduction over the
    batch (whose result is reshaped and summed over a broadcast size-1 dimension before the
    update). Once per graph."""

    def make() -> frozenset[int]:
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

    return memo(graph, ("pipeline", "gradient ops"), make)


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
    per-step work (see :class:`LayerCost` and the module docstring).

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
    """

    fast: Any
    lean: Any = None
    lean_solved: bool = False
    solves: int = 0
    timed_out: int = 0


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
    out = LayerPlans(None) if fast is None else LayerPlans(fast.fast, fast.lean, fast.lean_solved)
    if out.lean_solved or (fast is not None and not lean):
        return out
    mesh = make_logical_mesh(view, shape)
    try:
        prob = per_step_weighted(build_problem(sub, mesh, pins=pins, count_unmerged=False),
                                 1.0 / B)
    except SearchError:
        if pins is None:
            raise
        out.lean_solved = True
        return out  # a pinned spec does not divide on this mesh: no plan here

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

    if fast is None:
        out.fast = result(solve(0.0, LAYER_MIP_GAP))
    if lean:
        f = out.fast
        if sum(_stage_memory(f.plan)) <= 1.2 * f.solution.least_memory:
            out.lean = f
        else:
            out.lean = result(_lean_plan(f, lambda w: solve(w, LEAN_MIP_GAP)))
        out.lean_solved = True
    return out


@dataclass(frozen=True)
class _Solved:
    """One layer ILP solved: its solution and the seconds it took."""

    solution: ILPSolution
    seconds: float


# ---------------------------------------------------------------------------------------------
# the search's context and the layer costs at one micro-batch count
# ---------------------------------------------------------------------------------------------


class _Context:
    """What every micro-batch count's costing shares: the cluster, the submeshes and their
    logical-mesh variants, the options, and the solve counter."""

    def __init__(self, cluster: Cluster, full: OpGraph, submeshes: list[tuple[int, int]],
                 schedule: str, budget: float, time_limit: float, megatron: bool,
                 pins: Mapping[str, Any] | None = None):
        self.cluster, self.full, self.submeshes = cluster, full, submeshes
        self.num_hosts, self.devices_per_host = cluster.nodes, cluster.devices_per_node
        self.schedule, self.budget, self.time_limit, self.megatron = (
            schedule, budget, time_limit, megatron)
        self.pins = dict(pins or {})
        shapes_of = [mesh_shapes_for(n * m, n, m) for n, m in submeshes]
        # a config is a logical mesh and a variant: the fastest plan, or the memory-lean one
        # (:func:`_lean_plan`), which the DP takes when the fastest plans do not fit (Eq. 5)
        self.configs = [[(shape, lean) for lean in (False, True) for shape in shapes]
                        for shapes in shapes_of]
        self.C = max(len(c) for c in self.configs)
        self.views = [replace(cluster, nodes=n, devices_per_node=m) for n, m in submeshes]
        self._meshes: dict[tuple, LogicalMesh] = {}
        self.solves = 0
        self.timed_out = 0  # layer ILPs stopped at their time limit
        self.groupings: list[list[list[int]]] | None = None  # the DAG stage ILP's, once
        self.levers = True  # ZeRO levels and rematerialisation where a stage does not fit

    def mesh(self, k: int, shape: tuple[int, ...]) -> LogicalMesh:
        key = (k, tuple(shape))
        if key not in self._meshes:
            self._meshes[key] = make_logical_mesh(self.views[k], shape)
        return self._meshes[key]

    def cells(self):
        """Every ``(submesh k, config c)``."""
        for k, cfgs in enumerate(self.configs):
            for c in range(len(cfgs)):
                yield k, c

    def transfer(self, nbytes: float, dst: int, cross: bool, dst_devices: int
                 ) -> tuple[float, float, float]:
        """Moving ``nbytes`` to a stage on submesh ``dst`` (``dst_devices`` devices): ``(seconds,
        send/recv bytes per receiving device, all-gather bytes)``, the cheaper of sending the
        whole tensor to each device and Alpa's send of 1/n slices followed by an all-gather on
        the receiving mesh.

        Across hosts the receiving devices of one host share its network link: each host's
        link carries what its devices receive (``m`` whole tensors, or ``m`` slices of
        ``1/n``), where inside a host each device has its own links."""
        if nbytes <= 0:
            return 0.0, 0.0, 0.0
        hosts = self.submeshes[dst][0]
        per_host = dst_devices // hosts if cross else 1
        whole = send_recv_time(self.cluster, nbytes * per_host, cross)
        if dst_devices <= 1:
            return whole, nbytes, 0.0
        sliced = send_recv_time(self.cluster, nbytes / dst_devices * per_host, cross)
        sliced += self.cluster.logical_mesh((dst_devices,), submesh=self.submeshes[dst]).all_gather(
            nbytes, [0])
        if whole <= sliced:
            return whole, nbytes, 0.0
        return sliced, nbytes / dst_devices, nbytes

    def recv_estimate(self, nbytes: float, k: int) -> float:
        """The stage DP's estimate of the time a stage on submesh ``k`` spends receiving
        ``nbytes`` from a neighbour: across hosts when the submesh spans whole hosts of a
        multi-host cluster (its neighbours then sit on other hosts), inside a host otherwise."""
        n, m = self.submeshes[k]
        return self.transfer(nbytes, k, self.num_hosts > 1 and m == self.devices_per_host, n * m)[0]

    def crosses_hosts(self, devices: Iterable[int], other: Iterable[int]) -> bool:
        """Whether two stages' devices (cluster ids, ``host * devices_per_host + local``) sit
        on different sets of hosts (their transfers then cross hosts)."""
        per_host = self.devices_per_host
        return {d // per_host for d in devices} != {d // per_host for d in other}


@dataclass
class _Terms:
    """One stage (or layer) on one cell: per micro-batch and per step."""

    forward: float
    backward: float
    step: float
    resident: float
    activation: float


class _Table:
    """Layer costs at one micro-batch count: every layer kind's plan on every cell, solved lazily
    and once per kind; the resharding between layers; the tensors layers pass each other."""

    def __init__(self, ctx: _Context, graph: OpGraph, layers: list[LayerGroup], B: int):
        self.ctx, self.graph, self.layers, self.B = ctx, graph, layers, B
        self.L = len(layers)
        self.rep: dict[str, int] = {}
        for ly in layers:
            self.rep.setdefault(ly.signature, ly.index)
        layer_of = np.full(len(graph.ops), -1, dtype=np.int64)
        for ly in layers:
            layer_of[list(ly.ops)] = ly.index
        self.layer_of = layer_of
        self.screenable = graph is not ctx.full and _aligned(graph, ctx.full)
        self._subs: dict[int, OpGraph] = {}
        self._local: dict[int, dict[int, int]] = {}
        self._solved: dict[tuple, LayerPlans] = {}  # (layer kind's first layer, k, shape)
        self._costs: dict[tuple, LayerCost] = {}
        self._pairs: dict[tuple, tuple] = {}
        self._dims: dict[int, dict[int, tuple]] = {}
        self._terms: dict[tuple, _Terms | None] = {}
        self._pair_terms: dict[tuple, tuple[float, float, float]] = {}
        self._pair_kinds: dict[tuple[int, int], tuple] = {}
        self._passing = None
        self._tensors = None

    # ---- layers and their solutions ----------------------------------------------------------
    def sub(self, li: int) -> OpGraph:
        if li not in self._subs:
            self._subs[li] = self.graph.subgraph(
                self.layers[li].ops, name=f"{self.graph.name}:{self.layers[li].name}")
        return self._subs[li]

    def local(self, li: int) -> dict[int, int]:
        """Layer ``li``'s subgraph tensor of each graph tensor it touches."""
        if li not in self._local:
            sub, ops, out = self.sub(li), self.graph.ops, {}
            for k, op in enumerate(sub.ops):
                g = ops[sub.origin[k]]
                for lt, gt in zip(op.inputs, g.inputs):
                    if lt is not None:
                        out[gt] = lt
                for lt, gt in zip(op.outputs, g.outputs):
                    out[gt] = lt
            self._local[li] = out
        return self._local[li]

    def _batch_dims(self, li: int) -> Callable[[int], tuple]:
        """Subgraph tensor -> its ``(dimension, full-batch size)`` pairs that scale with the
        batch (found by comparing this trace with the full-batch one)."""
        if li not in self._dims:
            full, out = self.ctx.full.tensors, {}
            for gt, lt in self.local(li).items():
                a, b = full[gt].shape, self.graph.tensors[gt].shape
                dims = tuple((d, x) for d, (x, y) in enumerate(zip(a, b)) if x != y)
                if dims:
                    out[lt] = dims
            self._dims[li] = out
        dims = self._dims[li]
        return lambda t: dims.get(t, ())

    def _transient(self, li: int) -> frozenset[int]:
        """Layer ``li``'s subgraph inputs made by another layer's backward or update operators."""
        g = self.graph
        return frozenset(gi.tensor for gi in self.sub(li).inputs if gi.kind == "activation"
                         and g.ops[g.tensors[int(gi.path[1:])].producer].role != "forward")

    def result(self, li: int, k: int, c: int):
        """The intra-op result of layer ``li``'s kind on cell ``(k, c)`` (the kind's first layer
        solved; its ids line up with every layer of the kind); None where the pins cannot hold
        on that cell's mesh."""
        shape, lean = self.ctx.configs[k][c]
        key = (self.rep[self.layers[li].signature], k, shape)
        got = self._solved.get(key)
        if got is None or (lean and not got.lean_solved):
            self._store(key, layer_plans(self.sub(key[0]), self.ctx.views[k], shape,
                                         **self._solve_options(key[0], k, shape), lean=lean,
                                         fast=None if got is None else got))
            got = self._solved[key]
        return got.lean if lean else got.fast

    def _solve_options(self, rep: int, k: int, shape: tuple[int, ...]) -> dict[str, Any]:
        return {"B": self.B, "pins": self._pins(rep, k, shape),
                "time_limit": min(self.ctx.time_limit, LAYER_TIME_LIMIT)}

    def _store(self, key: tuple, got: LayerPlans) -> None:
        self._solved[key] = got
        self.ctx.solves += got.solves
        self.ctx.timed_out += got.timed_out

    def solve_cells(self, cells: Iterable[tuple[int, int, int]], workers: int) -> None:
        """Solve the layer plans of ``(layer, k, c)`` cells not solved yet, as independent tasks
        on ``workers`` processes (:func:`~autoplan.search._parallel.run_tasks`; one task per
        layer kind, submesh and logical mesh: its fastest plan and, where a cell asks for it,
        the memory-lean one). Each layer kind's subgraph travels to a worker once. What each
        task gives is what :meth:`result` would solve in this process."""
        want: dict[tuple, bool] = {}
        for li, k, c in cells:
            shape, lean = self.ctx.configs[k][c]
            key = (self.rep[self.layers[li].signature], k, shape)
            got = self._solved.get(key)
            if got is None or (lean and not got.lean_solved):
                want[key] = want.get(key, False) or lean
        if not want:
            return
        keys = list(want)
        tasks = [Task(layer_plans, self.sub(rep), (self.ctx.views[k], shape),
                      {**self._solve_options(rep, k, shape), "lean": want[(rep, k, shape)],
                       "fast": self._solved.get((rep, k, shape))},
                      label=f"layer ILP {self.layers[rep].name} on submesh "
                            f"{'x'.join(map(str, self.ctx.submeshes[k]))}, mesh "
                            f"{'x'.join(map(str, shape))}")
                 for rep, k, shape in keys]
        for key, out in zip(keys, run_tasks(tasks, workers=workers)):
            for category, message in out.warnings:
                warnings.warn(message, category, stacklevel=2)
            self._store(key, out.result())

    def _pins(self, rep: int, k: int, shape: tuple[int, ...]) -> dict[str, Any] | None:
        """The pins that apply to layer ``rep``'s inputs: the user's, and Megatron's layout for
        the baseline (tensor parallelism over the logical mesh's inner axis)."""
        ctx, sub = self.ctx, self.sub(rep)
        out = {pat: spec for pat, spec in ctx.pins.items() if sub.find_inputs(pat, names_only=True)}
        if ctx.megatron:
            from autoplan.search.intra._pins import megatron_pins  # noqa: PLC0415

            out.update(megatron_pins(sub, shape[-1]) or {})
        return out or None

    def cost(self, li: int, k: int, c: int) -> LayerCost | None:
        sig = self.layers[li].signature
        key = (sig, k, c)
        if key not in self._costs:
            rep = self.rep[sig]
            shape = self.ctx.configs[k][c][0]
            res = self.result(li, k, c)
            self._costs[key] = None if res is None else layer_cost(
                res, self.sub(rep), self.ctx.mesh(k, shape),
                self._batch_dims(rep) if self.screenable else None, self._transient(rep))
        return self._costs[key]

    def terms(self, li: int, k: int, c: int, ratio: float = 1.0, B: int | None = None
              ) -> _Terms | None:
        """Layer ``li`` on cell ``(k, c)``; re-timed for micro-batches ``ratio`` times as large
        (``B`` of them) when ``ratio != 1``; None where the plan's splits do not divide."""
        key = (self.layers[li].signature, k, c, ratio, B if ratio != 1.0 else None)
        if key in self._terms:
            return self._terms[key]
        lc = self.cost(li, k, c)
        if lc is None:
            out = None
        elif ratio == 1.0:
            out = _Terms(lc.forward, lc.backward, lc.step, lc.resident, lc.activation)
        elif not lc.feasible(B):
            out = None
        else:
            f, b, a = lc.rescaled(ratio, self.ctx.mesh(k, self.ctx.configs[k][c][0]))
            out = _Terms(f, b, lc.step, lc.resident, a)
        self._terms[key] = out
        return out

    # ---- what layers pass each other -----------------------------------------------------------
    def passing(self) -> dict[tuple[int, int], list[tuple[int, str]]]:
        """``{(producer layer, consumer layer): [(tensor, role of its first reader there)]}`` for
        every tensor one layer makes and another reads."""
        if self._passing is None:
            ops, consumers, layer_of = self.graph.ops, self.graph.consumers, self.layer_of
            out: dict[tuple[int, int], dict[int, str]] = {}
            for op in ops:
                a = int(layer_of[op.id])
                for t in op.outputs:
                    for c in consumers[t]:
                        b = int(layer_of[c])
                        if b != a and b >= 0:
                            out.setdefault((a, b), {}).setdefault(t, ops[c].role)
            self._passing = {k: list(v.items()) for k, v in out.items()}
        return self._passing

    def tensors(self) -> list[tuple[int, int, str, tuple[int, ...], float]]:
        """``(tensor, producer layer, producer role, consumer layers, bytes)`` of every tensor
        read outside the layer that made it."""
        if self._tensors is None:
            by_t: dict[int, tuple[int, set[int]]] = {}
            for (a, b), ts in self.passing().items():
                for t, _ in ts:
                    by_t.setdefault(t, (a, set()))[1].add(b)
            g = self.graph
            self._tensors = [(t, a, g.ops[g.tensors[t].producer].role, tuple(sorted(bs)),
                              float(g.tensors[t].nbytes)) for t, (a, bs) in sorted(by_t.items())]
        return self._tensors

    def pair(self, a: int, b: int, k: int, c: int) -> tuple[list[Comm], list[Comm], list[Comm]]:
        """The resharding of the tensors layer ``a`` passes to layer ``b`` on cell ``(k, c)``:
        from the spec ``a``'s plan gives each to the spec ``b``'s plan assumed for it, as
        ``(forward, backward, per-step)`` collectives by the role of its reader in ``b``."""
        la, lb = self.local(a), self.local(b)
        entries = self.passing().get((a, b), [])
        fold = self._pair_kinds.get((a, b))
        if fold is None:  # pairs of the same layer kinds passing the same tensors cost the same
            fold = self._pair_kinds[(a, b)] = (
                self.layers[a].signature, self.layers[b].signature,
                tuple((la[t], lb[t], role) for t, role in entries))
        key = (fold, k, c)
        hit = self._pairs.get(key)
        if hit is not None:
            return hit
        ra, rb = self.result(a, k, c), self.result(b, k, c)
        out: tuple[list[Comm], list[Comm], list[Comm]] = ([], [], [])
        if ra is None or rb is None:  # no plan on this cell: the stage is impossible anyway
            self._pairs[key] = out
            return out
        sa, sb = ra.solution.specs, rb.solution.specs
        mesh = self.ctx.mesh(k, self.ctx.configs[k][c][0])
        for t, role in entries:
            src, dst = sa.get(la[t]), sb.get(lb[t])
            ten = self.graph.tensors[t]
            if src is None or dst is None or src == dst or not ten.shape:
                continue
            _, cs = reshard(src, dst, ten.shape, ten.dtype, mesh)
            out[0 if role == "forward" else 1 if role == "backward" else 2].extend(cs)
        self._pairs[key] = out
        return out

    def pair_terms(self, a: int, b: int, k: int, c: int, ratio: float = 1.0
                   ) -> tuple[float, float, float]:
        key = (a, b, k, c, ratio)
        hit = self._pair_terms.get(key)
        if hit is None:
            fw, bw, st = self.pair(a, b, k, c)
            mesh = self.ctx.mesh(k, self.ctx.configs[k][c][0])
            hit = self._pair_terms[key] = (_retimed(fw, ratio, mesh, False),
                                           _retimed(bw, ratio, mesh, False),
                                           sum(x.time for x in st))
        return hit

    def stage(self, members: Sequence[int], k: int, c: int, ratio: float = 1.0,
              B: int | None = None) -> _Terms | None:
        """A stage of layers ``members`` on cell ``(k, c)``: the sum of its layers plus the
        resharding between them (None where a layer's plan does not divide)."""
        out = _Terms(0.0, 0.0, 0.0, 0.0, 0.0)
        for li in members:
            t = self.terms(li, k, c, ratio, B)
            if t is None:
                return None
            out.forward += t.forward
            out.backward += t.backward
            out.step += t.step
            out.resident += t.resident
            out.activation += t.activation
        inside = set(members)
        for a, b in self.passing():
            if a in inside and b in inside:
                f, bw, s = self.pair_terms(a, b, k, c, ratio)
                out.forward += f
                out.backward += bw
                out.step += s
        return out

    def weight_share(self, li: int) -> float:
        """The share of layer ``li``'s backward FLOPs that make its parameters' gradients
        (:func:`gradient_ops`): ZB-H1's ``W`` pass, the rest being ``B``, the gradient of the
        layer's input. About a half for matmul layers (``dX = dY W^T`` and ``dW = X^T dY`` cost
        the same)."""
        ops, grads = self.graph.ops, gradient_ops(self.graph)
        bwd = self.layers[li].backward
        total = sum(ops[i].flops for i in bwd)
        return sum(ops[i].flops for i in bwd if i in grads) / total if total > 0 else 0.0

    def boundary_bytes(self, stage_of: Sequence[int], S: int) -> tuple[np.ndarray, np.ndarray]:
        """Per boundary between stage ``s`` and ``s + 1`` (``S - 1`` of them): the bytes of
        forward tensors sent on (once per boundary each crosses) and of backward tensors sent
        back."""
        fwd, bwd = np.zeros(max(S - 1, 0)), np.zeros(max(S - 1, 0))
        for _, a, role, bs, nbytes in self.tensors():
            sa = stage_of[a]
            far = max(stage_of[b] for b in bs)
            near = min(stage_of[b] for b in bs)
            if role == "forward" and far > sa:
                fwd[sa:far] += nbytes
            elif role == "backward" and near < sa:
                bwd[near:sa] += nbytes
        return fwd, bwd


# ---------------------------------------------------------------------------------------------
# stage-DP inputs
# ---------------------------------------------------------------------------------------------


def _dp_inputs(t: np.ndarray, step: np.ndarray, pmem: np.ndarray, amem: np.ndarray,
               schedule: str, B: int) -> dict[str, np.ndarray]:
    """The arrays :func:`stage_dp` takes; GPipe keeps all ``B`` micro-batches in flight on every
    stage (folded into the per-stage memory)."""
    if schedule == "gpipe":
        pmem, amem = pmem + B * amem, np.zeros_like(amem)
    return {"t": t, "step": step, "pmem": pmem, "amem": amem}


def _chain_inputs(table: _Table, ratio: float = 1.0, B: int | None = None) -> dict[str, np.ndarray]:
    """``t_intra``, per-step, resident and activation arrays ``(L, L, K, C)`` of the contiguous
    stages of a chain of layers (see the module docstring, step 4)."""
    ctx, L = table.ctx, table.L
    B = B or table.B
    K, C = len(ctx.submeshes), ctx.C
    mb = np.full((4, L, K, C), np.inf)  # forward + backward, step, resident, activation
    for li in range(L):
        for k, c in ctx.cells():
            tt = table.terms(li, k, c, ratio, B)
            if tt is not None:
                mb[:, li, k, c] = (tt.forward + tt.backward, tt.step, tt.resident, tt.activation)
    t, step, pmem, amem = (range_sums(x) for x in mb)
    # resharding between two layers of a stage: P[lo, hi] charged to every range holding both
    pair_mb, pair_step = np.zeros((L, L, K, C)), np.zeros((L, L, K, C))
    for a, b in table.passing():
        lo, hi = min(a, b), max(a, b)
        for k, c in ctx.cells():
            f, bw, s = table.pair_terms(a, b, k, c, ratio)
            pair_mb[lo, hi, k, c] += f + bw
            pair_step[lo, hi, k, c] += s
    for arr, pair in ((t, pair_mb), (step, pair_step)):
        inner = np.cumsum(pair, axis=1)  # over hi <= j
        arr += np.cumsum(inner[::-1], axis=0)[::-1]  # over lo >= i
    # receiving the input activations (cut i) and the output gradients (cut j + 1)
    fwd, bwd = table.boundary_bytes(list(range(L)), L)
    for k in range(K):
        recv_f = np.array([0.0] + [ctx.recv_estimate(x * ratio, k) for x in fwd])
        recv_b = np.array([ctx.recv_estimate(x * ratio, k) for x in bwd] + [0.0])
        t[:, :, k, :] += (recv_f[:, None] + recv_b[None, :])[:, :, None]
    return _dp_inputs(t, step, pmem, amem, ctx.schedule, B)


def _group_inputs(table: _Table, groups: list[list[int]], ratio: float = 1.0,
                  B: int | None = None) -> dict[str, np.ndarray]:
    """The same arrays over fixed stages (``groups``, in pipeline order): only ``[g, g]`` is
    finite, so the DP keeps each group one stage and picks its submesh and logical mesh."""
    ctx = table.ctx
    B = B or table.B
    S, K, C = len(groups), len(ctx.submeshes), ctx.C
    arrs = np.full((4, S, S, K, C), np.inf)
    stage_of = [0] * table.L
    for g, members in enumerate(groups):
        for li in members:
            stage_of[li] = g
    fwd, bwd = table.boundary_bytes(stage_of, S)
    for g, members in enumerate(groups):
        for k, c in ctx.cells():
            tt = table.stage(members, k, c, ratio, B)
            if tt is None:
                continue
            recv = (ctx.recv_estimate(fwd[g - 1] * ratio, k) if g > 0 else 0.0) + (
                ctx.recv_estimate(bwd[g] * ratio, k) if g < S - 1 else 0.0)
            arrs[:, g, g, k, c] = (tt.forward + tt.backward + recv, tt.step, tt.resident,
                                   tt.activation)
    return _dp_inputs(*arrs, ctx.schedule, B)


# A layout: one (layer indices, submesh index, config index) per stage, in pipeline order.
Layout = tuple[tuple[tuple[int, ...], int, int], ...]


def _stage_dp_run(inputs: dict[str, np.ndarray], submeshes: list[tuple[int, int]], num_hosts: int,
                  devices_per_host: int, B: int, least: int, most: int | None,
                  budget: float | None) -> tuple[tuple[float, tuple[tuple[int, int, int, int], ...]], ...]:
    """One :func:`stage_dp` run for ``least .. most`` stages (a module-level function: the runs
    of a search are independent tasks of :func:`~autoplan.search._parallel.run_tasks`): its best
    ``t_max`` optima as ``(DP latency, ((start, end, submesh index, config index), ...))``, none
    when no layout exists; with ``budget`` every stage fits it (Alpa's Eq. 5)."""
    kw = ({"param_mem": inputs["pmem"], "act_mem": inputs["amem"], "device_memory": budget}
          if budget is not None else {})
    try:
        r = stage_dp(inputs["t"], submeshes, num_hosts, devices_per_host, B, max_stages=most,
                     min_stages=least, step_cost=inputs["step"], max_alternatives=DP_ALTERNATIVES,
                     explain=False, **kw)
    except InfeasiblePlanError:
        return ()
    return tuple((total, tuple((st.start, st.end, st.submesh_index, st.config_index)
                               for st in stages)) for total, stages in r.alternatives)


def _least_fitting_memory(inputs: dict[str, np.ndarray], ctx: _Context, B: int) -> float | None:
    """The least memory per device with which some layout of ``inputs`` would fit (a bisection
    of DP runs, sought only to say why nothing fits)."""
    try:
        stage_dp(inputs["t"], ctx.submeshes, ctx.num_hosts, ctx.devices_per_host, B,
                 step_cost=inputs["step"], param_mem=inputs["pmem"], act_mem=inputs["amem"],
                 device_memory=ctx.budget)
    except InfeasiblePlanError as err:
        return err.least_memory
    return None


# ---------------------------------------------------------------------------------------------
# a layout simulated
# ---------------------------------------------------------------------------------------------


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
    """Simulate ``layout`` under schedule ``kind`` with ``v`` virtual stages (see the module
    docstring, step 6); None when a stage's plans do not divide the micro-batch, the submeshes
    cannot be placed, or an interleaved schedule does not apply (:func:`_chunks`, and ``B`` a
    multiple of the stages).

    How each kind is weighed, beyond its simulated step:

    * memory for in-flight activations: GPipe ``B``, 1F1B ``min(S - s, B)`` micro-batches on
      stage ``s``; ZB-H1 the simulated peak between a forward and its ``W`` (deferring ``W``
      holds its inputs: at most ``min(S, B)``; with rematerialised layers the saved
      activations are the checkpoints, and a deferred ``W`` either keeps what ``B`` recomputed
      or recomputes it, which this does not count); interleaved, per mesh, its chunks' resident
      bytes plus its simulated peak of chunk micro-batches times its largest chunk's
      activations;
    * ZB-H1's ``W`` of a stage is its layers' backward times their weight-gradient FLOP share
      (:meth:`_Table.weight_share`), its ``B`` the rest;
    * interleaved pays a transfer between every pair of consecutive chunks (mesh ``P - 1``
      hands back to mesh 0) and a program launch per chunk task;
    * a layout that does not fit gets the memory levers its stages need
      (:func:`~autoplan.search.pipeline._levers.choose`: a ZeRO level, rematerialised layers)
      at the in-flight counts simulated, and is simulated again with them (``levers``: the
      chosen ones, per stage, with their stage terms).
    """
    ctx = table.ctx
    B = B or table.B
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
    if kind == "interleaved":
        mine = [range(g, S, P) for g in range(P)]
        per_mesh = [sum(stages[s].resident for s in mine[g]) + stats.peak_inflight[g]
                    * max(stages[s].activation for s in mine[g]) for g in range(P)]
        memory = [per_mesh[s % P] for s in range(S)]
    elif kind in SPLIT_KINDS:
        memory = [x.resident + stats.peak_inflight[s] * x.activation for s, x in enumerate(stages)]
    else:
        memory = [x.resident + (min(S - s, B) if kind == "1f1b" else B) * x.activation
                  for s, x in enumerate(stages)]
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


# ---------------------------------------------------------------------------------------------
# layouts of one micro-batch count
# ---------------------------------------------------------------------------------------------


def _stage_counts(L: int, D: int) -> list[int]:
    """Stage counts the DAG stage ILP is solved for: 2 .. 8, then powers of two, up to
    ``min(L, D)``."""
    cap = min(L, D)
    return [s for s in sorted({*range(2, 9), 16, 32, 64}) if s <= cap]


def _cells(layouts: Iterable[Layout]) -> list[tuple[int, int, int]]:
    """The ``(layer, submesh k, config c)`` cells the stages of ``layouts`` use."""
    return list(dict.fromkeys((li, k, c) for lay in layouts for members, k, c in lay
                              for li in members))


def _layouts(table: _Table, dag, use_ilp: bool, ratio: float = 1.0, B: int | None = None,
             full: bool = True, explain: bool = False, workers: int = 1
             ) -> tuple[dict[Layout, float], bool, float | None, float]:
    """The candidate layouts of ``table`` (re-timed by ``ratio`` for ``B`` micro-batches):
    ``(layouts with the DP's latency, whether they fit, the least memory that would fit, DP
    seconds)``. ``full`` runs the DP for each stage count of :data:`STAGE_COUNTS` too (else the
    DP over any number of stages and the one-stage layout only). ``explain`` seeks the least
    memory that would fit when nothing does (a bisection of DP runs: only for a message). The
    DP runs are tasks on ``workers`` processes (:func:`_layouts_of`)."""
    return _layouts_of(table, dag, use_ilp, [(ratio, B or table.B, full)], explain, workers)[0]


def _layouts_of(table: _Table, dag, use_ilp: bool, items: Sequence[tuple[float, int, bool]],
                explain: bool = False, workers: int = 1
                ) -> list[tuple[dict[Layout, float], bool, float | None, float]]:
    """:func:`_layouts` of several ``(ratio, B, full)`` items at once: every stage-DP run of
    every item is an independent task (:func:`_stage_dp_run`) of one batch on ``workers``
    processes, first with the memory limit; the items where no layout fits it are run again
    without it (their layouts are then marked as not fitting). Each item's layouts come in the
    order one process would meet them; the seconds are the batch's, shared by its items."""
    ctx = table.ctx
    t0 = time.perf_counter()
    if ctx.megatron:
        lays = _megatron_layouts(table, grid=ctx.megatron == "grid")
        return [({lay: math.nan for lay in lays}, True, None, time.perf_counter() - t0)
                for _ in items]
    runs = [_dp_runs(table, dag, use_ilp, ratio, B, full) for ratio, B, full in items]
    out: list[Any] = [None] * len(items)
    leasts: dict[int, float | None] = {}
    todo = list(range(len(items)))
    for memory in (True, False):
        jobs = [(i, r, lo, hi) for i in todo for r, (_, counts, _, _) in enumerate(runs[i])
                for lo, hi in counts]
        tasks = [Task(_stage_dp_run, None, (runs[i][r][0], ctx.submeshes, ctx.num_hosts,
                                            ctx.devices_per_host, items[i][1], lo, hi,
                                            ctx.budget if memory else None),
                      label=f"stage DP, {items[i][1]} micro-batches, {lo}..{hi or 'any'} stages")
                 for i, r, lo, hi in jobs]
        results = [o.result() for o in run_tasks(tasks, workers=workers)]
        found: dict[int, dict[Layout, float]] = {i: {} for i in todo}
        empty_runs: dict[int, list[int]] = {i: [] for i in todo}
        n = 0
        for i in todo:
            for r, (_, counts, members, levered) in enumerate(runs[i]):
                got_any = False
                for _ in counts:
                    for total, stages in results[n]:
                        if levered and all(c < ctx.C for _, _, _, c in stages):
                            continue  # (a lever run's layouts without a lever: the base run's)
                        found[i].setdefault(tuple((members(a, b), k, c % ctx.C)
                                                  for a, b, k, c in stages), total)
                        got_any = True
                    n += 1
                if not got_any:
                    empty_runs[i].append(r)
        left = []
        for i in todo:
            if memory and explain:
                for r in empty_runs[i]:
                    lm = _least_fitting_memory(runs[i][r][0], ctx, items[i][1])
                    if lm is not None:
                        least = leasts.get(i)
                        leasts[i] = lm if least is None else min(least, lm)
            if found[i] or not memory:
                out[i] = (found[i], memory)
            else:
                left.append(i)
        todo = left
        if not todo:
            break
    seconds = time.perf_counter() - t0
    return [(found_i, fits, leasts.get(i), seconds) for i, (found_i, fits) in enumerate(out)]


def _megatron_layouts(table: _Table, grid: bool = True) -> list[Layout]:
    """The Megatron TP x PP x DP baseline's layouts, as Megatron-LM's own benchmark grid-searches
    them: ``PP`` pipeline stages of equal layer counts (every ``PP`` dividing the devices, up to
    the layers), each on ``N / PP`` devices viewed as a ``DP x TP`` mesh with tensor parallelism
    of 1, 2, 4 or 8 devices inside a node (``TP`` on the inner axis). The micro-batch count is
    searched over them as for any layout. Without ``grid`` the one layout of one stage per node,
    tensor parallelism over the node's devices."""
    ctx, L = table.ctx, table.L
    n, per = ctx.num_hosts * ctx.devices_per_host, ctx.devices_per_host
    out: list[Layout] = []
    for pp in range(1, min(L, n) + 1):
        d = n // pp
        if n % pp or not grid and (pp != ctx.num_hosts or ctx.num_hosts == 1):
            continue
        sub = (1, d) if d <= per else (d // per, per)
        if sub not in ctx.submeshes or sub[0] * sub[1] != d:
            continue
        k = ctx.submeshes.index(sub)
        cuts = [round(i * L / pp) for i in range(pp + 1)]
        for c, (shape, lean) in enumerate(ctx.configs[k]):
            if lean or len(shape) != 2 or shape[1] not in (1, 2, 4, 8) or shape[1] > per:
                continue
            if not grid and shape != (1, per):
                continue
            out.append(tuple((tuple(range(cuts[i], cuts[i + 1])), k, c) for i in range(pp)))
    if not out:
        raise InfeasiblePlanError(f"Megatron TP x PP: no stage layout of {L} layers on "
                                  f"{ctx.num_hosts} x {per} devices.")
    return out


def _dp_runs(table: _Table, dag, use_ilp: bool, ratio: float, B: int, full: bool):
    """The stage-DP runs of one ``(ratio, B, full)`` item: ``(DP inputs, [(least, most)
    stages], layer indices of a run's stage start .. end)`` per run: one run over the chain of
    layers, or one per grouping of TePDist's DAG stage ILP."""
    ctx, L = table.ctx, table.L
    num_devices = ctx.num_hosts * ctx.devices_per_host
    if not use_ilp:
        counts: list[tuple[int, int | None]] = [(1, None), (1, 1)]
        if full:
            counts += [(s, s) for s in STAGE_COUNTS if s <= min(L, num_devices)]

        def members(a: int, b: int) -> tuple[int, ...]:
            return tuple(range(a, b))

        base = _chain_inputs(table, ratio, B)
        return [(base, counts, members, False)] + _lever_runs(table, [(base, counts, members)],
                                                               None, ratio, B)
    from autoplan.search.pipeline._stage_ilp import stage_ilp  # noqa: PLC0415

    if ctx.groupings is None:
        ctx.groupings = [[list(range(L))]]
        for S in _stage_counts(L, num_devices):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    r = stage_ilp(dag, S, time_limit=ctx.time_limit)
            except (InfeasiblePlanError, SearchError):
                continue
            groups = [sorted(v for v, s in r.assignment.items() if s == st) for st in range(S)]
            if all(groups):
                ctx.groupings.append(groups)
    out = []
    for groups in ctx.groupings:
        run = (_group_inputs(table, groups, ratio, B), [(1, None)],
               lambda a, b, g=groups: tuple(li for x in range(a, b) for li in g[x]))
        out += [(*run, False)] + _lever_runs(table, [run], groups, ratio, B)
    return out


def _lever_runs(table: _Table, runs: list, groups: list[list[int]] | None, ratio: float,
                B: int) -> list:
    """The lever runs (:func:`~autoplan.search.pipeline._levers.lever_run`) beside base runs:
    their layouts are kept only where they use a lever configuration."""
    if not table.ctx.levers:
        return []
    from autoplan.search.pipeline._levers import lever_run  # noqa: PLC0415

    out = []
    for inputs, counts, members in runs:
        lever = lever_run(table, inputs, groups, ratio, B)
        if lever is not None:
            out.append((lever, counts, members, True))
    return out


# ---------------------------------------------------------------------------------------------
# the plan
# ---------------------------------------------------------------------------------------------


def _add(out: dict[str, float], key: str, v: float) -> None:
    out[key] = out.get(key, 0.0) + v


def _compose(table: _Table, ev: _Eval, *, workload: Any, level: str, notes: tuple[str, ...]
             ) -> Plan:
    """The :class:`Plan` of a simulated layout: each stage composed from its layers' solutions,
    every operator under its own layer's name and scope."""
    ctx, graph, full, B = table.ctx, table.graph, table.ctx.full, ev.B
    layer_names = op_layer_names(graph)  # the layers' names as every view shows them
    full_shapes = {gi.name: full.tensors[gi.tensor].shape for gi in full.inputs}
    S = len(ev.layout)
    stages: list[Stage] = []
    inputs: dict[str, InputSpec] = {}
    per_stage = []  # (compute, comm seconds, comm time by kind, comm bytes, comm by axis)
    stage_of = [0] * table.L
    for s, (members, _, _) in enumerate(ev.layout):
        for li in members:
            stage_of[li] = s
    fwd_bytes, bwd_bytes = table.boundary_bytes(stage_of, S)
    for si, ((members, k, c), terms) in enumerate(zip(ev.layout, ev.stages)):
        n, m = ctx.submeshes[k]
        shape, _ = ctx.configs[k][c]
        mesh = ctx.mesh(k, shape)
        op_shardings = []
        mb_comms: list[Comm] = []
        step_comms: list[Comm] = []
        compute = 0.0
        for li in members:
            res = table.result(li, k, c)
            lc = table.cost(li, k, c)
            compute += B * (lc.forward_compute + lc.backward_compute) + lc.step_compute
            mb_comms += [*lc.forward_comms, *lc.backward_comms]
            step_comms += lc.step_comms
            rep_sub, mine = table.sub(table.rep[table.layers[li].signature]), table.sub(li)
            names = {a.name: b.name for a, b in zip(rep_sub.inputs, mine.inputs)}
            names.update({f"%{lt}": f"%{gt}" for gt, lt in table.local(li).items()})
            for o in res.plan.stages[0].ops:
                gop = graph.ops[mine.origin[o.op]]
                op_shardings.append(replace(
                    o, op=gop.id, scope=gop.scope_name,
                    layer=layer_names[gop.id],
                    tensors=tuple(replace(t, name=names.get(t.name, t.name)) for t in o.tensors)))
            for spec, gi in zip(res.plan.inputs, mine.inputs):
                if gi.kind == "activation":
                    continue
                inputs.setdefault(gi.name, replace(
                    spec, arg=gi.arg, arg_name=gi.arg_name, path=gi.path, kind=gi.kind,
                    stage=si, shape=tuple(full_shapes.get(gi.name, spec.shape))))
        inside = set(members)
        for a, b in table.passing():
            if a in inside and b in inside:
                fw, bw, st = table.pair(a, b, k, c)
                mb_comms += fw + bw
                step_comms += st
        comm_bytes: dict[str, float] = {}
        comm_time: dict[str, float] = {}
        by_axis: dict[str, float] = {}
        for times, comms in ((B, mb_comms), (1, step_comms)):
            for x in comms:
                _add(comm_bytes, x.kind, times * x.bytes)
                _add(comm_time, x.kind, times * x.time)
                axis: dict[str, float] = {}
                _comm_by_axis(x, mesh, axis)
                for ax, v in axis.items():
                    _add(by_axis, ax, times * v)
        # cross-stage transfers a device of this stage receives, per step
        for nbytes, src in ((fwd_bytes[si - 1] if si > 0 else 0.0, si - 1),
                            (bwd_bytes[si] if si < S - 1 else 0.0, si + 1)):
            if nbytes <= 0:
                continue
            cross = ctx.crosses_hosts(ev.placed[src], ev.placed[si])
            t, sr, ag = ctx.transfer(float(nbytes), k, cross, n * m)
            _add(comm_bytes, "send-recv", B * sr)
            if ag:
                _add(comm_bytes, "all-gather", B * ag)
            _add(comm_time, "send-recv", B * t)
        names = tuple(nm for li in members for nm in table.layers[li].names)
        lever = {}
        if ev.levers is not None and ev.levers[si]:
            lever, compute = _lever_fields(table, members, k, c, ev.levers[si], B, comm_bytes,
                                           compute)
        stages.append(Stage(
            index=si, layers=names, layer_range=(members[0], members[-1] + 1), submesh_shape=(n, m),
            device_ids=tuple(ev.placed[si]), mesh_shape=tuple(shape), axis_names=mesh.axis_names,
            ops=tuple(op_shardings), forward_time=terms.forward, backward_time=terms.backward,
            memory=ev.memory[si], comm_bytes=comm_bytes, **lever))
        per_stage.append((compute, comm_time, comm_bytes, by_axis))
    busy = ev.stats.busy
    hot = int(np.argmax(busy))
    step = ev.step
    devices = sum(s.num_devices for s in stages[:ev.meshes])  # (interleaved: each mesh once)
    batch = batch_size(full)
    pred = Predicted(
        step_time=step, throughput=batch / step if step > 0 else 0.0,
        memory_per_device=max(ev.memory), compute_time=per_stage[hot][0],
        comm_time=sum(per_stage[hot][1].values()),
        comm_bytes={kk: max(p[2].get(kk, 0.0) for p in per_stage)
                    for kk in sorted({kk for p in per_stage for kk in p[2]})},
        comm_by_axis={ax: max(p[3].get(ax, 0.0) for p in per_stage)
                      for ax in sorted({ax for p in per_stage for ax in p[3]})},
        comm_time_by_kind=dict(per_stage[hot][1]), bubble_fraction=ev.stats.bubble_fraction,
        mfu=full.flops / (step * devices * ctx.cluster.peak_flops) if step > 0 else 0.0)
    if any(st.levers for st in stages):
        from autoplan.search.pipeline._levers import EXEC_NOTE  # noqa: PLC0415

        notes = (*notes, EXEC_NOTE)
    table_rows = schedule_table(ev.kind, S, B, ev.virtual_stages)
    return Plan(
        model=full.name, fingerprint=full.fingerprint, cluster=ctx.cluster, stages=tuple(stages),
        inputs=tuple(_complete_inputs(full, inputs)), predicted=pred,
        schedule=Schedule(ev.kind, B, S,
                          table=tuple(tuple(None if e is None else (e.microbatch, e.stage, e.kind)
                                            for e in row) for row in table_rows),
                          events=tuple((e.start, e.end, e.mesh, e.microbatch, e.stage, e.kind)
                                       for e in ev.events),
                          virtual_stages=ev.virtual_stages),
        label="autoplan-pipeline" if S > 1 else "autoplan", level=level,
        config=dict(workload.config), jax_version=jax.__version__,
        notes=notes)


def _lever_fields(table: _Table, members: Sequence[int], k: int, c: int, lv: Any, B: int,
                  comm_bytes: dict[str, float], compute: float) -> tuple[dict[str, Any], float]:
    """A stage's lever fields (``zero``, ``zero_axes``, ``remat_layers``) and its compute with
    the recomputed forwards; ``comm_bytes`` gets ZeRO's collectives (none below zero)."""
    from autoplan.search.pipeline._levers import stage_extras  # noqa: PLC0415

    more, nbytes = stage_extras(table, members, k, c, lv, B)
    for kind, b in nbytes.items():
        comm_bytes[kind] = max(0.0, comm_bytes.get(kind, 0.0) + b)
    remat = tuple(nm for li in members if li in lv.remat for nm in table.layers[li].names)
    return {"zero": lv.zero, "zero_axes": lv.axes, "remat_layers": remat}, compute + more


def _complete_inputs(full: OpGraph, inputs: dict[str, InputSpec]) -> list[InputSpec]:
    """Every graph input in the full graph's order; inputs no stage read stay replicated on stage 0."""
    out = []
    for gi in full.inputs:
        if gi.name in inputs:
            out.append(inputs[gi.name])
        else:
            t = full.tensors[gi.tensor]
            out.append(InputSpec(gi.arg, gi.arg_name, gi.path, gi.kind, t.shape, t.dtype,
                                 (None,) * len(t.shape), 0))
    return out


# ---------------------------------------------------------------------------------------------
# the search
# ---------------------------------------------------------------------------------------------


def pipeline_search(workload: Any, cluster: Cluster, *, schedule: str = "1f1b",
                    microbatches: int | str | None = None, level: str = "folded",
                    memory_budget: float | None = None, time_limit: float = 60.0,
                    num_layers: int | None = None, stage_algorithm: str = "auto",
                    max_candidates: int = 3, megatron: bool | str = False,
                    inter_only: bool = False,
                    submesh_hosts: str = "auto", pins: Mapping[str, Any] | None = None,
                    workers: int | None = None, levers: bool = True,
                    pin: Mapping[str, Any] | None = None) -> PipelineResult:
    """Search pipeline plans (see the module docstring).

    Args:
        workload: an :class:`~autoplan.Workload` (a zoo workload or a user's), or anything
            with ``fn`` and ``args``; the batch is read from the leading dimension of its
            ``batch`` arguments.
        cluster: the cluster.
        schedule: ``"1f1b"``, ``"gpipe"``, ``"interleaved"`` (Megatron-LM's interleaved 1F1B
            with :data:`INTERLEAVED_CHUNKS` virtual stages per mesh, the best kept; 1F1B where
            none applies), ``"zb-h1"`` (zero-bubble ZB-H1) or ``"auto"`` (every layout
            simulated under each of :data:`AUTO_SCHEDULES`, the best kept).
        microbatches: the number of micro-batches; ``None`` or ``"auto"`` searches it
            (see the module docstring, step 7).
        level: recorded in the plans (each layer's ILP is solved whole).
        memory_budget: bytes per device (default the device's memory).
        time_limit: seconds per ILP (a layer ILP stops at :data:`LAYER_TIME_LIMIT` if less,
            with the best plan found).
        num_layers: how many layers to group the operators into (default automatic).
        stage_algorithm: ``"dp"`` (Alpa's stage DP on contiguous layers), ``"ilp"`` (TePDist's
            stage ILP on the layer DAG, then the DP for submeshes) or ``"auto"`` (the ILP when
            the layer graph is not a chain, side tensors aside).
        max_candidates: how many stage counts to return the best plan of (the one-stage
            layout is always among them).
        megatron: build a Megatron baseline instead of searching: ``True`` one stage per node
            with equal layer counts, Megatron's tensor-parallel pins over each node, the
            default number of micro-batches; ``"grid"`` the TP x PP x DP grid of
            :func:`_megatron_layouts` (pipeline stages of equal layer counts, tensor parallelism
            of 1, 2, 4 or 8 devices inside a node, data parallelism outside), micro-batches
            searched as for any layout; the best of each stage count.
        inter_only: the inter-operator-only ablation: every stage on one device (submesh
            ``1x1``, so as many stages as devices), Alpa's stage DP over the layers.
        submesh_hosts: ``"all"`` (Alpa's ``(2, M) .. (N, M)`` on ``N`` hosts of ``M`` devices),
            ``"pow2"`` (2, 4, 8, ... hosts, plus ``N``), or ``"auto"`` (``"all"`` up to
            :data:`AUTO_ALL_HOSTS` hosts).
        pins: ``{regex over input names: PartitionSpec}`` fixing those inputs' specs in every
            layer plan (a submesh and logical mesh on which a pinned spec does not divide has
            no plan).
        workers: processes that solve the layer ILPs (independent tasks of
            :func:`~autoplan.search._parallel.run_tasks`, with the same results as one process);
            None: every core for a large step (as :func:`autoplan.search`).
        levers: let stages that do not fit the memory limit use a ZeRO level and
            rematerialised layers (:mod:`~autoplan.search.pipeline._levers`); a search whose
            layouts fit is the same either way. The executor does not apply them yet: plans
            that use them say so in their notes.
        pin: the old name of ``pins`` (deprecated: a :class:`DeprecationWarning`).

    Returns:
        The best plan per distinct number of stages, best first (fitting plans before the
        others), and ``stats``: ``layers``, ``microbatches`` (of the best plan),
        ``microbatches_default``, ``microbatch_candidates`` (``{count: its best fitting step time,
        exact at the default and re-timed from the default's plans elsewhere; None where no
        layout divides or fits}``), ``microbatches_exact`` (the counts costed
        exactly), ``submeshes``, ``layer_solves``, ``layer_solves_at_time_limit``,
        ``unique_layer_kinds``,
        ``layouts_simulated``, ``stage_algorithm``, ``dp_latency`` (the DP's latency of the
        best plan's layout), ``fits``, ``infeasible`` (why, when no layout fits the memory: the
        fastest layouts are returned then, marked as not fitting) and seconds per phase.

    Raises:
        SearchError: bad options; a fixed ``microbatches`` that does not divide the batch.
        InfeasiblePlanError: no stage layout exists, or none fits a given ``memory_budget`` (the
            message says why and the least memory that would fit). Without ``memory_budget`` the
            device's memory only ranks: layouts that do not fit are returned, marked.
    """
    pins = renamed_pin("pipeline_search", pins, pin)
    memory_budget = check_memory_budget("pipeline_search", memory_budget)
    workload = as_workload(require_workload("pipeline_search", workload), "pipeline_search")
    if stage_algorithm not in ("auto", "dp", "ilp"):
        raise SearchError(f"search: stage_algorithm should be 'auto', 'dp' or 'ilp'. Got "
                          f"{stage_algorithm!r}. Fix: 'dp' (Alpa), 'ilp' (TePDist's DAG ILP) or "
                          "'auto'.")
    if schedule not in SCHEDULES:
        raise SearchError(f"search: schedule should be one of {', '.join(map(repr, SCHEDULES))}. "
                          f"Got {schedule!r}.")
    check_microbatches(microbatches)
    check_submesh_hosts(submesh_hosts)
    check_workers(workers)
    if not isinstance(levers, bool):
        raise SearchError(f"pipeline: levers should be True or False. Got {levers!r}. Fix: "
                          "levers=False searches without ZeRO levels and rematerialisation.")
    t0 = time.perf_counter()
    full = traced(workload)
    for pattern in pins or {}:
        try:
            hit = full.find_inputs(pattern, names_only=True)
        except re.error as err:
            raise SearchError(f"pipeline: the pin {pattern!r} should be a regular expression. Got "
                              f"the error {err}. Fix: escape its brackets.") from err
        if not hit:
            raise SearchError(f"pipeline: the pin {pattern!r} should match an input name. Got no "
                              f"match among {len(full.inputs)} inputs such as "
                              f"{full.inputs[0].name!r}. Fix: re.search must find it in a name.")
    batch = batch_size(full)
    num_hosts, devices_per_host = cluster.nodes, cluster.devices_per_node
    fixed = isinstance(microbatches, int | np.integer)
    B0 = int(microbatches) if fixed else _default_microbatches(batch, num_hosts * devices_per_host)
    if batch % B0:
        raise SearchError(f"pipeline: microbatches should divide the batch ({batch}, the leading "
                          f"dimension of the batch arguments). Got {B0}. Fix: pass a divisor of "
                          f"{batch} or microbatches='auto'.")
    search_mb = not fixed and megatron is not True
    full, graph = _traces(workload, B0)
    t_trace = time.perf_counter() - t0
    layers = group_layers(graph, num_layers)
    dag = layer_dag(graph, layers)
    use_ilp = stage_algorithm == "ilp" or (stage_algorithm == "auto" and not _is_chain(dag))
    hosts = (submesh_hosts if submesh_hosts != "auto"
             else ("all" if num_hosts <= AUTO_ALL_HOSTS else "pow2"))
    budget = float(memory_budget or cluster.device_memory)
    subs = [(1, 1)] if inter_only else submesh_shapes(num_hosts, devices_per_host, hosts)
    ctx = _Context(cluster, full, subs, schedule, budget,
                   time_limit, megatron, pins)
    ctx.levers = levers
    table = _Table(ctx, graph, layers, B0)
    n_workers = resolve_workers(workers, len(full))

    # the default count, costed exactly: every layer kind on every cell, then the layouts
    t1 = time.perf_counter()
    if not megatron:
        table.solve_cells(((li, k, c) for li in table.rep.values() for k, c in ctx.cells()),
                          n_workers)
        for li in table.rep.values():
            for k, c in ctx.cells():
                table.cost(li, k, c)
    t_costs = time.perf_counter() - t1
    # the default count's layouts and the other counts' screening (the default's plans re-timed):
    # the stage-DP runs of both in one batch of tasks
    others: list[int] = []
    counts: list[int] = [B0]
    if search_mb and table.screenable:
        window = MICROBATCH_WINDOW if num_hosts <= AUTO_ALL_HOSTS else 2
        counts = microbatch_counts(batch, B0, window)
        # screened in two rounds: the default's power-of-two multiples and fractions first,
        # then the other divisors between the best of those and its neighbours (finer_counts)
        others = [B for B in counts if B != B0 and max(B, B0) % min(B, B0) == 0
                  and (r := max(B, B0) // min(B, B0)) & (r - 1) == 0]
    outs = _layouts_of(table, dag, use_ilp, [(1.0, B0, True)] + [(B0 / B, B, False)
                                                                  for B in others],
                       workers=n_workers)
    found, fits, _, t_dp = outs[0]

    def no_fit() -> tuple[str, float | None]:
        """Why no layout of the default count fits, with the least memory that would (sought
        only when said: it takes a bisection of DP runs)."""
        least = _layouts(table, dag, use_ilp, explain=True, workers=n_workers)[2]
        return (f"pipeline: no stage layout fits {budget:.4g} bytes per device ({table.L} layers, "
                f"{len(ctx.submeshes)} submesh shapes, {B0} micro-batches)."
                + (f" The least memory with which one would fit is {least:.4g} bytes." if least
                   else "")), least

    if not found or (not fits and memory_budget is not None):
        why, least = no_fit()
        raise InfeasiblePlanError(why + " Fix: use more or larger devices, enable "
                                  "rematerialisation, or raise the memory budget.", least)
    table.solve_cells(_cells(found), n_workers)
    evals = [ev for ev in (_evaluate(table, lay, dp_latency=v) for lay, v in found.items()) if ev]
    simulated = len(found)
    candidates: dict[int, float | None] = {B0: min((ev.step for ev in evals if ev.fits),
                                                   default=None)}
    exact = [B0]
    tables = {B0: table}

    # other counts: screened on the default's plans re-timed, the best costed exactly
    if len(counts) > 1 and evals:
        t2 = time.perf_counter()
        screened: list[tuple[tuple[bool, float], int, list[Layout]]] = []

        def screen(Bs: list[int], outs_B: list) -> None:
            nonlocal simulated
            for B, (lays, ok, _, _) in zip(Bs, outs_B):
                ratio = B0 / B
                got = sorted((ev for ev in (_evaluate(table, lay, ratio, B) for lay in lays)
                              if ev), key=lambda ev: ev.key)
                simulated += len(lays)
                candidates[B] = got[0].step if got and ok and got[0].fits else None
                if got:
                    screened.append((got[0].key, B, [ev.layout for ev in got[:EXACT_LAYOUTS]]))

        screen(others, outs[1:])
        best_now = min(ev.key for ev in evals)
        lead = min([(k, B) for k, B, _ in screened] + [(best_now, B0)])[1]
        finer = finer_counts(counts, sorted(set(others) | {B0}), lead)
        if finer:
            # (a few short DP runs: in this process, cheaper than handing them to workers)
            screen(finer, _layouts_of(table, dag, use_ilp, [(B0 / B, B, False) for B in finer]))
        t_dp += time.perf_counter() - t2
        for key, B, lays in sorted(screened, key=lambda x: (x[0], x[1]))[:EXACT_MICROBATCH_COUNTS]:
            if key[:2] >= (best_now[0], best_now[1] * (1 - SCREEN_MARGIN)):
                continue  # not faster than the default by more than the screening can resolve
            try:
                gB = _traces(workload, B)[1]
            except TraceError:
                continue  # the step does not trace at this micro-batch size (a model's constraint)
            if not _aligned(gB, graph):
                continue
            tables[B] = tB = _Table(ctx, gB, layers, B)
            tB.solve_cells(_cells(lays), n_workers)
            evals += [ev for ev in (_evaluate(tB, lay) for lay in lays) if ev]
            exact.append(B)
    if not evals:  # (the Megatron grid, whose pins may divide on none of its meshes)
        raise InfeasiblePlanError(f"pipeline: none of the {len(found)} stage layouts can be "
                                  "placed with plans on their meshes. Fix: use a batch that "
                                  "divides over the devices, or fewer devices.")
    evals.sort(key=lambda ev: ev.key)

    # the best plan per stage count (the one-stage layout kept), best first
    best_of: dict[int, _Eval] = {}
    for ev in evals:
        best_of.setdefault(ev.meshes, ev)
    chosen = sorted(best_of.values(), key=lambda ev: ev.key)[:max(1, max_candidates)]
    if 1 in best_of and best_of[1] not in chosen:
        chosen.append(best_of[1])
    plans = []
    alg = "TePDist DAG ILP + Alpa stage DP for submeshes" if use_ilp else "Alpa stage DP"
    for ev in chosen:
        tb = tables[ev.B]
        dp = "" if ev.dp_latency is None or math.isnan(ev.dp_latency) else \
            f"; stage DP latency {ev.dp_latency:.6g} s"
        notes = (f"stage algorithm: {alg}",
                 f"{ev.B} micro-batches" + (" (searched)" if search_mb else "")
                 + f"; simulated step {ev.step:.6g} s{dp}")
        plans.append(_compose(tb, ev, workload=workload, level=level, notes=notes))
    stats = {"layers": len(layers), "microbatches": chosen[0].B, "microbatches_default": B0,
             "microbatch_candidates": candidates, "microbatches_exact": exact,
             "submeshes": len(ctx.submeshes), "layer_solves": ctx.solves,
             "layer_solves_at_time_limit": ctx.timed_out,
             "unique_layer_kinds": len(table.rep), "layouts_simulated": simulated,
             "trace_seconds": t_trace, "cost_seconds": t_costs, "dp_seconds": t_dp,
             "stage_algorithm": "ilp" if use_ilp else "dp",
             "dp_latency": chosen[0].dp_latency, "fits": chosen[0].fits}
    if not chosen[0].fits:  # (no count's layout fits: the default count's says why)
        stats["infeasible"] = no_fit()[0] + " Its fastest layouts are returned, marked as not fitting."
    return PipelineResult(plans=plans, stats=stats)

