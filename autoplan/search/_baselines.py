"""Baselines computed with the same cost model as the search, so a user sees what it gained.

The default set is data parallel, Megatron TP and the fixed Megatron TP x PP (one stage per node,
tensor parallelism over the node); ``baselines="paper"`` (Alpa's comparisons) has data parallel,
ZeRO-2, ZeRO-3, Megatron TP, Megatron-LM's TP x PP x DP grid and inter-op only.

* ``baseline: data parallel`` — logical mesh (n, 1): every batch leaf split on its leading
  dimension over all devices, every parameter and optimizer-state leaf replicated; the ILP only
  fills in the rest (so gradients are all-reduced).
* ``baseline: ZeRO-2`` and ``baseline: ZeRO-3`` — Alpa's intra-operator ablations (Rajbhandari
  et al., "ZeRO", SC'20): data parallelism over all devices (mesh (n, 1)) with the optimizer
  state partitioned over them (stage 2: gradients reduce-scattered, the updated parameters
  all-gathered), and for stage 3 the parameters too (all-gathered where used).
* ``baseline: Megatron TP`` — Megatron-LM's expert plan (Shoeybi et al., "Megatron-LM", 2019, section 3): QKV / FC1 / expert
  ``wi`` kernels split on their output dimension, attention-output / FC2 / expert ``wo`` kernels on
  their input dimension, the embedding vocabulary-parallel, the LM head on its vocabulary
  dimension; tensor parallelism inside a node (mesh axis ``y``), data parallelism across nodes
  (axis ``x``). Only for models with such layers.
* ``baseline: Megatron TP x PP`` — by default the same tensor parallelism over each node and one
  pipeline stage per node with equal layer counts (clusters of several nodes); with ``"paper"``
  Megatron-LM's TP x PP x DP grid, as its own benchmark searched it (Narayanan et al., SC'21):
  pipeline stages of equal layer counts, tensor parallelism of 1, 2, 4 or 8 devices inside a node
  with the same pins, data parallelism outside, micro-batches searched; the best of the grid
  (clusters of several devices).
* ``baseline: inter-op only`` — Alpa's inter-operator-only ablation: pipeline stages alone, each
  on one device (as many stages as devices, where the layers allow), placed by the stage DP.

A baseline is a spec per input (:mod:`autoplan.search.intra._pins`, keyed by tensor id), searched
at the same level as the plans it is compared with. The intra-operator baselines are independent
tasks of the search (:func:`baseline_tasks`), run on all cores beside its own meshes; the
Megatron TP x PP baseline needs the workload (it traces the micro-batch step) and runs in the
caller's process.
"""

from __future__ import annotations

import warnings
from typing import Any

from autoplan._errors import AutoplanError
from autoplan._memo import memo
from autoplan._options import require_graph, require_instance
from autoplan.costs._cluster import Cluster
from autoplan.plans._plan import Plan
from autoplan.search._parallel import Task, resolve_workers, run_tasks
from autoplan.search.intra._pins import INTRA_BASELINES, baseline_pins, megatron_pins
from autoplan.tracing._graph import OpGraph

__all__ = ["baseline_plans", "baseline_tasks", "solve_baseline", "megatron_pipeline_baseline",
           "inter_op_baseline", "pipeline_baselines", "INTRA_BASELINES"]

#: the ones only ``baselines="paper"`` adds (of :data:`INTRA_BASELINES`, the intra-operator
#: baselines in the order they are listed)
PAPER_ONLY = ("baseline: ZeRO-2", "baseline: ZeRO-3")


def solve_baseline(graph: OpGraph, cluster: Cluster, label: str, *, time_limit: float = 60.0,
                   config: dict | None = None) -> Plan | None:
    """The intra-operator baseline ``label`` (one of :data:`INTRA_BASELINES`), or None where it
    does not apply or cannot be made (its pins do not fit the mesh, or nothing fits)."""
    from autoplan.search.fold._levels import level_search  # noqa: PLC0415

    made = baseline_pins(graph, cluster, label)
    if made is None:
        return None
    shape, pins = made
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return level_search(graph, cluster, shape, pins=pins, time_limit=time_limit,
                                label=label, level="auto", config=config).plan
    except AutoplanError:
        return None


def baseline_tasks(graph: OpGraph, cluster: Cluster, *, time_limit: float = 60.0,
                   config: dict | None = None, paper: bool = False) -> list[Task]:
    """The intra-operator baselines that apply to this graph and cluster (with ``paper``, Alpa's
    ZeRO ablations too), as independent tasks of :func:`~autoplan.search._parallel.run_tasks`
    (each gives a plan or None)."""
    return [Task(solve_baseline, graph, (cluster, label), {"time_limit": time_limit,
                                                          "config": config}, label=label)
            for label in INTRA_BASELINES if (paper or label not in PAPER_ONLY)
            and baseline_pins(graph, cluster, label) is not None]


def megatron_pipeline_baseline(workload: Any, cluster: Cluster, *, schedule: str = "1f1b",
                               time_limit: float = 60.0, workers: int | None = None,
                               grid: bool = True) -> Plan | None:
    """The Megatron TP x PP baseline: the best of its grid on clusters of several devices, or
    without ``grid`` its one layout on clusters of several nodes (None where it does not apply
    or cannot be made), its layer ILPs solved on ``workers`` processes."""
    from autoplan.search.pipeline._microbatches import traced  # noqa: PLC0415
    from autoplan.search.pipeline._pipeline import pipeline_search  # noqa: PLC0415

    graph = traced(workload)
    if (cluster.num_devices if grid else cluster.nodes) <= 1 or megatron_pins(graph, min(cluster.devices_per_node,
                                                      cluster.num_devices)) is None:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = pipeline_search(workload, cluster, schedule=schedule, level="folded",
                                  time_limit=time_limit, megatron="grid" if grid else True,
                                  max_candidates=1,
                                  workers=workers)
    except AutoplanError:
        return None
    return res.plans[0].with_(label="baseline: Megatron TP x PP") if res.plans else None


def inter_op_baseline(workload: Any, cluster: Cluster, *, schedule: str = "1f1b",
                      time_limit: float = 60.0, workers: int | None = None) -> Plan | None:
    """The inter-operator-only baseline (None where the layers cannot fill one stage per device
    or nothing can be made)."""
    from autoplan.search.pipeline._pipeline import pipeline_search  # noqa: PLC0415

    if cluster.num_devices <= 1:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = pipeline_search(workload, cluster, schedule=schedule, level="folded",
                                  time_limit=time_limit, inter_only=True, max_candidates=1,
                                  workers=workers)
    except AutoplanError:
        return None
    best = next((p for p in res.plans if len(p.stages) == cluster.num_devices), None)
    return best.with_(label="baseline: inter-op only") if best is not None else None


def pipeline_baselines(workload: Any, cluster: Cluster, *, schedule: str = "1f1b",
                       time_limit: float = 60.0, workers: int | None = None,
                       paper: bool = False) -> list[Plan]:
    """The baselines that need the workload, those that apply: the Megatron TP x PP layout, or
    with ``paper`` the best of Megatron's grid and the inter-op-only ablation.

    They read no memory budget (each is the best layout of its kind on the device's memory), so
    they are kept per workload object, cluster, schedule, time limit and ``paper``: a search of
    the same workload at another budget (the Explorer's budget change) gets them without a
    search. Which processes solve them (``workers``) changes nothing of what they are."""
    def make() -> tuple[Plan, ...]:
        kw = {"schedule": schedule, "time_limit": time_limit, "workers": workers}
        out = [megatron_pipeline_baseline(workload, cluster, grid=paper, **kw)]
        if paper:
            out.append(inter_op_baseline(workload, cluster, **kw))
        return tuple(p for p in out if p is not None)

    return list(memo(workload, (pipeline_baselines, cluster, schedule, float(time_limit),
                                bool(paper)), make))


def baseline_plans(graph: OpGraph, cluster: Cluster, *, workload: Any = None, schedule: str = "1f1b",
                   time_limit: float = 60.0, config: dict | None = None,
                   pipeline: bool = False, workers: int | None = None,
                   paper: bool = False) -> list[Plan]:
    """The baselines that apply to this graph and cluster (see the module docstring), the
    intra-operator ones solved on ``workers`` processes (as :func:`autoplan.search`)."""
    require_graph("baseline_plans", graph)
    require_instance("baseline_plans", "cluster", cluster, Cluster, "pass Cluster.parse('cpu:8')")
    tasks = baseline_tasks(graph, cluster, time_limit=time_limit, config=config, paper=paper)
    outcomes = run_tasks(tasks, workers=resolve_workers(workers, len(graph)))
    out = [p for o in outcomes if (p := o.result()) is not None]
    if pipeline and workload is not None:
        out += pipeline_baselines(workload, cluster, schedule=schedule, time_limit=time_limit,
                                  workers=workers, paper=paper)
    return out
