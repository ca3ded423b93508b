"""The analyses of a graph that several parts of the search read, each computed by one function
and memoised on the graph (:func:`autoplan._memo.per_owner`).

* :func:`mining_of`: the TAPAS mining (:func:`~autoplan.search.fold._mine.mine`);
* :func:`segments_of`: the chain of segments the hierarchical and folded levels solve
  (:func:`~autoplan.search.fold._levels._choose_segments`), which the folding analysis names;
* :func:`segment_index_of`, :func:`segment_facts_of`: what the levels need of that chain;
* :func:`analysis_of`: the folding analysis the plans and figures carry
  (:func:`~autoplan.search.fold._summary.folding_analysis`).

The modules that compute them are imported on first use (this module is imported by them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autoplan._memo import per_owner

if TYPE_CHECKING:
    from autoplan._analysis import FoldingAnalysis
    from autoplan._graph import OpGraph
    from autoplan.search.fold._cones import Segment
    from autoplan.search.fold._mine import MiningResult

__all__ = ["mining_of", "segments_of", "segment_index_of", "segment_facts_of", "analysis_of"]


@per_owner
def mining_of(graph: OpGraph) -> MiningResult:
    """The graph's repeated-subgraph mining."""
    from autoplan.search.fold._mine import mine  # noqa: PLC0415

    return mine(graph)


@per_owner
def segments_of(graph: OpGraph) -> list[Segment]:
    """The chain of segments the hierarchical and folded levels solve, in model order."""
    from autoplan.search.fold._cones import segments as find_segments  # noqa: PLC0415
    from autoplan.search.fold._levels import _choose_segments  # noqa: PLC0415

    mining = mining_of(graph)
    return _choose_segments(graph, lambda: find_segments(graph, mining=mining), mining)


@per_owner
def segment_index_of(graph: OpGraph) -> tuple[list[int], list[int]]:
    """Each operator's segment of :func:`segments_of` and its position in it (-1, -1: none)."""
    from autoplan.search.fold._levels import _segment_index  # noqa: PLC0415

    return _segment_index(graph, segments_of(graph))


@per_owner
def segment_facts_of(graph: OpGraph) -> tuple[Any, ...]:
    """What the levels need of the chain, whatever is pinned or fixed
    (:func:`~autoplan.search.fold._levels._segment_facts`): the same for every search of this
    graph's segments (the baselines share them)."""
    from autoplan.search.fold._levels import _segment_facts  # noqa: PLC0415

    return _segment_facts(graph, segments_of(graph), segment_index_of(graph)[0])


@per_owner
def analysis_of(graph: OpGraph) -> FoldingAnalysis:
    """The graph's folding analysis (the record every plan of a search carries)."""
    from autoplan.search.fold._summary import folding_analysis  # noqa: PLC0415

    return folding_analysis(graph)
