"""The chain of segments the hierarchical and folded levels solve, and what they need of it.

:func:`segments_of` is the chain (:func:`_choose_segments`: the model's own layers when its
operators carry named scopes, else TePDist's segments between critical nodes, coarsened);
:func:`segment_index_of` places each operator in it and :func:`segment_facts_of` gives the
boundary and long-range tensors, the shared inputs and each segment's structural signature.
Each is computed once per graph (:func:`autoplan._memo.per_owner`): every level, every logical
mesh and the folding analysis the plans carry (:mod:`autoplan.search.fold._summary`) read the
same chain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from autoplan._memo import per_owner
from autoplan.search.fold._layers import _forward, _signature, group_layers
from autoplan.search.fold._mine import mining_of
from autoplan.search.intra._ilp_problem import _free_tensors, _updated_pairs
from autoplan.tracing._graph import OpGraph
from autoplan.tracing._operands import operand_arrays

if TYPE_CHECKING:
    from autoplan.search.fold._cones import Segment

__all__ = ["segments_of", "segment_index_of", "segment_facts_of"]


@per_owner
def segments_of(graph: OpGraph) -> list[Segment]:
    """The chain of segments the hierarchical and folded levels solve, in model order."""
    from autoplan.search.fold._cones import segments as find_segments  # noqa: PLC0415

    mining = mining_of(graph)
    return _choose_segments(graph, lambda: find_segments(graph, mining=mining), mining)


@per_owner
def segment_index_of(graph: OpGraph) -> tuple[list[int], list[int]]:
    """Each operator's segment of :func:`segments_of` and its position in it (-1, -1: none)."""
    return _segment_index(graph, segments_of(graph))


@per_owner
def segment_facts_of(graph: OpGraph) -> tuple:
    """What the levels need of the chain, whatever is pinned or fixed (:func:`_segment_facts`):
    the same for every search of this graph's segments (the baselines share them)."""
    return _segment_facts(graph, segments_of(graph), segment_index_of(graph)[0])


def _segment_index(graph: OpGraph, segs: list) -> tuple[list[int], list[int]]:
    """Each operator's segment and its position in that segment's operator list (-1, -1: in
    none)."""
    seg_of = [-1] * len(graph.ops)
    position = [-1] * len(graph.ops)
    for s in segs:
        for p, o in enumerate(s.ops):
            seg_of[o] = s.id
            position[o] = p
    return seg_of, position


def _segment_facts(graph: OpGraph, segs: list, seg_of: list[int]) -> tuple:
    """What the hierarchical levels need of a chain of segments, whatever is pinned or fixed:
    the boundary and long-range tensors (:func:`_crossings`), the shared inputs and their updates
    (:func:`_shared_inputs`), each segment's outside uses of its boundary tensors, and each
    segment's structural signature."""
    K = len(segs)
    boundaries, long_range = _crossings(graph, seg_of, K)
    shared, pair_out = _shared_inputs(graph, seg_of)
    # per segment, for each tensor of its two boundaries: how often it is read outside the
    # segment when the segment makes it (-1 when it does not); a boundary spec fixed on a tensor
    # made inside is charged once per such use (see extra_uses; ``consumers`` lists an operator
    # once per operand it reads the tensor as)
    outside_uses = [tuple(
        sum(1 for c in graph.consumers[t] if seg_of[c] != i)
        if seg_of[graph.tensors[t].producer] == i else -1
        for b in (i - 1, i) if 0 <= b < K - 1 for t in boundaries[b]) for i in range(K)]
    sig = [_signature(graph, s.ops) for s in segs]
    return boundaries, long_range, shared, pair_out, outside_uses, sig


def _crossings(graph: OpGraph, seg_of: list[int], K: int
               ) -> tuple[list[tuple[int, ...]], list[list[int]]]:
    """The non-scalar tensors crossing between segments (constants and what is computed from
    them alone excluded: the ILP decides nothing about them).

    Returns:
        For each i < K-1, the tensors crossing between segments i and i+1 in either direction
        (sorted); and for each segment, the tensors it reads from a segment that is not adjacent.
    """
    bound: list[list[int]] = [[] for _ in range(max(K - 1, 0))]
    long_range: list[list[int]] = [[] for _ in range(K)]
    # over the flat operand arrays: (tensor, reading segment) pairs whose producer is an
    # operator of another segment, each pair once, in tensor order
    arr = operand_arrays(graph)
    seg = np.asarray(seg_of, dtype=np.int64)
    t = arr.tensor
    made = t >= 0
    made[made] = arr.producer[t[made]] >= 0
    t = t[made]
    q = seg[arr.reader[made]]
    p = seg[arr.producer[t]]
    other = q != p
    pair = np.unique(t[other] * K + q[other])
    t, q = pair // K, pair % K
    p = seg[arr.producer[t]]
    tensors = graph.tensors
    free = _free_tensors(graph)  # constants and what is computed from them alone: no decision
    for ti, pi, qi in zip(t.tolist(), p.tolist(), q.tolist()):
        if not tensors[ti].shape or ti in free:
            continue
        if qi == pi + 1:
            bound[pi].append(ti)
        elif qi == pi - 1:
            bound[qi].append(ti)
        else:
            long_range[qi].append(ti)
    return [tuple(sorted(x)) for x in bound], long_range


def _shared_inputs(graph: OpGraph, seg_of: list[int]
                   ) -> tuple[dict[int, list[int]], dict[int, list[tuple[int, int]]]]:
    """The graph inputs whose spec couples segments, and the updates that write them back.

    A graph input read by several segments (stacked ``lax.scan`` weights read by every
    iteration, a parameter read by its layer's forward pass and by an update placed elsewhere)
    must take one spec in all of them, else the stitched plan reshards it for every segment that
    assumed another. So must an input whose updated value (a new parameter or optimizer state)
    is made by a segment that does not read it: the stitched plan charges resharding that value
    to the input's spec, which only the input's readers fix.

    Returns:
        ``{input tensor: its reading segments, in order}`` for the non-scalar inputs read by
        several segments or updated by a segment that does not read them, and ``{input tensor:
        [(updated output tensor, the segment making it)]}`` for the latter.
    """
    readers: dict[int, list[int]] = {}
    for gi in graph.inputs:
        if not graph.tensors[gi.tensor].shape:
            continue
        segs = sorted({seg_of[c] for c in graph.consumers[gi.tensor] if seg_of[c] >= 0})
        if segs:
            readers[gi.tensor] = segs
    shared = {t: r for t, r in readers.items() if len(r) > 1}
    pair_out: dict[int, list[tuple[int, int]]] = {}
    for o, i in _updated_pairs(graph):
        p = seg_of[graph.tensors[o].producer]
        if i in readers and p >= 0 and p not in readers[i]:
            pair_out.setdefault(i, []).append((o, p))
            shared.setdefault(i, readers[i])
    return shared, pair_out


def _choose_segments(graph: OpGraph, tepdist_segments, mining) -> list:
    """The chain of segments the hierarchical levels solve.

    A model's own layer structure is the best boundary set: when most forward operators carry a
    named scope, the layers found from the scopes (operator clustering) are the segments. Without
    scopes, TePDist's segments between critical nodes (one per mined layer instance) are used,
    unless one segment holds most of the graph (critical nodes are scarce); then the heavy-operator
    clustering is used. ``tepdist_segments()`` computes TePDist's segments (only when needed).
    Fine-grained segments are coarsened (see :func:`_coarsen`).
    """
    from autoplan.search.fold._cones import Segment  # noqa: PLC0415

    scoped = _forward(graph)[1]
    if not scoped:
        segs = tepdist_segments()
        if len(segs) >= 3 and max(len(s.ops) for s in segs) <= 0.5 * len(graph):
            return _coarsen(graph, segs, mining)
    layers = group_layers(graph, max_layers=None if scoped else 64)
    out = [Segment(id=k, ops=ly.ops, main=ly.forward, critical=None, inputs=(), outputs=(),
                   params=(), flops=ly.flops) for k, ly in enumerate(layers) if ly.ops]
    out = [Segment(**{**s.__dict__, "id": k}) for k, s in enumerate(out)]
    return _coarsen(graph, out, mining)


def _coarsen(graph: OpGraph, segs: list, mining, max_segments: int | None = None) -> list:
    """Merge neighbouring segments that are not mined layer instances until at most
    ``max_segments`` remain (default: the mined instances plus 6): many tiny segments would make
    boundary communication dominate the decomposition."""
    from autoplan.search.fold._cones import Segment  # noqa: PLC0415

    n_inst = sum(len(c.instances) for c in mining.classes)
    limit = max_segments or max(8, n_inst + 6)
    if len(segs) <= limit:
        return segs
    inst_of = {o: k for k, i in enumerate(i for c in mining.classes for i in c.instances) for o in i}
    groups = [list(s.ops) for s in segs]

    def mostly_one_instance(ops) -> bool:
        counts: dict[int, int] = {}
        for o in ops:
            if o in inst_of:
                counts[inst_of[o]] = counts.get(inst_of[o], 0) + 1
        return bool(counts) and max(counts.values()) > len(ops) / 2

    keep = [mostly_one_instance(s.ops) for s in segs]
    while len(groups) > limit:
        best, arg = None, None
        for k in range(len(groups) - 1):
            if keep[k] and keep[k + 1]:
                continue
            size = len(groups[k]) + len(groups[k + 1])
            if best is None or size < best:
                best, arg = size, k
        if arg is None:
            break
        groups[arg] = sorted(groups[arg] + groups.pop(arg + 1))
        keep[arg] = False
        keep.pop(arg + 1)
    if len(groups) == len(segs):
        return segs
    out = []
    for k, ops in enumerate(groups):
        crit = next((s.critical for s in reversed(segs) if s.ops and s.ops[-1] in set(ops)), None)
        out.append(Segment(id=k, ops=tuple(ops), main=tuple(ops), critical=crit, inputs=(),
                           outputs=(), params=(), flops=float(sum(graph.ops[o].flops for o in ops))))
    return out
