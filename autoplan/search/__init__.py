"""The search's implementation: the entry point (``_api``), the baselines, the parallel tasks,
and the algorithm families in their sub-packages: intra-operator sharding (``intra``: Alpa's
ILP), folding (``fold``: TAPAS mining, TePDist cones and segments, the optimisation levels) and
pipeline stages (``pipeline``: Alpa's stage DP, TePDist's DAG stage ILP, the schedules).

The modules here are private. ``autoplan.search`` is the search function
(:func:`autoplan.search._api.search`: the ``autoplan`` package keeps that name bound to the
function when this package is imported), and the algorithms are public in
:mod:`autoplan.algorithms`. ``from autoplan.search import <name>`` of a name this package
re-exported until the previous release still works for one release, with a
:class:`DeprecationWarning` naming where it lives now.
"""

#: the public names this package re-exported until the previous release: where each lives now
_MOVED_TO_TOP = frozenset({"search", "plan", "SearchResult"})
_MOVED = frozenset({
    "LEVELS", "PlanDoesNotFitWarning", "BatchSplitWarning", "NoPipelineWarning",
    "baseline_plans", "LayerGroup", "group_layers", "Cone", "Segment", "cones", "critical_nodes",
    "segments", "group_graphnodes", "ILPSolution", "UnsupportedPrimitiveWarning", "evaluate",
    "solve_ilp", "IntraOpResult", "intra_op_search", "level_search", "MiningResult", "mine",
    "pipeline_search", "reshard", "gpipe_table", "one_f_one_b_table", "interleaved_table",
    "zb_h1_table", "schedule_events", "schedule_order", "schedule_stats", "schedule_summary",
    "schedule_table", "SolverTimeoutWarning", "enumerate_specs", "place_submeshes", "stage_dp",
    "submesh_shapes", "stage_ilp", "Strategy", "strategies", "cluster_layers",
})


def __getattr__(name: str):
    """A name this package re-exported until the previous release, with a
    :class:`DeprecationWarning` saying where it lives now (``autoplan.<name>`` for the search
    itself, :mod:`autoplan.algorithms` for the algorithms)."""
    if name in _MOVED_TO_TOP or name in _MOVED:
        import importlib  # noqa: PLC0415
        import sys  # noqa: PLC0415
        import warnings  # noqa: PLC0415

        home = "autoplan" if name in _MOVED_TO_TOP else "autoplan.algorithms"
        new = "group_layers" if name == "cluster_layers" else name
        value = getattr(importlib.import_module(home), new)
        if sys._getframe(1).f_code.co_name == "_handle_fromlist":
            return value  # (the import system's look before ``from ... import``: warned next)
        warnings.warn(f"autoplan.search.{name} is deprecated and will be removed in the next "
                      f"release; use {home}.{new} (the same object): autoplan.search is the "
                      "search function, its algorithms are autoplan.algorithms.",
                      DeprecationWarning, stacklevel=2)
        return value
    raise AttributeError(f"module 'autoplan.search' has no attribute {name!r}")
