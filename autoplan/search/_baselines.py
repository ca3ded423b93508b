"""Baselines computed with the same cost model as the search, so a user sees what it gained.

* ``baseline: data parallel`` — logical mesh (n, 1): every batch leaf split on its leading
  dimension over all devices, every parameter and optimizer-state leaf replicated; the ILP only
  fills in the rest (so gradients are all-reduced).
* ``baseline: Megatron TP`` — Megatron-LM's expert plan (REFERENCE.md section 4): QKV / FC1 / expert
  ``wi`` kernels split on their output dimension, attention-output / FC2 / expert ``wo`` kernels on
  their input dimension, the embedding vocabulary-parallel, the LM head on its vocabulary
  dimension; tensor parallelism inside a node (mesh axis ``y``), data parallelism across nodes
  (axis ``x``). Only for models with such layers.
* ``baseline: Megatron TP x PP`` — the same tensor parallelism inside each node and one pipeline
  stage per node with equal layer counts (for clusters of several nodes).
"""

from __future__ import annotations

import warnings
from typing import Any

from autoplan._cluster import Cluster
from autoplan._errors import AutoplanError
from autoplan._graph import OpGraph
from autoplan._plan import Plan
from autoplan.search.intra._pins import data_parallel_pins, megatron_pins

__all__ = ["baseline_plans"]

def baseline_plans(graph: OpGraph, cluster: Cluster, *, workload: Any = None, schedule: str = "1f1b",
                   time_limit: float = 60.0, config: dict | None = None,
                   pipeline: bool = False) -> list[Plan]:
    """The baselines that apply to this graph and cluster (see the module docstring)."""
    from autoplan.search.fold._levels import level_search  # noqa: PLC0415

    n, per = cluster.num_devices, cluster.devices_per_node
    out: list[Plan] = []

    def attempt(label: str, shape: tuple[int, int], pins: dict[str, Any]) -> None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = level_search(graph, cluster, shape, pin=pins, time_limit=time_limit,
                                   label=label, level="auto", config=config)
            out.append(res.plan)
        except AutoplanError:
            pass

    attempt("baseline: data parallel", (n, 1), data_parallel_pins(graph))
    tp = min(per, n)
    pins = megatron_pins(graph, tp)
    if pins is not None and n > 1:
        attempt("baseline: Megatron TP", (n // tp, tp), pins)
        if pipeline and cluster.nodes > 1 and workload is not None:
            from autoplan.search.pipeline._pipeline import pipeline_search  # noqa: PLC0415

            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    res = pipeline_search(workload, cluster, schedule=schedule, level="folded",
                                          time_limit=time_limit, megatron=True, max_candidates=1)
                out.extend(p.with_(label="baseline: Megatron TP x PP") for p in res.plans[:1])
            except AutoplanError:
                pass
    return out
