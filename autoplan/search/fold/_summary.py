"""The folding analysis of a traced graph as one record (:class:`autoplan._analysis.FoldingAnalysis`).

:func:`folding_analysis` condenses the miner's and TePDist's view of a graph into the small
record that :class:`autoplan.SearchResult` gives and every plan carries in its plain form
(``plan.analysis``, kept in its file), so :func:`autoplan.viz.graph_figure` can draw it from a
search result, a plan, or a plan file (see :mod:`autoplan._analysis` for its fields).

It is computed for every search, whatever level ran, from the graph alone: the mining and the
segments are the ones the folded levels solve (:func:`~autoplan.search.fold._mine.mining_of`,
:func:`~autoplan.search.fold._chain.segments_of`, memoised on the graph), and take well under a
second even for GPT-3-sized graphs. :func:`analysis_of` is the graph's memoised record.
"""

from __future__ import annotations

from autoplan._analysis import ANALYSIS_VERSION, FoldingAnalysis, SegmentSummary
from autoplan._memo import per_owner
from autoplan.tracing._graph import OpGraph
from autoplan.tracing._primitives import LAYER_HEAVY

__all__ = ["folding_analysis", "analysis_of", "SUMMARY_VERSION"]

#: Version of the record's plain layout (``analysis["version"]``).
SUMMARY_VERSION = ANALYSIS_VERSION



def folding_analysis(graph: OpGraph) -> FoldingAnalysis:
    """The folding analysis of ``graph`` (see the module docstring); :func:`analysis_of` is
    the graph's, computed once."""
    from autoplan.search.fold._chain import segments_of  # noqa: PLC0415
    from autoplan.search.fold._cones import critical_nodes  # noqa: PLC0415
    from autoplan.search.fold._layers import _signature, segment_names  # noqa: PLC0415
    from autoplan.search.fold._mine import mining_of  # noqa: PLC0415

    mining = mining_of(graph)
    segs = segments_of(graph)
    classes: dict[str, int] = {}
    crit = set(critical_nodes(graph, part="forward")) if segs else set()
    out, critical, critical_ops = [], [], []
    names = segment_names(graph, segs)
    for k, seg in enumerate(segs):
        cls = classes.setdefault(_signature(graph, seg.ops), len(classes))
        planned = tuple(o for o in seg.ops if graph.ops[o].primitive in LAYER_HEAVY)
        out.append(SegmentSummary(name=names[k], flops=float(seg.flops), ops=len(seg.ops),
                                  cls=cls, planned=planned))
        cut = max((o for o in seg.main if o in crit), default=None)
        if cut is not None and k < len(segs) - 1:
            critical.append(k)
            critical_ops.append(int(cut))
    return FoldingAnalysis(operators=len(graph), segments=tuple(out), classes=len(classes),
                           critical=tuple(critical), critical_ops=tuple(critical_ops),
                           fold_ratio=float(mining.fold_ratio),
                           mined_classes=len(mining.classes),
                           instances=tuple(len(c.instances) for c in mining.classes))


@per_owner
def analysis_of(graph: OpGraph) -> FoldingAnalysis:
    """:func:`folding_analysis` of ``graph``, computed once per graph (the record every plan of
    its searches carries)."""
    return folding_analysis(graph)
