"""The search's algorithms, public: TAPAS mining, TePDist cones, critical nodes and segments, the
intra-operator ILP and its levels, Alpa's stage DP, TePDist's DAG stage ILP, the pipeline search,
the schedules and the baselines.

``autoplan.search`` is the search itself (a function: ``autoplan.search(workload, cluster,
...)``); this module holds what it is made of, for a caller that runs one part on its own::

    >>> import autoplan
    >>> from autoplan import algorithms
    >>> graph = autoplan.trace(autoplan.models.get("mlp", size="tiny", batch=512))
    >>> algorithms.mine(graph).fold_ratio >= 1
    True

Until the previous release these names were ``autoplan.search.<name>`` (``autoplan.search`` was
both a module and the function): ``from autoplan.search import <name>`` still works for one
release, with a :class:`DeprecationWarning` naming this module.
"""

from autoplan.plans._schedule import gpipe_table as gpipe_table
from autoplan.plans._schedule import interleaved_table as interleaved_table
from autoplan.plans._schedule import one_f_one_b_table as one_f_one_b_table
from autoplan.plans._schedule import schedule_events as schedule_events
from autoplan.plans._schedule import schedule_order as schedule_order
from autoplan.plans._schedule import schedule_stats as schedule_stats
from autoplan.plans._schedule import schedule_summary as schedule_summary
from autoplan.plans._schedule import schedule_table as schedule_table
from autoplan.plans._schedule import zb_h1_table as zb_h1_table
from autoplan.search._api import LEVELS as LEVELS
from autoplan.search._api import BatchSplitWarning as BatchSplitWarning
from autoplan.search._api import NoPipelineWarning as NoPipelineWarning
from autoplan.search._api import PinNotHeldWarning as PinNotHeldWarning
from autoplan.search._api import PlanDoesNotFitWarning as PlanDoesNotFitWarning
from autoplan.search._api import SearchResult as SearchResult
from autoplan.search._baselines import baseline_plans as baseline_plans
from autoplan.search._search_options import SearchOptions as SearchOptions
from autoplan.search.fold._cones import Cone as Cone
from autoplan.search.fold._cones import Segment as Segment
from autoplan.search.fold._cones import cones as cones
from autoplan.search.fold._cones import critical_nodes as critical_nodes
from autoplan.search.fold._cones import segments as segments
from autoplan.search.fold._graphnodes import group_graphnodes as group_graphnodes
from autoplan.search.fold._layers import LayerGroup as LayerGroup
from autoplan.search.fold._layers import group_layers as group_layers
from autoplan.search.fold._levels import level_search as level_search
from autoplan.search.fold._mine import MiningResult as MiningResult
from autoplan.search.fold._mine import mine as mine
from autoplan.search.intra._ilp_cost import evaluate as evaluate
from autoplan.search.intra._ilp_solve import ILPSolution as ILPSolution
from autoplan.search.intra._ilp_solve import UnsupportedPrimitiveWarning as UnsupportedPrimitiveWarning
from autoplan.search.intra._ilp_solve import solve_ilp as solve_ilp
from autoplan.search.intra._intra import IntraOpResult as IntraOpResult
from autoplan.search.intra._intra import intra_op_search as intra_op_search
from autoplan.search.intra._reshard import reshard as reshard
from autoplan.search.intra._solver import SolverTimeoutWarning as SolverTimeoutWarning
from autoplan.search.intra._spec_space import enumerate_specs as enumerate_specs
from autoplan.search.intra._strategies import Strategy as Strategy
from autoplan.search.intra._strategies import strategies as strategies
from autoplan.search.pipeline._pipeline import pipeline_search as pipeline_search
from autoplan.search.pipeline._stage_dp import place_submeshes as place_submeshes
from autoplan.search.pipeline._stage_dp import stage_dp as stage_dp
from autoplan.search.pipeline._stage_dp import submesh_shapes as submesh_shapes
from autoplan.search.pipeline._stage_ilp import stage_ilp as stage_ilp

__all__ = [
    "LEVELS", "SearchResult", "SearchOptions", "PlanDoesNotFitWarning", "BatchSplitWarning",
    "NoPipelineWarning", "PinNotHeldWarning", "baseline_plans", "LayerGroup", "group_layers", "Cone", "Segment",
    "cones", "critical_nodes", "segments", "group_graphnodes", "ILPSolution",
    "UnsupportedPrimitiveWarning", "evaluate", "solve_ilp", "IntraOpResult", "intra_op_search",
    "level_search", "MiningResult", "mine", "pipeline_search", "reshard", "gpipe_table",
    "one_f_one_b_table", "interleaved_table", "zb_h1_table", "schedule_events", "schedule_order",
    "schedule_stats", "schedule_summary", "schedule_table", "SolverTimeoutWarning",
    "enumerate_specs", "place_submeshes", "stage_dp", "submesh_shapes", "stage_ilp", "Strategy",
    "strategies",
]

_RENAMED = {"cluster_layers": "group_layers"}


def __getattr__(name: str):
    """Old names that still work for one release, with a :class:`DeprecationWarning` naming the
    new one: ``cluster_layers`` is :func:`group_layers` (layers of operators, not a cluster of
    devices)."""
    if name in _RENAMED:
        import warnings  # noqa: PLC0415

        new = _RENAMED[name]
        warnings.warn(f"autoplan.algorithms.{name} is deprecated and will be removed in the next "
                      f"release; use autoplan.algorithms.{new} (the same function).",
                      DeprecationWarning, stacklevel=2)
        return globals()[new]
    raise AttributeError(f"module 'autoplan.algorithms' has no attribute {name!r}")
