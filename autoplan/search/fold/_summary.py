"""The folding analysis as plain data: what a plan carries for the mined-subgraph figure.

:func:`analysis_summary` condenses the miner's and TePDist's view of a traced graph into a small,
JSON-ready dict that :class:`autoplan.Plan` keeps (``plan.analysis``) and writes to its file, so
:func:`autoplan.viz.graph_figure` can draw it from a search result, a plan, or a plan file:

* ``layers``: the chain of segments the hierarchical levels solve (one per layer of the model:
  the embedding, each repeated block, the head), in model order, each with its name (its
  layer's, as every view names it: :func:`segment_names`), FLOPs,
  operator count, structural class and the ids of its planned (dot/conv) operators;
* ``classes``: how many structurally distinct segments there are (segments of one class are
  solved once when folding: TAPAS);
* ``critical`` / ``critical_ops``: the segments whose forward part ends at one of TePDist's
  critical nodes (an operator every other forward operator is an ancestor or a descendant of:
  a cut point of the chain), and those operators;
* ``fold_ratio``: the miner's operators / operators of one instance per class plus the rest.

The summary is computed for every search, whatever level ran: mining and the segments are
memoised on the graph (the folded levels use the same ones), and take well under a second even
for GPT-3-sized graphs.
"""

from __future__ import annotations

from typing import Any

from autoplan._graph import OpGraph
from autoplan._memo import memo
from autoplan._primitives import LAYER_HEAVY

__all__ = ["analysis_summary", "SUMMARY_VERSION"]

#: Version of the summary's layout (``analysis["version"]``).
SUMMARY_VERSION = 1


def analysis_summary(graph: OpGraph, analysis: Any = None) -> dict[str, Any]:
    """The folding analysis of ``graph`` as plain data (see the module docstring).

    Args:
        graph: the traced graph.
        analysis: the :class:`~autoplan.search.fold._levels.Analysis` of a hierarchical or
            folded search of this graph, when one ran (its segments are reused); else the
            segments are found as those levels would find them.

    Returns:
        A dict with ``version``, ``operators``, ``layers`` (``name``, ``flops``, ``ops``,
        ``class``, ``planned``), ``classes``, ``critical``, ``critical_ops``, ``fold_ratio``,
        ``mined_classes`` and ``instances`` (per mined class, its instance count).
    """
    from autoplan.search.fold._cones import critical_nodes  # noqa: PLC0415
    from autoplan.search.fold._cones import segments as find_segments  # noqa: PLC0415
    from autoplan.search.fold._layers import _signature, segment_names  # noqa: PLC0415
    from autoplan.search.fold._levels import _choose_segments  # noqa: PLC0415
    from autoplan.search.fold._mine import mine  # noqa: PLC0415

    def build() -> dict[str, Any]:
        mining = memo(graph, "mining", lambda: mine(graph))
        if analysis is not None and analysis.segments:
            segs = analysis.segments
        else:
            segs = memo(graph, "segments", lambda: _choose_segments(
                graph, lambda: find_segments(graph, mining=mining), mining))
        classes: dict[str, int] = {}
        crit = set(critical_nodes(graph, part="forward")) if segs else set()
        layers, critical, critical_ops = [], [], []
        names = segment_names(graph, segs)
        for k, seg in enumerate(segs):
            cls = classes.setdefault(_signature(graph, seg.ops), len(classes))
            planned = [o for o in seg.ops if graph.ops[o].primitive in LAYER_HEAVY]
            layers.append({"name": names[k], "flops": float(seg.flops),
                           "ops": len(seg.ops), "class": cls, "planned": planned})
            cut = max((o for o in seg.main if o in crit), default=None)
            if cut is not None and k < len(segs) - 1:
                critical.append(k)
                critical_ops.append(int(cut))
        return {"version": SUMMARY_VERSION, "operators": len(graph), "layers": layers,
                "classes": len(classes), "critical": critical, "critical_ops": critical_ops,
                "fold_ratio": float(mining.fold_ratio), "mined_classes": len(mining.classes),
                "instances": [len(c.instances) for c in mining.classes]}

    key = ("analysis_summary", id(analysis.segments) if analysis is not None else None)
    return memo(graph, key, build)
