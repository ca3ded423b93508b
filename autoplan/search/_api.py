"""``autoplan.search`` and ``autoplan.plan``: the one entry point to every search.

:func:`search` traces the workload (unless given an OpGraph), then

* ``pipeline=False``: the intra-operator search on the whole cluster for each logical mesh shape
  (or the one given), at the chosen ``level``;
* ``pipeline=True``: the inter-operator search (layers, submeshes, Alpa's stage DP or TePDist's DAG
  stage ILP, a GPipe/1F1B schedule) with intra-operator plans per stage;
* ``pipeline="auto"`` (default): both, ranked together.

It adds baselines computed with the same cost model (data parallel, Megatron-style tensor
parallel, Megatron TP x PP) so the user sees what the search gained, and returns a
:class:`SearchResult` whose ``plans`` (candidates and baselines alike) are ranked by one
prediction: plans that fit in memory first, then by predicted step time. ``result.best`` is the
first of them, whatever produced it, so the search never hands back a plan worse than one it
holds; its label says where it came from (``"autoplan"``, ``"autoplan-pipeline"``,
``"baseline: data parallel"``, ...).

The workload is an :class:`autoplan.Workload` (a user's step and its arguments), a zoo workload
(:func:`autoplan.models.get`), or an :class:`~autoplan.OpGraph` from :func:`autoplan.trace`
(intra-operator plans only). Plans made from a workload's arguments keep the arguments' pytree
structure, so ``plan.named_shardings()`` returns the user's own types.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from autoplan import _cache
from autoplan._analysis import FoldingAnalysis
from autoplan._errors import AutoplanError, InfeasiblePlanError, SearchError
from autoplan._gc import gc_paused
from autoplan._options import (
    cache_max_bytes,
    check_callback,
    check_search_cluster,
)
from autoplan.costs._cluster import Cluster
from autoplan.plans._plan import LEVELS, Plan
from autoplan.search._parallel import (
    AUTO_PARALLEL_OPS,
    Task,
    check_not_bootstrapping,
    prestart,
    resolve_workers,
    run_tasks,
)
from autoplan.search._search_options import SearchOptions
from autoplan.search._warn import raise_again, user_stacklevel
from autoplan.search.fold._summary import analysis_of
from autoplan.search.intra._intra import make_logical_mesh, mesh_shapes_for
from autoplan.search.intra._pins import (
    pin_specs,
    pins_by_name,
    renamed_pin,
    resolve_pins,
    unheld_pins,
)
from autoplan.search.pipeline._microbatches import MicrobatchTraceError
from autoplan.tracing._batchflow import MIXING_NOTE, RANDOM_NOTE, mixing_of, random_draws
from autoplan.tracing._graph import OpGraph
from autoplan.tracing._workload import as_workload, is_workload_like

__all__ = ["SearchResult", "search", "plan", "LEVELS", "PlanDoesNotFitWarning", "BatchSplitWarning",
           "NoPipelineWarning", "PinNotHeldWarning", "GRAPH_ONLY_NOTE"]

#: the note (and warning) of a search given a graph alone, which has no pipeline candidates
GRAPH_ONLY_NOTE = "pipeline plans need the workload: pass autoplan.Workload(fn, args)"


class PlanDoesNotFitWarning(UserWarning):
    """No candidate plan fits in the devices' memory: the best one is returned anyway, and the
    message says the least memory any candidate needs (``autoplan plan`` refuses to write such a
    plan unless given ``--allow-no-fit``)."""


class BatchSplitWarning(UserWarning):
    """The global batch does not divide over the devices, and the best plan keeps it whole on
    every device (no data parallelism)."""


class PinNotHeldWarning(UserWarning):
    """A candidate plan did not hold the pins the search was given (an input in another spec,
    or sharded further by a stage's ZeRO level): it was left out of the result, and the message
    names the plan and the pin. Every candidate is checked; this is the search's own fault."""


class NoPipelineWarning(UserWarning):
    """A search that could have made pipeline plans made none: it was given a traced graph, not
    the workload the pipeline search traces again at the micro-batch size, or the step could not
    be traced at the micro-batch size (the message names what was split, what was kept whole,
    JAX's error and the fix)."""


@dataclass
class SearchResult:
    """What :func:`search` found.

    Attributes:
        best: the best plan: the first of ``plans`` (lowest predicted step time among those that
            fit in memory), a candidate or a baseline (its ``label`` says which).
        plans: every candidate and baseline, ranked by the same prediction.
        stats: counts and timings (operators, GraphNodes, segments, classes, ILPs, variables,
            seconds per phase); ``level`` the level asked for, ``level_used`` and
            ``level_reason`` the level that ran on each logical mesh (``"2x4"``) and why,
            ``best_label`` where the best plan came from.
        graph: the traced graph the plans are for.
        analysis: the graph's folding analysis (:class:`autoplan._analysis.FoldingAnalysis`:
            its segments in model order with their structural classes, TePDist's critical
            nodes, the fold ratio), the record every plan carries in plain form
            (``plan.analysis``, with the ILPs and level of the search that made it).
        notes: what the user should know about the whole search: a loss that mixes examples
            across the batch (``"this loss mixes examples across the batch; micro-batching would
            change it"``, with where, and whether micro-batched plans were left out), a search
            given a graph alone (``"pipeline plans need the workload: pass
            autoplan.Workload(fn, args)"``).
        mixing: where the step's forward pass mixes examples of its batch
            (:class:`autoplan.tracing._batchflow.Mixing`), or None when its loss is a sum or mean of
            per-example terms.
    """

    best: Plan
    plans: list[Plan]
    stats: dict[str, Any]
    graph: OpGraph | None = field(default=None, repr=False)
    analysis: FoldingAnalysis | None = field(default=None, repr=False)
    notes: list[str] = field(default_factory=list)
    mixing: Any = field(default=None, repr=False)

    @property
    def candidates(self) -> list[Plan]:
        return [p for p in self.plans if not p.label.startswith("baseline")]

    @property
    def baselines(self) -> list[Plan]:
        return [p for p in self.plans if p.label.startswith("baseline")]

    def table(self) -> str:
        """The ranked plans as a text table (the best one marked ``*``)."""
        lines = [f"{'#':>3}  {'label':<28} {'layout':<52} {'step ms':>10} {'mem GiB':>8} {'MFU':>6} {'fits':>5}"]
        for k, p in enumerate(self.plans):
            mark = "*" if p is self.best else " "
            fits = p.predicted.memory_per_device <= p.cluster.device_memory
            lines.append(f"{mark}{k:>2}  {p.label:<28} {p.describe()[:52]:<52} "
                         f"{p.predicted.step_time * 1e3:>10.3f} "
                         f"{p.predicted.memory_per_device / 2**30:>8.3f} "
                         f"{p.predicted.mfu * 100:>5.1f}% {'yes' if fits else 'NO':>5}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"SearchResult(best={self.best.describe()!r}, plans={len(self.plans)}, stats={list(self.stats)})"

    def _repr_html_(self) -> str:
        import html  # noqa: PLC0415

        return f"<pre>{html.escape(self.table())}</pre>"


#: the modules a search's tasks run in a worker (imported by workers started ahead)
_TASK_MODULES = ("autoplan.search._api", "autoplan.search.pipeline._pipeline",
                 "autoplan.search.intra._solver", "highspy")
#: a workload whose arguments hold at least this many elements (parameters, optimizer state,
#: batch) has its search's worker processes started before it is traced
PRESTART_ELEMENTS = 10**8


def _large_workload(workload_or_graph: Any) -> bool:
    """Whether ``workload_or_graph`` is a workload (not yet traced) with at least
    :data:`PRESTART_ELEMENTS` argument elements: a step whose trace takes seconds and whose
    graph is large enough for worker processes."""
    if isinstance(workload_or_graph, OpGraph) or not hasattr(workload_or_graph, "args"):
        return False
    import jax  # noqa: PLC0415

    try:
        leaves = jax.tree_util.tree_leaves(workload_or_graph.args)
        return sum(math.prod(getattr(x, "shape", ()) or ()) for x in leaves) >= PRESTART_ELEMENTS
    except Exception:  # (arguments of a kind this cannot size: no early start)
        return False


def _graph_and_workload(workload_or_graph: Any) -> tuple[OpGraph, Any, float]:
    t0 = time.perf_counter()
    if isinstance(workload_or_graph, OpGraph):
        return workload_or_graph, None, 0.0
    if is_workload_like(workload_or_graph):
        from autoplan.search.pipeline._microbatches import traced  # noqa: PLC0415

        workload = as_workload(workload_or_graph, "search")
        g = traced(workload)
        return g, workload, time.perf_counter() - t0
    if callable(workload_or_graph):
        name = getattr(workload_or_graph, "__name__", "")
        name = name if name.isidentifier() else "train_step"
        raise SearchError(
            f"search: the first argument should be a workload (a step with its arguments) or an "
            f"OpGraph. Got the function {name!r} alone, without arguments to trace it with. Fix: "
            f"autoplan.search(autoplan.Workload({name}, (params, opt_state, batch)), cluster).")
    raise SearchError("search: the first argument should be an autoplan.Workload (a step with its "
                      "arguments), a zoo workload or an OpGraph from autoplan.trace. Got "
                      f"{type(workload_or_graph).__name__}. Fix: autoplan.search("
                      "autoplan.Workload(train_step, (params, opt_state, batch)), cluster).")


def _least_memory(plans: list[Plan]) -> Plan:
    return min(plans, key=lambda p: p.predicted.memory_per_device)


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:,.3f} GiB"


def no_fit_message(best: Plan, plans: list[Plan]) -> str | None:
    """Why ``best`` does not fit its devices' memory (and what the least any of ``plans`` needs),
    or None when it fits."""
    cluster = best.cluster
    if best.predicted.memory_per_device <= cluster.device_memory:
        return None
    least = _least_memory(plans)
    fixes = ["use more or larger devices", "a smaller batch or model"]
    if best.config.get("remat") is False:
        fixes.append("rematerialisation (remat=True; --set remat=true on the command line)")
    return (f"no candidate plan fits in the {_gib(cluster.device_memory)} of a "
            f"{cluster.device_kind} device of {cluster.spec}: the best plan ({best.describe()}) needs "
            f"{_gib(best.predicted.memory_per_device)} per device, and the least any candidate needs "
            f"is {_gib(least.predicted.memory_per_device)} ({least.label}: {least.describe()}). Fix: "
            + ", ".join(fixes[:-1]) + f", or {fixes[-1]}")


def _check_batch_split(best: Plan, n: int) -> None:
    """Warn when the batch cannot be split over the ``n`` devices and ``best`` keeps it whole."""
    batch_inputs = [i for i in best.inputs if i.kind == "batch" and i.shape]
    if n <= 1 or not batch_inputs:
        return
    batch = best.config.get("batch", batch_inputs[0].shape[0])
    if not isinstance(batch, int) or batch % n == 0 or any(i.spec and i.spec[0] for i in batch_inputs):
        return
    warnings.warn(BatchSplitWarning(
        f"search: the batch of {batch} does not divide over the {n} devices of {best.cluster.spec}, "
        f"and the best plan ({best.describe()}) keeps every batch input whole on every device: no "
        f"data parallelism. Fix: use a batch that is a multiple of {n} (e.g. {n * -(-batch // n)}), "
        "or fewer devices."), stacklevel=user_stacklevel())


def _rank(plans: list[Plan]) -> list[Plan]:
    def key(p: Plan):
        fits = p.predicted.memory_per_device <= p.cluster.device_memory
        return (not fits, p.predicted.step_time, p.label)
    return sorted(plans, key=key)


def _rank_and_pick(plans: list[Plan], memory_budget: float | None) -> tuple[list[Plan], int]:
    """The plans ranked by one prediction (fitting in device memory first, then predicted step
    time), and the index of the best: the first within ``memory_budget``, candidate or baseline
    alike, so the search never hands back a plan it predicts slower than one it holds."""
    ranked = _rank(plans)
    i = next((k for k, p in enumerate(ranked) if memory_budget is None
              or p.predicted.memory_per_device <= memory_budget * (1 + 1e-9)), None)
    if i is None:
        least = min(p.predicted.memory_per_device for p in ranked)
        raise InfeasiblePlanError(
            f"search: no plan fits the memory budget {memory_budget:.4g} bytes per device; the "
            f"least any plan needs is {least:.4g} bytes. Fix: raise memory_budget, use more "
            "devices, or a smaller model.", least)
    return ranked, i


@gc_paused
def search(workload_or_graph: Any, cluster: Cluster | str = "cpu:8", *, pipeline: bool | str = "auto",
           schedule: str = "1f1b", microbatches: int | str | None = None, level: str = "auto",
           mesh_shape: tuple[int, ...] | None = None, memory_budget: float | None = None,
           pins: Mapping[Any, Any] | None = None, time_limit: float = 60.0,
           baselines: bool | str = True,
           num_layers: int | None = None, stage_algorithm: str = "auto",
           submesh_hosts: str = "auto", workers: int | None = None, cache: bool = True,
           progress: Callable[[str, float], None] | None = None,
           partial: Callable[[SearchResult], None] | None = None,
           allow_microbatching_mixed: bool = False, memory_levers: bool = True,
           options: SearchOptions | None = None,
           pin: Mapping[Any, Any] | None = None) -> SearchResult:
    """Search parallelisation plans for a training step on a cluster.

    Args:
        workload_or_graph: an :class:`autoplan.Workload` (a user's step and its arguments), a
            zoo workload (:func:`autoplan.models.get`), anything with ``fn`` and ``args`` (and
            optionally ``arg_kinds``), or an :class:`~autoplan.OpGraph`. Pipeline plans need a
            workload (the micro-batch graph is traced from it).
        cluster: a :class:`~autoplan.Cluster` or its ``"name:nodes"`` string.
        pipeline: ``False`` intra-operator only; ``True`` pipeline plans only; ``"auto"`` both.
        schedule: the pipeline schedule: ``"1f1b"`` (default), ``"gpipe"``, ``"interleaved"``
            (Megatron-LM's interleaved 1F1B: each stage's layers cut into ``v`` chunks, 2 or 4,
            on the same devices, the bubble divided by ``v``), ``"zb-h1"`` (zero-bubble ZB-H1:
            each backward split into its input- and weight-gradient passes, the latter
            deferred into the bubble), or ``"auto"``: every layout simulated under 1F1B, ZB-H1
            and interleaved, the fastest that fits kept. The default stays 1F1B: it is what
            the plans of earlier versions ran, and the new kinds run more programs per step
            (interleaved ``v`` times the tasks and transfers, ZB-H1 a third more tasks), whose
            launch costs the model counts but a loaded host can exceed.
        microbatches: number of micro-batches for pipeline plans; ``None`` or ``"auto"``
            (default) searches it among the batch's divisors near the default (the batch is the
            leading dimension of the batch arguments).
        level: ``"auto"`` (default: the exhaustive ILP where it is the fast path, else the
            folded search, bounded in ILPs; see :func:`autoplan.search.fold._levels.choose_level`),
            ``"exhaustive"`` (whole-graph ILP, Alpa / TePDist O3), ``"hierarchical"`` (segment
            ILPs + chain DP, TePDist O2) or ``"folded"`` (hierarchical, each unique segment class
            solved once, TAPAS).
        mesh_shape: the logical mesh for intra-operator plans (default: all 2-D shapes).
        memory_budget: per-device bytes (default: the device's memory, for ranking only).
        pins: ``{regex over input names: PartitionSpec}`` fixing those inputs' specs (in the
            pipeline search too, in every layer's plan; a graph input's tensor id, ``gi.tensor``,
            may stand for a regex: that input alone).
        time_limit: seconds per ILP; at the limit the best plan found is used, with a warning.
        baselines: add data-parallel, Megatron TP and TP x PP baselines; ``"paper"`` adds
            Alpa's comparisons instead of the fixed Megatron TP x PP: Megatron-LM's TP x PP x DP
            grid (its best), ZeRO-2, ZeRO-3 and inter-op only (see
            :mod:`autoplan.search._baselines`; the grid costs a search of its own).
        num_layers: pipeline layers (default automatic).
        stage_algorithm: ``"dp"`` (Alpa), ``"ilp"`` (TePDist DAG ILP) or ``"auto"`` (the ILP when
            the layer graph is not a chain).
        submesh_hosts: multi-host submesh shapes of the pipeline search: ``"all"`` (Alpa's
            ``(2, M) .. (N, M)`` on ``N`` hosts of ``M`` devices), ``"pow2"`` (2, 4, 8, ... hosts
            and ``N``) or ``"auto"`` (``"all"`` up to 16 hosts).
        workers: processes that solve the independent searches (each logical mesh, each
            baseline) at once, this one included. Default: every CPU for graphs of at least
            :data:`~autoplan.search._parallel.AUTO_PARALLEL_OPS` operators that are searched on
            several logical meshes or with pipeline plans, else 1 (one mesh's search and its
            baselines run faster here than a worker can unpickle the graph and redo its analyses);
            ``1`` searches in this process alone. Results do not depend on it. Worker processes are started
            fresh (a script that searches at its top level needs an
            ``if __name__ == "__main__":`` guard) and kept for later searches.
        cache: look the result up in the plan cache, and store it there (:mod:`autoplan._cache`:
            keyed by the graph's structure, every cluster field and
            :meth:`SearchOptions.key() <autoplan.SearchOptions.key>`: every option but
            ``workers``, ``cache`` and the callbacks); ``False`` searches and stores nothing.
        progress: called as ``progress(message, fraction)`` during the search.
        partial: called at most once (in one process before the pipeline search, else from a
            thread of its own) with the intra-operator candidates ranked (``stats["partial"]``
            True) as soon as they are in while the pipeline search runs, to show them meanwhile.
        allow_microbatching_mixed: search micro-batched plans (gradient accumulation,
            pipelines over several micro-batches) for a step whose loss mixes examples across
            the batch (batch statistics such as batch norm, in-batch negatives, any reduction
            over the batch before the loss's final one: :func:`autoplan.tracing._batchflow.mixing`).
            Micro-batching changes what such a loss computes, so by default they are left out
            and ``result.notes`` says why; ``True`` accepts the change (the plans then carry the
            note). A pipeline of one micro-batch does not micro-batch: ``pipeline=True,
            microbatches=1`` searches such pipelines without it.
        memory_levers: let pipeline stages that do not fit the memory limit use a ZeRO level
            and rematerialised layers (:mod:`autoplan.search.pipeline._levers`; default True).
        options: every option above but ``progress`` and ``partial`` as one
            :class:`autoplan.SearchOptions` (frozen, validated when made, reusable); the
            keywords it holds are then left at their defaults.
        pin: the old name of ``pins`` (deprecated: a :class:`DeprecationWarning`).

    Returns:
        A :class:`SearchResult`; ``stats["cache"]`` says ``"hit"`` (from the plan cache),
        ``"stored"``, ``"not stored"`` (the cache folder could not be written) or ``"off"``.
        Every plan carries the folding analysis of the graph as plain data (``plan.analysis``:
        segments in model order, their mined classes, TePDist's critical nodes, the fold ratio,
        and the ILPs and level of the search that made it), so
        :func:`autoplan.viz.graph_figure` can draw it from the plan or its file.

    Raises:
        SearchError: bad options (the checks of :class:`autoplan.SearchOptions`), ``options=``
            with keywords it holds, or options the chosen ``pipeline`` mode would ignore
            (``mesh_shape`` with ``pipeline=True``; ``microbatches``, ``schedule``,
            ``num_layers``, ``stage_algorithm`` or ``submesh_hosts`` with ``pipeline=False``);
            ``pipeline=True`` for a loss that mixes examples without
            ``allow_microbatching_mixed=True`` (or ``microbatches=1``).
        InfeasiblePlanError: no plan fits ``memory_budget`` (``least_memory`` says what would).

    Warns:
        PlanDoesNotFitWarning: without ``memory_budget``, when no candidate fits in the devices'
            memory (the best is returned; the message gives the least memory any candidate needs).
        BatchSplitWarning: the batch does not divide over the devices and the best plan keeps it
            whole on every device.
        NoPipelineWarning: ``pipeline="auto"`` with a graph (from :func:`autoplan.trace`) instead
            of the workload: no pipeline candidates (``result.notes`` says so too).
    """
    pins = renamed_pin("search", pins, pin)
    given = dict(pipeline=pipeline, schedule=schedule, microbatches=microbatches, level=level,
                 mesh_shape=mesh_shape, memory_budget=memory_budget, pins=pins,
                 time_limit=time_limit, baselines=baselines, num_layers=num_layers,
                 stage_algorithm=stage_algorithm, submesh_hosts=submesh_hosts, workers=workers,
                 cache=cache, allow_microbatching_mixed=allow_microbatching_mixed,
                 memory_levers=memory_levers)
    opts, cluster = _resolved_options(options, given, cluster, progress, partial)
    return _run_search(workload_or_graph, cluster, opts, progress, partial)


def _resolved_options(options: SearchOptions | None, given: dict[str, Any], cluster: Cluster | str,
                      progress: Callable[[str, float], None] | None,
                      partial: Callable[[SearchResult], None] | None
                      ) -> tuple[SearchOptions, Cluster]:
    """The search's options and cluster, checked (with the callbacks and the cache's size limit)
    before any work."""
    opts = _options(options, given)
    cluster = _check_cluster(cluster)
    check_callback("search", "progress", progress, SearchError)
    check_callback("search", "partial", partial, SearchError, "(result)")
    if opts.cache:
        cache_max_bytes(_cache.MAX_BYTES)  # a bad $AUTOPLAN_CACHE_MAX_BYTES: said before any work
    check_not_bootstrapping()
    return opts, cluster


def _run_search(workload_or_graph: Any, cluster: Cluster, opts: SearchOptions,
                progress: Callable[[str, float], None] | None,
                partial: Callable[[SearchResult], None] | None) -> SearchResult:
    """:func:`search` once its options are checked: trace, look the result up in the plan cache,
    else search, rank and store."""
    report = progress or (lambda msg, frac: None)
    t_start = time.perf_counter()
    report("tracing", 0.0)
    single = opts.mesh_shape is not None or len(mesh_shapes_for(
        cluster.num_devices, cluster.nodes, cluster.devices_per_node)) == 1
    graph, workload, t_trace = _trace_for_search(workload_or_graph, opts, single)
    found_mixing = mixing_of(graph)
    notes, microbatching = _search_notes(graph, workload, opts, found_mixing)
    n_workers = resolve_workers(opts.workers, len(graph))
    if opts.workers is None and single and (opts.pipeline is False or workload is None):
        # one logical mesh and its baselines: a worker would first unpickle the graph and redo its
        # analyses, which costs more than the baselines it would take off this process
        n_workers = 1
    config = _batch_config(graph, workload)
    key = None
    if opts.cache:
        # (the pipeline search needs a workload: a graph alone cannot share a pipeline result)
        key = _cache.search_key(graph, cluster, opts, config, workload=workload is not None,
                                microbatching=microbatching)
        hit = _cached_result(key, graph, opts, notes, found_mixing)
        if hit is not None:
            report("done (from the plan cache)", 1.0)
            return hit
    found = _search_plans(graph, workload, cluster, opts, microbatching, config, n_workers,
                          report, partial)
    plans, stats, recorded = found
    stats.update({"operators": len(graph), "trace_seconds": t_trace, "level": opts.level,
                  "workers": n_workers})
    analysis = analysis_of(graph)
    plans = _finish_plans(plans, graph, stats, found_mixing)
    stats["search_seconds"] = time.perf_counter() - t_start - t_trace
    ranked, i = _ranked_with_best(plans, stats, opts.memory_budget)
    stats["cache"] = "off"
    if key is not None and stats.get("pipeline_not_traced"):
        # (the key is the full-batch graph's: a step mended where only its micro-batch trace
        # failed keys the same, and must be searched again, not read back with the failure)
        stats["cache"] = "not stored"
    elif key is not None:
        stats["cache"] = "stored"
        if not _cache.store(key, ranked, i, stats, analysis.to_dict(), recorded):
            stats["cache"] = "not stored"
    report("done", 1.0)
    return _result(graph, ranked, i, stats, analysis, recorded, opts.memory_budget, notes,
                   found_mixing)


def _trace_for_search(workload_or_graph: Any, opts: SearchOptions, single: bool
                      ) -> tuple[OpGraph, Any, float]:
    """``(graph, workload or None, trace seconds)``; a large workload's worker processes start
    while it traces (unless one logical mesh is searched in this process alone)."""
    if _large_workload(workload_or_graph) and not (opts.workers is None and single
                                                   and opts.pipeline is False):
        # (they start while it traces, importing what the tasks run)
        prestart(resolve_workers(opts.workers, AUTO_PARALLEL_OPS), _TASK_MODULES)
    graph, workload, t_trace = _graph_and_workload(workload_or_graph)
    if opts.pipeline is True and workload is None:
        raise SearchError("search: pipeline=True needs a Workload (the micro-batch graph is traced "
                          "from it), not an OpGraph. Got an OpGraph. Fix: "
                          f"{GRAPH_ONLY_NOTE.replace('pipeline plans need the workload: ', '')}"
                          " (or a zoo workload), or use pipeline=False.")
    return graph, workload, t_trace


def _batch_config(graph: OpGraph, workload: Any) -> dict[str, Any]:
    """The workload's config; for an OpGraph, the batch inputs' leading dimension as its
    ``batch``, when they agree."""
    config = dict(getattr(workload, "config", {}) or {})
    if "batch" not in config:  # an OpGraph: the batch inputs' leading dimension, when they agree
        lead = {graph.tensors[gi.tensor].shape[0] for gi in graph.inputs
                if gi.kind == "batch" and graph.tensors[gi.tensor].shape}
        if len(lead) == 1:
            config["batch"] = lead.pop()
    return config


def _cached_result(key: str, graph: OpGraph, opts: SearchOptions, notes: list[str],
                   found_mixing: Any) -> SearchResult | None:
    """The search's result from the plan cache (``stats["cache"] == "hit"``), or None."""
    hit = _cache.load(key)
    if hit is None:
        return None
    return _result(graph, hit["plans"], hit["best"], {**hit["stats"], "cache": "hit"},
                   FoldingAnalysis.from_dict(hit["analysis"]), hit["warnings"],
                   opts.memory_budget, notes, found_mixing)


def _ranked_with_best(plans: list[Plan], stats: dict[str, Any], memory_budget: float | None
                      ) -> tuple[list[Plan], int]:
    """The plans ranked and the index of the best (:func:`_rank_and_pick`), which carries the
    search's seconds; ``stats["best_label"]`` says where it came from."""
    ranked, i = _rank_and_pick(plans, memory_budget)
    ranked[i] = ranked[i].with_(search_seconds=stats["search_seconds"])
    stats["best_label"] = ranked[i].label
    return ranked, i


def _options(options: Any, given: dict[str, Any]) -> SearchOptions:
    """The search's options: ``options`` when given (then every keyword in ``given`` must be at
    its default), else a :class:`SearchOptions` of the keywords (validated)."""
    if options is None:
        return SearchOptions(**given)
    if not isinstance(options, SearchOptions):
        raise SearchError(f"search: options should be an autoplan.SearchOptions. Got "
                          f"{type(options).__name__}: {options!r:.40}. Fix: "
                          "options=autoplan.SearchOptions(level='folded', ...), or pass the "
                          "keywords alone.")
    defaults = {f.name: f.default for f in fields(SearchOptions)}
    clash = [k for k, v in given.items() if v is not defaults[k] and v != defaults[k]]
    if clash:
        raise SearchError(f"search: options= holds every option, but "
                          f"{', '.join(f'{k}={given[k]!r}' for k in clash)} "
                          f"{'was' if len(clash) == 1 else 'were'} given too. Fix: "
                          f"options=options.replace({', '.join(f'{k}=...' for k in clash)}), or "
                          "pass the keywords alone.")
    return options


def _search_notes(graph: OpGraph, workload: Any, options: SearchOptions, found: Any
                  ) -> tuple[list[str], bool]:
    """The notes of a search, and whether it may make micro-batched plans; warns (and refuses
    ``pipeline=True``) where the user must know before any work."""
    notes: list[str] = []
    pipeline, microbatches = options.pipeline, options.microbatches
    allow_mixed = options.allow_microbatching_mixed
    microbatching = found is None or allow_mixed
    if found is not None:
        if allow_mixed:
            notes.append(f"{MIXING_NOTE} ({found}); micro-batched plans were searched "
                         "(allow_microbatching_mixed=True) and carry this note")
        else:
            if pipeline is True and microbatches != 1:
                raise SearchError(
                    f"search: pipeline=True makes micro-batched plans, but {MIXING_NOTE}: "
                    f"{found}. Got pipeline=True, microbatches={microbatches!r}. Fix: pass "
                    "allow_microbatching_mixed=True (--allow-microbatching-mixed on the command "
                    "line) to accept the change, microbatches=1 for "
                    "pipelines without micro-batches, or pipeline='auto' for intra-operator "
                    "plans.")
            notes.append(f"{MIXING_NOTE} ({found}); micro-batched plans (gradient "
                         "accumulation, pipelines over several micro-batches) were left out. Fix: pass "
                         "allow_microbatching_mixed=True (--allow-microbatching-mixed on the "
                         "command line) to search them anyway")
    if workload is None and pipeline == "auto":
        notes.append(GRAPH_ONLY_NOTE)
        warnings.warn(NoPipelineWarning(
            f"search: given a traced graph, so no pipeline candidates: {GRAPH_ONLY_NOTE} "
            "(the pipeline search traces the step again at the micro-batch size)."),
            stacklevel=user_stacklevel())
    return notes, microbatching


def _check_cluster(cluster: Cluster | str) -> Cluster:
    """The cluster as a :class:`Cluster`, refused when a search cannot plan for it."""
    cluster = Cluster.parse(cluster) if isinstance(cluster, str) else cluster
    if not isinstance(cluster, Cluster):
        raise SearchError(f"search: cluster should be an autoplan.Cluster or 'name:nodes'. Got "
                          f"{type(cluster).__name__}.")
    check_search_cluster("search", cluster, SearchError)
    return cluster


def _mesh_search(graph: OpGraph, cluster: Cluster, shape: tuple[int, ...], **kw: Any
                 ) -> tuple[Plan, dict[str, Any]]:
    """One logical mesh's intra-operator search (a task of the search): its plan and statistics
    (the folding analysis is the graph's, computed by the caller)."""
    from autoplan.search.fold._levels import level_search  # noqa: PLC0415

    res = level_search(graph, cluster, shape, **kw)
    return res.plan, res.stats


def _pipeline_plans(graph: OpGraph, workload: Any, cluster: Cluster, **kw: Any) -> Any:
    """The pipeline search (a task of the search, run in the caller's process: it traces the
    workload)."""
    from autoplan.search.pipeline._pipeline import pipeline_search  # noqa: PLC0415

    return pipeline_search(workload, cluster, **kw)


def _megatron_pipeline(graph: OpGraph, workload: Any, cluster: Cluster, **kw: Any) -> list[Plan]:
    from autoplan.search._baselines import pipeline_baselines  # noqa: PLC0415

    return pipeline_baselines(workload, cluster, **kw)


def _search_plans(graph: OpGraph, workload: Any, cluster: Cluster, options: SearchOptions,
                  microbatching: bool, config: dict[str, Any], n_workers: int, report: Callable[[str, float], None],
                  partial: Callable[[SearchResult], None] | None = None
                  ) -> tuple[list[Plan], dict[str, Any], list[tuple[type[Warning], str]]]:
    """The candidates and baselines of a search, its statistics, and the warnings its tasks
    raised (in task order).

    The independent parts are tasks run on ``n_workers`` processes: the pipeline search (in this
    process, it traces the workload), one intra-operator search per logical mesh, the
    intra-operator baselines, and the Megatron TP x PP baseline (in this process).
    """
    from autoplan.search._baselines import baseline_tasks  # noqa: PLC0415

    pipeline, level, memory_budget = options.pipeline, options.level, options.memory_budget
    time_limit = options.time_limit
    do_intra = pipeline in (False, "auto")
    # on one device the pipeline search gives the one-stage, gradient-accumulation plan
    do_pipe = pipeline in (True, "auto") and workload is not None and (
        microbatching or options.microbatches == 1)
    if options.mesh_shape is not None:
        shapes = [options.mesh_shape] if do_intra else []
    else:
        shapes = mesh_shapes_for(cluster.num_devices, cluster.nodes,
                                 cluster.devices_per_node) if do_intra else []
    # options each task would refuse, refused before any of them runs
    resolve_pins(graph, options.pins)
    for shape in shapes:
        pin_specs(graph, make_logical_mesh(cluster, shape), options.pins)
    tasks: list[Task] = []
    if do_pipe:
        tasks.append(Task(_pipeline_plans, graph, (workload, cluster), dict(
            schedule=options.schedule, microbatches=options.microbatches,
            level="exhaustive" if level == "auto" else level, memory_budget=memory_budget,
            time_limit=time_limit, num_layers=options.num_layers,
            stage_algorithm=options.stage_algorithm, submesh_hosts=options.submesh_hosts,
            pins=pins_by_name(graph, options.pins), workers=n_workers,
            levers=options.memory_levers),
            label="pipeline search", local=True))
    mesh_kw = dict(level=level, memory_budget=memory_budget, pins=options.pins,
                   time_limit=time_limit, config=config)
    tasks += [Task(_mesh_search, graph, (cluster, shape), mesh_kw,
                   label=f"intra-op search on mesh {'x'.join(map(str, shape))}")
              for shape in shapes]
    if options.baselines:
        paper = options.baselines == "paper"
        tasks += baseline_tasks(graph, cluster, time_limit=time_limit, config=config,
                                paper=paper)
        if do_pipe and microbatching and (
                cluster.nodes > 1 or paper and cluster.num_devices > 1):
            tasks.append(Task(_megatron_pipeline, graph, (workload, cluster),
                              dict(schedule=options.schedule, time_limit=time_limit,
                                   workers=n_workers, paper=paper),
                              label="baseline: Megatron TP x PP", local=True))
    stats: dict[str, Any] = {}
    plans: list[Plan] = []
    baseline_plans: list[Plan] = []
    strict = pipeline is True  # (a step that cannot be micro-batched is then an error)
    infeasible: list[InfeasiblePlanError] = []
    if partial is not None and do_pipe and shapes:
        # the intra-operator candidates and baselines first, shown while the pipeline search
        # runs: one batch, the caller on the pipeline search while the workers take the rest
        # ahead of its layer ILPs; what they give is collected (and ranked and shown) as soon as
        # they are all in
        first = [k for k, t in enumerate(tasks) if t.fn not in (_pipeline_plans, _megatron_pipeline)]
        later = [k for k in range(len(tasks)) if k not in first]
        shown: list[bool] = []

        def show(got: list[Any]) -> None:
            shown.append(True)
            _collect([tasks[k] for k in first], got, stats, plans, baseline_plans, infeasible,
                     level, strict)
            if plans:
                ranked = _rank(_finish_plans(plans + baseline_plans, graph, stats))
                partial(SearchResult(best=ranked[0], plans=ranked, stats={**stats, "partial": True},
                                     graph=graph, analysis=analysis_of(graph)))

        done = run_tasks(tasks, workers=n_workers, first=first, on_first=show,
                         report=lambda msg, frac: report(msg, 0.05 + 0.9 * frac))
        outcomes = [done[k] for k in first + later]
        if not shown:
            _collect([tasks[k] for k in first], outcomes[:len(first)], stats, plans,
                     baseline_plans, infeasible, level, strict)
        _collect([tasks[k] for k in later], outcomes[len(first):], stats, plans, baseline_plans,
                 infeasible, level, strict)
    else:
        outcomes = run_tasks(tasks, workers=n_workers,
                             report=lambda msg, frac: report(msg, 0.05 + 0.9 * frac))
        _collect(tasks, outcomes, stats, plans, baseline_plans, infeasible, level, strict)
    recorded = [w for o in outcomes for w in o.warnings]
    plans, broken = _holding_pins(plans, graph, options.pins)
    recorded += [(PinNotHeldWarning, message) for message in broken]
    if not plans and broken:
        raise SearchError(f"search: no candidate plan held the pins. Got: {broken[0]}. Fix: "
                          "pin fewer inputs, or other specs.")
    if not plans:
        # (micro-batched candidates need less memory: say why there were none)
        skipped = (f" No micro-batched candidate was searched: {stats['pipeline_not_traced']}"
                   if stats.get("pipeline_not_traced") else "")
        if infeasible:
            least = min((e.least_memory for e in infeasible if e.least_memory), default=None)
            budget = memory_budget or cluster.device_memory
            raise InfeasiblePlanError(
                f"search: no plan fits the memory budget {budget:.4g} bytes per device"
                + ("" if memory_budget else " (the device's memory)")
                + (f"; the least any plan needs is {least:.4g} bytes" if least else "")
                + ". Got: " + "; ".join(str(e).rstrip(".") for e in infeasible) + "."
                + " Fix: raise memory_budget, use more devices, or a smaller model." + skipped,
                least)
        raise AutoplanError("search: no candidate plan was produced; check the options." + skipped)
    if memory_budget is not None:
        plans = [p for p in plans if p.predicted.memory_per_device <= memory_budget * (1 + 1e-9)]
    return plans + baseline_plans, stats, recorded


def _holding_pins(plans: list[Plan], graph: OpGraph, pins: Mapping[Any, Any] | None
                  ) -> tuple[list[Plan], list[str]]:
    """The candidates that hold every pin (:func:`~autoplan.search.intra._pins.unheld_pins`),
    and a message per candidate left out (a plan that breaks a pin is never shown as one that
    holds it)."""
    if not pins:
        return plans, []
    kept, broken = [], []
    for p in plans:
        why = unheld_pins(p, graph, pins)
        if why:
            meshes = ", ".join("x".join(map(str, s.mesh_shape)) for s in p.stages)
            broken.append(f"search: candidate [{p.label}] on meshes {meshes} "
                          f"({p.schedule.microbatches} micro-batches) was left out: it does not "
                          f"hold the pins: {'; '.join(why[:3])}"
                          + (f"; and {len(why) - 3} more" if len(why) > 3 else ""))
        else:
            kept.append(p)
    return kept, broken


def _collect(tasks: list[Task], outcomes: list[Any], stats: dict[str, Any], plans: list[Plan],
             baseline_plans: list[Plan], infeasible: list[InfeasiblePlanError],
             level: str, strict: bool = False) -> None:
    """Add the tasks' outcomes to ``plans`` (candidates), ``baseline_plans``, ``infeasible`` and
    ``stats``. A step the micro-batched searches could not trace is a warning on their outcome
    unless ``strict`` (``pipeline=True``: then it is raised)."""
    for t, o in zip(tasks, outcomes):
        if t.fn is _pipeline_plans:
            if not strict and isinstance(o.error, MicrobatchTraceError):
                # (a step that cannot be micro-batched as its kinds say: the other candidates
                # stand, and the warning says why the pipeline ones are missing and what to do)
                o.warnings.append((NoPipelineWarning, "search: no micro-batched candidates "
                                   f"(pipelines, gradient accumulation): {o.error}"))
                stats.setdefault("pipeline_not_traced", str(o.error))
                continue
            if isinstance(o.error, InfeasiblePlanError):
                infeasible.append(o.error)
                stats["pipeline_error"] = str(o.error)
                continue
            pres = o.result()
            plans.extend(pres.plans)
            stats.update({f"pipeline_{k}": v for k, v in pres.stats.items()})
        elif t.fn is _mesh_search:
            if isinstance(o.error, InfeasiblePlanError):
                infeasible.append(o.error)
                continue
            plan, mesh_stats = o.result()
            plans.append(plan)
            _merge_mesh_stats(stats, "x".join(map(str, t.args[1])), mesh_stats, level)
        else:  # a baseline: a plan (or a list of them), or None where it does not apply
            got = o.result()
            baseline_plans.extend(got if isinstance(got, list) else [got] if got else [])


def _merge_mesh_stats(stats: dict[str, Any], mesh_key: str, mesh_stats: Mapping[str, Any],
                      level: str) -> None:
    """Add one mesh's statistics: its level and why, per mesh; numbers summed over meshes;
    anything else as the first mesh gave it."""
    stats.setdefault("level_used", {})[mesh_key] = mesh_stats.get("level", level)
    stats.setdefault("ilps_by_mesh", {})[mesh_key] = mesh_stats.get("ilps_solved")
    stats.setdefault("level_reason", {})[mesh_key] = mesh_stats.get(
        "level_reason", f"level={level!r} asked for")
    for key, val in mesh_stats.items():
        if key in ("level", "level_reason"):
            continue
        if isinstance(val, int | float) and not isinstance(val, bool):
            prev = stats.get(key)  # a mesh may have reported None for it
            numeric = isinstance(prev, int | float) and not isinstance(prev, bool)
            stats[key] = prev + val if numeric else val
        else:
            stats.setdefault(key, val)


def _result(graph: OpGraph, ranked: list[Plan], i: int, stats: dict[str, Any],
            analysis: FoldingAnalysis, recorded: list[tuple[type[Warning], str]],
            memory_budget: float | None, notes: list[str] | None = None,
            found_mixing: Any = None) -> SearchResult:
    """The :class:`SearchResult` of ranked plans (searched now or from the cache), with the
    search's warnings raised at the user's line."""
    if graph.arg_trees is not None:  # kept in memory only: the caller's own pytrees
        ranked = [p.with_(arg_trees=graph.arg_trees) for p in ranked]
    raise_again(recorded)
    best = ranked[i]
    if memory_budget is None:
        why = no_fit_message(best, ranked)
        if why is not None:
            warnings.warn(PlanDoesNotFitWarning(f"search: {why}; or pass memory_budget= to plan "
                                                "for another device memory."),
                          stacklevel=user_stacklevel())
    _check_batch_split(best, best.cluster.num_devices)
    notes = list(notes or [])
    if stats.get("pipeline_not_traced"):  # (searched now or read from the cache alike)
        notes.append(f"no micro-batched candidates: {stats['pipeline_not_traced']}")
    return SearchResult(best=best, plans=ranked, stats=stats, graph=graph, analysis=analysis,
                        notes=notes, mixing=found_mixing)


def _finish_plans(plans: list[Plan], graph: OpGraph, stats: Mapping[str, Any],
                  found_mixing: Any = None) -> list[Plan]:
    """Each plan with the argument pytrees' structure (the JAX views then mirror the user's own
    types), the graph's folding analysis in plain form (:func:`~autoplan.search.fold._summary.
    analysis_of`, :meth:`~autoplan._analysis.FoldingAnalysis.to_dict`) with the ILPs and level of the search that made it: an intra-operator
    candidate's mesh, the pipeline search's layer solves; None for a baseline. A micro-batched
    plan gets the notes of what micro-batching changes: its random draws
    (:data:`~autoplan.tracing._batchflow.RANDOM_NOTE`), a loss that mixes examples
    (:data:`~autoplan.tracing._batchflow.MIXING_NOTE`)."""
    if graph.arg_trees is not None:
        types = tuple(t.types for t in graph.arg_trees)
        plans = [p.with_(arg_types=types, arg_trees=graph.arg_trees) for p in plans]
    base = analysis_of(graph)
    out = []
    for p in plans:
        ilps = level = None
        if p.label == "autoplan" and not p.is_pipeline:
            mesh = "x".join(map(str, p.mesh_shape))
            ilps = (stats.get("ilps_by_mesh") or {}).get(mesh)
            level = (stats.get("level_used") or {}).get(mesh)
        elif p.label == "autoplan-pipeline":
            ilps, level = stats.get("pipeline_layer_solves"), p.level
        p = p.with_(analysis=base.with_search(ilps, level).to_dict())
        if p.schedule.microbatches > 1:
            p = p.with_(notes=tuple(p.notes) + _microbatch_notes(p, graph, found_mixing))
        out.append(p)
    return out


def _microbatch_notes(p: Plan, graph: OpGraph, found_mixing: Any) -> tuple[str, ...]:
    """What running ``p`` over its micro-batches changes, as notes it does not hold yet."""
    extra = []
    draws = random_draws(graph)  # (OpGraph.random_draws is computed once per graph)
    if draws:
        extra.append(f"{RANDOM_NOTE} ({p.schedule.microbatches} micro-batches; "
                     f"{', '.join(draws)}): the draws differ from one full-batch step's")
    if found_mixing is not None:
        extra.append(f"{MIXING_NOTE} ({found_mixing})")
    return tuple(n for n in extra if not any(m.startswith(n.split(" (")[0]) for m in p.notes))


def plan(workload_or_graph: Any, cluster: Cluster | str = "cpu:8", **kwargs: Any) -> Plan:
    """The best plan of :func:`search` (same arguments)."""
    return search(workload_or_graph, cluster, **kwargs).best
