"""The folding analysis of a traced graph: one frozen record that the search, the plans and the
figures share.

:func:`autoplan.search.fold._summary.folding_analysis` computes it (once per graph); the search
gives it as ``SearchResult.analysis``, writes its plain form (:meth:`FoldingAnalysis.to_dict`,
with the ILPs and level of the search that made each plan) into every plan (``plan.analysis``,
kept in the plan file), and :func:`autoplan.viz.graph_figure` reads it back
(:meth:`FoldingAnalysis.from_dict`). This module imports nothing of the search, so the figures
can read a plan file without loading it.

* ``segments``: the chain of segments the hierarchical and folded levels solve (one per layer of
  the model: the embedding, each repeated block, the head), in model order, each a
  :class:`SegmentSummary`: its name (its layer's, as every view names it), FLOPs, operator count,
  structural class and the ids of its planned (dot/conv) operators. (The plain form calls them
  ``layers``: they are the layers the figure draws.)
* ``classes``: how many structurally distinct segments there are;
* ``critical`` / ``critical_ops``: the segments whose forward part ends at one of TePDist's
  critical nodes (a cut point of the chain), and those operators;
* ``fold_ratio``, ``mined_classes``, ``instances``: the miner's operators / operators of one
  instance per class plus the rest, its classes and each class's instance count;
* ``ilps`` / ``level``: the ILPs and level of the search that made a plan (None in the graph's
  own record, and for a baseline's plan).

A segment's class is structural: segments with equal structure (operators, shapes, dtypes and
operand wiring) share it, whatever level ran and whatever was pinned. That is what the figure
colours (the repetition folding exploits); how many ILPs a search solved is ``ilps``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ._errors import ArgumentError

__all__ = ["FoldingAnalysis", "SegmentSummary", "ANALYSIS_VERSION"]

#: Version of the plain form's layout (``analysis["version"]``).
ANALYSIS_VERSION = 1


def _ints(values: Any, what: str) -> tuple[int, ...]:
    if values is None:
        return ()
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise ArgumentError(f"folding analysis: {what} should be a list of integers. Got "
                            f"{values!r:.60}. Fix: pass plan.analysis as a search wrote it.")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ArgumentError(f"folding analysis: {what} should hold integers. Got {v!r:.40}. "
                                "Fix: pass plan.analysis as a search wrote it.")
        out.append(int(v))
    return tuple(out)


@dataclass(frozen=True)
class SegmentSummary:
    """One segment of the chain (a layer of the model, as the figure draws it).

    Attributes:
        name: its layer's name (``first..last`` when it spans several; ``layer (1/2)`` when a
            layer is cut in several segments), unique along the chain.
        flops: FLOPs of its operators.
        ops: how many operators it holds.
        cls: its structural class (``"class"`` in the plain form), or None where unknown.
        planned: ids of its planned operators (dot and convolution).
    """

    name: str
    flops: float
    ops: int
    cls: int | None
    planned: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The plain form (``{"name", "flops", "ops", "class", "planned"}``) a plan file holds."""
        return {"name": self.name, "flops": float(self.flops), "ops": int(self.ops),
                "class": self.cls, "planned": list(self.planned)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SegmentSummary:
        """A segment from its plain form; ``flops``, ``ops``, ``class`` and ``planned`` may be
        missing (a layer given by hand)."""
        if not isinstance(d, Mapping) or not isinstance(d.get("name"), str):
            raise ArgumentError(f"folding analysis: each layer should be a dict with a 'name'. "
                                f"Got {d!r:.60}. Fix: pass plan.analysis as a search wrote it.")
        c = d.get("class")
        return cls(name=d["name"], flops=float(d.get("flops", 0.0) or 0.0),
                   ops=int(d.get("ops", 0) or 0),
                   cls=None if c is None or isinstance(c, str) else int(c),
                   planned=_ints(d.get("planned"), "a layer's planned operators"))


@dataclass(frozen=True)
class FoldingAnalysis:
    """The folding analysis of a graph (see the module docstring)."""

    operators: int
    segments: tuple[SegmentSummary, ...]
    classes: int
    critical: tuple[int, ...] = ()
    critical_ops: tuple[int, ...] = ()
    fold_ratio: float | None = None
    mined_classes: int = 0
    instances: tuple[int, ...] = ()
    ilps: int | None = None
    level: str | None = None
    version: int = field(default=ANALYSIS_VERSION)

    def with_search(self, ilps: int | None, level: str | None) -> FoldingAnalysis:
        """This analysis with the ILPs and level of the search that made a plan."""
        return replace(self, ilps=ilps, level=level)

    def to_dict(self) -> dict[str, Any]:
        """The plain form a plan holds (``plan.analysis``) and its file keeps: ``version``,
        ``operators``, ``layers`` (the segments), ``classes``, ``critical``, ``critical_ops``,
        ``fold_ratio``, ``mined_classes``, ``instances``, ``ilps`` and ``level``."""
        return {"version": self.version, "operators": self.operators,
                "layers": [s.to_dict() for s in self.segments], "classes": self.classes,
                "critical": list(self.critical), "critical_ops": list(self.critical_ops),
                "fold_ratio": None if self.fold_ratio is None else float(self.fold_ratio),
                "mined_classes": self.mined_classes, "instances": list(self.instances),
                "ilps": self.ilps, "level": self.level}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FoldingAnalysis:
        """The record of a plain form (:meth:`to_dict`, or a plan file's ``analysis``); keys an
        older file lacks take their defaults.

        Raises:
            ArgumentError: ``d`` is not a mapping with a list of named ``layers``.
        """
        if not isinstance(d, Mapping) or isinstance(d.get("layers"), str | bytes) or not isinstance(
                d.get("layers"), Sequence):
            raise ArgumentError(f"folding analysis: should be a dict with a list of 'layers'. Got "
                                f"{d!r:.60}. Fix: pass plan.analysis as a search wrote it.")
        segments = tuple(SegmentSummary.from_dict(x) for x in d["layers"])
        classes = d.get("classes")
        if not isinstance(classes, int) or isinstance(classes, bool):
            classes = len({s.cls for s in segments if s.cls is not None})
        ratio = d.get("fold_ratio")
        ilps = d.get("ilps")
        level = d.get("level")
        return cls(operators=int(d.get("operators", sum(s.ops for s in segments)) or 0),
                   segments=segments, classes=classes,
                   critical=_ints(d.get("critical"), "critical"),
                   critical_ops=_ints(d.get("critical_ops"), "critical_ops"),
                   fold_ratio=None if ratio is None or not math.isfinite(float(ratio))
                   else float(ratio),
                   mined_classes=int(d.get("mined_classes", 0) or 0),
                   instances=_ints(d.get("instances"), "instances"),
                   ilps=None if ilps is None else int(ilps),
                   level=None if level is None else str(level),
                   version=int(d.get("version", ANALYSIS_VERSION)))
