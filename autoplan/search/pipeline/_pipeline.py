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
   always a candidate, and so is the best layout of each of :data:`RANKED_STAGE_COUNTS` stages.
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

Where each part lives (modules of :mod:`autoplan.search.pipeline`):

* :mod:`._microbatches`: the batch, the step traced at micro-batch size, the counts searched
  (steps 1 and 7);
* :mod:`._layer_costs`: a layer's ILPs, the lean plan and :class:`LayerCost` (steps 2 and 3);
* :mod:`._cost_table`: the search's context and the table of layer costs at one micro-batch
  count, from which stages are costed (steps 2 to 4);
* :mod:`._layouts`: the layer DAG, the stage DP's inputs and runs, the candidate layouts (step
  5); :mod:`._stage_dp`, :mod:`._stage_ilp` and :mod:`._levers` the algorithms they run;
* :mod:`._simulate`: a layout simulated under the schedules weighed (step 6);
* :mod:`._compose`: the :class:`~autoplan.Plan` of a simulated layout;
* this module: the options, the search's steps in order and :func:`pipeline_search`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autoplan._errors import InfeasiblePlanError, SearchError, TraceError
from autoplan._options import check_memory_budget, require_workload
from autoplan.costs._cluster import Cluster
from autoplan.plans._plan import Plan
from autoplan.plans._schedule import check_schedule_choice
from autoplan.search._parallel import check_workers, resolve_workers
from autoplan.search.fold._layers import LayerGroup, group_layers
from autoplan.search.intra._pins import pins_by_name, renamed_pin, resolve_pins
from autoplan.search.pipeline._compose import _compose
from autoplan.search.pipeline._cost_table import _Context, _Table
from autoplan.search.pipeline._layer_costs import LayerCost, layer_cost, per_step_weighted
from autoplan.search.pipeline._layouts import (
    Layout,
    _cells,
    _is_chain,
    _layouts,
    _layouts_of,
    layer_dag,
)
from autoplan.search.pipeline._microbatches import (
    MICROBATCH_WINDOW,
    _aligned,
    _default_microbatches,
    _traces,
    batch_size,
    check_microbatches,
    finer_counts,
    microbatch_counts,
    microbatch_workload_args,
    traced,
)
from autoplan.search.pipeline._simulate import _Eval, _evaluate
from autoplan.search.pipeline._stage_dp import submesh_shapes
from autoplan.tracing._workload import Workload, as_workload

__all__ = ["PipelineResult", "LayerCost", "pipeline_search", "microbatch_workload_args",
           "layer_dag", "batch_size", "layer_cost", "per_step_weighted"]

#: Up to this many hosts the pipeline search uses Alpa's full submesh set; beyond it, multi-host
#: submeshes of a power-of-two number of hosts (plus all hosts): 11 shapes instead of 131 on 128
#: DGX nodes.
AUTO_ALL_HOSTS = 16

#: Besides the default, how many searched micro-batch counts are costed exactly (the best
#: screened ones predicted faster than the default's best by more than :data:`SCREEN_MARGIN`).
EXACT_MICROBATCH_COUNTS = 1

#: A screened count is costed exactly only when its re-timed step beats the default's by more
#: than this fraction (the layer ILPs' own gap,
#: :data:`~autoplan.search.pipeline._layer_costs.LAYER_MIP_GAP`, is of the same order).
SCREEN_MARGIN = 5e-3

#: Layouts of a screened micro-batch count costed exactly.
EXACT_LAYOUTS = 4


@dataclass
class PipelineResult:
    """What :func:`pipeline_search` found: ``plans`` best first, ``stats`` (see
    :func:`pipeline_search`)."""

    plans: list[Plan]
    stats: dict[str, Any]


# ---------------------------------------------------------------------------------------------
# the options
# ---------------------------------------------------------------------------------------------


def check_submesh_hosts(value: Any) -> None:
    """Raise :class:`SearchError` unless ``value`` is a ``submesh_hosts`` choice."""
    if value not in ("auto", "all", "pow2"):
        raise SearchError(f"search: submesh_hosts should be 'auto', 'all' or 'pow2'. Got "
                          f"{value!r}. Fix: 'all' is Alpa's full set of multi-host submeshes, "
                          "'pow2' keeps 2, 4, 8, ... hosts, 'auto' picks by cluster size.")


def check_stage_algorithm(value: Any) -> None:
    """Raise :class:`SearchError` unless ``value`` is a ``stage_algorithm`` choice."""
    if value not in ("auto", "dp", "ilp"):
        raise SearchError(f"search: stage_algorithm should be 'auto', 'dp' or 'ilp'. Got "
                          f"{value!r}. Fix: 'dp' (Alpa), 'ilp' (TePDist's DAG ILP) or 'auto'.")


def _check_options(schedule: str, microbatches: Any, stage_algorithm: str, submesh_hosts: str,
                   workers: Any, levers: Any) -> None:
    """Raise :class:`SearchError` on an option :func:`pipeline_search` does not take."""
    check_stage_algorithm(stage_algorithm)
    check_schedule_choice(schedule)
    check_microbatches(microbatches)
    check_submesh_hosts(submesh_hosts)
    check_workers(workers)
    if not isinstance(levers, bool):
        raise SearchError(f"pipeline: levers should be True or False. Got {levers!r}. Fix: "
                          "levers=False searches without ZeRO levels and rematerialisation.")


# ---------------------------------------------------------------------------------------------
# the search's steps
# ---------------------------------------------------------------------------------------------


@dataclass
class _Run:
    """One pipeline search under way: its inputs and what its steps have found so far.

    Attributes:
        table: the default count's layer costs (``B0`` micro-batches); ``tables`` holds it and
            those of the counts costed exactly.
        evals: the simulated layouts of the counts costed exactly.
        candidates: ``{count: its best fitting step time}`` (the ``microbatch_candidates``
            statistic); exact: the counts costed exactly.
        simulated: layouts simulated; seconds: per phase (``trace``, ``cost``, ``dp``).
    """

    workload: Workload
    ctx: _Context
    table: _Table
    layers: list[LayerGroup]
    dag: Any
    use_ilp: bool
    batch: int
    B0: int
    search_mb: bool
    workers: int
    memory_budget: float | None
    seconds: dict[str, float]
    evals: list[_Eval] = field(default_factory=list)
    candidates: dict[int, float | None] = field(default_factory=dict)
    exact: list[int] = field(default_factory=list)
    tables: dict[int, _Table] = field(default_factory=dict)
    simulated: int = 0


def _start(workload: Workload, cluster: Cluster, *, schedule: str, microbatches: Any,
           memory_budget: float | None, time_limit: float, num_layers: int | None,
           stage_algorithm: str, megatron: bool | str, inter_only: bool, submesh_hosts: str,
           pins: Mapping[str, Any] | None, workers: int | None, levers: bool) -> _Run:
    """The search's inputs: the step traced at full and at the default micro-batch size, its
    layers and their DAG, the stage algorithm, the submeshes, and the default count's (empty)
    table of layer costs."""
    t0 = time.perf_counter()
    full = traced(workload)
    resolve_pins(full, pins)  # each pin a regular expression matching an input
    # (a pin keyed by an input's tensor id, as autoplan.trace numbers them, becomes its name:
    # the layers' subgraphs and the micro-batch trace number tensors otherwise)
    pins = pins_by_name(full, pins)
    batch = batch_size(full)
    num_hosts, devices_per_host = cluster.nodes, cluster.devices_per_node
    fixed = isinstance(microbatches, int | np.integer)
    B0 = int(microbatches) if fixed else _default_microbatches(batch, num_hosts * devices_per_host)
    if batch % B0:
        raise SearchError(f"pipeline: microbatches should divide the batch ({batch}, the leading "
                          f"dimension of the batch arguments). Got {B0}. Fix: pass a divisor of "
                          f"{batch} or microbatches='auto'.")
    full, graph = _traces(workload, B0)
    t_trace = time.perf_counter() - t0
    layers = group_layers(graph, num_layers)
    dag = layer_dag(graph, layers)
    use_ilp = stage_algorithm == "ilp" or (stage_algorithm == "auto" and not _is_chain(dag))
    hosts = (submesh_hosts if submesh_hosts != "auto"
             else ("all" if num_hosts <= AUTO_ALL_HOSTS else "pow2"))
    budget = float(memory_budget or cluster.device_memory)
    subs = [(1, 1)] if inter_only else submesh_shapes(num_hosts, devices_per_host, hosts)
    ctx = _Context(cluster, full, subs, schedule, budget, time_limit, megatron, pins)
    ctx.levers = levers
    return _Run(workload, ctx, _Table(ctx, graph, layers, B0), layers, dag, use_ilp, batch, B0,
                not fixed and megatron is not True, resolve_workers(workers, len(full)),
                memory_budget, {"trace": t_trace})


def _cost_default(run: _Run) -> None:
    """The default count costed exactly: every layer kind on every cell (the Megatron baseline's
    only on the cells its layouts use, solved when they are simulated)."""
    t1 = time.perf_counter()
    table, ctx = run.table, run.ctx
    if not ctx.megatron:
        table.solve_cells(((li, k, c) for li in table.rep.values() for k, c in ctx.cells()),
                          run.workers)
        for li in table.rep.values():
            for k, c in ctx.cells():
                table.cost(li, k, c)
    run.seconds["cost"] = time.perf_counter() - t1


def _counts(run: _Run) -> tuple[list[int], list[int]]:
    """``(the counts searched, those screened in the first round)``: the default alone when the
    count is fixed; else the divisors of the batch within the window of the default, the first
    round the default's power-of-two multiples and fractions (the second, :func:`finer_counts`,
    the other divisors between the best of those and its neighbours)."""
    B0 = run.B0
    if not (run.search_mb and run.table.screenable):
        return [B0], []
    window = MICROBATCH_WINDOW if run.ctx.num_hosts <= AUTO_ALL_HOSTS else 2
    counts = microbatch_counts(run.batch, B0, window)
    others = [B for B in counts if B != B0 and max(B, B0) % min(B, B0) == 0
              and (r := max(B, B0) // min(B, B0)) & (r - 1) == 0]
    return counts, others


def _no_fit(run: _Run) -> tuple[str, float | None]:
    """Why no layout of the default count fits, with the least memory that would (sought only
    when said: it takes a bisection of DP runs)."""
    table, ctx = run.table, run.ctx
    least = _layouts(table, run.dag, run.use_ilp, explain=True, workers=run.workers)[2]
    return (f"pipeline: no stage layout fits {ctx.budget:.4g} bytes per device ({table.L} layers, "
            f"{len(ctx.submeshes)} submesh shapes, {run.B0} micro-batches)."
            + (f" The least memory with which one would fit is {least:.4g} bytes." if least
               else "")), least


def _simulate_default(run: _Run, found: dict[Layout, float]) -> None:
    """The default count's layouts (with their DP latencies) solved and simulated."""
    run.table.solve_cells(_cells(found), run.workers)
    run.evals = [ev for ev in (_evaluate(run.table, lay, dp_latency=v) for lay, v in found.items())
                 if ev]
    run.simulated = len(found)
    run.candidates = {run.B0: min((ev.step for ev in run.evals if ev.fits), default=None)}
    run.exact = [run.B0]
    run.tables = {run.B0: run.table}


def _screen(run: _Run, Bs: list[int], outs: list, screened: list) -> None:
    """Counts ``Bs`` screened: their layouts (``outs``, from :func:`_layouts_of`) simulated on
    the default's plans re-timed; each count's best step is a candidate, and its best
    :data:`EXACT_LAYOUTS` layouts go to ``screened`` with their ranking key."""
    for B, (lays, ok, _, _) in zip(Bs, outs):
        ratio = run.B0 / B
        got = sorted((ev for ev in (_evaluate(run.table, lay, ratio, B) for lay in lays)
                      if ev), key=lambda ev: ev.key)
        run.simulated += len(lays)
        run.candidates[B] = got[0].step if got and ok and got[0].fits else None
        if got:
            screened.append((got[0].key, B, [ev.layout for ev in got[:EXACT_LAYOUTS]]))


def _other_counts(run: _Run, counts: list[int], others: list[int], outs: list) -> None:
    """The other counts: screened on the default's plans re-timed (``others`` first, whose
    layouts are ``outs``, then :func:`finer_counts`), the best
    :data:`EXACT_MICROBATCH_COUNTS` costed exactly where they beat the default by more than
    :data:`SCREEN_MARGIN`."""
    t2 = time.perf_counter()
    screened: list[tuple[tuple[bool, float, float], int, list[Layout]]] = []
    _screen(run, others, outs, screened)
    best_now = min(ev.key for ev in run.evals)
    lead = min([(k, B) for k, B, _ in screened] + [(best_now, run.B0)])[1]
    finer = finer_counts(counts, sorted(set(others) | {run.B0}), lead)
    if finer:
        # (a few short DP runs: in this process, cheaper than handing them to workers)
        _screen(run, finer, _layouts_of(run.table, run.dag, run.use_ilp,
                                        [(run.B0 / B, B, False) for B in finer]), screened)
    run.seconds["dp"] += time.perf_counter() - t2
    for key, B, lays in sorted(screened, key=lambda x: (x[0], x[1]))[:EXACT_MICROBATCH_COUNTS]:
        if key[:2] >= (best_now[0], best_now[1] * (1 - SCREEN_MARGIN)):
            continue  # not faster than the default by more than the screening can resolve
        _cost_exactly(run, B, lays)


def _cost_exactly(run: _Run, B: int, lays: list[Layout]) -> None:
    """Count ``B`` costed exactly: the step traced at its micro-batch size, the layer ILPs of
    ``lays`` solved there and the layouts simulated (nothing where the step does not trace at
    that size, or its trace does not line up with the default's)."""
    try:
        gB = _traces(run.workload, B)[1]
    except TraceError:
        return  # the step does not trace at this micro-batch size (a model's constraint)
    if not _aligned(gB, run.table.graph):
        return
    run.tables[B] = tB = _Table(run.ctx, gB, run.layers, B)
    tB.solve_cells(_cells(lays), run.workers)
    run.evals += [ev for ev in (_evaluate(tB, lay) for lay in lays) if ev]
    run.exact.append(B)


def _chosen(run: _Run, max_candidates: int) -> list[_Eval]:
    """The best layout per stage count (the one-stage layout kept), best first."""
    run.evals.sort(key=lambda ev: ev.key)
    best_of: dict[int, _Eval] = {}
    for ev in run.evals:
        best_of.setdefault(ev.meshes, ev)
    chosen = sorted(best_of.values(), key=lambda ev: ev.key)[:max(1, max_candidates)]
    if 1 in best_of and best_of[1] not in chosen:
        chosen.append(best_of[1])
    return chosen


def _plan(run: _Run, ev: _Eval, level: str) -> Plan:
    """The plan of a chosen layout, its notes saying how it was found."""
    alg = "TePDist DAG ILP + Alpa stage DP for submeshes" if run.use_ilp else "Alpa stage DP"
    dp = "" if ev.dp_latency is None or math.isnan(ev.dp_latency) else \
        f"; stage DP latency {ev.dp_latency:.6g} s"
    notes = (f"stage algorithm: {alg}",
             f"{ev.B} micro-batches" + (" (searched)" if run.search_mb else "")
             + f"; simulated step {ev.step:.6g} s{dp}")
    return _compose(run.tables[ev.B], ev, workload=run.workload, level=level, notes=notes)


def _stats(run: _Run, chosen: list[_Eval]) -> dict[str, Any]:
    """The search's statistics (see :func:`pipeline_search`)."""
    ctx, seconds = run.ctx, run.seconds
    stats = {"layers": len(run.layers), "microbatches": chosen[0].B, "microbatches_default": run.B0,
             "microbatch_candidates": run.candidates, "microbatches_exact": run.exact,
             "submeshes": len(ctx.submeshes), "layer_solves": ctx.solves,
             "layer_solves_at_time_limit": ctx.timed_out, "layer_plans_mapped": ctx.mapped,
             "layer_plans_reused": sum(t.reused for t in {id(t): t for t in
                                                          (run.table, *run.tables.values())}.values()),
             "unique_layer_kinds": len(run.table.rep), "layouts_simulated": run.simulated,
             "trace_seconds": seconds["trace"], "cost_seconds": seconds["cost"],
             "dp_seconds": seconds["dp"], "stage_algorithm": "ilp" if run.use_ilp else "dp",
             "dp_latency": chosen[0].dp_latency, "fits": chosen[0].fits}
    if not chosen[0].fits:  # (no count's layout fits: the default count's says why)
        stats["infeasible"] = _no_fit(run)[0] + " Its fastest layouts are returned, marked as not fitting."
    return stats


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
            layouts fit is the same either way. The stage executor applies them; plans
            that use them say so in their notes.
        pin: the old name of ``pins`` (deprecated: a :class:`DeprecationWarning`).

    Returns:
        The best plan per distinct number of stages, best first (fitting plans before the
        others), and ``stats``: ``layers``, ``microbatches`` (of the best plan),
        ``microbatches_default``, ``microbatch_candidates`` (``{count: its best fitting step time,
        exact at the default and re-timed from the default's plans elsewhere; None where no
        layout divides or fits}``), ``microbatches_exact`` (the counts costed
        exactly), ``submeshes``, ``layer_solves``, ``layer_solves_at_time_limit``,
        ``layer_plans_reused`` (layer plans found already solved on the same traced step with
        the same options, by an earlier search or another pipeline run of this one: a change
        of memory budget or schedule re-solves none), ``layer_plans_mapped`` (layer plans
        taken from another layer kind's ILP, the same up to a constant: a kind that differs from
        another only where it reads a literal), ``unique_layer_kinds``,
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
    _check_options(schedule, microbatches, stage_algorithm, submesh_hosts, workers, levers)
    run = _start(workload, cluster, schedule=schedule, microbatches=microbatches,
                 memory_budget=memory_budget, time_limit=time_limit, num_layers=num_layers,
                 stage_algorithm=stage_algorithm, megatron=megatron, inter_only=inter_only,
                 submesh_hosts=submesh_hosts, pins=pins, workers=workers, levers=levers)
    _cost_default(run)
    # the default count's layouts and the other counts' screening (the default's plans re-timed):
    # the stage-DP runs of both in one batch of tasks
    counts, others = _counts(run)
    items = [(1.0, run.B0, True)] + [(run.B0 / B, B, False) for B in others]
    outs = _layouts_of(run.table, run.dag, run.use_ilp, items, workers=run.workers)
    found, fits, _, run.seconds["dp"] = outs[0]
    if not found or (not fits and memory_budget is not None):
        why, least = _no_fit(run)
        raise InfeasiblePlanError(why + " Fix: use more or larger devices, enable "
                                  "rematerialisation, or raise the memory budget.", least)
    _simulate_default(run, found)
    if len(counts) > 1 and run.evals:
        _other_counts(run, counts, others, outs[1:])
    if not run.evals:  # (the Megatron grid, whose pins may divide on none of its meshes)
        raise InfeasiblePlanError(f"pipeline: none of the {len(found)} stage layouts can be "
                                  "placed with plans on their meshes. Fix: use a batch that "
                                  "divides over the devices, or fewer devices.")
    chosen = _chosen(run, max_candidates)
    plans = [_plan(run, ev, level) for ev in chosen]
    return PipelineResult(plans=plans, stats=_stats(run, chosen))
