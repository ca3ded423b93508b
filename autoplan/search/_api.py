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

import sys
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autoplan._cluster import Cluster
from autoplan._errors import AutoplanError, InfeasiblePlanError, SearchError
from autoplan._graph import OpGraph
from autoplan._plan import Plan
from autoplan.search.intra._intra import mesh_shapes_for

__all__ = ["SearchResult", "search", "plan", "LEVELS", "PlanDoesNotFitWarning", "BatchSplitWarning"]

LEVELS = ("auto", "exhaustive", "hierarchical", "folded")


class PlanDoesNotFitWarning(UserWarning):
    """No candidate plan fits in the devices' memory: the best one is returned anyway, and the
    message says the least memory any candidate needs (``autoplan plan`` refuses to write such a
    plan unless given ``--allow-no-fit``)."""


class BatchSplitWarning(UserWarning):
    """The global batch does not divide over the devices, and the best plan keeps it whole on
    every device (no data parallelism)."""


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
        analysis: the folding analysis (mining classes, segments), when computed.
    """

    best: Plan
    plans: list[Plan]
    stats: dict[str, Any]
    graph: OpGraph | None = field(default=None, repr=False)
    analysis: Any = field(default=None, repr=False)

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


def _graph_and_workload(workload_or_graph: Any) -> tuple[OpGraph, Any, float]:
    t0 = time.perf_counter()
    if isinstance(workload_or_graph, OpGraph):
        return workload_or_graph, None, 0.0
    if hasattr(workload_or_graph, "fn") and hasattr(workload_or_graph, "args"):
        from autoplan.search.pipeline._pipeline import traced  # noqa: PLC0415

        g = traced(workload_or_graph)
        return g, workload_or_graph, time.perf_counter() - t0
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


def _user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning point at the first caller outside autoplan (the
    user's line), counted from the function that calls this one."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("autoplan"):
        frame, level = frame.f_back, level + 1
    return level


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
        "or fewer devices."), stacklevel=_user_stacklevel())


def _check_pipeline_options(pipeline: bool | str, mesh_shape: Any, microbatches: Any, schedule: str,
                            num_layers: Any, stage_algorithm: str, submesh_hosts: str) -> None:
    """Refuse options that the chosen ``pipeline`` mode would ignore."""
    if pipeline is True and mesh_shape is not None:
        raise SearchError(
            f"search: mesh_shape={mesh_shape!r} sets the logical mesh of intra-operator plans, "
            "but pipeline=True makes pipeline plans only (each stage's mesh is searched), so it "
            "would be ignored. Fix: drop mesh_shape, or use pipeline=False (or 'auto').")
    if pipeline is False:
        given = [f"{k}={v!r}" for k, v, default in (
            ("microbatches", microbatches, None), ("schedule", schedule, "1f1b"),
            ("num_layers", num_layers, None), ("stage_algorithm", stage_algorithm, "auto"),
            ("submesh_hosts", submesh_hosts, "auto")) if v != default]
        if given:
            raise SearchError(
                f"search: {', '.join(given)} set{'s' if len(given) == 1 else ''} pipeline plans, but "
                "pipeline=False makes intra-operator plans only, so "
                f"{'it' if len(given) == 1 else 'they'} would be ignored. Fix: drop "
                f"{'it' if len(given) == 1 else 'them'}, or use pipeline=True (or 'auto').")


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


def search(workload_or_graph: Any, cluster: Cluster | str = "cpu:8", *, pipeline: bool | str = "auto",
           schedule: str = "1f1b", microbatches: int | str | None = None, level: str = "auto",
           mesh_shape: tuple[int, ...] | None = None, memory_budget: float | None = None,
           pin: Mapping[str, Any] | None = None, time_limit: float = 60.0, baselines: bool = True,
           num_layers: int | None = None, stage_algorithm: str = "auto",
           submesh_hosts: str = "auto",
           progress: Callable[[str, float], None] | None = None) -> SearchResult:
    """Search parallelisation plans for a training step on a cluster.

    Args:
        workload_or_graph: an :class:`autoplan.Workload` (a user's step and its arguments), a
            zoo workload (:func:`autoplan.models.get`), anything with ``fn`` and ``args`` (and
            optionally ``arg_kinds``), or an :class:`~autoplan.OpGraph`. Pipeline plans need a
            workload (the micro-batch graph is traced from it).
        cluster: a :class:`~autoplan.Cluster` or its ``"name:nodes"`` string.
        pipeline: ``False`` intra-operator only; ``True`` pipeline plans only; ``"auto"`` both.
        schedule: ``"1f1b"`` or ``"gpipe"``.
        microbatches: number of micro-batches for pipeline plans; ``None`` or ``"auto"``
            (default) searches it among powers of two near the default (the batch is the
            leading dimension of the batch arguments).
        level: ``"auto"`` (default: the exhaustive ILP where it is the fast path, else the
            folded search, bounded in ILPs; see :func:`autoplan.search.fold._levels.choose_level`),
            ``"exhaustive"`` (whole-graph ILP, Alpa / TePDist O3), ``"hierarchical"`` (segment
            ILPs + chain DP, TePDist O2) or ``"folded"`` (hierarchical, each unique segment class
            solved once, TAPAS).
        mesh_shape: the logical mesh for intra-operator plans (default: all 2-D shapes).
        memory_budget: per-device bytes (default: the device's memory, for ranking only).
        pin: ``{regex over input names: PartitionSpec}`` fixing those inputs' specs (in the
            pipeline search too, in every layer's plan).
        time_limit: seconds per ILP; at the limit the best plan found is used, with a warning.
        baselines: add data-parallel, Megatron TP and TP x PP baselines.
        num_layers: pipeline layers (default automatic).
        stage_algorithm: ``"dp"`` (Alpa), ``"ilp"`` (TePDist DAG ILP) or ``"auto"`` (the ILP when
            the layer graph is not a chain).
        submesh_hosts: multi-host submesh shapes of the pipeline search: ``"all"`` (Alpa's
            ``(2, M) .. (N, M)``), ``"pow2"`` (2, 4, 8, ... hosts and ``N``) or ``"auto"``
            (``"all"`` up to 16 hosts).
        progress: called as ``progress(message, fraction)`` during the search.

    Returns:
        A :class:`SearchResult`.

    Raises:
        SearchError: bad options, or options the chosen ``pipeline`` mode would ignore
            (``mesh_shape`` with ``pipeline=True``; ``microbatches``, ``schedule``,
            ``num_layers``, ``stage_algorithm`` or ``submesh_hosts`` with ``pipeline=False``).
        InfeasiblePlanError: no plan fits ``memory_budget`` (``least_memory`` says what would).

    Warns:
        PlanDoesNotFitWarning: without ``memory_budget``, when no candidate fits in the devices'
            memory (the best is returned; the message gives the least memory any candidate needs).
        BatchSplitWarning: the batch does not divide over the devices and the best plan keeps it
            whole on every device.
    """
    if level not in LEVELS:
        raise SearchError(f"search: level should be one of {LEVELS}. Got {level!r}. "
                          "Fix: level='auto' (default), 'exhaustive', 'hierarchical' or 'folded'.")
    if pipeline not in (True, False, "auto"):
        raise SearchError(f"search: pipeline should be True, False or 'auto'. Got {pipeline!r}.")
    if schedule not in ("1f1b", "gpipe"):
        raise SearchError(f"search: schedule should be '1f1b' or 'gpipe'. Got {schedule!r}.")
    from autoplan.search.pipeline._pipeline import check_microbatches, check_submesh_hosts  # noqa: PLC0415

    check_submesh_hosts(submesh_hosts)
    check_microbatches(microbatches)
    _check_pipeline_options(pipeline, mesh_shape, None if microbatches == "auto" else microbatches,
                            schedule, num_layers, stage_algorithm, submesh_hosts)
    cluster = Cluster.parse(cluster) if isinstance(cluster, str) else cluster
    if not isinstance(cluster, Cluster):
        raise SearchError(f"search: cluster should be an autoplan.Cluster or 'name:nodes'. Got "
                          f"{type(cluster).__name__}.")
    report = progress or (lambda msg, frac: None)
    t_start = time.perf_counter()
    report("tracing", 0.0)
    graph, workload, t_trace = _graph_and_workload(workload_or_graph)
    config = dict(getattr(workload, "config", {}) or {})
    stats: dict[str, Any] = {"operators": len(graph), "trace_seconds": t_trace, "level": level}
    plans: list[Plan] = []
    analysis = None

    from autoplan.search.fold._levels import level_search  # noqa: PLC0415

    n = cluster.num_devices
    do_intra = pipeline in (False, "auto")
    # on one device the pipeline search gives the one-stage, gradient-accumulation plan
    do_pipe = pipeline in (True, "auto") and workload is not None
    if pipeline is True and workload is None:
        raise SearchError("search: pipeline=True needs a Workload (the micro-batch graph is traced "
                          "from it), not an OpGraph. Fix: pass autoplan.models.get(...) or use "
                          "pipeline=False.")
    if mesh_shape is not None:
        shapes = [tuple(int(x) for x in mesh_shape)]
    else:
        shapes = mesh_shapes_for(n, cluster.nodes, cluster.devices_per_node)
    infeasible: list[InfeasiblePlanError] = []
    if do_intra:
        for k, shape in enumerate(shapes):
            report(f"intra-op search on mesh {'x'.join(map(str, shape))}", 0.1 + 0.4 * k / len(shapes))
            try:
                res = level_search(graph, cluster, shape, level=level, memory_budget=memory_budget,
                                   pin=pin, time_limit=time_limit, config=config)
            except InfeasiblePlanError as err:
                infeasible.append(err)
                continue
            plans.append(res.plan)
            analysis = analysis or res.analysis
            mesh_key = "x".join(map(str, shape))
            stats.setdefault("level_used", {})[mesh_key] = res.stats.get("level", level)
            stats.setdefault("level_reason", {})[mesh_key] = res.stats.get(
                "level_reason", f"level={level!r} asked for")
            for key, val in res.stats.items():
                if key in ("level", "level_reason"):
                    continue
                if isinstance(val, int | float) and not isinstance(val, bool):
                    stats[key] = stats.get(key, 0) + val
                else:
                    stats.setdefault(key, val)
    if do_pipe:
        from autoplan.search.pipeline._pipeline import pipeline_search  # noqa: PLC0415

        report("pipeline search", 0.55)
        try:
            pres = pipeline_search(workload, cluster, schedule=schedule, microbatches=microbatches,
                                   level="exhaustive" if level == "auto" else level,
                                   memory_budget=memory_budget, time_limit=time_limit,
                                   num_layers=num_layers, stage_algorithm=stage_algorithm,
                                   submesh_hosts=submesh_hosts, pin=pin)
            plans.extend(pres.plans)
            stats.update({f"pipeline_{k}": v for k, v in pres.stats.items()})
        except InfeasiblePlanError as err:
            infeasible.append(err)
            stats["pipeline_error"] = str(err)
    if baselines:
        from autoplan.search._baselines import baseline_plans  # noqa: PLC0415

        report("baselines", 0.85)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plans.extend(baseline_plans(graph, cluster, workload=workload, schedule=schedule,
                                        time_limit=time_limit, config=config,
                                        pipeline=do_pipe))
    searched = [p for p in plans if not p.label.startswith("baseline")]
    if not searched:
        if infeasible:
            least = min((e.least_memory for e in infeasible if e.least_memory), default=None)
            budget = memory_budget or cluster.device_memory
            raise InfeasiblePlanError(
                f"search: no plan fits {budget:.4g} bytes per device"
                + ("" if memory_budget else " (the device's memory)") + ". Got: "
                + "; ".join(str(e) for e in infeasible) + " "
                + (f"The least memory that would fit is {least:.4g} bytes. " if least else "")
                + "Fix: raise memory_budget, use more devices, or a smaller model.", least)
        raise AutoplanError("search: no candidate plan was produced; check the options.")
    if memory_budget is not None:
        plans = [p for p in plans if p.label.startswith("baseline")
                 or p.predicted.memory_per_device <= memory_budget * (1 + 1e-9)]
    if graph.arg_trees is not None:  # the JAX views mirror the user's own pytrees
        types = tuple(t.types for t in graph.arg_trees)
        plans = [p.with_(arg_types=types, arg_trees=graph.arg_trees) for p in plans]
    total = time.perf_counter() - t_start
    stats["search_seconds"] = total - t_trace
    ranked, i = _rank_and_pick(plans, memory_budget)
    best = ranked[i] = ranked[i].with_(search_seconds=stats["search_seconds"])
    stats["best_label"] = best.label
    if memory_budget is None:
        why = no_fit_message(best, ranked)
        if why is not None:
            warnings.warn(PlanDoesNotFitWarning(f"search: {why}; or pass memory_budget= to plan "
                                                "for another device memory."),
                          stacklevel=_user_stacklevel())
    _check_batch_split(best, cluster.num_devices)
    report("done", 1.0)
    return SearchResult(best=best, plans=ranked, stats=stats, graph=graph, analysis=analysis)


def plan(workload_or_graph: Any, cluster: Cluster | str = "cpu:8", **kwargs: Any) -> Plan:
    """The best plan of :func:`search` (same arguments)."""
    return search(workload_or_graph, cluster, **kwargs).best
