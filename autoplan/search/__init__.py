"""Plan search: intra-operator sharding (Alpa's ILP), folding (TAPAS mining, TePDist cones and
segments, optimisation levels) and pipeline stages (Alpa's stage DP, TePDist's DAG stage ILP,
GPipe/1F1B schedules).

``autoplan.search`` is both this package and the entry point: ``autoplan.search(workload,
cluster, ...)`` calls :func:`search`, and ``autoplan.search.mine``, ``autoplan.search.stage_dp``
... are the algorithms.
"""

import sys as _sys
import types as _types

from ._api import LEVELS as LEVELS
from ._api import SearchResult as SearchResult
from ._api import plan as plan
from ._api import search as search
from ._baselines import baseline_plans as baseline_plans
from ._clustering import LayerGroup as LayerGroup
from ._clustering import cluster_layers as cluster_layers
from ._cones import Cone as Cone
from ._cones import Segment as Segment
from ._cones import cones as cones
from ._cones import critical_nodes as critical_nodes
from ._cones import segments as segments
from ._graphnodes import group_graphnodes as group_graphnodes
from ._ilp import ILPSolution as ILPSolution
from ._ilp import UnsupportedPrimitiveWarning as UnsupportedPrimitiveWarning
from ._ilp import evaluate as evaluate
from ._ilp import solve_ilp as solve_ilp
from ._intra import IntraOpResult as IntraOpResult
from ._intra import intra_op_search as intra_op_search
from ._levels import level_search as level_search
from ._mine import MiningResult as MiningResult
from ._mine import mine as mine
from ._pipeline import pipeline_search as pipeline_search
from ._reshard import reshard as reshard
from ._schedule import gpipe_table as gpipe_table
from ._schedule import one_f_one_b_table as one_f_one_b_table
from ._schedule import schedule_events as schedule_events
from ._schedule import schedule_stats as schedule_stats
from ._schedule import schedule_table as schedule_table
from ._solver import SolverTimeoutWarning as SolverTimeoutWarning
from ._spec import enumerate_specs as enumerate_specs
from ._stage_dp import place_submeshes as place_submeshes
from ._stage_dp import stage_dp as stage_dp
from ._stage_dp import submesh_shapes as submesh_shapes
from ._stage_ilp import stage_ilp as stage_ilp
from ._strategies import Strategy as Strategy
from ._strategies import strategies as strategies

__all__ = [
    "LEVELS", "SearchResult", "plan", "search", "baseline_plans", "LayerGroup", "cluster_layers",
    "Cone", "Segment", "cones", "critical_nodes", "segments", "group_graphnodes", "ILPSolution",
    "UnsupportedPrimitiveWarning", "evaluate", "solve_ilp", "IntraOpResult", "intra_op_search",
    "level_search", "MiningResult", "mine", "pipeline_search", "reshard", "gpipe_table",
    "one_f_one_b_table", "schedule_events", "schedule_stats", "schedule_table",
    "SolverTimeoutWarning", "enumerate_specs", "place_submeshes", "stage_dp", "submesh_shapes",
    "stage_ilp", "Strategy", "strategies",
]


class _SearchModule(_types.ModuleType):
    """Makes ``autoplan.search(...)`` call :func:`search`."""

    def __call__(self, *args, **kwargs):
        return search(*args, **kwargs)


_sys.modules[__name__].__class__ = _SearchModule
