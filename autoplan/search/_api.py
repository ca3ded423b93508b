"""``autoplan.search`` and ``autoplan.plan``: the one entry point to every search.

:func:`search` traces the workload (unless given an OpGraph), then

* ``pipeline=False``: the intra-operator search on the whole cluster for each logical mesh shape
  (or the one given), at the chosen ``level``;
* ``pipeline=True``: the inter-operator search (layers, submeshes, Alpa's stage DP or TePDist's DAG
  stage ILP, a GPipe/1F1B schedule) with intra-operator plans per stage;
* ``pipeline="auto"`` (default): both, ranked together.

It adds baselines computed with the same cost model (data parallel, Megatron-style tensor
parallel, Megatron TP x PP) so the user sees what the search gained, and returns a
:class:`SearchResult` whose ``plans`` are ranked by predicted step time (plans that fit in memory
first).
"""

from __future__ import annotations

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

__all__ = ["SearchResult", "search", "plan", "LEVELS"]

LEVELS = ("exhaustive", "hierarchical", "folded")


@dataclass
class SearchResult:
    """What :func:`search` found.

    Attributes:
        best: the best plan (lowest predicted step time among those that fit in memory).
        plans: every candidate and baseline, ranked.
        stats: counts and timings (operators, GraphNodes, segments, classes, ILPs, variables,
            seconds per phase).
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
        """The ranked plans as a text table."""
        lines = [f"{'#':>2}  {'label':<28} {'layout':<52} {'step ms':>10} {'mem GiB':>8} {'MFU':>6} {'fits':>5}"]
        for k, p in enumerate(self.plans):
            fits = p.predicted.memory_per_device <= p.cluster.device_memory
            lines.append(f"{k:>2}  {p.label:<28} {p.describe()[:52]:<52} "
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
    raise SearchError("search: the first argument should be an autoplan.models Workload or an OpGraph "
                      f"from autoplan.trace. Got {type(workload_or_graph).__name__}. Fix: "
                      "autoplan.search(autoplan.models.get('gpt', size='tiny'), cluster).")


def _rank(plans: list[Plan]) -> list[Plan]:
    def key(p: Plan):
        fits = p.predicted.memory_per_device <= p.cluster.device_memory
        return (not fits, p.predicted.step_time, p.label)
    return sorted(plans, key=key)


def search(workload_or_graph: Any, cluster: Cluster | str = "cpu:8", *, pipeline: bool | str = "auto",
           schedule: str = "1f1b", microbatches: int | str | None = None, level: str = "folded",
           mesh_shape: tuple[int, ...] | None = None, memory_budget: float | None = None,
           pin: Mapping[str, Any] | None = None, time_limit: float = 60.0, baselines: bool = True,
           num_layers: int | None = None, stage_algorithm: str = "auto",
           submesh_hosts: str = "auto",
           progress: Callable[[str, float], None] | None = None) -> SearchResult:
    """Search parallelisation plans for a training step on a cluster.

    Args:
        workload_or_graph: a :class:`autoplan.models.Workload` (or anything with ``fn``, ``args``
            and ``arg_kinds``), or an :class:`~autoplan.OpGraph`. Pipeline plans need a workload
            (the micro-batch graph is traced from it).
        cluster: a :class:`~autoplan.Cluster` or its ``"name:nodes"`` string.
        pipeline: ``False`` intra-operator only; ``True`` pipeline plans only; ``"auto"`` both.
        schedule: ``"1f1b"`` or ``"gpipe"``.
        microbatches: number of micro-batches for pipeline plans; ``None`` or ``"auto"``
            (default) searches it among powers of two near the default (the batch is the
            leading dimension of the batch arguments).
        level: ``"exhaustive"`` (whole-graph ILP, Alpa / TePDist O3), ``"hierarchical"``
            (segment ILPs + chain DP, TePDist O2) or ``"folded"`` (hierarchical, each unique
            segment class solved once, TAPAS).
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
        SearchError: bad options. InfeasiblePlanError: no plan fits ``memory_budget``.
    """
    if level not in LEVELS:
        raise SearchError(f"search: level should be one of {LEVELS}. Got {level!r}. "
                          "Fix: level='folded' (default), 'hierarchical' or 'exhaustive'.")
    if pipeline not in (True, False, "auto"):
        raise SearchError(f"search: pipeline should be True, False or 'auto'. Got {pipeline!r}.")
    if schedule not in ("1f1b", "gpipe"):
        raise SearchError(f"search: schedule should be '1f1b' or 'gpipe'. Got {schedule!r}.")
    from autoplan.search.pipeline._pipeline import check_microbatches, check_submesh_hosts  # noqa: PLC0415

    check_submesh_hosts(submesh_hosts)
    check_microbatches(microbatches)
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
            for key, val in res.stats.items():
                if isinstance(val, int | float) and not isinstance(val, bool):
                    stats[key] = stats.get(key, 0) + val
                else:
                    stats.setdefault(key, val)
    if do_pipe:
        from autoplan.search.pipeline._pipeline import pipeline_search  # noqa: PLC0415

        report("pipeline search", 0.55)
        try:
            pres = pipeline_search(workload, cluster, schedule=schedule, microbatches=microbatches,
                                   level=level, memory_budget=memory_budget, time_limit=time_limit,
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
    total = time.perf_counter() - t_start
    stats["search_seconds"] = total - t_trace
    ranked = _rank(plans)
    i = next(k for k, p in enumerate(ranked) if not p.label.startswith("baseline"))
    best = ranked[i] = ranked[i].with_(search_seconds=stats["search_seconds"])
    report("done", 1.0)
    return SearchResult(best=best, plans=ranked, stats=stats, graph=graph, analysis=analysis)


def plan(workload_or_graph: Any, cluster: Cluster | str = "cpu:8", **kwargs: Any) -> Plan:
    """The best plan of :func:`search` (same arguments)."""
    return search(workload_or_graph, cluster, **kwargs).best
